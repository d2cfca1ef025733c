"""Which explanations lower the student's r_SS most: a teacher's per-question r_SS gap (after its explanation minus
after an empty thought, from ``bench/explanation_value.py``'s ``per_question``) against features of the explanation
read from the kept rows (``study_fair.py keep``'s folder), no model.

Features: ``results_share``, the share of the worked solution's intermediate results (each number right of an
``=``) that the explanation states; ``chars``, its length; ``latex``, whether it writes TeX (``\\[``, ``\\(``,
``\\text``, ``\\times``, ``\\frac``); ``markdown``, whether it writes bold or headings (``**``, ``#``). For a number,
Spearman's rho with the gap; for a yes/no, the mean gap with and without and their difference. Intervals: 95%
bootstrap, templates resampled, then questions within them (the study's resampling).

    python bench/explanation_features.py study_data/gsm_symbolic_v2/explanation_value_all.json \\
        study_data/gsm_symbolic_v2/explanations --teacher rl_s0 \\
        --out results/study_gsm_symbolic_v2/explanation_features.json
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]  # rlt_mono, and the scripts beside this one however it was loaded

from bench_mono import code_commit  # noqa: E402
from study.kept import read_kept  # noqa: E402
from study.layout import StudyError  # noqa: E402
from study.stats import _interval, _question_weights, spearman  # noqa: E402

from rlt_mono.runs.atomic_write import write_json  # noqa: E402
from rlt_mono.study.eval_stats import RESAMPLES  # noqa: E402

NUMBER = re.compile(r"\d+(?:\.\d+)?")
RESULT = re.compile(r"=\s*\$?(\d[\d,]*(?:\.\d+)?)")  # a number right of "=" in the worked solution
LATEX = re.compile(r"\\\[|\\\(|\\text|\\times|\\frac")
MARKDOWN = re.compile(r"\*\*|^#", re.MULTILINE)


def features(solution: str, explanation: str) -> dict[str, float]:
    """The explanation's features against its worked solution (NaN ``results_share`` for a solution without an
    ``=``)."""
    results = {value.replace(",", "") for value in RESULT.findall(solution)}
    stated = set(NUMBER.findall(explanation.replace(",", "")))
    return {"results_share": len(results & stated) / len(results) if results else float("nan"),
            "chars": float(len(explanation)), "latex": float(bool(LATEX.search(explanation))),
            "markdown": float(bool(MARKDOWN.search(explanation)))}


def analyse(gap: np.ndarray, table: dict[str, np.ndarray], templates: np.ndarray, seed: int,
            resamples: int = RESAMPLES) -> dict:
    """Per feature: Spearman's rho with ``gap`` (a number) or the mean gap with and without (a yes/no), each with a
    template-clustered bootstrap interval."""
    rng = np.random.default_rng(seed)
    weights = _question_weights(templates, resamples, rng).astype(int)  # (resamples, questions): draws per question
    draws = [np.repeat(np.arange(len(gap)), w) for w in weights]
    out = {}
    for name, values in table.items():
        keep = ~np.isnan(values)
        if name in ("latex", "markdown"):
            yes, no = values == 1, values == 0
            difference = [gap[d][yes[d]].mean() - gap[d][no[d]].mean() for d in draws if yes[d].any() and no[d].any()]
            out[name] = {"share": round(float(yes.mean()), 4),
                         "mean_gap_with": round(float(gap[yes].mean()), 4) if yes.any() else None,
                         "mean_gap_without": round(float(gap[no].mean()), 4) if no.any() else None,
                         "difference": round(float(gap[yes].mean() - gap[no].mean()), 4)
                         if yes.any() and no.any() else None,
                         "ci95": _interval(np.array(difference)) if difference else None}
        else:
            samples = [spearman(values[d][keep[d]], gap[d][keep[d]]) for d in draws]
            rho = spearman(values[keep], gap[keep])  # None where either side is constant (study.stats.spearman)
            out[name] = {"median": round(float(np.median(values[keep])), 4),
                         "spearman_rho": None if rho is None else round(rho, 4),
                         "ci95": _interval(np.array([s for s in samples if s is not None]))}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("value", type=Path, help="bench/explanation_value.py's JSON (its per_question)")
    parser.add_argument("explanations", type=Path, help="study_fair.py keep's folder, the rows it scored")
    parser.add_argument("--teacher", required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    try:
        per_question = json.loads(args.value.read_text())["per_question"]
        if not per_question or args.teacher not in per_question[0]:
            raise StudyError(f"{args.value}: no per-question r_SS of {args.teacher}")
        rows = {row["question_id"]: row for _, row in read_kept(args.explanations).get(args.teacher, [])}
        missing = [q["question_id"] for q in per_question if q["question_id"] not in rows]
        if missing:
            raise StudyError(f"{args.explanations}: {len(missing)} of the scored questions have no kept row of "
                             f"{args.teacher} (first: {missing[0]}): not the rows that were scored")
    except (OSError, KeyError, json.JSONDecodeError, StudyError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    gap = np.array([q[args.teacher] - q["none"] for q in per_question])
    found = [features(rows[q["question_id"]]["solution"], rows[q["question_id"]]["explanation"]) for q in per_question]
    table = {name: np.array([f[name] for f in found]) for name in found[0]}
    templates = np.array([q["template"] for q in per_question])
    result = {"teacher": args.teacher, "questions": len(gap), "templates": int(len(np.unique(templates))),
              "mean_gap": round(float(gap.mean()), 4), "features": analyse(gap, table, templates, args.seed),
              "commit": code_commit(), "device": "CPU, no model",
              "command": "python bench/explanation_features.py " + " ".join(sys.argv[1:] if argv is None else argv)}
    write_json(args.out, result)
    for name, figures in result["features"].items():
        print(f"{name:>14}: {json.dumps(figures)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
