"""The explanations the fair study's students read (bench/study_fair.py ``common``, ``keep``, ``restore``,
``check-distilled``, ``worked-target``, ``rounded``): each distill's rows of the questions every distill explained,
the repository's compressed copy of them with its ``manifest.json``, the students' files written back from it byte
for byte, and the checks that a part's distilled files hold the kept rows."""

from __future__ import annotations

import gzip
import json
import lzma
from pathlib import Path

from rlt_mono.read_source import module_constant
from rlt_mono.runs.atomic_write import write_bytes, write_json
from rlt_mono.runs.outputs import CONFIG_FILE
from study.layout import (
    _SFT_SAMPLE,
    ANSWER_ONLY_TEACHER,
    DISTILL_FILE,
    DISTILLED_FOLDER,
    KEPT_SUFFIX,
    MANIFEST_FILE,
    STUDENTS_SUFFIX,
    StudyError,
    _config,
    _jsonl_lines,
    _question_id,
    _root_file,
    _sha256,
    _text,
    below_teachers,
)

# The weights' dtypes in which a step of the RL learning rate mostly rounds away
ROUNDING_DTYPES = module_constant("rlt_mono.runs.precision", "LOW_PRECISION_NAMES")


def distill_files(root: Path) -> dict[str, Path]:
    """``{name: rows file}`` of every distill under ``root``: ``teachers/distill_<name>/distill.jsonl``, else
    ``distilled/<name>.jsonl``."""
    names = {path.parent.name.removeprefix("distill_") for path in root.glob(f"teachers/distill_*/{DISTILL_FILE}")}
    names |= {path.stem for path in root.glob(f"{DISTILLED_FOLDER}/*.jsonl")}
    files = {}
    for name in sorted(names):
        own = root / "teachers" / f"distill_{name}" / DISTILL_FILE
        files[name] = own if own.is_file() else root / DISTILLED_FOLDER / f"{name}.jsonl"
    return files


def _common_rows(root: Path) -> tuple[dict[str, list[tuple[str, dict]]], set[str]]:
    """Each distill's ``(line, row)`` pairs (``distill_files``) and the questions every one of them explained."""
    files = distill_files(root)
    if not files:
        raise StudyError(f"no distill under {root} (teachers/distill_<name>/{DISTILL_FILE} or "
                         f"{DISTILLED_FOLDER}/<name>.jsonl): pass the root the teachers part of bench/study_fair.sh "
                         "wrote")
    rows = {name: _jsonl_lines(path) for name, path in files.items()}
    return rows, _questions_in_all(rows)


def _questions_in_all(rows: dict[str, list[tuple[str, dict]]]) -> set[str]:
    """The questions every file of ``rows`` (``{name: [(line, row), ...]}``) holds."""
    return set.intersection(*({row["question"] for _, row in pairs} for pairs in rows.values()))


def students_rows(root: Path) -> dict[str, list[str]]:
    """Each distill's rows of the questions every distill under ``root`` explained, as the students read them: one
    JSON line per question, ``question_id`` first, then the row as the distill wrote it, sorted by question id (the
    same order in every file, whatever order the distills wrote). An empty common set is refused."""
    rows, common = _common_rows(root)
    if not common:
        raise StudyError(f"{root}: no question every distill explained ({', '.join(rows)}): nothing written")
    lines = {}
    for name, pairs in rows.items():
        kept = sorted((_question_id(row["question"]), row) for _, row in pairs if row["question"] in common)
        lines[name] = [json.dumps({"question_id": question_id, **row}) for question_id, row in kept]
    return lines


def _write_students_file(out: Path, name: str, data: bytes, replace: bool) -> Path:
    """``out/<name>.jsonl.gz`` of the uncompressed rows ``data``: the same bytes for the same rows (no time stamp).
    A file already there with other rows is replaced only with ``replace``."""
    path = out / f"{name}{STUDENTS_SUFFIX}"
    if not replace and path.is_file() and gzip.decompress(path.read_bytes()) != data:
        raise StudyError(f"{path}: holds other rows than the kept ones: restore into an empty folder")
    out.mkdir(parents=True, exist_ok=True)
    write_bytes(path, gzip.compress(data, mtime=0))
    return path


def write_common(root: Path, out: Path) -> list[tuple[Path, int]]:
    """``out/<name>.jsonl.gz`` of ``students_rows`` for every distill under ``root``; returns ``(file, rows)`` of
    each. A file there is replaced (a later ``wait`` brings more rows)."""
    return [(_write_students_file(out, name, _text(lines), replace=True), len(lines))
            for name, lines in students_rows(root).items()]


def _provenance(root: Path, name: str, rows: list[str]) -> dict:
    """What ``root`` records of how distill ``name``'s rows were made: its ``teacher`` (as the distill's config, else
    its rows, name it; the part below ``teachers/`` where there is one), the study's ``commit`` and ``command``
    (``root/commit``, ``root/command``) and the ``config`` of the teacher's training run and of the distill (their
    ``config.yaml``); None where not there."""
    distill = _config(root / "teachers" / f"distill_{name}" / CONFIG_FILE)
    recorded = {json.loads(line).get("teacher") for line in rows} - {None}
    teacher = (distill or {}).get("model", {}).get("model_name_or_path") or (
        recorded.pop() if len(recorded) == 1 else None)
    training = None
    if teacher is not None and (below := below_teachers(teacher)) != teacher:
        teacher = below
        training = _config((root / "teachers" / below).parent / CONFIG_FILE)  # its run's, beside final/
    return {"teacher": teacher, "commit": _root_file(root, "commit"), "command": _root_file(root, "command"),
            "config": {"training": training, "distill": distill}}


def _read_manifest(folder: Path) -> dict:
    path = folder / MANIFEST_FILE
    return json.loads(path.read_text()) if path.is_file() else {"teachers": {}}


def kept_solutions(folder: Path) -> dict[str, str]:
    """The text each kept distill's ``r_ss`` scored: its run's ``data.gsm_solution`` (``worked``, or ``answer`` for
    the answer-only teacher's distill); ``worked``, that setting's default, where the manifest records no config."""
    teachers = _read_manifest(folder)["teachers"]
    return {name: ((entry.get("config") or {}).get("distill") or {}).get("data", {}).get("gsm_solution") or "worked"
            for name, entry in teachers.items()}


def keep(root: Path, out: Path, replace: bool = False, names: dict[str, str] | None = None
         ) -> list[tuple[Path, int, str]]:
    """Keep in ``out`` the explanations the students read (``students_rows``), for the repository: per distill
    ``<name>.jsonl.xz`` of its rows and its entry in ``manifest.json`` (``file``, ``rows``, the ``sha256`` of the
    uncompressed rows and ``_provenance``). A distill kept already with other rows is refused, before anything is
    written, unless ``replace`` (and even then where the new rows cover only some of the kept questions: a partial
    distill in the root narrowed them); one kept with the same rows keeps its file and entry. ``names``: a distill
    of the root kept under another name (``{"rl_s0": "rl_full_s0"}``: a teacher of another part, the 48K RL run,
    beside the kept ``rl_s0``; its entry says ``distill_in_root``). Returns ``(file, rows, "kept" | "already kept" |
    "replaced")`` of each."""
    names = names or {}
    found = students_rows(root)
    unknown = sorted(set(names) - set(found))
    if unknown:
        raise StudyError(f"{root}: no distill {', '.join(unknown)} to keep under another name (it has "
                         f"{', '.join(sorted(found)) or 'none'})")
    lines = {names.get(name, name): rows for name, rows in found.items()}
    in_root = {names.get(name, name): name for name in found}
    plans = []
    for name, mine in lines.items():
        data, path = _text(mine), out / f"{name}{KEPT_SUFFIX}"
        held_rows = lzma.decompress(path.read_bytes()) if path.is_file() else None
        held, digest = None if held_rows is None else _sha256(held_rows), _sha256(data)
        if held not in (None, digest) and not replace:
            raise StudyError(f"{path}: {name} is kept already with other rows (sha256 {held[:12]}, these "
                             f"{digest[:12]}): keep these into another folder, or pass --replace")
        if held not in (None, digest):
            kept_ids = {json.loads(line)["question_id"] for line in held_rows.decode().splitlines() if line.strip()}
            new_ids = {json.loads(line)["question_id"] for line in mine}
            if new_ids < kept_ids:  # fewer questions, all of them kept already: a partial distill narrowed the set
                raise StudyError(f"{path}: --replace would keep {name} on {len(new_ids)} of its {len(kept_ids)} "
                                 f"kept questions: a distill in {root} that explained fewer questions (a partial "
                                 "one) narrows the questions every distill explained; move it out of the root, or "
                                 "keep into another folder")
        state = "kept" if held is None else "already kept" if held == digest else "replaced"
        plans.append((name, data, path, digest, state))
    manifest = _read_manifest(out)
    out.mkdir(parents=True, exist_ok=True)
    for name, data, path, digest, state in plans:
        if state == "already kept" and name in manifest["teachers"]:
            continue
        if state != "already kept":
            write_bytes(path, lzma.compress(data))
        manifest["teachers"][name] = {"file": path.name, "rows": len(lines[name]), "sha256": digest,
                                      **_provenance(root, in_root[name], lines[name]),
                                      **({"distill_in_root": in_root[name]} if in_root[name] != name else {})}
    manifest["teachers"] = dict(sorted(manifest["teachers"].items()))
    write_json(out / MANIFEST_FILE, manifest)
    return [(path, len(lines[name]), state) for name, _, path, _, state in plans]


def read_kept(folder: Path) -> dict[str, list[tuple[str, dict]]]:
    """Each distill ``keep`` kept in ``folder``: ``{name: [(line, row), ...]}``, its file checked against its sha256
    in ``manifest.json``."""
    teachers = _read_manifest(folder)["teachers"]
    if not teachers:
        raise StudyError(f"{folder}: no {MANIFEST_FILE} naming kept explanations (bench/study_fair.py keep <root> "
                         f"--out {folder} writes them)")
    rows = {}
    for name, entry in teachers.items():
        path = folder / entry["file"]
        if not path.is_file():
            raise StudyError(f"{path}: not there, but {MANIFEST_FILE} names it for {name}")
        data = lzma.decompress(path.read_bytes())
        if _sha256(data) != entry["sha256"]:
            raise StudyError(f"{path}: its rows are not the ones kept (sha256 {_sha256(data)[:12]}, "
                             f"{MANIFEST_FILE}: {entry['sha256'][:12]})")
        rows[name] = [(line, json.loads(line)) for line in data.decode().splitlines()]
    return rows


def restore(folder: Path, out: Path) -> list[tuple[Path, int]]:
    """The students' files (``out/<name>.jsonl.gz``, as ``common`` writes them) from the explanations ``keep`` kept
    in ``folder``: each kept file checked against its sha256 in ``manifest.json``, then its rows of the questions
    every kept distill explained (all of them, when they were kept together), byte for byte. Returns ``(file,
    rows)`` of each."""
    rows = read_kept(folder)
    common = _questions_in_all(rows)
    written = []
    for name, pairs in rows.items():
        lines = [line for line, row in pairs if row["question"] in common]
        written.append((_write_students_file(out, name, _text(lines), replace=False), len(lines)))
    return written


def worked_target(lines: list[str]) -> list[str]:
    """The answer-only teacher's rows (``rl_answer_s0``) with the worked solution as its students' target: each
    row's ``solution``, its answer line ("The answer is N."), after the row's steps (``reasoning_trace``), which is the
    worked-solution mapping's ``solution`` (rlt_mono.data.gsm_symbolic), the rest of the row as it was. Its
    students then learn its explanation + the worked solution, as every other taught arm's do, so that the arm
    differs from ``rl_teacher`` in its teacher alone (shown the answer, rewarded on it), not in what the student
    learns to write after the explanation."""
    out = []
    for number, line in enumerate(lines, 1):
        row = json.loads(line)
        if row.get("solution") != f"The answer is {row.get('answer')}." or not row.get("reasoning_trace"):
            raise StudyError(f"row {number}: not an answer-only row (a solution \"The answer is <answer>.\" and "
                             f"its steps in reasoning_trace): {line[:120]}")
        row["solution"] = f"{row['reasoning_trace']}\n{row['solution']}"
        out.append(json.dumps(row, ensure_ascii=False))
    return out


def _kept_digests(explanations: Path) -> dict[str, set[str]]:
    """Per teacher ``keep`` kept in ``explanations``, the sha256 of the rows a student may have read of it: its whole
    file (the manifest's) and its rows of the questions every kept teacher explained (what ``restore`` writes, and
    the questions the summary's common block covers; the same where every teacher explained the same questions)."""
    rows = read_kept(explanations)
    common = _questions_in_all(rows)
    digests = {}
    for name, pairs in rows.items():
        read = [[line for line, _ in pairs], [line for line, row in pairs if row["question"] in common]]
        if name == ANSWER_ONLY_TEACHER:  # its students read its rows with the worked solutions (worked_target)
            read += [worked_target(lines) for lines in read]
        digests[name] = {_sha256(_text(lines)) for lines in read}
    return digests


def check_students_inputs(folder: Path, distilled: Path) -> list[str]:
    """What a students part would read wrongly in ``distilled`` against the explanations kept in ``folder``: a kept
    SFT sample of a seed (``sft_s<seed>``) or the answer-only teacher's rows missing there (bench/study_fair.sh
    would then teach those students from ``sft``, or not at all), or an SFT sample there that is not kept (its
    students would read rows the summary refuses). ``check_distilled`` checks the rows of the files there are."""
    kept = set(_read_manifest(folder)["teachers"])
    there = {path.stem for path in distilled.glob("*.jsonl")}
    wrong = [f"{distilled}: no {name}.jsonl, which {folder} keeps (its students would read other rows): restore "
             f"it with bench/study_fair.py restore {folder} --out <an empty folder>"
             for name in sorted(kept - there) if _SFT_SAMPLE.match(name) or name == ANSWER_ONLY_TEACHER]
    wrong += [f"{distilled / name}.jsonl: an SFT teacher's sample that {folder} does not keep (its students' rows "
              f"could not be checked): keep it (bench/study_fair.py keep) or remove it"
              for name in sorted(there - kept) if _SFT_SAMPLE.match(name)]
    return wrong


def check_distilled(folder: Path, distilled: Path, own: Path | None = None) -> list[str]:
    """What is wrong with the students' and teachers' input files in ``distilled`` (``<name>.jsonl``) against the
    explanations ``keep`` kept in ``folder``: a file named as a kept teacher must hold its kept rows (the whole kept
    file, or the rows ``restore`` writes of it: ``_kept_digests``), or a part would train on other rows (a raw
    distill unpacked there, an earlier part's teacher) or skip a distill it was meant to run. Given ``own`` (a
    teachers part's ``<root>/teachers``), a file that is that root's own distill (``own/distill_<name>/distill.jsonl``
    byte for byte, as the part copies it) is its own output, and passes: the part run again on its root. Files of
    teachers not kept are not checked. One line per file, empty when all is well."""
    digests = _kept_digests(folder)
    wrong = []
    for name in sorted(digests):
        path = distilled / f"{name}.jsonl"
        if not path.is_file():
            continue
        data = _sha256(path.read_bytes())
        written = own / f"distill_{name}" / DISTILL_FILE if own is not None else None
        if written is not None and written.is_file() and _sha256(written.read_bytes()) == data:
            continue
        if data not in digests[name]:
            wrong.append(f"{path} holds other rows than the kept {name} ({folder}): remove it, or write it again with "
                         f"bench/study_fair.py restore {folder} --out <an empty folder>")
    return wrong


def rounded_teachers(folder: Path) -> list[str]:
    """The kept teachers of ``folder`` whose training run trained its full weights in bfloat16 or float16 (its
    config's ``model.dtype`` in the manifest, with no LoRA adapter nor 4-bit base, whose adapters train in
    float32): most of each optimizer step rounded away (docs/STUDY.md, "Steps that round away"), so their
    explanations are not the method's. A teacher whose config was not sent back is not named."""
    names = []
    for name, entry in sorted(_read_manifest(folder)["teachers"].items()):
        model = ((entry.get("config") or {}).get("training") or {}).get("model") or {}
        if (model.get("dtype") in ROUNDING_DTYPES and not model.get("lora_r")
                and not model.get("load_in_4bit")):
            names.append(name)
    return names
