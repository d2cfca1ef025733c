"""What a run leaves in its output folder besides TRL's checkpoints.

- ``metrics.jsonl``: one JSON line per logged step (reward components, lengths, phase timings, memory).
- ``samples.jsonl``: a few teacher explanations per step with their full reward breakdown.
- ``reward_components.png``: reward components and phase timings over steps.
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

from transformers import TrainerCallback

logger = logging.getLogger(__name__)

METRICS_FILE = "metrics.jsonl"
SAMPLES_FILE = "samples.jsonl"
PLOT_FILE = "reward_components.png"


class RunFilesCallback(TrainerCallback):
    """Appends metrics and explanation samples at every log; draws the plot at the end of training.

    On a resume, rows of the steps after the checkpoint (which are about to run again) are dropped first, so each
    step appears once.
    """

    def __init__(self, output_dir: str | Path, reward=None, samples_per_step: int = 4, plot: bool = True):
        self.output_dir = Path(output_dir)
        self.reward = reward
        self.samples_per_step = samples_per_step
        self.plot = plot

    def on_train_begin(self, args, state, control, **kwargs):
        if not state.is_world_process_zero or state.global_step == 0:
            return
        for name in (METRICS_FILE, SAMPLES_FILE):
            path = self.output_dir / name
            if not path.exists():
                continue
            lines = path.read_text().splitlines(keepends=True)
            kept = [line for line in lines if line.strip() and json.loads(line).get("step", 0) <= state.global_step]
            if len(kept) < len(lines):
                tmp = path.with_suffix(".tmp")
                tmp.write_text("".join(kept))
                tmp.replace(path)
                logger.info("resuming at step %d: dropped %d rows of later steps from %s",
                            state.global_step, len(lines) - len(kept), path)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not state.is_world_process_zero or not logs:
            return
        self.output_dir.mkdir(parents=True, exist_ok=True)
        row = {"step": state.global_step, **{k: _jsonable(v) for k, v in logs.items()}}
        with open(self.output_dir / METRICS_FILE, "a") as f:
            f.write(json.dumps(row) + "\n")
        scores = getattr(self.reward, "last_scores", None) or []
        if self.samples_per_step and scores and "reward" in logs:  # a step's log, not the end-of-run summary
            with open(self.output_dir / SAMPLES_FILE, "a") as f:
                for sample in scores[: self.samples_per_step]:
                    f.write(json.dumps({"step": state.global_step, **sample}) + "\n")

    def on_train_end(self, args, state, control, **kwargs):
        if not (self.plot and state.is_world_process_zero and (self.output_dir / METRICS_FILE).exists()):
            return
        try:
            plot_metrics(self.output_dir / METRICS_FILE, self.output_dir / PLOT_FILE)
        except ImportError:  # the run itself is done; a missing plotting library must not fail it
            logger.warning("matplotlib is not installed: no %s (pip install matplotlib)", PLOT_FILE)


def _jsonable(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value if isinstance(value, (int, float, str, bool, type(None))) else str(value)


def read_metrics(path: str | Path) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def plot_metrics(metrics_path: str | Path, out_path: str | Path) -> Path:
    """Plot reward components (top) and phase seconds (bottom) against the step; returns the PNG path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in read_metrics(metrics_path) if "reward" in r or any(k.startswith("phase/") for k in r)]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 7), sharex=True)
    reward_keys = sorted({k for r in rows for k in r if k.startswith("teacher_reward/") and k.count("/") == 1})
    for key in ["reward", *reward_keys]:
        points = [(r["step"], r[key]) for r in rows if isinstance(r.get(key), (int, float))]
        if points:
            top.plot(*zip(*points), marker="o", label=key.removeprefix("teacher_reward/"))
    top.set_ylabel("reward")
    top.set_title("RLT teacher reward components")
    top.legend(fontsize=8)
    for key in sorted({k for r in rows for k in r if k.startswith("phase/") and k.endswith("/seconds")}):
        points = [(r["step"], r[key]) for r in rows if isinstance(r.get(key), (int, float))]
        if points:
            bottom.plot(*zip(*points), marker=".", label=key.split("/")[1])
    bottom.set_xlabel("step")
    bottom.set_ylabel("seconds per step")
    bottom.legend(fontsize=8)
    fig.tight_layout()
    out_path = Path(out_path)
    fig.savefig(out_path, dpi=100)
    plt.close(fig)
    logger.info("wrote %s", out_path)
    return out_path
