"""The fair study's names (bench/study_fair.py): its held-out sets, its arms in table order and the teacher whose rows
each taught arm reads, the files a study root holds, the error a user must fix, and the small readers every part of
the study shares (JSON lines, a root's commit and command, a run's config, sha256s)."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

from omegaconf import OmegaConf

from rlt_mono.read_source import module_constant

SETS = {"instances": "held_out_instances", "templates": "held_out_templates"}
SHORT_SETS = {name[0]: name for name in SETS}  # export writes each row's set as its first letter

# The study table's arm order: these first, then rl_teacher_step<N> by N, then any other arm by name.
ARM_ORDER = ("untrained", "untrained_plain", "worked", "worked_common", "traces", "sft_teacher", "rl_teacher",
             "rl_teacher_full", "rl_teacher_answer_only")
_STEP_ARM = re.compile(r"^rl_teacher_step(?P<step>\d+)$")
# The SFT teacher's explanations sampled with distill seed s (bench/study_fair.sh's STUDY_SFT_SEEDS), which its
# students of seed s read: the distill's name, and how to know one.
SFT_SAMPLE = "sft_s{seed}"
_SFT_SAMPLE = re.compile(r"^sft_s\d+$")

ANSWER_ONLY_TEACHER = "rl_answer_s0"  # the answer-only reward's RL teacher, which rl_teacher_answer_only reads

# What the teachers part of bench/study_fair.sh leaves under <root>/teachers: the SFT teacher's folder, each RL
# teacher's run folder teachers/<name>/rl (rl_s<seed>, rl_answer_s<seed>), each distill's folder and its log.
SFT_SUMMARY_FILE = module_constant("rlt_mono.stages.sft", "SUMMARY_FILE")
DISTILL_FILE = module_constant("rlt_mono.stages.distill", "DISTILL_FILE")

# Where the teachers part leaves each distill's rows: teachers/distill_<name>/distill.jsonl, copied to
# distilled/<name>.jsonl (the file read when the first is not there).
DISTILLED_FOLDER = "distilled"
TEACHERS_FILE = "teachers.json"
# The students' files (common, restore) and the repository's copy of them (keep): per distill <name>.jsonl.gz,
# <name>.jsonl.xz and one manifest.json.
STUDENTS_SUFFIX, KEPT_SUFFIX, MANIFEST_FILE = ".jsonl.gz", ".jsonl.xz", "manifest.json"


class StudyError(ValueError):
    """What the user must fix: one line."""


def arm_rank(arm: str) -> tuple:
    """An arm's place in the study table: ``ARM_ORDER``, then rl_teacher_step<N> by N, then the rest by name."""
    if arm in ARM_ORDER:
        return (ARM_ORDER.index(arm), 0, "")
    if match := _STEP_ARM.match(arm):
        return (len(ARM_ORDER), int(match["step"]), "")
    return (len(ARM_ORDER) + 1, 0, arm)


def _arm_distill(arm: str, seed: int, distills: frozenset[str] | set[str] = frozenset()) -> tuple[str, str] | None:
    """``(teacher, distill)`` of a taught arm's students of ``seed``: sft_teacher -> sft, distill sft_s<seed> where
    ``distills`` (the distills there are) has it (the SFT teacher's sample with that seed: bench/study_fair.sh's
    STUDY_SFT_SEEDS), else sft; rl_teacher -> rl_s<seed>; rl_teacher_full -> rl_full_s<seed>; rl_teacher_step<N> ->
    rl_s0's checkpoint N, distill rl_step<N>; None for an arm no teacher taught."""
    if arm == "sft_teacher":
        sample = SFT_SAMPLE.format(seed=seed)
        return "sft", sample if seed != 0 and sample in distills else "sft"
    if arm == "rl_teacher":
        return f"rl_s{seed}", f"rl_s{seed}"
    if arm == "rl_teacher_full":  # the RL teacher trained the study's whole 48K completions (docs/STUDY.md)
        return f"rl_full_s{seed}", f"rl_full_s{seed}"
    if match := _STEP_ARM.match(arm):
        return "rl_s0", f"rl_step{match['step']}"
    return None


def _kept_teacher(arm: str, seed: int, distills: frozenset[str] | set[str] = frozenset()) -> str | None:
    """The kept teacher (``keep``'s name) whose rows a taught arm's students of ``seed`` read: the distill
    ``_arm_distill`` names, and for the two arms that are no correlation point, worked_common (its questions' worked
    solutions) -> sft and rl_teacher_answer_only -> rl_answer_s0; None for an arm that reads no teacher's rows."""
    if arm == "worked_common":
        return "sft"
    if arm == "rl_teacher_answer_only":
        return ANSWER_ONLY_TEACHER
    named = _arm_distill(arm, seed, distills)
    return None if named is None else named[1]


def _question_id(question: str) -> str:
    return hashlib.sha256(" ".join(question.split()).encode()).hexdigest()[:12]


def _jsonl_lines(path: Path) -> list[tuple[str, dict]]:
    """``(line, row)`` of each non-empty line of a JSON-lines file."""
    pairs = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            pairs.append((line, json.loads(line)))
        except json.JSONDecodeError as err:
            raise StudyError(f"{path}, line {number}: not a JSON row ({err.msg})") from err
    return pairs


def _jsonl(path: Path) -> list[dict]:
    return [row for _, row in _jsonl_lines(path)]


def _text(lines: list[str]) -> bytes:
    return "".join(line + "\n" for line in lines).encode()


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _root_file(root: Path, name: str) -> str | None:
    """The text of ``root/<name>`` (the commit or command a study was started with), or None."""
    path = root / name
    text = path.read_text().strip() if path.is_file() else ""
    return text or None


def _config(path: Path) -> dict | None:
    return OmegaConf.to_container(OmegaConf.load(path)) if path.is_file() else None


def below_teachers(teacher: str) -> str:
    """A teacher's path as the host named it (``<study>/teachers/rl_s0/rl/final``) from below its last
    ``teachers/`` (``rl_s0/rl/final``), the same on every host; a path without one as it is."""
    parts = Path(teacher).parts
    if "teachers" not in parts:
        return teacher
    return "/".join(parts[len(parts) - parts[::-1].index("teachers"):])
