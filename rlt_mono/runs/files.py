"""The callback that writes a run's files while it trains: metrics, explanation samples, the plot and the README.

``RunFilesCallback`` appends a row to ``metrics.jsonl`` at every log and a few of the reward's scored explanations
to ``samples.jsonl`` (``sample_row``), writes ``README.md`` at each checkpoint and at the end
(``rlt_mono.runs.readme``), and draws ``reward_components.png`` at the end (``rlt_mono.runs.plots``). What each file
holds and how it is read back is ``rlt_mono.runs.outputs``.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Mapping
from pathlib import Path

from transformers import TrainerCallback

from rlt_mono.runs.atomic_write import append_text
from rlt_mono.runs.checkpoints import how_to_continue
from rlt_mono.runs.outputs import (
    EVAL_EVENT,
    METRICS_FILE,
    PLOT_FILE,
    SAMPLES_FILE,
    STEP_EVENT,
    SUMMARY_EVENT,
    drop_rows_after,
    is_summary_log,
    read_metrics,
)
from rlt_mono.runs.plots import plot_metrics
from rlt_mono.runs.readme import launch_command, write_run_readme

logger = logging.getLogger(__name__)

# Keys of samples.jsonl rows written first, in this order, so a row reads as: what was asked, what the teacher
# wrote, what it earned.
# Each metrics row's seconds since this process's training began.
WALL_TIME_KEY = "wall_time_seconds"
SAMPLE_KEYS_FIRST = ("step", "question", "solution", "explanation", "total", "r_ss", "r_kl", "match_penalty")


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
        self._started: float | None = None

    def on_train_begin(self, args, state, control, **kwargs):
        self._started = time.monotonic()
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
        if self._started is not None:  # the wall-clock axis of a learning curve (time to a held-out reward)
            row[WALL_TIME_KEY] = round(time.monotonic() - self._started, 3)
        then = how_to_continue(self.output_dir)
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
