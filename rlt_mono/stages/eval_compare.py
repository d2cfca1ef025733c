"""``python -m rlt_mono.stages.eval compare a/eval.json b/eval.json ...``: several eval runs side by side, one markdown
table, without torch (it reads JSON files, so it answers in about a second).

The eval stage writes the ``eval.json`` files; ``rlt_mono.stages.eval``'s command line runs ``compare`` with
``add_arguments`` and ``run`` here; ``compare_table`` is also the table the eval stage logs and the pipeline writes.
Evals over different held-out questions are refused unless ``--allow-different-questions`` (the table then says so).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

from rlt_mono.config import ConfigError
from rlt_mono.errors import UserError
from rlt_mono.read_source import module_constant
from rlt_mono.study.eval_stats import EVAL_FILE, interval_text, read_rows


def read_eval(path: Path) -> dict:
    """An ``eval.json``, checked for the shape ``compare`` reads: a mapping whose ``metrics`` map each figure to
    a mapping with ``mean`` and ``n``; anything else is a ``ConfigError`` naming the file and what it expected."""
    expected = 'an eval.json (a JSON object whose "metrics" map each figure to its "mean", "low", "high", "n")'
    try:
        result = json.loads(Path(path).read_bytes().decode("utf-8"))
    except FileNotFoundError as err:
        raise ConfigError(f"{path}: no such file; expected {expected}, e.g. outputs/eval/<run>/eval.json") from err
    except OSError as err:
        raise ConfigError(f"{path}: cannot be read ({err.strerror}); expected {expected}") from err
    except UnicodeDecodeError as err:
        raise ConfigError(f"{path}: not text (a binary file?); expected {expected}") from err
    except json.JSONDecodeError as err:
        raise ConfigError(f"{path}: not JSON ({err}); expected {expected}") from err
    if not isinstance(result, dict) or not isinstance(result.get("metrics"), dict):
        raise ConfigError(f'{path}: a JSON {type(result).__name__} without "metrics"; expected {expected}')
    for name, figure in result["metrics"].items():
        if not isinstance(figure, dict) or not {"mean", "n"} <= figure.keys():
            raise ConfigError(f'{path}: metrics.{name} has no "mean" and "n"; expected {expected}')
    return result


def questions_fingerprint(questions: list[str]) -> str:
    """sha256 of the sorted, distinct question texts: equal for two evals over the same held-out set."""
    return hashlib.sha256("\n".join(sorted(set(questions))).encode()).hexdigest()


def held_out_fingerprint(path: Path, result: dict) -> str | None:
    """The held-out set's fingerprint of an ``eval.json``: stored as ``questions_sha256``, else from the
    ``eval_rows.jsonl`` beside it (an eval written before the field); None when neither is there."""
    if "questions_sha256" in result:
        return result["questions_sha256"]
    try:
        return questions_fingerprint([row["question"] for row in read_rows(Path(path).parent)])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def compare_table(paths: list[str | Path], allow_different_questions: bool = False,
                  names: list[str] | None = None) -> str:
    """One markdown table of several ``eval.json``: a column per file (named ``names``, else by its folder as
    given), a row per figure (in
    the order of ``rlt_mono.stages.eval.METRICS``, then any other a file holds), each cell ``mean [low, high]``; "—"
    where a file lacks the figure. Evals over
    different held-out sets are refused (``ConfigError``) unless ``allow_different_questions``, when the table opens
    with a warning."""
    results = [read_eval(Path(path)) for path in paths]
    names = names or [str(Path(p).parent) if Path(p).name == EVAL_FILE else str(p) for p in paths]
    # An eval with neither the stored fingerprint nor its rows cannot be checked: it is compared as it is.
    differ = len({held_out_fingerprint(Path(path), r) for path, r in zip(paths, results)} - {None}) > 1
    if differ and not allow_different_questions:
        raise ConfigError(f"{', '.join(names)}: evaluated on different held-out questions, so their figures are not "
                          "comparable; evaluate on the same rows, or pass --allow-different-questions")
    lines = ["| | " + " | ".join(names) + " |", "| --- |" + " --- |" * len(paths)]
    if differ:
        lines.insert(0, "**WARNING: these evals ran on DIFFERENT held-out questions; the figures are not "
                        "comparable question for question.**\n")
    for key in ("teacher", "student", "questions"):
        lines.append(f"| {key} | " + " | ".join(str(r.get(key, "—")) for r in results) + " |")
    known = module_constant("rlt_mono.stages.eval", "METRICS").values()  # from the source: that module imports this one
    held = list(dict.fromkeys(name for r in results for name in r["metrics"]))
    metric_names = [name for name in known if name in held] + [name for name in held if name not in known]
    for name in metric_names:
        lines.append(f"| {name} | " + " | ".join(cell(r["metrics"].get(name)) for r in results) + " |")
    sets = sorted({name for r in results for name in r.get("by_heldout", {})})
    for held_out in sets:  # each held-out set apart (gsm_symbolic: instances, templates)
        parts = [r.get("by_heldout", {}).get(held_out, {}).get("metrics", {}) for r in results]
        for name in metric_names:
            lines.append(f"| {name} [{held_out}] | " + " | ".join(cell(p.get(name)) for p in parts) + " |")
    return "\n".join(lines)


def cell(metric: dict | None) -> str:
    """A figure as a table cell: ``0.412 [0.350, 0.475] (n=200)``, "—" when there is none."""
    if not metric or metric["mean"] is None:
        return "—"
    return f"{metric['mean']:.3f} {interval_text(metric)} (n={metric['n']})"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``compare``'s arguments (``python -m rlt_mono.stages.eval compare``, a subcommand of its ``main``)."""
    parser.add_argument("eval_json", nargs="+", help="eval.json files (or their run folders)")
    parser.add_argument("--allow-different-questions", action="store_true",
                        help="compare evals over different held-out sets (the table then says so)")


def run(args: argparse.Namespace) -> int:
    """Write the table of ``args.eval_json`` on stdout; a user error is one line on stderr and exit code 2."""
    paths = [Path(p) / EVAL_FILE if Path(p).is_dir() else Path(p) for p in args.eval_json]
    try:
        sys.stdout.write(compare_table(paths, args.allow_different_questions) + "\n")
    except UserError as err:
        sys.stderr.write(f"error: {err}\n")
        return err.exit_code
    return 0

