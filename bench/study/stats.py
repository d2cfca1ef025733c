"""The fair study's statistics (bench/study_fair.py ``summarize``): percentile-bootstrap weights that resample
templates and then questions within them, resamples of seeds, a Welch t interval over seeds alone, the difference
of two arms on the questions neither cut at the cap, and Pearson's r and Spearman's rho with their intervals."""

from __future__ import annotations

import zlib

import numpy as np

from rlt_mono.study.aggregate import pearson

# Student's t, the two-sided 95% quantile for 1-30 degrees of freedom (the standard table); past 30, 30's, which
# widens the interval a little (``seed_t_interval``).
T_975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
         2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)

# The correlation: no figure under MIN_POINTS points, no interval under INTERVAL_POINTS.
CORRELATION_MIN_POINTS, CORRELATION_INTERVAL_POINTS = 3, 4


def stream(seed: int, *names: object) -> np.random.Generator:
    """The bootstrap's random stream for one thing it draws (a student's held-out set, an arm's seeds on it),
    named: the same ``seed`` and names give the same draws whatever else the summary holds, so a run added to one
    arm leaves every other arm's interval as it was (while every arm answered the same questions: the question
    weights are drawn over the questions all arms share)."""
    return np.random.default_rng([seed, *(zlib.crc32(str(name).encode()) for name in names)])


def _interval(samples: np.ndarray) -> list[float]:
    return [round(float(np.percentile(samples, 2.5)), 4), round(float(np.percentile(samples, 97.5)), 4)]


def _question_weights(templates: np.ndarray, resamples: int, rng: np.random.Generator) -> np.ndarray:
    """(resamples x questions) counts: templates drawn with replacement, then questions within each drawn one."""
    groups = [np.flatnonzero(templates == t) for t in np.unique(templates)]
    weights = np.zeros((resamples, len(templates)))
    for b in range(resamples):
        for g in rng.integers(len(groups), size=len(groups)):
            members = groups[g]
            np.add.at(weights[b], members[rng.integers(len(members), size=len(members))], 1.0)
    return weights


def _seed_means(correct: np.ndarray, resamples: int, rng: np.random.Generator) -> np.ndarray:
    """(resamples x questions): each question's mean over a resample of the seeds."""
    picks = rng.integers(len(correct), size=(resamples, len(correct)))
    return correct[picks].mean(axis=1)


def seed_t_interval(a: list[float], b: list[float]) -> dict | None:
    """Two arms' difference in mean accuracy with a Welch t interval over their per-seed accuracies alone: each
    seed's accuracy on the same questions one observation, the questions held fixed. Beside the bootstrap, which
    resamples three seeds with replacement (ten distinct draws) and so may understate the spread between seeds. An
    arm of one seed counts as exact (an untrained student's greedy answers have no seed); None where neither arm has
    two seeds. The degrees of freedom are Welch-Satterthwaite's, rounded down for the quantile (wider, not
    narrower)."""
    terms = [(float(np.var(x, ddof=1)) / len(x), len(x) - 1) for x in (a, b) if len(x) >= 2]
    if not terms:
        return None
    point = float(np.mean(a) - np.mean(b))
    variance = sum(v for v, _ in terms)
    df = variance ** 2 / sum(v ** 2 / d for v, d in terms) if variance > 0 else float(sum(d for _, d in terms))
    half = T_975[min(max(int(df), 1), len(T_975)) - 1] * variance ** 0.5
    return {"difference": round(point, 4), "ci95": [round(point - half, 4), round(point + half, 4)],
            "df": round(df, 2), "seeds": [len(a), len(b)]}


def _uncut_difference(correct: list[np.ndarray], seed_means: list[np.ndarray], uncut: np.ndarray,
                      weights: np.ndarray) -> dict:
    """Two arms' difference on the questions no seed of either cut at the cap, with the same resamples of templates,
    questions and seeds as the full difference, restricted to those questions."""
    if not uncut.any():
        return {"questions": 0}
    w = weights[:, uncut]
    total = np.maximum(w.sum(1), 1e-12)  # a resample that drew none of these questions adds a zero
    boot = [(w * means[:, uncut]).sum(1) / total for means in seed_means]
    point = float(correct[0][:, uncut].mean() - correct[1][:, uncut].mean())
    return {"questions": int(uncut.sum()), "difference": round(point, 4), "ci95": _interval(boot[0] - boot[1])}


def _ranks(values: np.ndarray) -> np.ndarray:
    """(n,): 1-based ranks of ``values`` (n,), tied values sharing their mean rank."""
    return np.array([(values < v).sum() + ((values == v).sum() + 1) / 2 for v in values])


def spearman(xs: np.ndarray, ys: np.ndarray) -> float | None:
    """Spearman's rho: Pearson's r of the ranks (None as ``pearson`` gives it)."""
    return pearson(_ranks(np.asarray(xs)), _ranks(np.asarray(ys)))


def correlation_figures(xs: list[float], ys: list[float], resamples: int, rng: np.random.Generator,
                        replicates: np.ndarray | None = None) -> dict:
    """Pearson's r and Spearman's rho of paired values, with ``points``; with at least
    ``CORRELATION_INTERVAL_POINTS`` a percentile-bootstrap ``ci95`` of each over the points (resamples where a side
    is constant have no r and are dropped: ``resamples_used``) and, given ``replicates`` (resamples x points: each
    point's ``ys`` value recomputed from a resample of the answers it stands on, ``_point_replicates``),
    ``ci95_answers``: the interval of r and rho over those, the points and ``xs`` fixed (how much the students'
    answers alone move the correlation); under ``CORRELATION_MIN_POINTS``, ``too few points``. A side that is
    constant has no r (null)."""
    x, y = np.asarray(xs, dtype=np.float64), np.asarray(ys, dtype=np.float64)  # (n,), (n,)
    if len(x) < CORRELATION_MIN_POINTS:
        return {"points": len(x), "result": f"too few points (fewer than {CORRELATION_MIN_POINTS})"}
    figures: dict = {"points": len(x)}
    for name, statistic in (("pearson_r", pearson), ("spearman_rho", spearman)):
        value = statistic(x, y)
        figures[name] = None if value is None else round(value, 4)
    if len(x) < CORRELATION_INTERVAL_POINTS:
        figures["ci95"] = f"no interval under {CORRELATION_INTERVAL_POINTS} points"
        return figures
    draws = rng.integers(len(x), size=(resamples, len(x)))  # (resamples, n) point indices
    figures["ci95"] = {}
    for name, statistic in (("pearson_r", pearson), ("spearman_rho", spearman)):
        values = [v for draw in draws if (v := statistic(x[draw], y[draw])) is not None]
        figures["ci95"][name] = _interval(np.array(values)) if values else None
        figures["ci95"][f"{name}_resamples_used"] = len(values)
    if replicates is not None:
        figures["ci95_answers"] = {}
        for name, statistic in (("pearson_r", pearson), ("spearman_rho", spearman)):
            values = [v for row in replicates if (v := statistic(x, row)) is not None]
            figures["ci95_answers"][name] = _interval(np.array(values)) if values else None
            figures["ci95_answers"][f"{name}_resamples_used"] = len(values)
    return figures


def _point_replicates(points: list[dict], arms: dict, answers: dict, rng: np.random.Generator) -> np.ndarray:
    """(resamples x points): each point's accuracy recomputed as every interval of the study resamples (templates,
    then questions within them: ``answers["weights"]``, shared by all points; then the point's own seeds, where it
    has several: a one-seed point, such as each RL seed's, carries no seed spread), from its arm's answers
    (``answers["correct"][arm]``, seeds x questions in the arm's ``seeds`` order)."""
    weights = answers["weights"]
    columns = []
    for p in points:
        correct = answers["correct"][p["arm"]]
        rows = correct[[arms[p["arm"]]["seeds"].index(seed) for seed in p["seeds"]]]
        columns.append((weights * _seed_means(rows, len(weights), rng)).sum(1) / weights.sum(1))
    return np.stack(columns, axis=1)
