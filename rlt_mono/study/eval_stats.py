"""The eval stage's files and statistics, without torch: read by ``rlt_mono.stages.eval`` (which writes them) and by
``rlt_mono.study.aggregate`` (which compares several eval runs from the pipeline process); the benchmarks' paired
ratios take their interval from ``median_interval``."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

EVAL_FILE = "eval.json"
ROWS_FILE = "eval_rows.jsonl"
# Below this many questions a percentile-bootstrap interval of a mean is too narrow to trust: the resampled
# means' spread is biased low by sqrt((n-1)/n) and, for 0/1 figures such as accuracy, takes only n + 1 values,
# so its nominal 95% covers far less often (the usual n >= 30 rule for a normal-ish mean). Such an interval is
# still computed (from 2 rows) but carried with ``too_few: true``; one row gets none.
MIN_ROWS_FOR_INTERVAL = 30


# The bootstrap's defaults, here alone: every interval of an eval, a study table and a speed ratio is drawn at this
# coverage from this many resamples unless its caller (the eval group's options, a script's flag) says otherwise.
CONFIDENCE = 0.95
RESAMPLES = 2000


def read_rows(folder: Path) -> list[dict]:
    """The per-question rows of an eval run folder (``eval_rows.jsonl``)."""
    with open(Path(folder) / ROWS_FILE) as f:
        return [json.loads(line) for line in f if line.strip()]


def bootstrap_interval(values: list[float], confidence: float = CONFIDENCE, resamples: int = RESAMPLES,
                       seed: int = 0, statistic=np.mean) -> tuple[float, float]:
    """Percentile-bootstrap interval of ``statistic`` (the mean unless given; it takes an ``axis``) of ``values``:
    resample them with replacement ``resamples`` times, take the ``(1 - confidence) / 2`` and
    ``(1 + confidence) / 2`` quantiles of the resampled statistics."""
    data = np.asarray(values, dtype=np.float64)  # (n,)
    picks = np.random.default_rng(seed).integers(0, len(data), size=(resamples, len(data)))  # (resamples, n)
    resampled = statistic(data[picks], axis=1)  # (resamples,)
    low, high = np.quantile(resampled, [(1 - confidence) / 2, (1 + confidence) / 2])
    return float(low), float(high)


def median_interval(ratios: list[float], confidence: float = CONFIDENCE, resamples: int = RESAMPLES,
                    seed: int = 0) -> dict:
    """Percentile-bootstrap interval of the median of paired ``ratios`` (the pairs resampled with replacement), as
    ``{"confidence", "low", "high", "resamples"}``; no bounds (and no resamples) from fewer than 2 pairs."""
    if len(ratios) < 2:
        return {"confidence": confidence, "low": None, "high": None, "resamples": 0}
    low, high = bootstrap_interval(ratios, confidence, resamples, seed, statistic=np.median)
    return {"confidence": confidence, "low": low, "high": high, "resamples": resamples}


def summarize(values: list[float], confidence: float, resamples: int, seed: int) -> dict:
    """``{"mean", "low", "high", "n", "too_few"}`` of a list of per-question values: ``too_few`` when ``n`` is
    below ``MIN_ROWS_FOR_INTERVAL``; ``low``/``high`` None with fewer than 2 values (mean too for none)."""
    too_few = len(values) < MIN_ROWS_FOR_INTERVAL
    if len(values) < 2:
        mean = float(np.mean(values)) if values else None
        return {"mean": mean, "low": None, "high": None, "n": len(values), "too_few": too_few}
    low, high = bootstrap_interval(values, confidence, resamples, seed)
    return {"mean": float(np.mean(values)), "low": low, "high": high, "n": len(values), "too_few": too_few}


def interval_text(figure: dict) -> str:
    """``[low, high]`` of a ``summarize`` figure, ``[no interval]`` without one, and a note when it rests on
    too few rows (``too_few``)."""
    text = "[no interval]" if figure.get("low") is None else f"[{figure['low']:.3f}, {figure['high']:.3f}]"
    return text + (" (too few rows)" if figure.get("too_few") else "")
