"""The students' answers of the fair study (bench/study_fair.py): the eval folders bench/study_fair.sh writes and
``export``'s few kilobytes of each run, read as ``{student: {arm: {seed: rows}}}`` (``read_arms``); whether an
answer loops; where each run ran (``provenance``) and what it was trained on (``trained_on``), with the checks that
every taught run read the kept explanations and every traces run the committed traces; and the larger-model traces
made from an eval of the training questions (``traces``)."""

from __future__ import annotations

import gzip
import json
import logging
import re
from pathlib import Path

from omegaconf import OmegaConf

from rlt_mono.read_source import module_constant
from rlt_mono.runs.atomic_write import write_json, write_text
from study.kept import _kept_digests
from study.layout import SETS, SHORT_SETS, StudyError, _config, _kept_teacher, _question_id, _root_file, _sha256

logger = logging.getLogger(__name__)

_SEEDED = re.compile(r"^(?P<arm>.+)_s(?P<seed>\d+)$")
# The sentence a plain-prompt answer ends with (rlt_mono.stages.eval), the markup that may open it on its line, and
# what a traces eval must have been run with.
THE_ANSWER_IS = module_constant("rlt_mono.stages.eval", "THE_ANSWER_IS")
_SENTENCE_MARKUP = re.compile(r"[ \t*#_>-]*\Z")
TRACES_EVAL = {"eval.split": "train", "eval.student_prompt": "plain"}
# A trace line's columns: the row's own, then the trace.
TRACE_COLUMNS = ("question", "solution", "answer", "template")

# An answer loops when its last LOOP_TAIL_CHARS characters (trailing space dropped) occur LOOP_TIMES times or more in
# it: a student that repeats itself until the cap (a line, a block of lines or a phrase inside one line), which a
# larger cap does not help. An answer that ends normally ("The answer is 7.") does not repeat its ending, and a list
# whose items repeat a fact line does not end on a repeat unless it is still repeating.
LOOP_TAIL_CHARS, LOOP_TIMES = 40, 4


def looped(answer: str) -> bool:
    """Whether ``answer``'s last ``LOOP_TAIL_CHARS`` characters occur ``LOOP_TIMES`` times or more in it (counted
    where they overlap, too: a loop shorter than the ending repeats it at each turn)."""
    answer = answer.rstrip()
    tail = answer[-LOOP_TAIL_CHARS:]
    if len(tail) < LOOP_TAIL_CHARS:
        return False
    found, start = 0, answer.find(tail)
    while start != -1 and found < LOOP_TIMES:
        found, start = found + 1, answer.find(tail, start + 1)
    return found >= LOOP_TIMES


def _eval_folders(root: Path) -> list[tuple[str, str, int, Path]]:
    """``(student, arm, seed, eval folder)`` of every eval folder under ``root`` that wrote its rows (unread)."""
    folders = []
    for rows_file in sorted(root.glob("*/*/eval/eval_rows.jsonl")):
        run = rows_file.parent.parent
        match = _SEEDED.match(run.name)
        arm, seed = (match["arm"], int(match["seed"])) if match else (run.name, 0)
        folders.append((run.parent.name, arm, seed, rows_file.parent))
    return folders


def _finished_eval_folders(root: Path) -> list[tuple[str, str, int, Path]]:
    """``_eval_folders`` whose eval wrote its summary (``eval.json``) after its rows, as ``_eval_runs`` takes them."""
    return [entry for entry in _eval_folders(root) if (entry[3] / "eval.json").is_file()]


def _eval_runs(root: Path) -> list[tuple[str, str, int, list[dict], Path]]:
    """``(student, arm, seed, rows, eval folder)`` of every eval folder under ``root``, each row keyed by its
    question's id."""
    runs = []
    for student, arm, seed, folder in _eval_folders(root):
        rows_file = folder / "eval_rows.jsonl"
        rows = [json.loads(line) for line in rows_file.read_text().splitlines() if line.strip()]
        if not rows:
            raise StudyError(f"{rows_file} is empty: that eval did not finish; run its part again")
        if not (folder / "eval.json").is_file():  # its rows are written, its summary not yet
            logger.warning("%s: no eval.json beside its rows yet (the eval is ending): left out", folder)
            continue
        runs.append((student, arm, seed, [{**row, "question": _question_id(row["question"]),
                                           "looped": looped(row.get("student_output") or "")}
                                          for row in rows], folder))
    return runs


def _exported_runs(root: Path) -> list[tuple[str, str, int, list[dict]]]:
    """The same from ``export``'s files under ``root``."""
    runs = []
    for path in sorted(root.glob("*/*.json")):
        match = _SEEDED.match(path.stem)
        if match is None:
            continue
        saved = json.loads(path.read_text())
        loops = saved.get("looped") or [None] * len(saved["question"])  # exports before it kept no loop bit
        rows = [{"question": q, "heldout": SHORT_SETS[h], "template": t, "correct": c == "1", "capped": x == "1",
                 "looped": None if loop is None else loop == "1"}
                for q, h, t, c, x, loop in zip(saved["question"], saved["heldout"], saved["template"],
                                               saved["correct"], saved["capped"], loops, strict=True)]
        runs.append((path.parent.name, match["arm"], int(match["seed"]), rows))
    return runs


def is_answered(answers: Path, student: str, label: str, commit: str | None) -> bool:
    """Whether ``answers/<student>/<label>.json`` (``export``'s file of that run, e.g. ``rl_teacher_s0``) is there,
    and, given ``commit``, was run at that commit (either id may be the other's short form)."""
    path = answers / student / f"{label}.json"
    if not path.is_file():
        return False
    if commit is None:
        return True
    saved = str(json.loads(path.read_text()).get("commit", ""))
    return bool(saved) and (saved.startswith(commit) or commit.startswith(saved))


def read_arms(roots: list[Path]) -> dict[str, dict[str, dict[int, list[dict]]]]:
    """``{student: {arm: {seed: eval rows}}}`` from every ``<root>/<student>/<arm>[_s<seed>]/eval`` and every
    exported ``<root>/<student>/<arm>_s<seed>.json``."""
    arms: dict[str, dict[str, dict[int, list[dict]]]] = {}
    for root in roots:
        for student, arm, seed, rows, *_ in [*_eval_runs(root), *_exported_runs(root)]:
            seeds = arms.setdefault(student, {}).setdefault(arm, {})
            if seed in seeds:
                raise StudyError(f"{root}: {student}/{arm} seed {seed} is there twice; pass each run once")
            seeds[seed] = rows
    if not arms:
        raise StudyError(f"no <student>/<arm>/eval/eval_rows.jsonl under {', '.join(map(str, roots))}: pass the "
                         "folder bench/study_fair.sh wrote")
    return arms


def _runs_trained_on(roots: list[Path]) -> list[tuple[str, str, int, dict | None]]:
    """``(student, arm, seed, trained_on)`` of every run under ``roots``, eval folders (``_finished_eval_folders``,
    their rows unread) and exported files alike (``trained_on`` None where the run does
    not say)."""
    runs = []
    for root in roots:
        for student, arm, seed, folder in _finished_eval_folders(root):
            runs.append((student, arm, seed, trained_on(folder)))
        for path in sorted(root.glob("*/*.json")):
            if match := _SEEDED.match(path.stem):
                runs.append((path.parent.name, match["arm"], int(match["seed"]),
                             json.loads(path.read_text()).get("trained_on")))
    return runs


def _misread_runs(roots: list[Path], expected) -> tuple[list[str], list[str]]:
    """The runs under ``roots`` that read other rows than ``expected(arm, seed)`` allows (``(sha256s, note)``, None for
    a run it does not check), as ``<student>/<arm>_s<seed> (<file><note>)``, and those whose ``trained_on`` records
    no sha256 (it cannot be checked), as ``<student>/<arm>_s<seed>``."""
    other, unsaid = [], []
    for student, arm, seed, taught in _runs_trained_on(roots):
        allowed = expected(arm, seed)
        if allowed is None:
            continue
        label = f"{student}/{arm}_s{seed}"
        if not taught or not taught.get("sha256"):
            unsaid.append(label)
        elif taught["sha256"] not in allowed[0]:
            other.append(f"{label} ({taught.get('file')}{allowed[1]})")
    return other, unsaid


def check_read_kept(roots: list[Path], explanations: Path) -> None:
    """Every taught run read the rows ``explanations`` keeps of its teacher (the sha256 its ``trained_on`` records
    against ``_kept_digests``: the kept file's, or that of the rows ``restore`` writes of it): the correlation pairs
    each student with its teacher's reward on those rows, so a student taught by other explanations (an earlier
    part's teachers, say) is refused, naming the runs; so is one that does not record what it read (exported before
    ``trained_on``, or its file gone when it was exported): the answers of students taught by explanations no longer
    kept (the 2026-11-28 teachers') are such runs, and would otherwise enter the summary beside the new ones."""
    kept = _kept_digests(explanations)

    def expected(arm: str, seed: int) -> tuple[set[str], str] | None:
        teacher = _kept_teacher(arm, seed, set(kept))
        return None if teacher is None else (kept.get(teacher, set()), f", not the kept {teacher}")

    other, unsaid = _misread_runs(roots, expected)
    if other:
        raise StudyError(f"--explanations {explanations}: {len(other)} run(s) read other rows than the kept "
                         f"teacher's: {', '.join(other)}; summarize them without --explanations, or run them again")
    if unsaid:
        raise StudyError(f"--explanations {explanations}: {len(unsaid)} run(s) do not record what they were trained "
                         f"on, so whether they read the kept rows cannot be checked: {', '.join(unsaid)}; summarize "
                         "them without --explanations, or run them again")


def check_read_traces(roots: list[Path], traces: Path) -> None:
    """Every ``traces`` run read the committed traces (``traces``: the gzipped file bench/study_fair.sh unpacks,
    study_data/gsm_symbolic_v2/traces.jsonl.gz): the sha256 its ``trained_on`` records against that of the
    unpacked rows. A run taught by other traces, or that does not say what it read, is refused, naming the runs."""
    try:
        digest = _sha256(gzip.decompress(traces.read_bytes()))
    except (OSError, EOFError) as err:
        raise StudyError(f"--traces {traces}: not a readable gzip file of the traces ({err})") from err
    other, unsaid = _misread_runs(roots, lambda arm, seed: ({digest}, "") if arm == "traces" else None)
    if other or unsaid:
        raise StudyError(f"--traces {traces}: " + "; ".join(
            [f"{len(other)} run(s) read other traces: {', '.join(other)}"] * bool(other)
            + [f"{len(unsaid)} run(s) do not record what they were trained on: {', '.join(unsaid)}"] * bool(unsaid))
            + "; summarize them without --traces, or run them again")


def where_ran(runs: list[dict]) -> dict:
    """The ``commit``, ``device`` and ``commands`` of ``provenance``'s runs, each the sorted set of theirs: what a
    result file says of where its runs ran."""
    return {"commit": sorted({r["commit"] for r in runs}), "device": sorted({r["device"] for r in runs}),
            "commands": sorted({r["command"] for r in runs})}


def provenance(roots: list[Path]) -> list[dict]:
    """Where each run ran: ``student``, ``arm``, ``seed``, ``device``, ``commit``, ``command``: an exported run's as
    its file says; an eval folder's (a study root summarized as it is) the root's ``commit``, its own ``command``
    (else the root's) and ``device`` "?" (an eval folder does not record it), "?" for what is not there."""
    runs = []
    for root in roots:
        for student, arm, seed, folder in _finished_eval_folders(root):
            runs.append({"student": student, "arm": arm, "seed": seed, "device": "?",
                         "commit": _root_file(root, "commit") or "?",
                         "command": _root_file(folder, "command") or _root_file(root, "command") or "?"})
        for path in sorted(root.glob("*/*.json")):
            match = _SEEDED.match(path.stem)
            if match:
                saved = json.loads(path.read_text())
                runs.append({"student": path.parent.name, "arm": match["arm"], "seed": int(match["seed"]),
                             **{key: saved.get(key, "?") for key in ("device", "commit", "command")}})
    return runs


def trained_on(eval_folder: Path) -> dict | None:
    """What the student of an eval run was trained on: its SFT run's (``<run>/sft/config.yaml``) ``data.source``
    file's name and the sha256 of its bytes (``keep``'s manifest gives the same of each kept teacher's rows); the
    sha256 None where that file is gone, or ``data.source`` names a dataset, not a file. None for an untrained
    student (no SFT run)."""
    config = _config(eval_folder.parent / "sft" / "config.yaml")
    if config is None:
        return None
    source = str((config.get("data") or {}).get("source") or "")
    path = Path(source)
    if not source or path.suffix != ".jsonl":
        return {"file": source or None, "sha256": None}
    return {"file": path.name, "sha256": _sha256(path.read_bytes()) if path.is_file() else None}


def export(root: Path, out: Path, suffix: str, where: dict) -> list[Path]:
    """Each eval run under ``root`` as ``out/<student>/<arm><suffix>_s<seed>.json``; refuses to overwrite one. A run
    whose eval folder keeps the command that started it (``command``, bench/study_fair.sh) is exported with that
    command rather than ``where``'s: one root may hold the runs of several commands. A trained student's file says
    what it was trained on (``trained_on``)."""
    written = []
    for student, arm, seed, rows, folder in _eval_runs(root):
        own = folder / "command"
        run_where = {**where, "command": own.read_text().strip()} if own.is_file() else where
        taught = trained_on(folder)
        if taught is not None:
            run_where = {**run_where, "trained_on": taught}
        rows = [row for row in rows if row.get("heldout") in SETS and row.get("correct") is not None]
        path = out / student / f"{arm}{suffix}_s{seed}.json"
        if path.exists():
            raise StudyError(f"{path} exists: a run is exported once (choose another --suffix, or delete it)")
        path.parent.mkdir(parents=True, exist_ok=True)
        write_json(path, {
            **run_where, "question": [row["question"] for row in rows],
            "heldout": "".join(row["heldout"][0] for row in rows), "template": [row.get("template") for row in rows],
            "correct": "".join("1" if row["correct"] else "0" for row in rows),
            "capped": "".join("1" if row.get("capped") else "0" for row in rows),
            "looped": "".join("1" if row["looped"] else "0" for row in rows)}, indent=None)
        written.append(path)
    if not written:
        raise StudyError(f"no <student>/<arm>/eval/eval_rows.jsonl under {root}: pass the folder bench/study_fair.sh "
                         "wrote")
    return written


def trace_text(output: str) -> str:
    """A right answer as a trace: everything before its last "The answer is" (all of it where there is none), less
    the markup that opens that sentence on its line (``**``, ``#``, a bullet)."""
    return _SENTENCE_MARKUP.sub("", output.rsplit(THE_ANSWER_IS, 1)[0]).strip()


def traces(folder: Path, out: Path) -> tuple[int, int]:
    """``out``: one JSON line per row of the eval folder answered right and not cut at the cap, with a non-empty
    ``trace_text``; returns ``(kept, answered)``."""
    config = folder / "config.yaml"
    if not config.is_file() or not (folder / "eval_rows.jsonl").is_file():
        raise StudyError(f"{folder}: no config.yaml and eval_rows.jsonl here; pass the eval folder of the traces part")
    cfg = OmegaConf.load(config)
    for key, value in TRACES_EVAL.items():
        if OmegaConf.select(cfg, key) != value:
            raise StudyError(f"{folder} was run with {key}={OmegaConf.select(cfg, key)}: traces come from an eval "
                             f"with {', '.join(f'{k}={v}' for k, v in TRACES_EVAL.items())}")
    rows = [json.loads(line) for line in (folder / "eval_rows.jsonl").read_text().splitlines() if line.strip()]
    kept = [{**{key: row[key] for key in TRACE_COLUMNS if key in row}, "trace": trace_text(row["student_output"])}
            for row in rows if row.get("correct") and not row.get("capped")]
    kept = [row for row in kept if row["trace"]]
    out.parent.mkdir(parents=True, exist_ok=True)
    write_text(out, "".join(json.dumps(row) + "\n" for row in kept))
    return len(kept), len(rows)
