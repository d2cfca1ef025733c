"""What a run shows while it trains, and what it leaves in its output folder besides TRL's checkpoints.

- The terminal: a progress bar and, under it, one line per logged step (``CompactProgressCallback``, in place of
  transformers' dump of the whole metrics dict), and one line when training ends.
- ``metrics.jsonl``: one JSON row per logged step, ``{"event": "step", "step": N, ...every metric}``, and one per
  finished ``train()`` call, ``{"event": "summary", "step": N, "train_runtime": ...}``. ``read_metrics`` returns
  the step rows (or the summaries).
- ``samples.jsonl``: a few teacher explanations per step: step, question, solution, explanation, reward parts
  first, then the rest of the reward's breakdown.
- ``reward_components.png``: reward components, unmatched explanations and phase seconds over steps.
- ``README.md``: what the run was, what each file is and how to resume (``write_run_readme``).

A resumed run first drops the rows of the steps it is about to run again, and a last line cut short by a killed
process; any other unreadable line stops it with a ``UserError`` naming the file and line.
"""

from __future__ import annotations

import json
import logging
import math
import shlex
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import NamedTuple

from transformers import TrainerCallback
from transformers.trainer_callback import PrinterCallback, ProgressCallback

from rlt_mono.errors import UserError

logger = logging.getLogger(__name__)

METRICS_FILE = "metrics.jsonl"
SAMPLES_FILE = "samples.jsonl"
PLOT_FILE = "reward_components.png"
README_FILE = "README.md"
CONFIG_FILE = "config.yaml"
STEP_EVENT = "step"
SUMMARY_EVENT = "summary"
# Keys of samples.jsonl rows written first, in this order, so a row reads as: what was asked, what the teacher
# wrote, what it earned.
SAMPLE_KEYS_FIRST = ("step", "question", "solution", "explanation", "total", "r_ss", "r_kl", "match_penalty")
# Short names of the phases in the progress line (others keep their name).
PHASE_SHORT_NAMES = {"generate": "gen"}
# Phases in the order a step runs them; any other phase follows, by name.
PHASE_ORDER = ("generate", "score", "train")


# ---- the terminal -------------------------------------------------------------------------------------
class CompactProgressCallback(TrainerCallback):
    """transformers' progress bar, with one short line per logged step under it instead of the metrics dict.

    ``step 12/40 | reward -2.71 (r_ss -1.90, r_kl 0.81, unmatched 0%) | 3.1 s/step (gen 1.2, score 0.8, train
    1.1)``; at the end ``done: step 40/40 in 2 min 4 s (3.1 s/step) | mean reward -3.02 (steps 1-7) -> -2.41
    (steps 34-40) | outputs in <dir>``. With ``disable_tqdm`` there is no bar and the lines go to ``logging``.
    Every metric stays in ``metrics.jsonl`` and the loggers (``report_to``).
    """

    def __init__(self):
        self.bar = None
        self._bar_step = 0
        self._start_step = 0
        self._rewards: list[tuple[int, float]] = []

    def on_train_begin(self, args, state, control, **kwargs):
        self._start_step = self._bar_step = state.global_step
        self._rewards = []
        if state.is_world_process_zero and not args.disable_tqdm:
            from tqdm.auto import tqdm  # what transformers' ProgressCallback uses (a widget in a notebook)

            self.bar = tqdm(total=state.max_steps, initial=state.global_step, dynamic_ncols=True)

    def on_step_end(self, args, state, control, **kwargs):
        if self.bar is not None:
            self.bar.update(state.global_step - self._bar_step)
        self._bar_step = state.global_step

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not state.is_world_process_zero or not logs:
            return
        if is_summary_log(logs):
            line = format_summary_line(logs, state.global_step, state.max_steps, state.global_step - self._start_step,
                                       self._rewards, args.output_dir)
        else:
            if _is_number(logs.get("reward")):
                self._rewards.append((state.global_step, float(logs["reward"])))
            line = format_step_line(logs, state.global_step, state.max_steps)
        if self.bar is not None:
            self.bar.write(line)
        else:
            logger.info(line)

    def on_train_end(self, args, state, control, **kwargs):
        if self.bar is not None:
            self.bar.close()
            self.bar = None


def replace_progress_callback(trainer) -> CompactProgressCallback:
    """Swap the progress display transformers gave ``trainer`` for a ``CompactProgressCallback``.

    transformers adds it at the end of ``Trainer.__init__`` (after the callbacks passed in): ``ProgressCallback``
    in a terminal, ``NotebookProgressCallback`` in Jupyter, ``PrinterCallback`` (a bare ``print`` of the dict)
    when ``args.disable_tqdm``; whichever it is goes.
    """
    display = (ProgressCallback, PrinterCallback)
    for callback in list(trainer.callback_handler.callbacks):
        # By name: transformers.utils.notebook imports IPython, which a plain Python (the GPU machine) lacks.
        if isinstance(callback, display) or type(callback).__name__ == "NotebookProgressCallback":
            trainer.remove_callback(callback)
    callback = CompactProgressCallback()
    trainer.add_callback(callback)
    return callback


def is_summary_log(logs: Mapping) -> bool:
    """Whether a log is transformers' end-of-``train()`` summary (runtime, throughput), not a step's."""
    return "train_runtime" in logs


def format_step_line(logs: Mapping, step: int, max_steps: int) -> str:
    """One line for a step's logs; a missing metric is left out, e.g. ``step 12/40 | reward -2.71 (r_ss -1.90,
    r_kl 0.81, unmatched 0%) | 3.1 s/step (gen 1.2, score 0.8, train 1.1)``."""
    parts = [f"step {step}/{max_steps}"]
    details = [f"{name} {_reward_number(logs[key])}" for name, key in
               (("r_ss", "teacher_reward/r_ss"), ("r_kl", "teacher_reward/r_kl")) if _is_number(logs.get(key))]
    if _is_number(logs.get("alignment/unmatched_frac")):
        details.append(f"unmatched {logs['alignment/unmatched_frac']:.0%}")
    if _is_number(logs.get("reward")):
        parts.append(f"reward {_reward_number(logs['reward'])}" + (f" ({', '.join(details)})" if details else ""))
    elif details:
        parts.append(", ".join(details))
    phases = {key.split("/")[1]: value for key, value in logs.items()
              if key.startswith("phase/") and key.endswith("/seconds") and key.count("/") == 2 and _is_number(value)}
    step_seconds = logs.get("step_time") if _is_number(logs.get("step_time")) else sum(phases.values()) or None
    if step_seconds is not None:
        names = _in_phase_order(phases)
        digits = 1 if step_seconds >= 1 else 2  # one precision for the step and its phases
        details = ", ".join(f"{PHASE_SHORT_NAMES.get(name, name)} {phases[name]:.{digits}f}" for name in names)
        parts.append(f"{step_seconds:.{digits}f} s/step" + (f" ({details})" if details else ""))
    return " | ".join(parts)


def format_summary_line(logs: Mapping, step: int, max_steps: int, steps_run: int,
                        rewards: Sequence[tuple[int, float]], output_dir: str | Path) -> str:
    """The end-of-training line: ``done: step 40/40 in 2 min 4 s (3.1 s/step) | mean reward -3.02 (steps 1-7)
    -> -2.41 (steps 34-40) | outputs in <dir>``. ``rewards`` are the (step, reward) pairs this call logged;
    ``steps_run`` the steps it ran (fewer than ``step`` after a resume)."""
    parts = [f"done: step {step}/{max_steps}"]
    runtime = logs.get("train_runtime")
    if _is_number(runtime):
        per_step = f" ({_seconds(runtime / steps_run)} s/step)" if steps_run > 0 else ""
        parts[0] += f" in {_duration(runtime)}{per_step}"
    trend = reward_trend([step for step, _ in rewards], [reward for _, reward in rewards])
    if trend is not None:
        parts.append(f"mean reward {describe_trend(trend)}")
    parts.append(f"outputs in {output_dir}")
    return " | ".join(parts)


# ---- the run folder: metrics, samples, plot, README ------------------------------------------------------
class RunFilesCallback(TrainerCallback):
    """Appends metrics and explanation samples at every log; at each checkpoint and at the end of training
    writes the run's README (when given ``run_config``); at the end draws the plot.

    On a resume, rows of the steps after the checkpoint (which are about to run again) are dropped first, so each
    step appears once; so is a last line that a killed process left unfinished.

    Args:
        run_config: the resolved run config as plain containers (``OmegaConf.to_container(cfg, resolve=True)``),
            for ``README.md``; ``None`` writes no README.
    """

    def __init__(self, output_dir: str | Path, reward=None, samples_per_step: int = 4, plot: bool = True,
                 run_config: Mapping | None = None):
        self.output_dir = Path(output_dir)
        self.reward = reward
        self.samples_per_step = samples_per_step
        self.plot = plot
        self.run_config = run_config

    def on_train_begin(self, args, state, control, **kwargs):
        if not state.is_world_process_zero or state.global_step == 0:
            return
        for name in (METRICS_FILE, SAMPLES_FILE):
            drop_rows_after(self.output_dir / name, state.global_step)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not state.is_world_process_zero or not logs:
            return
        self.output_dir.mkdir(parents=True, exist_ok=True)
        event = SUMMARY_EVENT if is_summary_log(logs) else STEP_EVENT
        row = {"event": event, "step": state.global_step, **{k: _jsonable(v) for k, v in logs.items()}}
        with open(self.output_dir / METRICS_FILE, "a") as f:
            f.write(json.dumps(row) + "\n")
        scores = getattr(self.reward, "last_scores", None) or []
        if self.samples_per_step and scores and event == STEP_EVENT and "reward" in logs:
            with open(self.output_dir / SAMPLES_FILE, "a") as f:
                for sample in scores[: self.samples_per_step]:
                    f.write(json.dumps(sample_row(state.global_step, sample)) + "\n")

    def on_save(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            self._write_readme()

    def on_train_end(self, args, state, control, **kwargs):
        if not state.is_world_process_zero:
            return
        if self.plot and (self.output_dir / METRICS_FILE).exists():
            try:
                plot_metrics(self.output_dir / METRICS_FILE, self.output_dir / PLOT_FILE)
            except ImportError:  # the run itself is done; a missing plotting library must not fail it
                logger.warning("matplotlib is not installed: no %s (pip install matplotlib)", PLOT_FILE)
        self._write_readme()

    def _write_readme(self) -> None:
        if self.run_config is None:
            return
        path = self.output_dir / METRICS_FILE
        write_run_readme(self.output_dir, self.run_config, read_metrics(path) if path.exists() else [],
                         command=launch_command())


def sample_row(step: int, sample: Mapping) -> dict:
    """A samples.jsonl row: ``SAMPLE_KEYS_FIRST`` (those present) first, then the sample's other keys."""
    row = {"step": step, **sample}
    first = {key: row[key] for key in SAMPLE_KEYS_FIRST if key in row}
    return {**first, **{key: value for key, value in row.items() if key not in first}}


def _jsonable(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value if isinstance(value, (int, float, str, bool, type(None))) else str(value)


def _parse_lines(path: Path, lines: list[str]) -> list[dict | None]:
    """Each line's row (``None`` for a blank line). An unparseable last line, left by a process killed while
    writing it, is ``None`` with a warning; an unparseable line elsewhere raises ``UserError``."""
    last = max((i for i, line in enumerate(lines) if line.strip()), default=-1)
    rows: list[dict | None] = []
    for i, line in enumerate(lines):
        if not line.strip():
            rows.append(None)
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as err:
            if i != last:
                raise UserError(f"{path}, line {i + 1}: not a JSON row ({err.msg}); fix or delete that line, "
                                "then run again") from err
            logger.warning("%s: dropped its last line (line %d), cut short when the run stopped: %r", path, i + 1,
                           line.strip()[:80])
            rows.append(None)
    return rows


def drop_rows_after(path: str | Path, step: int) -> None:
    """Resume: keep only the rows of ``path`` up to ``step`` (and no unfinished last line), rewritten atomically."""
    path = Path(path)
    if not path.exists():
        return
    original = path.read_text()
    lines = original.splitlines()
    rows = _parse_lines(path, lines)
    kept = [line for line, row in zip(lines, rows, strict=True) if row is not None and row.get("step", 0) <= step]
    dropped = sum(row is not None for row in rows) - len(kept)
    text = "".join(line + "\n" for line in kept)
    if text == original:
        return
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    tmp.replace(path)
    if dropped:
        logger.info("resuming at step %d: dropped %d rows of later steps from %s", step, dropped, path)


def _event(row: Mapping) -> str:
    # Rows written before rows carried "event": transformers' summary is the one with train_runtime.
    return row.get("event") or (SUMMARY_EVENT if is_summary_log(row) else STEP_EVENT)


def read_metrics(path: str | Path, event: str = STEP_EVENT) -> list[dict]:
    """The rows of a ``metrics.jsonl``: one per logged step (``event="step"``), or the end-of-training summaries
    (``event="summary"``). A last line cut short by a killed run is skipped with a warning."""
    path = Path(path)
    lines = path.read_text().splitlines()
    return [row for row in _parse_lines(path, lines) if row is not None and _event(row) == event]


# ---- the plot -------------------------------------------------------------------------------------------
class Series(NamedTuple):
    """One plotted metric: raw per-step values (drawn as light points) and their running mean (the line)."""

    label: str
    steps: list[int]
    values: list[float]
    smoothed: list[float]


# (metrics key, label, colour) of the reward panel, in legend order; ``total`` only when it is not ``reward``.
REWARD_SERIES = (
    ("reward", "reward (= r_ss - r_kl + match_penalty)", "black"),
    ("teacher_reward/total", "total", "tab:gray"),
    ("teacher_reward/r_ss", "r_ss (student log-prob of the solution)", "tab:blue"),
    ("teacher_reward/r_kl", "r_kl (subtracted)", "tab:red"),
    ("teacher_reward/match_penalty", "match_penalty", "tab:orange"),
)
UNMATCHED_SERIES = (
    ("alignment/unmatched_frac", "explanation never closed (unmatched)", "tab:purple"),
    ("completions/clipped_ratio", "cut at max_completion_length", "tab:brown"),
)
PHASE_COLOURS = {"generate": "tab:green", "score": "tab:olive", "train": "tab:cyan"}


def smoothing_window(n: int) -> int:
    """Odd running-mean window for ``n`` points, growing like sqrt(n): 1 up to 3 points, 3 from 4, 5 from 16,
    7 from 36, 11 for 100, 31 for 1000."""
    return 2 * int(math.sqrt(n) / 2) + 1 if n > 0 else 1


def running_mean(values: Sequence[float], window: int) -> list[float]:
    """Centred running mean; the window shrinks at both ends (``window`` odd)."""
    half = window // 2
    out = []
    for i in range(len(values)):
        chunk = values[max(0, i - half): i + half + 1]
        out.append(sum(chunk) / len(chunk))
    return out


def _series(rows: Sequence[Mapping], key: str, label: str) -> Series | None:
    points = [(row["step"], float(row[key])) for row in rows if _is_number(row.get(key))]
    if not points:
        return None
    steps, values = [s for s, _ in points], [v for _, v in points]
    return Series(label, steps, values, running_mean(values, smoothing_window(len(values))))


def metric_series(rows: Sequence[Mapping]) -> dict[str, list[Series]]:
    """What ``plot_metrics`` draws, panel by panel: ``reward`` (TRL's reward and the RLT components; ``total``
    left out where it equals ``reward``), ``unmatched`` (fractions, when logged) and ``seconds`` (per phase)."""
    rows = [row for row in rows if _event(row) == STEP_EVENT]
    reward_keys = [key for key, _, _ in REWARD_SERIES]
    extra = sorted({k for row in rows for k in row if k.startswith("teacher_reward/") and k.count("/") == 1}
                   - set(reward_keys))
    labels = {key: label for key, label, _ in REWARD_SERIES}
    panels: dict[str, list[Series]] = {"reward": [], "unmatched": [], "seconds": []}
    for key in [*reward_keys, *extra]:
        if key == "teacher_reward/total" and _same_values(rows, key, "reward"):
            continue
        series = _series(rows, key, labels.get(key, key.removeprefix("teacher_reward/")))
        if series is not None:
            panels["reward"].append(series)
    # Clipped completions are shown only beside the unmatched ones, as the usual reason an explanation never closes.
    if any(_is_number(row.get(UNMATCHED_SERIES[0][0])) for row in rows):
        panels["unmatched"] = [s for key, label, _ in UNMATCHED_SERIES if (s := _series(rows, key, label))]
    phases = {k.split("/")[1] for row in rows for k in row if k.startswith("phase/") and k.endswith("/seconds")}
    for phase in _in_phase_order(phases):
        series = _series(rows, f"phase/{phase}/seconds", phase)
        if series is not None:
            panels["seconds"].append(series)
    return {name: series for name, series in panels.items() if series}


def _same_values(rows: Sequence[Mapping], key: str, other: str) -> bool:
    pairs = [(row.get(key), row.get(other)) for row in rows if _is_number(row.get(key))]
    return all(_is_number(b) and abs(a - b) <= 1e-6 * max(1.0, abs(b)) for a, b in pairs)


def draw_metric_series(panels: Mapping[str, Sequence[Series]]):
    """A matplotlib figure of ``metric_series``'s panels, stacked, sharing the step axis; legends right of the
    axes. Returns the figure, on an Agg canvas of its own (pyplot's state and backend are left alone, so a
    notebook's inline plots keep working)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator, PercentFormatter

    colours = {label: colour for table in (REWARD_SERIES, UNMATCHED_SERIES) for _, label, colour in table}
    colours.update(PHASE_COLOURS)
    titles = {
        "reward": "RLT teacher reward per step (mean over the step's completions)",
        "unmatched": "share of the step's completions",
        "seconds": "seconds per step, by phase",
    }
    names = list(panels)
    fig = Figure(figsize=(11, 3.2 * len(names)))
    FigureCanvasAgg(fig)
    axes = fig.subplots(len(names), 1, sharex=True, squeeze=False)
    for ax, name in zip(axes[:, 0], names, strict=True):
        percent = name == "unmatched"
        scale = 100.0 if percent else 1.0
        window = 1
        for i, series in enumerate(panels[name]):
            colour = colours.get(series.label, f"C{i}")
            window = max(window, smoothing_window(len(series.values)))
            ax.plot(series.steps, [v * scale for v in series.values], linestyle="none", marker="o", markersize=3,
                    alpha=0.35, color=colour)
            # Dashed after the first line of a panel: series that coincide (often all at 0%) stay distinguishable.
            ax.plot(series.steps, [v * scale for v in series.smoothed], color=colour, label=series.label,
                    linewidth=2.4 if series.label.startswith("reward") else 1.6,
                    linestyle="--" if percent and i else "-")
        if percent:  # a fraction: 0 to at least 10%, so a flat 0% reads as "none" rather than as noise
            top = max([10.0] + [v * scale for series in panels[name] for v in series.values])
            ax.set_ylim(-0.04 * top, 1.08 * top)
            ax.yaxis.set_major_formatter(PercentFormatter(decimals=0))
        if name == "reward":
            ax.axhline(0.0, color="lightgray", linewidth=0.8, zorder=0)
        ax.set_title(titles[name] + (f"; lines: running mean over {window} steps" if window > 1 else ""),
                     fontsize=10, loc="left")
        ax.grid(alpha=0.3)
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False, fontsize=9)
    axes[-1, 0].set_xlabel("optimizer step")
    axes[-1, 0].xaxis.set_major_locator(MaxNLocator(integer=True))
    fig.tight_layout()
    return fig


def plot_metrics(metrics_path: str | Path, out_path: str | Path) -> dict[str, list[Series]]:
    """Draw the step rows of ``metrics_path`` into the PNG ``out_path``; returns the series drawn
    (``metric_series``)."""
    panels = metric_series(read_metrics(metrics_path))
    if not panels:
        logger.info("%s has no step metrics to plot", metrics_path)
        return panels
    fig = draw_metric_series(panels)
    out_path = Path(out_path)
    fig.savefig(out_path, dpi=100, bbox_inches="tight")
    logger.info("wrote %s", out_path)
    return panels


# ---- the README ------------------------------------------------------------------------------------------
class Block(NamedTuple):
    """Mean reward over consecutive steps ``first``..``last``."""

    first: int
    last: int
    mean: float


def reward_trend(steps: Sequence[int], rewards: Sequence[float]) -> tuple[Block, Block] | None:
    """Mean reward of the first and of the last block of steps, a block being the plot's smoothing window."""
    if not rewards:
        return None
    width = smoothing_window(len(rewards))
    head, tail = slice(0, width), slice(len(rewards) - width, len(rewards))
    return tuple(Block(steps[s][0], steps[s][-1], sum(rewards[s]) / width) for s in (head, tail))


def describe_trend(trend: tuple[Block, Block]) -> str:
    """``-3.020 (steps 1-7) -> -2.410 (steps 34-40)``; one block when both are the same steps."""
    first, last = trend
    return _describe_block(first) if first == last else f"{_describe_block(first)} -> {_describe_block(last)}"


def _describe_block(block: Block) -> str:
    steps = f"step {block.first}" if block.first == block.last else f"steps {block.first}-{block.last}"
    return f"{block.mean:.3f} ({steps})"


# What each file of a run folder is; checkpoints are described apart.
RUN_FILES = {
    CONFIG_FILE: "the resolved config of the run (every key, after overrides)",
    METRICS_FILE: 'one JSON row per optimizer step (`"event": "step"`: reward components, alignment, '
                  'completion lengths, phase seconds, memory) and one per finished training call '
                  '(`"event": "summary"`: runtime); `rlt_mono.outputs.read_metrics` reads the step rows',
    SAMPLES_FILE: "a few teacher explanations per step with their question, solution and reward breakdown",
    PLOT_FILE: "reward components, unmatched explanations and phase seconds over steps",
    "final": "the trained teacher and its tokenizer (`AutoModelForCausalLM.from_pretrained` loads it)",
    README_FILE: "this file",
    "runs": "TensorBoard logs",
    "wandb": "Weights & Biases run files (`wandb sync` uploads an offline run)",
}
CHECKPOINT_DESCRIPTION = ("resumable checkpoint: teacher, optimizer, schedule, RNG, trainer state "
                          "(and `reference_model.safetensors` once a reference mixup has happened)")


def launch_command() -> str | None:
    """The ``launch_mono.sh`` command line of this process when it is the command-line entry
    (``python -m rlt_mono.train``, which ``launch_mono.sh`` runs), else ``None`` (a notebook, a test)."""
    entry = Path(sys.argv[0])
    if entry.name != "train.py" or entry.parent.name != "rlt_mono":
        return None
    return shlex.join(["./launch_mono.sh", *sys.argv[1:]])


def resume_command(command: str | None, output_dir: str | Path) -> str:
    """``command`` with ``output_dir`` set to the run's folder and ``resume_from_checkpoint=true``."""
    target = [f"output_dir={Path(output_dir).resolve()}", "resume_from_checkpoint=true"]
    if command is None:
        return shlex.join(["./launch_mono.sh"]) + " <the run config and overrides of this run> " + shlex.join(target)
    words = [w for w in shlex.split(command)
             if not w.lstrip("+~").startswith(("output_dir=", "resume_from_checkpoint="))]
    return shlex.join([*words, *target])


def write_run_readme(output_dir: str | Path, cfg_dict: Mapping, rows: Sequence[Mapping],
                     command: str | None = None) -> Path:
    """Write ``output_dir/README.md``: what the run was (command, teacher, student, data, steps, mean reward at
    the start and the end), what each file in the folder is, and how to resume.

    Args:
        cfg_dict: the resolved run config as plain containers (``OmegaConf.to_container(cfg, resolve=True)``).
        rows: the step rows of ``metrics.jsonl`` (``read_metrics``); summary rows are ignored.
        command: the command line that started the run (``launch_command()``), if known.
    """
    output_dir = Path(output_dir)
    rows = [row for row in rows if _event(row) == STEP_EVENT]
    model, student = cfg_dict.get("model") or {}, cfg_dict.get("student") or {}
    data, trainer = cfg_dict.get("data") or {}, cfg_dict.get("trainer") or {}
    max_steps = trainer.get("max_steps")
    steps_done = max((row["step"] for row in rows), default=0)
    of_max = f" of {max_steps}" if max_steps else ""
    if (output_dir / "final").is_dir():
        status = "finished; the trained teacher is in `final/`"
    elif max_steps and steps_done >= max_steps:
        status = "all steps done; no `final/` (the newest checkpoint holds the teacher)"
    else:
        status = "stopped, or still running"
    rewarded = [row for row in rows if _is_number(row.get("reward"))]
    trend = reward_trend([row["step"] for row in rewarded], [float(row["reward"]) for row in rewarded])
    data_source = data.get("source")
    if data_source and data.get("max_rows"):
        data_source += f" (first {data['max_rows']} rows)"
    facts = [
        ("command", f"`{command}`" if command else
         "not recorded (built in Python, e.g. `rlt_mono.compose(...)`); the resolved config is `config.yaml`"),
        ("run name", f"`{cfg_dict['run_name']}`" if "run_name" in cfg_dict else None),
        ("seed", cfg_dict.get("seed")),
        ("teacher (trained)", f"`{model['model_name_or_path']}`" if "model_name_or_path" in model else None),
        ("student (frozen, scores the explanations)",
         f"`{student['model_name_or_path']}`" if "model_name_or_path" in student else None),
        ("data", f"`{data_source}`" if data_source else None),
        ("steps done", f"{steps_done}{of_max}: {status}"),
    ]
    if trend is not None:
        facts.append(("mean reward", describe_trend(trend)))
    lines = [
        f"# rlt_mono run `{cfg_dict.get('run_name', output_dir.name)}`: {output_dir.name}",
        "",
        "An RLT teacher trained with GRPO: it sees a question and its solution and writes an explanation; the "
        "reward is the frozen student's log-probability of the solution after the explanation (`r_ss`) minus the "
        "teacher-student KL on the explanation (`r_kl`), with a penalty when the explanation is never closed.",
        "",
        "| | |",
        "| --- | --- |",
        *[f"| {name} | {value} |" for name, value in facts if value is not None],
        "",
        "## Files",
        "",
    ]
    entries = sorted(p for p in output_dir.iterdir() if not p.name.startswith((".", "~"))) \
        if output_dir.is_dir() else []
    names = {p.name for p in entries} | {README_FILE}
    for name in sorted(names, key=_file_order):
        path = output_dir / name
        slash = "/" if path.is_dir() else ""
        if name.startswith("checkpoint-"):
            lines.append(f"- `{name}/`: {CHECKPOINT_DESCRIPTION}")
        else:
            lines.append(f"- `{name}{slash}`" + (f": {RUN_FILES[name]}" if name in RUN_FILES else ""))
    lines += [
        "",
        "## Resume",
        "",
        "From the newest checkpoint (rows of `metrics.jsonl` / `samples.jsonl` after it are dropped and run again):",
        "",
        "```bash",
        resume_command(command, output_dir),
        "```",
        "",
    ]
    output_dir.mkdir(parents=True, exist_ok=True)
    path = output_dir / README_FILE
    tmp = path.with_suffix(".tmp")
    tmp.write_text("\n".join(lines))
    tmp.replace(path)
    return path


def _file_order(name: str) -> tuple:
    known = list(RUN_FILES)
    if name.startswith("checkpoint-") and name.removeprefix("checkpoint-").isdigit():
        return (len(known), int(name.removeprefix("checkpoint-")), name)
    return (known.index(name) if name in known else len(known) + 1, 0, name)


# ---- number formatting ----------------------------------------------------------------------------------
def _in_phase_order(names) -> list[str]:
    return sorted(names, key=lambda name: (PHASE_ORDER.index(name) if name in PHASE_ORDER else len(PHASE_ORDER),
                                           name))


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


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
