"""What a run shows in the terminal while it trains: a progress bar and, under it, one line per logged step
(``CompactProgressCallback``, in place of transformers' dump of the whole metrics dict), and one line when training
ends. The RL stage and the SFT stages show the same: ``step 8/32 | reward ...`` (RL) or ``step 8/32 | loss 1.234 |
lr 1.0e-05 | 0.42 s/step`` (SFT).

``replace_progress_callback`` installs it on a trainer; ``format_step_line`` and ``format_summary_line`` are the
lines, as plain functions (the notebook prints them from ``metrics.jsonl`` rows). Every metric stays in
``metrics.jsonl`` (``rlt_mono.runs.outputs``) and the loggers (``report_to``).

One bar, and only in a terminal (or a notebook's widgets): when stderr goes to a file or a pipe (``... 2>&1 | tee
log``, a pipeline stage's log) a bar is a stream of ``\\r`` redraws glued to the lines written under it. There the run
draws no bar (its per-step line, through ``logging``, is the progress; ``rlt_mono.cli`` also sets the libraries'
environment switches before they load). In a terminal the training bar is the only one: ``bars_only_in_terminal``
switches off transformers' bars (loading and saving weights) and datasets' (``map``), keeping huggingface_hub's
download bars; while it is open every log line is written above it (tqdm's logging redirect), and a run stopped in
the middle of training closes it before its error line (``close_open_bars``).
"""

from __future__ import annotations

import contextlib
import logging
import sys
import time
import weakref
from collections.abc import Mapping, Sequence
from pathlib import Path

import datasets
import huggingface_hub
import transformers
from tqdm.contrib.logging import logging_redirect_tqdm
from transformers import TrainerCallback
from transformers.trainer_callback import PrinterCallback, ProgressCallback
from transformers.utils import is_in_notebook

from rlt_mono.runs.outputs import in_phase_order, is_number, is_summary_log
from rlt_mono.runs.readme import describe_trend, reward_trend

logger = logging.getLogger(__name__)

# Short names of the phases in the progress line (others keep their name).
PHASE_SHORT_NAMES = {"generate": "gen"}


class CompactProgressCallback(TrainerCallback):
    """transformers' progress bar, with one short line per logged step under it instead of the metrics dict.

    ``step 12/40 | reward -2.71 (r_ss -1.90, r_kl 0.81, unmatched 0%) | 3.1 s/step (gen 1.2, score 0.8, train
    1.1)`` (RL) or ``step 8/32 | loss 1.234 | lr 1.0e-05 | 0.42 s/step`` (SFT: seconds per step measured between
    logged steps); at the end ``done: step 40/40 in 2 min 4 s (3.1 s/step) | mean reward -3.02 (steps 1-7) -> -2.41
    (steps 34-40) | outputs in <dir>``. With ``disable_tqdm``, or when stderr is no terminal
    (``terminal_shows_bars``), there is no bar and the lines go to ``logging``: one whole line per step in a log.
    Every metric stays in ``metrics.jsonl`` and the loggers (``report_to``).
    """

    def __init__(self):
        self.bar = None
        self._display = contextlib.ExitStack()  # the bar and the redirect of the log lines above it
        self._bar_step = 0
        self._start_step = 0
        self._rewards: list[tuple[int, float]] = []
        self._losses: list[tuple[int, float]] = []
        self._last_log = (0.0, 0)  # (time.monotonic(), step) of the last logged step

    def on_train_begin(self, args, state, control, **kwargs):
        self._start_step = self._bar_step = state.global_step
        self._rewards, self._losses = [], []
        self._last_log = (time.monotonic(), state.global_step)
        bars = bars_only_in_terminal()  # off a terminal: no bar, nor transformers' bars of the checkpoint saves
        if state.is_world_process_zero and not args.disable_tqdm and bars:
            from tqdm.auto import tqdm  # what transformers' ProgressCallback uses (a widget in a notebook)

            # Every log line goes through tqdm.write while the bar is open: written above the bar, which is drawn
            # again under it, rather than glued to its last redraw (a line logged at the end of training, before
            # this callback closes the bar, included). Closed in reverse: the bar, then the loggers' own handlers.
            self._display.enter_context(logging_redirect_tqdm(console_loggers(), tqdm_class=tqdm))
            self.bar = self._display.enter_context(
                tqdm(total=state.max_steps, initial=state.global_step, dynamic_ncols=True))
            OPEN_BARS.add(self)

    def on_step_end(self, args, state, control, **kwargs):
        if self.bar is not None:
            self.bar.update(state.global_step - self._bar_step)
        self._bar_step = state.global_step

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not state.is_world_process_zero or not logs:
            return
        if is_summary_log(logs):
            line = format_summary_line(logs, state.global_step, state.max_steps, state.global_step - self._start_step,
                                       self._rewards, args.output_dir, losses=self._losses)
        else:
            if is_number(logs.get("reward")):
                self._rewards.append((state.global_step, float(logs["reward"])))
            elif is_number(logs.get("loss")):
                self._losses.append((state.global_step, float(logs["loss"])))
            now, (then, last_step) = time.monotonic(), self._last_log
            per_step = (now - then) / (state.global_step - last_step) if state.global_step > last_step else None
            self._last_log = (now, state.global_step)
            line = format_step_line(logs, state.global_step, state.max_steps, per_step)
        if self.bar is not None:
            self.bar.write(line, file=sys.stderr)  # where the bar and the log lines are
        else:
            logger.info(line)

    def on_train_end(self, args, state, control, **kwargs):
        self.close()

    def close(self) -> None:
        """Close the bar (left on screen at its last count, the cursor under it) and give the log lines back to
        their handlers; nothing when no bar is open."""
        self._display.close()
        self.bar = None
        OPEN_BARS.discard(self)


# The callbacks whose bar is open: a run stopped in the middle of training (an error, Ctrl-C) never reaches
# on_train_end, and closes them with close_open_bars before its error line.
OPEN_BARS: weakref.WeakSet[CompactProgressCallback] = weakref.WeakSet()


def close_open_bars() -> None:
    """Close every training bar still open (``CompactProgressCallback.close``), so that what is written next starts
    on a line of its own under the bar."""
    for callback in list(OPEN_BARS):
        callback.close()


class NoLearningSignalWarning(TrainerCallback):
    """Warns once when GRPO has had almost nothing to learn from for ``window`` logged steps: in at least
    ``threshold`` of the step's groups every completion got the same reward (TRL's ``frac_reward_zero_std``), so
    their advantages, and the gradient they give, are zero.

    Seen on a GPU: after an SFT warm-up on templated traces the teacher wrote the same explanation 8 times per
    prompt (mean ``frac_reward_zero_std`` 0.89 over 200 steps) and RL left it where it was (README, "Does it
    teach?").
    """

    def __init__(self, window: int = 10, threshold: float = 0.9):
        self.window, self.threshold = window, threshold
        self._recent: list[float] = []
        self.warned = False

    def on_log(self, args, state, control, logs=None, **kwargs):
        if self.warned or not state.is_world_process_zero or not logs or \
                not is_number(logs.get("frac_reward_zero_std")):
            return  # data parallel: rank 0 warns for the run
        self._recent = [*self._recent, float(logs["frac_reward_zero_std"])][-self.window:]
        mean = sum(self._recent) / len(self._recent)
        if len(self._recent) == self.window and mean >= self.threshold:
            self.warned = True
            logger.warning(
                "no learning signal: over the last %d steps %.0f%% of prompt groups had all completions rewarded "
                "alike (frac_reward_zero_std), so GRPO's advantages are zero; the teacher writes the same explanation "
                "for a prompt. Raise trainer.temperature, or start from a less converged warm-up (fewer SFT steps)",
                self.window, 100 * mean)


def terminal_shows_bars() -> bool:
    """Whether progress bars suit this process's output: stderr, where tqdm draws, is a terminal, or a notebook
    shows tqdm's widgets. In a file or a pipe each redraw of a bar is ``\\r`` + the whole bar, glued to whatever is
    written next."""
    return sys.stderr.isatty() or is_in_notebook()


def console_loggers() -> list[logging.Logger]:
    """The loggers whose lines reach the terminal through a handler of their own: the root logger (rlt_mono's, TRL's
    and accelerate's lines, which propagate to it) and the libraries' own (transformers', datasets'). Only those:
    tqdm's redirect gives every logger it is handed a handler that writes to the terminal."""
    loggers = [logging.getLogger(), *(each for each in logging.Logger.manager.loggerDict.values()
                                      if isinstance(each, logging.Logger))]
    return [each for each in loggers if any(isinstance(handler, logging.StreamHandler) and handler.stream in (
        sys.stdout, sys.stderr) for handler in each.handlers)]


def bars_only_in_terminal() -> bool:
    """Leave the training bar the only one: switch off the libraries' own progress bars through their switches,
    transformers' (loading and saving weights) and datasets' (``map``); huggingface_hub's (downloads, which
    transformers' switch turns off with its own) stay as they were in a terminal and go off elsewhere. Returns
    ``terminal_shows_bars()``: the trainer's own bar follows it (``disable_tqdm``; the compact callback). Switches
    nothing back on that was off: a bar switched off by the user stays off."""
    terminal = terminal_shows_bars()
    downloads = not huggingface_hub.utils.are_progress_bars_disabled()
    transformers.utils.logging.disable_progress_bar()
    datasets.disable_progress_bars()
    if terminal and downloads:
        huggingface_hub.utils.enable_progress_bars()
    return terminal


def replace_progress_callback(trainer) -> CompactProgressCallback:
    """Swap the progress display transformers gave ``trainer`` for a ``CompactProgressCallback``.

    transformers adds it at the end of ``Trainer.__init__`` (after the callbacks passed in): ``ProgressCallback``
    in a terminal, ``NotebookProgressCallback`` in Jupyter, ``PrinterCallback`` (a bare ``print`` of the dict)
    when ``args.disable_tqdm``; whichever it is goes.
    """
    display = (ProgressCallback, PrinterCallback)
    for callback in list(trainer.callback_handler.callbacks):
        # By name: transformers.utils.notebook imports IPython, which a plain Python install need not have.
        if isinstance(callback, display) or type(callback).__name__ == "NotebookProgressCallback":
            trainer.remove_callback(callback)
    callback = CompactProgressCallback()
    trainer.add_callback(callback)
    return callback


def format_step_line(logs: Mapping, step: int, max_steps: int, seconds_per_step: float | None = None) -> str:
    """One line for a step's logs; a missing metric is left out, e.g. ``step 12/40 | reward -2.71 (r_ss -1.90,
    r_kl 0.81, unmatched 0%) | 3.1 s/step (gen 1.2, score 0.8, train 1.1)`` (RL), ``step 8/32 | loss 1.234 | lr
    1.0e-05 | 0.42 s/step`` (SFT: a step without a reward shows its loss; ``seconds_per_step`` when the logs hold no
    step time); for a held-out evaluation ``step 25/200 | held-out reward -8.05`` (RL) or ``step 4/40 | held-out loss
    0.0213`` (SFT)."""
    parts = [f"step {step}/{max_steps}"]
    if is_number(logs.get("eval_reward")):  # TRL's evaluation on held-out questions (its keys start with eval_)
        return f"{parts[0]} | held-out reward {_reward_number(logs['eval_reward'])}"
    if is_number(logs.get("eval_loss")):
        return f"{parts[0]} | held-out loss {logs['eval_loss']:.4g}"
    details = [f"{name} {_reward_number(logs[key])}" for name, key in
               (("r_ss", "teacher_reward/r_ss"), ("r_kl", "teacher_reward/r_kl")) if is_number(logs.get(key))]
    if is_number(logs.get("alignment/unmatched_frac")):
        details.append(f"unmatched {logs['alignment/unmatched_frac']:.0%}")
    if is_number(logs.get("reward")):
        parts.append(f"reward {_reward_number(logs['reward'])}" + (f" ({', '.join(details)})" if details else ""))
    elif details:
        parts.append(", ".join(details))
    elif is_number(logs.get("loss")):  # SFT (GRPO's loss is not what RL optimises: its line shows the reward)
        parts.append(f"loss {logs['loss']:.4g}")
        if is_number(logs.get("learning_rate")):
            parts.append(f"lr {logs['learning_rate']:.1e}")
    phases = {key.split("/")[1]: value for key, value in logs.items()
              if key.startswith("phase/") and key.endswith("/seconds") and key.count("/") == 2 and is_number(value)}
    step_seconds = logs.get("step_time") if is_number(logs.get("step_time")) else sum(phases.values()) or None
    step_seconds = step_seconds if step_seconds is not None else seconds_per_step
    if step_seconds is not None:
        names = in_phase_order(phases)
        digits = 1 if step_seconds >= 1 else 2  # one precision for the step and its phases
        details = ", ".join(f"{PHASE_SHORT_NAMES.get(name, name)} {phases[name]:.{digits}f}" for name in names)
        parts.append(f"{step_seconds:.{digits}f} s/step" + (f" ({details})" if details else ""))
    return " | ".join(parts)


def format_summary_line(logs: Mapping, step: int, max_steps: int, steps_run: int,
                        rewards: Sequence[tuple[int, float]], output_dir: str | Path,
                        losses: Sequence[tuple[int, float]] = ()) -> str:
    """The end-of-training line: ``done: step 40/40 in 2 min 4 s (3.1 s/step) | mean reward -3.02 (steps 1-7)
    -> -2.41 (steps 34-40) | outputs in <dir>``. ``rewards`` are the (step, reward) pairs this call logged, or else
    ``losses`` its (step, loss) pairs (SFT: ``mean loss ...``); ``steps_run`` the steps it ran (fewer than ``step``
    after a resume)."""
    parts = [f"done: step {step}/{max_steps}"]
    runtime = logs.get("train_runtime")
    if is_number(runtime):
        per_step = f" ({_seconds(runtime / steps_run)} s/step)" if steps_run > 0 else ""
        parts[0] += f" in {_duration(runtime)}{per_step}"
    name, values = ("reward", rewards) if rewards else ("loss", losses)
    trend = reward_trend([step for step, _ in values], [value for _, value in values])
    if trend is not None:
        parts.append(f"mean {name} {describe_trend(trend)}")
    parts.append(f"outputs in {output_dir}")
    return " | ".join(parts)


# ---- number formatting ----------------------------------------------------------------------------------
def _reward_number(value: float) -> str:
    return f"{value:.2f}" if value == 0 or abs(value) >= 0.01 else f"{value:.1e}"


def _seconds(value: float) -> str:
    return f"{value:.1f}" if value >= 1 else f"{value:.2f}"


def _duration(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(round(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {secs} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes} min"
