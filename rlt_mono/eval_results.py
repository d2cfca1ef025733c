"""The eval stage's files and statistics, without torch: read by ``rlt_mono.evaluate`` (which writes them) and by
``rlt_mono.study`` (which compares several eval runs from the pipeline process)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

EVAL_FILE = "eval.json"
ROWS_FILE = "eval_rows.jsonl"


def read_rows(folder: Path) -> list[dict]:
    """The per-question rows of an eval run folder (``eval_rows.jsonl``)."""
    with open(Path(folder) / ROWS_FILE) as f:
        return [json.loads(line) for line in f if line.strip()]


def bootstrap_interval(values: list[float], confidence: float = 0.95, resamples: int = 2000,
                       seed: int = 0) -> tuple[float, float]:
    """Percentile-bootstrap interval of the mean of ``values``: resample them with replacement ``resamples``
    times, take the ``(1 - confidence) / 2`` and ``(1 + confidence) / 2`` quantiles of the resampled means."""
    data = np.asarray(values, dtype=np.float64)  # (n,)
    picks = np.random.default_rng(seed).integers(0, len(data), size=(resamples, len(data)))  # (resamples, n)
    means = data[picks].mean(axis=1)  # (resamples,)
    low, high = np.quantile(means, [(1 - confidence) / 2, (1 + confidence) / 2])
    return float(low), float(high)


def summarize(values: list[float], confidence: float, resamples: int, seed: int) -> dict:
    """``{"mean", "low", "high", "n"}`` of a list of per-question values (all None for an empty list)."""
    if not values:
        return {"mean": None, "low": None, "high": None, "n": 0}
    low, high = bootstrap_interval(values, confidence, resamples, seed)
    return {"mean": float(np.mean(values)), "low": low, "high": high, "n": len(values)}
