"""One-step-off rollouts: the engine generates step n+1's completions while the trainer trains step n.

With the rollout engine on its own GPU (the ``async`` placement), the trainer need not wait for each generation:
once step n's weights θ_n are on the engine, the engine can generate the completions of step n+1's prompts while
the trainer scores and trains step n. Those completions come from θ_n, one optimizer step behind the θ_{n+1} that
trains on them (staleness exactly one step); TRL's importance-sampling correction accounts for the ratio.

The timeline, one call of ``OneStepOff.step`` per optimizer step, ``step`` = the trainer's global step (the number
of optimizer updates done, so the version of the weights it holds)::

    step 0:  push θ_0, generate B_0 (synchronous)      | submit B_1 (θ_0) ──┐ engine generates B_1 with θ_0
             trainer scores and trains B_0 -> θ_1      |                    │ while the trainer trains B_0
    step 1:  wait for B_1 ◄─────────────────────────────────────────────────┘
             push θ_1                                  | submit B_2 (θ_1) ──┐
             trainer trains B_1 (staleness 1) -> θ_2   |                    │
    step 2:  wait for B_2 ◄─────────────────────────────────────────────────┘ ...

Rules the class keeps:

- the weights move only in the caller's thread, at most once per ``step`` value, and never while a generation is
  in flight (a push always follows the wait for the pending generation);
- a pending generation is used only for exactly the prompts it was submitted for; for other prompts (a resume, a
  different batch) it is waited for, dropped with one warning, and the step generates synchronously with the
  current weights (staleness 0), as it does when nothing is pending (step 0, after an epoch's end, after ``drain``);
- a background generation that raises, or outlasts ``timeout_s``, becomes a ``RolloutError`` at the step that
  needs it; while the caller waits, ``alive`` is asked every ``poll_s`` whether the engine still runs, so an engine
  that died is named within seconds rather than after ``timeout_s``.

``ReadAhead`` supplies the next step's prompts: it reads each optimizer step's micro-batches one step early (the
first of them is what ``step`` is handed as ``next_prompt_ids``), without skipping or repeating a batch.

The module is engine-agnostic (``generate`` and ``push_weights`` are callables), so it runs without torch or a GPU.
"""

from __future__ import annotations

import concurrent.futures
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger(__name__)

PromptIds = list[list[int]]


class RolloutError(RuntimeError):
    """A background generation failed or did not finish in time; the message says which and at which step."""


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


@dataclass
class _Pending:
    future: concurrent.futures.Future
    prompts: tuple[tuple[int, ...], ...]  # a snapshot, compared with the prompts of the step that comes for it
    version: int  # the step (weights version) it was submitted at


class OneStepOff:
    """Generates the next step's completions in a background thread with the current weights (see the module doc).

    Args:
        generate: runs one generation on the engine for a list of prompts (token ids) and returns its result;
            blocking. Called from one background worker thread and, for a synchronous generation, from the
            caller's thread, never from both at once.
        push_weights: sends the trainer's current weights to the engine; called from the caller's thread only,
            and only when no generation is in flight.
        timeout_s: the longest the caller waits for a background generation before raising ``RolloutError``.
        alive: raises when the engine has stopped (e.g. ``VLLMServer.check_alive``); asked every ``poll_s`` while
            the caller waits for a background generation. None: not asked.
        poll_s: how often ``alive`` is asked.
    """

    def __init__(
        self,
        generate: Callable[[PromptIds], Any],
        push_weights: Callable[[], None],
        timeout_s: float = 1800.0,
        alive: Callable[[], None] | None = None,
        poll_s: float = 5.0,
    ) -> None:
        if timeout_s <= 0 or poll_s <= 0:
            raise ValueError(f"timeout_s and poll_s must be positive, got {timeout_s} and {poll_s}")
        self._generate = generate
        self._push_weights = push_weights
        self._timeout_s = float(timeout_s)
        self._alive = alive
        self._poll_s = float(poll_s)
        self._executor = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="one-step-off")
        self._pending: _Pending | None = None
        # The last future submitted, kept after its result was taken or dropped: while it runs (a timed-out
        # generation still going), no push and no synchronous generation may start.
        self._last_future: concurrent.futures.Future | None = None
        self._last_version: int | None = None  # the step it was submitted at
        self._pushed_step: int | None = None
        self._closed = False

    @property
    def pending_version(self) -> int | None:
        """The weights version (step) the generation in flight was submitted with; None when none is pending."""
        return None if self._pending is None else self._pending.version

    def _timed_generate(self, prompt_ids: PromptIds) -> tuple[Any, float]:
        start = time.monotonic()
        result = self._generate(prompt_ids)
        return result, time.monotonic() - start

    def _result(self, future: concurrent.futures.Future, version: int, waiting: str) -> tuple[Any, float]:
        """``future``'s result within ``timeout_s`` (``concurrent.futures.TimeoutError`` after it; the generation's
        own error as raised), asking ``alive`` every ``poll_s``: an engine that stopped is a ``RolloutError``."""
        deadline = time.monotonic() + self._timeout_s
        while True:
            try:
                return future.result(timeout=max(0.0, min(self._poll_s, deadline - time.monotonic())))
            except concurrent.futures.TimeoutError:
                if time.monotonic() >= deadline:
                    raise
            if self._alive is not None:
                try:
                    self._alive()
                except Exception as exc:
                    raise RolloutError(f"{waiting}: the rollout engine stopped during the generation submitted at "
                                       f"step {version}: {_one_line(exc)}") from exc

    def _wait(self, pending: _Pending, step: int) -> tuple[Any, float]:
        """The pending generation's (result, own duration); a failure or a timeout raises ``RolloutError``."""
        try:
            return self._result(pending.future, pending.version, f"waiting at step {step}")
        except RolloutError:
            raise
        except concurrent.futures.TimeoutError as exc:
            raise RolloutError(
                f"the background generation submitted at step {pending.version} did not finish within "
                f"{self._timeout_s:g} s (waited for it at step {step}); is the rollout engine alive?"
            ) from exc
        except Exception as exc:
            raise RolloutError(
                f"the background generation submitted at step {pending.version} failed (needed at step {step}): "
                f"{_one_line(exc)}"
            ) from exc

    def _ensure_idle(self, step: int) -> None:
        """Wait for a generation still running after its result was given up (a timeout); raise if it goes on."""
        future = self._last_future
        if future is None or future.done():
            return
        done, _ = concurrent.futures.wait([future], timeout=self._timeout_s)
        if not done:
            raise RolloutError(
                f"a background generation is still running at step {step} after {self._timeout_s:g} s more; "
                "the weights cannot move while it runs"
            )

    def _push_once(self, step: int) -> int:
        """Push the weights unless already pushed at this step; returns the number of pushes made (0 or 1)."""
        if self._pushed_step == step:
            return 0
        assert self._pending is None, "no push while a generation is in flight"
        self._ensure_idle(step)
        self._push_weights()
        self._pushed_step = step
        return 1

    def step(
        self, prompt_ids: PromptIds, step: int, next_prompt_ids: PromptIds | None
    ) -> tuple[Any, dict[str, float]]:
        """This step's generation for ``prompt_ids``, and the start of the next step's for ``next_prompt_ids``.

        Args:
            prompt_ids: this step's prompts (token ids).
            step: the trainer's global step (optimizer updates done: the version of the weights it holds).
            next_prompt_ids: the next step's prompts, generated in the background with this step's weights;
                None when they are not known (an epoch's end): the next step then generates synchronously.

        Returns:
            ``generate``'s result for ``prompt_ids`` and the metrics ``async/staleness``, ``async/wait_seconds``,
            ``async/generate_seconds``, ``async/overlapped`` and ``async/pushes``.

        Raises:
            RolloutError: the background generation for this step failed or did not finish within ``timeout_s``.
        """
        if self._closed:
            raise RuntimeError("OneStepOff.step called after close()")
        pushes = 0
        result: Any = None
        version: int | None = None
        wait_seconds = 0.0
        generate_seconds = 0.0

        pending, self._pending = self._pending, None
        if pending is not None:
            wanted = tuple(tuple(p) for p in prompt_ids)
            waited_from = time.monotonic()
            if pending.prompts == wanted:
                result, generate_seconds = self._wait(pending, step)
                wait_seconds = time.monotonic() - waited_from
                version = pending.version
            else:
                try:
                    self._wait(pending, step)
                    outcome = "finished"
                except RolloutError as exc:
                    if not pending.future.done():
                        raise  # still running: the weights cannot move
                    outcome = f"failed ({_one_line(exc.__cause__ or exc)})"
                logger.warning(
                    "step %d: the background generation submitted at step %d was for other prompts "
                    "(%d prompts, %d asked); dropped it (%s, waited %.2f s) and generating synchronously",
                    step, pending.version, len(pending.prompts), len(wanted), outcome,
                    time.monotonic() - waited_from,
                )

        if version is None:
            pushes += self._push_once(step)
            self._ensure_idle(step)
            start = time.monotonic()
            result = self._generate(prompt_ids)
            generate_seconds = time.monotonic() - start
            version = step

        pushes += self._push_once(step)
        if next_prompt_ids is not None:
            snapshot = tuple(tuple(p) for p in next_prompt_ids)
            future = self._executor.submit(self._timed_generate, [list(p) for p in snapshot])
            self._pending = _Pending(future, snapshot, step)
            self._last_future, self._last_version = future, step

        staleness = step - version
        logger.debug(
            "step %d: used a generation from step %d (staleness %d), waited %.3f s, generation %.3f s, %d push(es)",
            step, version, staleness, wait_seconds, generate_seconds, pushes,
        )
        return result, {
            "async/staleness": float(staleness),
            "async/wait_seconds": float(wait_seconds),
            "async/generate_seconds": float(generate_seconds),
            "async/overlapped": 0.0 if version == step else 1.0,
            "async/pushes": float(pushes),
        }

    def drain(self) -> None:
        """Wait for the pending generation, if any, and drop it, so that nothing is in flight while weights move.

        A generation that failed is dropped with a warning; one that outlasts ``timeout_s`` raises ``RolloutError``.
        The next ``step`` generates synchronously.
        """
        pending, self._pending = self._pending, None
        if pending is None:
            return
        try:
            self._result(pending.future, pending.version, "draining")
        except RolloutError:
            raise
        except concurrent.futures.TimeoutError as exc:
            raise RolloutError(
                f"draining: the background generation submitted at step {pending.version} did not finish within "
                f"{self._timeout_s:g} s; is the rollout engine alive?"
            ) from exc
        except Exception as exc:
            logger.warning(
                "draining: the background generation submitted at step %d failed (%s); dropped it",
                pending.version, _one_line(exc),
            )
        else:
            logger.debug("drained the background generation submitted at step %d", pending.version)

    def close(self) -> None:
        """Drain, then shut the worker down; calling it again does nothing."""
        if self._closed:
            return
        self._closed = True
        try:
            self.drain()
            last = self._last_future
            if last is not None and not last.done():  # given up on earlier, and still running
                self._result(last, self._last_version, "closing")
        except (RolloutError, concurrent.futures.TimeoutError) as exc:
            reason = str(exc) if isinstance(exc, RolloutError) else (
                f"closing: a generation still runs after {self._timeout_s:g} s more")
            logger.warning("%s; not waiting for it", reason)
            self._executor.shutdown(wait=False, cancel_futures=True)
            return
        except Exception:  # noqa: BLE001 - that generation's own failure: its result was given up already
            logger.debug("closing: a generation given up on earlier failed as it ended")
        self._executor.shutdown(wait=True)

    def __enter__(self) -> OneStepOff:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class ReadAhead:
    """Reads each optimizer step's micro-batches one step early, so the next step's prompts are known in time.

    The batches a sequence of ``take`` calls returns are exactly those plain ``read`` calls would have returned
    (none skipped or repeated), whatever ``num_batches`` each call asks for and when the iterator runs out. The
    read-ahead batches are kept for the iterator they came from; a call with another iterator (a new epoch) drops
    them.
    """

    def __init__(self) -> None:
        self._iterator: Iterator | None = None
        self._stash: list = []

    def clear(self) -> None:
        """Drop the batches read ahead (the next ``take`` reads from its iterator only)."""
        self._iterator = None
        self._stash = []

    def take(
        self, iterator: Iterator, num_batches: int, read: Callable[[Iterator, int], list]
    ) -> tuple[list, Any | None]:
        """This step's ``num_batches`` batches and the first batch of the next step.

        Args:
            iterator: the epoch's iterator of micro-batches.
            num_batches: how many batches this step takes.
            read: ``read(iterator, n)`` returns up to ``n`` batches of the iterator, fewer at its end
                (transformers' ``Trainer.get_batch_samples``).

        Returns:
            This step's batches (those read ahead earlier for this iterator first), and the next step's first
            batch, read ahead now (None when the iterator has nothing left).
        """
        if iterator is not self._iterator:
            if self._stash:
                logger.debug("a new iterator: dropping %d batch(es) read ahead from the previous one", len(self._stash))
            self._iterator = iterator
            self._stash = []
        batches, self._stash = self._stash[:num_batches], self._stash[num_batches:]
        if len(batches) < num_batches:
            batches.extend(read(iterator, num_batches - len(batches)))
            if len(batches) < num_batches:  # the iterator ran out: nothing to read ahead
                return batches, None
        if not self._stash:
            self._stash = list(read(iterator, num_batches))
        return batches, (self._stash[0] if self._stash else None)
