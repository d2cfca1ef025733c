"""What a run leaves in its output folder besides TRL's checkpoints, and how it is read back.

- ``metrics.jsonl``: one JSON row per logged step, ``{"event": "step", "step": N, ...every metric}``, and one per
  finished ``train()`` call, ``{"event": "summary", "step": N, "train_runtime": ...}``. ``read_metrics`` returns
  the step rows (or the summaries).
- ``samples.jsonl``: a few teacher explanations per step: step, question, solution, explanation, reward parts
  first, then the rest of the reward's breakdown (``sample_row``).
- ``reward_components.png``: reward components, unmatched explanations and phase seconds over steps
  (``rlt_mono.plots``).
- ``README.md``: what the run was, what each file is and how to resume (``rlt_mono.run_readme``).

``RunFilesCallback`` writes them all during training. A resumed run first drops the rows of the steps it is about
to run again, and a last line cut short by a killed process (``drop_rows_after``); any other unreadable line stops
it with a ``UserError`` naming the file and line. Rows are appended whole (``rlt_mono.atomic_write.append_text``):
on a full or read-only disk the file is cut back to its last complete row and the run stops with one line.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Mapping
from pathlib import Path

from transformers import TrainerCallback

from rlt_mono.atomic_write import append_text, write_text
from rlt_mono.errors import UserError

logger = logging.getLogger(__name__)

METRICS_FILE = "metrics.jsonl"
SAMPLES_FILE = "samples.jsonl"
PLOT_FILE = "reward_components.png"
README_FILE = "README.md"
CONFIG_FILE = "config.yaml"
STEP_EVENT = "step"
SUMMARY_EVENT = "summary"
# TRL's evaluation on held-out questions (trainer.eval_strategy: steps): its keys start with "eval_".
EVAL_EVENT = "eval"
# Keys of samples.jsonl rows written first, in this order, so a row reads as: what was asked, what the teacher
# wrote, what it earned.
SAMPLE_KEYS_FIRST = ("step", "question", "solution", "explanation", "total", "r_ss", "r_kl", "match_penalty")
# Phases in the order a step runs them; any other phase follows, by name.
PHASE_ORDER = ("generate", "score", "train")


def is_summary_log(logs: Mapping) -> bool:
    """Whether a log is transformers' end-of-``train()`` summary (runtime, throughput), not a step's."""
    return "train_runtime" in logs


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
        event = (SUMMARY_EVENT if is_summary_log(logs) else
                 EVAL_EVENT if any(key.startswith("eval_") for key in logs) else STEP_EVENT)
        row = {"event": event, "step": state.global_step, **{k: _jsonable(v) for k, v in logs.items()}}
        then = f"resume with output_dir={self.output_dir} resume_from_checkpoint=true"
        append_text(self.output_dir / METRICS_FILE, json.dumps(row) + "\n", then)
        scores = getattr(self.reward, "last_scores", None) or []
        if self.samples_per_step and scores and event == STEP_EVENT and "reward" in logs:
            append_text(self.output_dir / SAMPLES_FILE, "".join(json.dumps(sample_row(state.global_step, sample)) + "\n"
                                                                for sample in scores[: self.samples_per_step]), then)

    def on_save(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            self._write_readme()

    def on_train_end(self, args, state, control, **kwargs):
        if not state.is_world_process_zero:
            return
        if self.plot and (self.output_dir / METRICS_FILE).exists():
            from rlt_mono.plots import plot_metrics  # here, not at the top: plots reads this module's rows

            try:
                plot_metrics(self.output_dir / METRICS_FILE, self.output_dir / PLOT_FILE)
            except ImportError:  # the run itself is done; a missing plotting library must not fail it
                logger.warning("matplotlib is not installed: no %s (pip install matplotlib)", PLOT_FILE)
        self._write_readme()

    def _write_readme(self) -> None:
        if self.run_config is None:
            return
        from rlt_mono.run_readme import launch_command, write_run_readme  # here: run_readme reads this module

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
    write_text(path, text)
    if dropped:
        logger.info("resuming at step %d: dropped %d rows of later steps from %s", step, dropped, path)


def row_event(row: Mapping) -> str:
    """A ``metrics.jsonl`` row's event: ``STEP_EVENT``, ``EVAL_EVENT`` or ``SUMMARY_EVENT``."""
    # Rows written before rows carried "event": transformers' summary is the one with train_runtime.
    return row.get("event") or (SUMMARY_EVENT if is_summary_log(row) else STEP_EVENT)


def read_metrics(path: str | Path, event: str = STEP_EVENT) -> list[dict]:
    """The rows of a ``metrics.jsonl``: one per logged step (``event="step"``), the held-out evaluations
    (``event="eval"``), or the end-of-training summaries (``event="summary"``). A last line cut short by a
    killed run is skipped with a warning."""
    path = Path(path)
    lines = path.read_text().splitlines()
    return [row for row in _parse_lines(path, lines) if row is not None and row_event(row) == event]


def in_phase_order(names) -> list[str]:
    """Phase names in ``PHASE_ORDER``, any other after them by name."""
    return sorted(names, key=lambda name: (PHASE_ORDER.index(name) if name in PHASE_ORDER else len(PHASE_ORDER),
                                           name))


def is_number(value) -> bool:
    """Whether a logged value is a finite number (a bool is not): one worth showing."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
