"""One-step-off rollouts (rlt_mono.rl.one_step_off) against a fake engine that stamps each generation with its weights.

The fake engine holds a weight version; ``push`` copies the trainer's version into it; ``generate`` sleeps a little
and returns (prompts, the engine's version when it started), and fails the test if a push or a second generation
happens while it runs.
"""

import logging
import threading
import time

import pytest

from rlt_mono.rl.one_step_off import OneStepOff, ReadAhead, RolloutError

LOGGER = "rlt_mono.rl.one_step_off"


class FakeEngine:
    def __init__(self, seconds: float = 0.03, fail_on: list[list[int]] | None = None):
        self.seconds = seconds
        self.fail_on = fail_on
        self.trainer_version = 0  # the trainer's weights; the test bumps it after each optimizer step
        self.version: int | None = None  # the engine's weights
        self.pushes: list[int] = []  # the version each push sent
        self.generated: list[tuple[list[list[int]], int]] = []
        self.overlaps: list[str] = []
        self._busy = threading.Event()
        self._lock = threading.Lock()

    def push(self) -> None:
        if self._busy.is_set():
            self.overlaps.append(f"push of version {self.trainer_version} during a generation")
            raise AssertionError(self.overlaps[-1])
        self.version = self.trainer_version
        self.pushes.append(self.version)

    def generate(self, prompts: list[list[int]]):
        with self._lock:
            if self._busy.is_set():
                self.overlaps.append("two generations at once")
                raise AssertionError(self.overlaps[-1])
            self._busy.set()
        try:
            version, pushes = self.version, len(self.pushes)
            time.sleep(self.seconds)
            if len(self.pushes) != pushes or self.version != version:
                self.overlaps.append("weights moved during a generation")
                raise AssertionError(self.overlaps[-1])
            if prompts == self.fail_on:
                raise ValueError("engine fell over\nsecond line of the engine's message")
            self.generated.append((prompts, version))
            return prompts, version
        finally:
            self._busy.clear()

    @property
    def busy(self) -> bool:
        return self._busy.is_set()


def prompts_of(n: int) -> list[list[int]]:
    return [[n, 10 + n], [n, 20 + n, 30 + n]]


def test_each_step_trains_the_previous_steps_weights_with_one_push_per_step():
    engine = FakeEngine()
    with OneStepOff(engine.generate, engine.push) as oso:
        metrics = []
        for n in range(5):
            assert engine.trainer_version == n
            result, m = oso.step(prompts_of(n), n, prompts_of(n + 1))
            assert oso.pending_version == n
            # step 0 generates synchronously with θ_0; step n > 0 uses the background batch made with θ_{n-1}
            assert result == (prompts_of(n), 0 if n == 0 else n - 1)
            assert engine.pushes == list(range(n + 1))  # θ_n pushed once, after this step's wait
            metrics.append(m)
            engine.trainer_version += 1  # the optimizer step
    assert [m["async/staleness"] for m in metrics] == [0.0, 1.0, 1.0, 1.0, 1.0]
    assert [m["async/overlapped"] for m in metrics] == [0.0, 1.0, 1.0, 1.0, 1.0]
    assert [m["async/pushes"] for m in metrics] == [1.0] * 5
    assert all(m["async/generate_seconds"] >= 0.025 for m in metrics)
    assert engine.overlaps == []
    # close() waited for the batch of step 5 (made with θ_4) before returning
    assert not engine.busy and engine.generated[-1] == (prompts_of(5), 4)
    assert oso.pending_version is None


def test_a_pending_batch_for_other_prompts_is_dropped_with_a_warning(caplog):
    engine = FakeEngine()
    with OneStepOff(engine.generate, engine.push) as oso:
        oso.step(prompts_of(0), 0, prompts_of(1))
        engine.trainer_version = 1
        with caplog.at_level(logging.WARNING, logger=LOGGER):
            result, m = oso.step(prompts_of(7), 1, None)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "other prompts" in warnings[0].getMessage()
    assert result == (prompts_of(7), 1)  # regenerated with the current weights
    assert m["async/staleness"] == 0.0 and m["async/overlapped"] == 0.0
    assert m["async/pushes"] == 1.0 and m["async/wait_seconds"] == 0.0
    assert engine.pushes == [0, 1]
    # the dropped batch was finished (made with θ_0) before θ_1 moved
    assert engine.generated[1] == (prompts_of(1), 0) and engine.overlaps == []


def test_no_next_prompts_makes_the_following_step_synchronous():
    engine = FakeEngine()
    with OneStepOff(engine.generate, engine.push) as oso:
        oso.step(prompts_of(0), 0, None)  # an epoch's last step: nothing read ahead
        assert oso.pending_version is None
        engine.trainer_version = 1
        result, m = oso.step(prompts_of(1), 1, prompts_of(2))
        assert result == (prompts_of(1), 1)
        assert m["async/staleness"] == 0.0 and m["async/overlapped"] == 0.0 and m["async/pushes"] == 1.0
        engine.trainer_version = 2
        result, m = oso.step(prompts_of(2), 2, None)
        assert result == (prompts_of(2), 1) and m["async/staleness"] == 1.0
    assert engine.pushes == [0, 1, 2] and engine.overlaps == []


def test_a_failing_background_generation_raises_at_the_step_that_needs_it():
    engine = FakeEngine(fail_on=prompts_of(1))
    oso = OneStepOff(engine.generate, engine.push)
    oso.step(prompts_of(0), 0, prompts_of(1))
    engine.trainer_version = 1
    with pytest.raises(RolloutError, match=r"submitted at step 0 failed \(needed at step 1\): ValueError: engine") as e:
        oso.step(prompts_of(1), 1, prompts_of(2))
    assert "\n" not in str(e.value) and "second line" in str(e.value)
    assert isinstance(e.value, RuntimeError) and isinstance(e.value.__cause__, ValueError)
    assert oso.pending_version is None and engine.pushes == [0]  # nothing pushed at the failing step
    oso.close()


def test_a_background_generation_that_outlasts_the_timeout_raises_and_blocks_pushes_while_it_runs():
    engine = FakeEngine(seconds=0.4)
    oso = OneStepOff(engine.generate, engine.push, timeout_s=0.05)
    oso.step(prompts_of(0), 0, prompts_of(1))  # synchronous: no timeout on the caller's own generation
    engine.trainer_version = 1
    with pytest.raises(RolloutError, match="submitted at step 0 did not finish within 0.05 s .*at step 1") as e:
        oso.step(prompts_of(1), 1, prompts_of(2))
    assert "\n" not in str(e.value)
    assert engine.busy  # the late generation still runs: another step may not push over it
    with pytest.raises(RolloutError, match="still running at step 1"):
        oso.step(prompts_of(1), 1, None)
    assert engine.pushes == [0]
    time.sleep(0.4)  # it ends; the engine is free again
    result, m = oso.step(prompts_of(1), 1, None)
    assert result == (prompts_of(1), 1) and m["async/staleness"] == 0.0
    assert engine.pushes == [0, 1] and engine.overlaps == []
    oso.close()


def test_drain_drops_the_pending_batch_and_close_is_idempotent():
    engine = FakeEngine(seconds=0.1)
    oso = OneStepOff(engine.generate, engine.push)
    oso.step(prompts_of(0), 0, prompts_of(1))
    assert oso.pending_version == 0
    oso.drain()
    assert oso.pending_version is None and not engine.busy
    assert engine.generated[-1] == (prompts_of(1), 0)  # drain waited for it to finish
    oso.drain()  # nothing pending: a no-op
    engine.trainer_version = 1
    result, m = oso.step(prompts_of(1), 1, prompts_of(2))
    assert result == (prompts_of(1), 1) and m["async/overlapped"] == 0.0 and m["async/staleness"] == 0.0
    assert oso.pending_version == 1  # the batch of step 2 is in flight
    oso.close()
    assert not engine.busy and engine.generated[-1] == (prompts_of(2), 1)
    oso.close()
    assert engine.pushes == [0, 1] and engine.overlaps == []
    with pytest.raises(RuntimeError, match="after close"):
        oso.step(prompts_of(2), 2, None)


def test_wait_seconds_is_the_generation_time_left_when_the_caller_arrives():
    engine = FakeEngine(seconds=0.3)
    with OneStepOff(engine.generate, engine.push) as oso:
        _, m0 = oso.step(prompts_of(0), 0, prompts_of(1))
        assert m0["async/wait_seconds"] == 0.0 and m0["async/generate_seconds"] >= 0.25
        engine.trainer_version = 1
        _, early = oso.step(prompts_of(1), 1, prompts_of(2))  # arrives at once: waits the whole generation
        assert 0.2 <= early["async/wait_seconds"] <= 1.0
        assert early["async/generate_seconds"] >= 0.25
        time.sleep(0.4)  # training takes longer than the generation
        engine.trainer_version = 2
        _, late = oso.step(prompts_of(2), 2, None)
        assert late["async/wait_seconds"] < 0.1 and late["async/generate_seconds"] >= 0.25
        assert late["async/overlapped"] == 1.0
    assert engine.overlaps == []


def read(iterator, n):
    """transformers' Trainer.get_batch_samples: up to n items, fewer at the iterator's end."""
    out = []
    for _ in range(n):
        try:
            out.append(next(iterator))
        except StopIteration:
            break
    return out


def test_read_ahead_returns_each_step_and_the_next_steps_first_batch():
    ahead = ReadAhead()
    it = iter(range(10))
    assert ahead.take(it, 3, read) == ([0, 1, 2], 3)
    assert next(it) == 6  # items 3..5 were read ahead by this call
    it = iter(range(10))
    calls = [ahead.take(it, 3, read) for _ in range(5)]
    assert calls == [([0, 1, 2], 3), ([3, 4, 5], 6), ([6, 7, 8], 9), ([9], None), ([], None)]


def test_read_ahead_with_a_changing_step_size_skips_and_repeats_nothing():
    ahead = ReadAhead()
    it = iter(range(10))
    calls = [ahead.take(it, n, read) for n in (3, 2, 2, 3, 3)]
    assert calls == [([0, 1, 2], 3), ([3, 4], 5), ([5, 6], 7), ([7, 8, 9], None), ([], None)]
    # one epoch of 3-batch steps then a 2-batch remainder, twice: the same batches as plain reads
    seen = []
    for _epoch in range(2):
        it = iter(range(8))
        for n in (3, 3, 2):
            batches, nxt = ahead.take(it, n, read)
            seen.append(batches)
    assert seen == [[0, 1, 2], [3, 4, 5], [6, 7]] * 2


def test_a_new_iterator_drops_the_batches_read_ahead_from_the_old_one():
    ahead = ReadAhead()
    old = iter(range(10))
    assert ahead.take(old, 3, read) == ([0, 1, 2], 3)
    new = iter(range(100, 110))
    assert ahead.take(new, 3, read) == ([100, 101, 102], 103)
    assert ahead.take(new, 3, read) == ([103, 104, 105], 106)
    ahead.clear()
    assert ahead.take(new, 2, read) == ([109], None)  # 106..108 were read ahead, then cleared


def test_an_engine_that_stops_during_a_background_generation_is_named_within_a_poll_not_the_timeout(caplog):
    engine = FakeEngine(seconds=5.0)  # the generation would go on: its server no longer answers
    checks: list[float] = []

    def alive():
        checks.append(time.monotonic())
        if len(checks) >= 3:
            raise RuntimeError("the rollout server exited with code 1;\nits log ends: CUDA error")

    oso = OneStepOff(engine.generate, engine.push, timeout_s=60, alive=alive, poll_s=0.02)
    oso.step(prompts_of(0), 0, prompts_of(1))  # synchronous, then step 1's in the background
    engine.trainer_version = 1
    started = time.monotonic()
    with pytest.raises(RolloutError) as e:
        oso.step(prompts_of(1), 1, prompts_of(2))
    assert time.monotonic() - started < 1.0 and len(checks) == 3  # three polls, not a minute
    assert str(e.value) == ("waiting at step 1: the rollout engine stopped during the generation submitted at step 0: "
                            "RuntimeError: the rollout server exited with code 1; its log ends: CUDA error")
    # close() does not wait for the generation of a stopped engine either, and says why
    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        oso.close()
    assert time.monotonic() - started < 1.0
    assert ("closing: the rollout engine stopped during the generation submitted at step 0: RuntimeError: the "
            "rollout server exited with code 1; its log ends: CUDA error; not waiting for it") in caplog.text


def test_a_live_engine_is_asked_while_the_caller_waits_and_the_result_is_used():
    engine = FakeEngine(seconds=0.6)
    checks: list[float] = []
    oso = OneStepOff(engine.generate, engine.push, alive=lambda: checks.append(time.monotonic()), poll_s=0.02)
    oso.step(prompts_of(0), 0, prompts_of(1))
    engine.trainer_version = 1
    result, m = oso.step(prompts_of(1), 1, None)  # arrives at once: waits about 0.6 s for the generation
    assert result == (prompts_of(1), 0) and m["async/staleness"] == 1.0
    assert 3 <= len(checks) <= 40  # asked every poll while it waited (about 30 times), not after it ended
    oso.close()
