"""Held-out instances that repeat a training question but for its names (bench/study_fair.py ``duplicates`` and
``distinct``): a declared sensitivity analysis of the fair study, not a change of its primary endpoint.

GSM-Symbolic draws each question of a template from a few names, nouns and numbers, so a held-out instance of a
training template can repeat a training question's numbers in the same order with only its names changed ("5 pink
bricks ... 21" against "5 white bricks ... 21"): the same sums, the same answer, often the same steps. A held-out
question is a *near-duplicate* when its template and the sequence of numbers in its text (``numbers``) equal those of
a training question (``near_duplicates``). The training questions compared with are all of the split's (the
worked-solution students saw every one); each near-duplicate also says whether a matching question is among those
the teachers explained (``explained_ids``: the questions of the kept explanations, the same for every kept teacher).

``distinct_figures`` then summarizes the students' answers (``study.summary.summarize``, unchanged) twice: on the
held-out instances that are no near-duplicate, and on the near-duplicates alone, so that the gap between the two
shows how much of the held-out-instance figures a student's memory of the training questions could explain.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterable
from decimal import Decimal
from pathlib import Path

from study.kept import read_kept
from study.layout import SETS, StudyError, _question_id
from study.report import accuracy_cell, signed_interval
from study.summary import summarize

logger = logging.getLogger(__name__)

# A number in a question's text: digits with commas between groups of three (thousands: "1,250" is 1250; a comma
# not followed by exactly three digits and then a non-digit separates two numbers: "3,4" and "1,2345" are two), then
# an optional decimal part (a point followed by digits; a sentence's closing point is not one: "costs 5." is 5).
# Signs are not read (a hyphen is a dash: "5-year-old"), nor number words ("twice", "three"): two questions that
# differ only in a number word count as the same numbers, which flags more near-duplicates, not fewer.
NUMBER = re.compile(r"\d{1,3}(?:,\d{3})+(?!\d)(?:\.\d+)?|\d+(?:\.\d+)?")
NUMBER_RULE = ("integers and decimals in the question's text, in order (regex " + NUMBER.pattern + "): commas "
               "between groups of three digits read as thousands separators, each number compared by value "
               "(1,250 = 1250, 5.50 = 5.5, 135.0 = 135); signs and number words are not read")
# The held-out set a near-duplicate belongs to (the training templates' new instances; the held-out templates share
# no template with a training question, so none of theirs can be one).
HELD_OUT = SETS["instances"]


def numbers(text: str) -> tuple[str, ...]:
    """The numbers of ``text`` in order (``NUMBER``), each as its value's shortest decimal form: "1,250" -> "1250",
    "5.50" -> "5.5", "135.0" -> "135"."""
    return tuple(format(Decimal(found.replace(",", "")).normalize(), "f") for found in NUMBER.findall(text))


def _key(row: dict) -> tuple:
    return row["template"], numbers(row["question"])


def near_duplicates(training: Iterable[dict], held_out: Iterable[dict]) -> dict[str, list[str]]:
    """Per held-out row (``{"id", "template", "question"}``) whose template and ``numbers`` equal a training row's,
    its id -> the sorted ids of every such training row. Held-out rows with no match are left out."""
    by_key: dict[tuple, list[str]] = {}
    for row in training:
        by_key.setdefault(_key(row), []).append(row["id"])
    return {row["id"]: sorted(set(by_key[_key(row)])) for row in held_out if _key(row) in by_key}


def duplicates_record(training: list[dict], held_out: list[dict], explained: set[str]) -> dict:
    """What ``duplicates`` writes of ``near_duplicates``: the ``counts`` (training questions, explained ones,
    held-out instances, near-duplicates, those matching an explained question, those with the very steps of a
    matching training question: rows with ``steps``, the worked solution's step lines) and per near-duplicate id
    its ``template``, matching ``training`` ids, whether one is ``explained``, and ``same_steps``."""
    unknown = explained - {row["id"] for row in training}
    if unknown:
        raise StudyError(f"{len(unknown)} explained question(s) are no training question of this split (e.g. "
                         f"{sorted(unknown)[0]}): the explanations are of another split")
    found = near_duplicates(training, held_out)
    steps = {row["id"]: row.get("steps") for row in training}
    entries = {}
    for row in sorted(held_out, key=lambda row: row["id"]):
        if row["id"] not in found:
            continue
        matches = found[row["id"]]
        entries[row["id"]] = {"template": row["template"], "training": matches,
                              "explained": any(match in explained for match in matches),
                              "same_steps": row.get("steps") is not None
                              and any(steps[match] == row["steps"] for match in matches)}
    counts = {"training": len(training), "explained": len(explained), HELD_OUT: len(held_out),
              "near_duplicates": len(entries),
              "near_duplicates_of_explained": sum(entry["explained"] for entry in entries.values()),
              "same_steps": sum(entry["same_steps"] for entry in entries.values())}
    logger.info("%d of %d held-out instances are near-duplicates of a training question (%d of one the teachers "
                "explained)", counts["near_duplicates"], len(held_out), counts["near_duplicates_of_explained"])
    return {"numbers": NUMBER_RULE, "counts": counts, "near_duplicates": entries}


def study_split(overrides: tuple[str, ...] = ("data=gsm_symbolic",)) -> tuple[list[dict], list[dict], dict]:
    """The fair study's training rows and held-out instances as ``near_duplicates`` reads them (``id``: the
    question's hash, as the answers and the kept explanations name it; ``template``; ``question``; ``steps``), and
    the data config they came from: the split the study's evals read (``./launch_mono.sh eval data=gsm_symbolic``:
    its seed is ``data.seed``, the same for every run seed), loaded through rlt_mono."""
    from rlt_mono.config import compose, instantiate
    from rlt_mono.data.rows import DataConfig, load_split

    cfg = compose("eval", list(overrides))
    config = instantiate(DataConfig, cfg.data, "data")

    def rows(split: str) -> list[dict]:
        return [{"id": _question_id(row["question"]), "template": row["template"], "question": row["question"],
                 "steps": row.get("reasoning_trace"), "heldout": row.get("heldout")}
                for row in load_split(config, cfg.seed, split)]

    held_out = [row for row in rows("eval") if row["heldout"] == "instances"]
    data = {key: value for key, value in vars(config).items()
            if key in ("source", "seed", "gsm_items_per_template", "eval_rows", "heldout_templates",
                       "heldout_template_rows")}
    return rows("train"), held_out, data


def explained_ids(folder: Path) -> set[str]:
    """The ids of the questions the teachers explained: those of the explanations kept in ``folder`` (``keep``'s),
    which must be the same for every kept teacher."""
    ids = {name: {row["question_id"] for _, row in rows} for name, rows in read_kept(folder).items()}
    first = next(iter(ids.values()))
    other = sorted(name for name, held in ids.items() if held != first)
    if other:
        raise StudyError(f"{folder}: the kept teachers explained different questions ({', '.join(other)} differ "
                         f"from {next(iter(ids))}): the explained questions are not one set")
    return first


def read_duplicates(path: Path) -> dict:
    """A file ``duplicates`` wrote, checked to hold its ``near_duplicates``: ``{held-out id: entry}``."""
    if not path.is_file():
        raise StudyError(f"--duplicates {path}: no such file (bench/study_fair.py duplicates --out {path} writes it)")
    try:
        saved = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise StudyError(f"--duplicates {path}: not a JSON file ({err})") from err
    found = saved.get("near_duplicates") if isinstance(saved, dict) else None
    if not isinstance(found, dict) or not all(isinstance(entry, dict) for entry in found.values()):
        raise StudyError(f"--duplicates {path}: no \"near_duplicates\" object of held-out ids: not a file "
                         "bench/study_fair.py duplicates wrote")
    return saved


def split_arms(arms: dict, duplicates: Iterable[str]) -> tuple[dict, dict]:
    """``read_arms``'s ``{student: {arm: {seed: rows}}}`` as two of the same, each holding held-out-instance rows
    only: those of the questions that are no near-duplicate (``duplicates``: their ids), and those of the
    near-duplicates. Every near-duplicate must be a held-out instance some run answered (a file of another split is
    refused)."""
    duplicates = set(duplicates)
    instances = "instances"  # read_arms' name of the held-out set (HELD_OUT's key)
    answered = {row["question"] for per_arm in arms.values() for per_seed in per_arm.values()
                for rows in per_seed.values() for row in rows if row.get("heldout") == instances}
    unknown = duplicates - answered
    if unknown:
        raise StudyError(f"{len(unknown)} of the {len(duplicates)} near-duplicates are no held-out instance these "
                         f"answers hold (e.g. {sorted(unknown)[0]}): the duplicates file is of another split")
    distinct, alone = {}, {}
    for student, per_arm in arms.items():
        for arm, per_seed in per_arm.items():
            for seed, rows in per_seed.items():
                mine = [row for row in rows if row.get("heldout") == instances]
                distinct.setdefault(student, {}).setdefault(arm, {})[seed] = [
                    row for row in mine if row["question"] not in duplicates]
                alone.setdefault(student, {}).setdefault(arm, {})[seed] = [
                    row for row in mine if row["question"] in duplicates]
    return distinct, alone


def _on_instances(entry: dict) -> dict:
    """A ``summarize`` student entry's held-out-instance figures: each arm's (with its seeds), the positive control
    and each difference."""
    return {"arms": {arm: {"seeds": figures["seeds"], **figures[HELD_OUT]} for arm, figures in entry["arms"].items()
                     if HELD_OUT in figures},
            "positive_control": entry.get("positive_control"),
            "differences": {pair: sets[HELD_OUT] for pair, sets in entry["differences"].items() if HELD_OUT in sets}}


def template_matched(distinct: dict, alone: dict) -> dict:
    """Per student and arm, the near-duplicates against the distinct questions of their own templates: the
    near-duplicates are not spread like the held-out instances (they gather in templates whose numbers have few
    values, which may be easier or harder), so a gap between the two sets may be a gap between templates. On the
    templates holding both kinds of question: the near-duplicates' accuracy, the distinct questions' accuracy with
    each template weighted by its near-duplicates (its mean accuracy over its distinct questions), and the ``gap``;
    each a mean over seeds of the seed's figure (point figures, no interval), with the ``templates`` and the
    near-duplicate ``questions`` they rest on."""
    matched = {}
    for student, per_arm in sorted(alone.items()):
        for arm, per_seed in per_arm.items():
            figures = []
            for seed, rows in per_seed.items():
                others: dict[int, list[bool]] = {}
                for row in distinct[student][arm][seed]:
                    if row.get("correct") is not None:  # as summarize, an unanswered row is left out
                        others.setdefault(row["template"], []).append(bool(row["correct"]))
                mine = [row for row in rows if row["template"] in others and row.get("correct") is not None]
                if not mine:
                    continue
                near = sum(bool(row["correct"]) for row in mine) / len(mine)
                weighted = sum(sum(others[row["template"]]) / len(others[row["template"]]) for row in mine) / len(mine)
                figures.append((near, weighted, len({row["template"] for row in mine}), len(mine)))
            if figures:
                near, weighted = (sum(f[i] for f in figures) / len(figures) for i in (0, 1))
                matched.setdefault(student, {})[arm] = {
                    "near_duplicates": round(near, 4), "distinct": round(weighted, 4), "gap": round(near - weighted, 4),
                    "templates": figures[0][2], "questions": figures[0][3]}
    return matched


def distinct_figures(arms: dict, duplicates: Iterable[str], resamples: int, seed: int) -> dict:
    """Per student, ``summarize``'s held-out-instance figures (``_on_instances``) on the questions that are no
    near-duplicate (``distinct``) and on the near-duplicates alone (``near_duplicates``), per arm the gap
    (near-duplicates minus distinct accuracy) and the same within templates (``template_matched``). Each summarize
    draws its own bootstrap from ``seed``."""
    distinct, alone = split_arms(arms, duplicates)
    blocks = {"distinct": summarize(distinct, resamples, seed), "near_duplicates": summarize(alone, resamples, seed)}
    matched = template_matched(distinct, alone)
    students = {}
    for student in sorted(arms):
        entry = {name: _on_instances(block[student]) for name, block in blocks.items() if student in block}
        both = [arm for arm in entry.get("distinct", {}).get("arms", {})
                if arm in entry.get("near_duplicates", {}).get("arms", {})]
        entry["gap"] = {arm: round(entry["near_duplicates"]["arms"][arm]["accuracy"]
                                   - entry["distinct"]["arms"][arm]["accuracy"], 4) for arm in both}
        entry["template_matched"] = matched.get(student, {})
        students[student] = entry
    return students


def _cell(figures: dict | None) -> str:
    return "—" if figures is None else accuracy_cell(figures)


def _difference(d: dict) -> str:
    line = signed_interval(d["difference"], d["ci95"])
    if "seed_t" in d:
        t = d["seed_t"]
        line += f" (seeds alone, Welch t: [{t['ci95'][0]:+.3f}, {t['ci95'][1]:+.3f}])"
    return line


def table(students: dict, counts: dict) -> str:
    """distinct_instances.md: per student each arm's accuracy on the distinct held-out instances and on the
    near-duplicates, then the positive control and the differences on each."""
    lines = [f"Held-out instances without the {counts['near_duplicates']} near-duplicates of a training question "
             f"(same template, same numbers in the same order; {counts['near_duplicates_of_explained']} of them match "
             "a question the teachers explained): a sensitivity analysis, not the primary endpoint "
             "(study_table.md).", ""]
    for student, entry in students.items():
        lines += [f"## {student}", "", "| arm | seeds | distinct held-out instances | near-duplicates | "
                  "near-duplicates − distinct | the same within templates |", "| --- | --- | --- | --- | --- | --- |"]
        distinct, alone = entry.get("distinct", {}), entry.get("near_duplicates", {})
        for arm, figures in distinct.get("arms", {}).items():
            gap, within = entry["gap"].get(arm), entry["template_matched"].get(arm)
            lines.append(f"| {arm} | {', '.join(map(str, figures['seeds']))} | {_cell(figures)} | "
                         f"{_cell(alone.get('arms', {}).get(arm))} | {'—' if gap is None else f'{gap:+.3f}'} | "
                         + ("—" if within is None else f"{within['near_duplicates']:.3f} − {within['distinct']:.3f} = "
                            f"{within['gap']:+.3f}") + " |")
        lines += ["", "Within templates: on the templates that hold both kinds of question, the near-duplicates' "
                  "accuracy against that of the distinct questions weighted as the near-duplicates are (point "
                  "figures; the near-duplicates gather in a few templates).", ""]
        for name, block in (("distinct", distinct), ("near-duplicates", alone)):
            control = block.get("positive_control")
            if control:
                lines.append(f"- positive control on the {name}: {control['arm']} − {control['baseline']} "
                             f"{_difference(control)}: {'passes' if control['passes'] else 'FAILS'}")
        for pair, d in distinct.get("differences", {}).items():
            other = alone.get("differences", {}).get(pair)
            lines.append(f"- {pair}: distinct {_difference(d)}"
                         + ("" if other is None else f"; near-duplicates {_difference(other)}"))
        lines.append("")
    return "\n".join(lines)
