"""The fair study's teachers (bench/study_fair.py ``teachers``, and ``summarize --teachers``): each RL teacher's,
the SFT teacher's and each distill's runs under ``<root>/teachers`` in a few numbers, the common block (the
teachers compared on the questions every distill explained), and the teachers files of several parts read and
merged as one."""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

import numpy as np
from omegaconf import OmegaConf

from rlt_mono.runs.atomic_write import write_json
from rlt_mono.runs.outputs import (
    CONFIG_FILE,
    EVAL_EVENT,
    METRICS_FILE,
    README_FILE,
    SUMMARY_EVENT,
    in_phase_order,
    is_number,
    read_metrics,
)
from study.kept import _common_rows, _questions_in_all, _read_manifest, distill_files, read_kept
from study.layout import DISTILL_FILE, SFT_SUMMARY_FILE, StudyError, _jsonl, below_teachers

logger = logging.getLogger(__name__)

# A distill's teacher that is an RL run's checkpoint (``below_teachers``): rl_s0/rl/checkpoint-30.
_CHECKPOINT_TEACHER = re.compile(r"^(?P<run>[^/]+)/rl/checkpoint-(?P<step>\d+)$")

# The line a distill logs when it ends (rlt_mono.stages.distill): questions written, where, and its phases' seconds.
_DISTILL_DONE = re.compile(r"distill: wrote \d+ questions to .+ \((?P<phases>[^()]*)\)\s*$")
_PHASE_SECONDS = re.compile(r"^phase/(?P<phase>[^/]+)/seconds$")
# The "steps done" line of an RL run's README.md (rlt_mono.runs.readme) when the run saved its trained teacher (it
# finished, or trainer.max_minutes stopped it): it says so where the archive of a run leaves final/ out.
_TEACHER_SAVED = re.compile(r"^\|\s*steps done\s*\|.*the trained teacher is in `final/`", re.MULTILINE)

# The parts of the RLT reward an RL teacher's held-out evaluations log (eval_teacher_reward/<part>,
# rlt_mono.rewards.teacher_kl): reward = r_ss - r_kl + match_penalty (docs/METHOD.md, "The reward").
RLT_PARTS = ("r_ss", "r_kl", "match_penalty")

# What an RL teacher's training steps log, summed up as the mean of its first and last 10 steps: the reward, its
# parts, the share of explanations that never closed (cut at the cap) and the completions' mean length in tokens.
TRAIN_FIGURES = {"reward": "reward", **{part: f"teacher_reward/{part}" for part in RLT_PARTS},
                 "unmatched_frac": "alignment/unmatched_frac", "mean_length": "completions/mean_length"}

# The one teacher every teachers part trains again (from the same data and seed): the only name two part files may
# both hold with other figures.
RETRAINED_TEACHER = "sft"
PROVENANCE_KEYS = ("commit", "device", "command")


def _median(values: list[float]) -> float | None:
    return round(float(np.median(values)), 3) if values else None


def _mean(values: list[float]) -> float | None:
    return round(float(np.mean(values)), 4) if values else None


def _train_means(steps: list[dict], parts: list[list[dict]]) -> dict[str, list[float | None]]:
    """Each TRAIN_FIGURES figure some step logs: its mean over each of ``parts`` (slices of ``steps``)."""
    return {name: [_mean([row[key] for row in part if is_number(row.get(key))]) for part in parts]
            for name, key in TRAIN_FIGURES.items() if any(is_number(row.get(key)) for row in steps)}


def _eval_curve(evals: list[dict], key: str) -> list[list]:
    """``[[step, value], ...]`` of ``key`` over the evaluation rows that log it as a number (4 decimals)."""
    return [[int(row["step"]), round(float(row[key]), 4)] for row in evals if is_number(row.get(key))]


def rl_teacher_summary(folder: Path) -> dict:
    """An RL teacher's run folder (``metrics.jsonl``, ``config.yaml``) in a few numbers: ``seed``,
    ``reward_setting`` (``data.gsm_solution``), optimizer ``steps`` (the end-of-training row's, else the last logged
    step's), ``completions`` trained on (no row logs a count: steps x ``completions_per_step``, which is
    ``per_device_train_batch_size x gradient_accumulation_steps`` of the config, on one GPU), the configured
    ``generation_batch`` (``per_device_train_batch_size x steps_per_generation``; TRL's default for a null
    ``steps_per_generation`` is the accumulation), ``median_seconds_per_step`` of each phase over the logged steps,
    the held-out ``eval_reward_curve`` ``[[step, eval_reward], ...]`` and its parts' (``eval_reward_parts``:
    ``r_ss``, ``r_kl`` and ``match_penalty``, each ``[[step, value], ...]``, RLT_PARTS; they show which part RL
    raised), the mean of the first and the last 10 steps' figures (``first_last_10``, TRAIN_FIGURES) and of each
    10 steps in turn (``by_10_steps``: whether the training reward still rose when the run stopped), the median
    ``step_time`` and the highest device memory any phase logged (``peak_device_gib``), the ``checkpoints`` in the
    folder (``read_teachers`` adds those a distill explained with, whose folders an archive leaves out), the
    configured
    ``max_steps`` and ``stopped_by_time_limit``: fewer steps than ``max_steps`` with ``trainer.max_minutes`` set
    (above 0)."""
    cfg = OmegaConf.load(folder / CONFIG_FILE)
    metrics = folder / METRICS_FILE
    steps, evals = read_metrics(metrics), read_metrics(metrics, EVAL_EVENT)
    ends = read_metrics(metrics, SUMMARY_EVENT)
    optimizer_steps = int(ends[-1]["step"] if ends else max((row["step"] for row in steps), default=0))
    batch, accumulation = cfg.trainer.per_device_train_batch_size, cfg.trainer.gradient_accumulation_steps
    per_step = batch * accumulation
    phases = {match["phase"] for row in steps for key in row if (match := _PHASE_SECONDS.match(key))}
    max_steps, max_minutes = OmegaConf.select(cfg, "trainer.max_steps"), OmegaConf.select(cfg, "trainer.max_minutes")
    stopped = (is_number(max_steps) and optimizer_steps < max_steps and is_number(max_minutes) and max_minutes > 0)
    return {
        "seed": int(cfg.seed), "reward_setting": OmegaConf.select(cfg, "data.gsm_solution"),
        "steps": optimizer_steps, "max_steps": max_steps, "stopped_by_time_limit": bool(stopped),
        "completions": optimizer_steps * per_step, "completions_per_step": per_step,
        "generation_batch": batch * (cfg.trainer.steps_per_generation or accumulation),
        "median_seconds_per_step": {phase: _median([row[f"phase/{phase}/seconds"] for row in steps
                                                    if is_number(row.get(f"phase/{phase}/seconds"))])
                                    for phase in in_phase_order(phases)},
        "median_step_seconds": _median([row["step_time"] for row in steps if is_number(row.get("step_time"))]),
        "peak_device_gib": max((round(float(row[key]), 2) for row in steps for key in row
                                if key.endswith("/device_peak_gib") and is_number(row[key])), default=None),
        "first_last_10": _train_means(steps, [steps[:10], steps[-10:]]),
        "by_10_steps": _train_means(steps, [steps[i:i + 10] for i in range(0, len(steps), 10)]),
        "eval_reward_curve": _eval_curve(evals, "eval_reward"),
        "eval_reward_parts": {part: _eval_curve(evals, f"eval_teacher_reward/{part}") for part in RLT_PARTS},
        "checkpoints": sorted(int(path.name.rsplit("-", 1)[1]) for path in folder.glob("checkpoint-*")
                              if path.name.rsplit("-", 1)[1].isdigit())}


def sft_teacher_summary(folder: Path) -> dict:
    """The SFT teacher's ``sft_summary.json`` in a few numbers: ``steps``, ``rows``, the held-out loss first
    (before training) and best (the lowest measured, at ``best_step``), and its early stopping."""
    summary = json.loads((folder / SFT_SUMMARY_FILE).read_text())
    curve = [point for point in summary.get("heldout_curve") or [] if is_number(point.get("eval_loss"))]
    first = summary.get("heldout_loss_before")
    if first is None and curve:
        first = curve[0]["eval_loss"]
    best = min(curve, key=lambda point: point["eval_loss"]) if curve else None
    return {"steps": summary.get("steps"), "rows": summary.get("rows"),
            "heldout_loss_first": None if first is None else round(float(first), 4),
            "heldout_loss_best": None if best is None else round(float(best["eval_loss"]), 4),
            "best_step": None if best is None else best["step"], "early_stopping": summary.get("early_stopping")}


def distill_summary(folder: Path, phases: str | None) -> dict:
    """A distill's folder (``distill.jsonl``, ``config.yaml``) and the phases of its end line (``phases``, as
    logged: ``phase/generate/seconds 4.7, ...``; those of its last run when it was resumed; None when it never
    ended): its ``teacher`` (from below the last ``teachers/`` of its path, the same wherever the study ran:
    ``below_teachers``), ``reward_setting``, ``rows``, the mean kept
    ``total`` reward and its parts, whether it is ``complete`` (it logged its end line; else its rows are the
    questions it explained before it stopped) and its phases' ``seconds`` (none when not complete)."""
    cfg = OmegaConf.load(folder / CONFIG_FILE)
    rows = _jsonl(folder / DISTILL_FILE)
    seconds = dict(part.rsplit(" ", 1) for part in (phases or "").split(", ") if part)
    return {"teacher": below_teachers(str(cfg.model.model_name_or_path)),
            "reward_setting": OmegaConf.select(cfg, "data.gsm_solution"), "rows": len(rows),
            **{f"mean_{part}": _mean([row[part] for row in rows if is_number(row.get(part))])
               for part in ("total", "r_ss", "r_kl")},
            "complete": phases is not None,
            "seconds": {match["phase"]: float(value) for key, value in seconds.items()
                        if (match := _PHASE_SECONDS.match(key))}}


def _distill_end(log: Path) -> str | None:
    """The phases of the last end line a distill's log holds; None when it never ended."""
    lines = log.read_text().splitlines() if log.is_file() else []
    ends = [match["phases"] for line in lines if (match := _DISTILL_DONE.search(line))]
    return ends[-1] if ends else None


def rl_teacher_saved(run: Path) -> bool:
    """Whether an RL run folder holds its trained teacher: its ``final/``, or (where ``final/`` was left out of an
    archive) its README.md's "steps done" line saying the trained teacher is in ``final/``."""
    readme = run / README_FILE
    return (run / "final").is_dir() or (readme.is_file() and _TEACHER_SAVED.search(readme.read_text()) is not None)


def read_teachers(root: Path) -> dict[str, dict[str, dict]]:
    """``{"teachers": {name: summary}, "distills": {name: summary}}`` of the runs under ``<root>/teachers``: an
    SFT teacher with its ``sft_summary.json``, an RL teacher that saved its trained teacher (``rl_teacher_saved``;
    one stopped by ``trainer.max_minutes`` counts), every distill with its ``distill.jsonl`` (one whose log in
    ``<root>/logs`` has no end line is kept with ``complete`` false, with a warning). A teacher not finished is
    left out with a warning."""
    folder = root / "teachers"
    if not folder.is_dir():
        raise StudyError(f"no teachers/ under {root}: pass the root the teachers part of bench/study_fair.sh wrote")
    found: dict[str, dict[str, dict]] = {"teachers": {}, "distills": {}}
    sft = folder / "sft"
    if (sft / SFT_SUMMARY_FILE).is_file():
        found["teachers"]["sft"] = sft_teacher_summary(sft)
    elif sft.is_dir():
        logger.warning("%s: no %s (not finished): left out", sft, SFT_SUMMARY_FILE)
    for run in sorted(folder.glob("*/rl")):
        if rl_teacher_saved(run):
            found["teachers"][run.parent.name] = rl_teacher_summary(run)
        else:
            logger.warning("%s: no final/ and its %s does not say the trained teacher is in final/ (not finished): "
                           "left out", run, README_FILE)
    for run in sorted(folder.glob("distill_*")):
        name, log = run.name.removeprefix("distill_"), root / "logs" / f"{run.name}.log"
        if not (run / DISTILL_FILE).is_file():
            logger.warning("%s: no %s (not started): left out", run, DISTILL_FILE)
            continue
        phases = _distill_end(log)
        found["distills"][name] = distill_summary(run, phases)
        if phases is None:
            logger.warning("%s: not finished (no end line in %s): kept as partial (%d rows)", run, log,
                           found["distills"][name]["rows"])
    for distill in found["distills"].values():  # a checkpoint that explained: its folder is not sent back
        match = _CHECKPOINT_TEACHER.match(distill["teacher"])
        if match and match["run"] in found["teachers"]:
            run = found["teachers"][match["run"]]
            run["checkpoints"] = sorted({*run["checkpoints"], int(match["step"])})
    if not found["teachers"] and not found["distills"]:
        raise StudyError(f"{folder}: no finished teacher or distill yet")
    return found


def _share(values: list[bool]) -> float | None:
    return round(float(np.mean(values)), 4) if values else None


def common_block(root: Path) -> dict | None:
    """The questions every distill under ``root`` explained (``distill_files``), their distinct ``templates`` and
    per distill, over its kept explanations of them: the mean ``total`` reward and its parts, the share
    ``matched``, the share with ``wrong_equations`` above 0 and the mean explanation length in characters. None
    when no question is common to them all."""
    rows, common = _common_rows(root)
    return rows_common_block(rows, common)


def rows_common_block(rows: dict[str, list[tuple[str, dict]]], common: set[str]) -> dict | None:
    """``common_block`` of ``rows`` (``{name: [(line, row), ...]}``) over the questions ``common``."""
    if not common:
        return None
    kept = {name: [row for _, row in pairs if row["question"] in common] for name, pairs in rows.items()}
    templates = {json.dumps(row.get("template")) for pairs in kept.values() for row in pairs}
    return {"questions": len(common), "templates": len(templates), "distills": {name: {
        **{f"mean_{part}": _mean([row[part] for row in mine if is_number(row.get(part))])
           for part in ("total", "r_ss", "r_kl")},
        "matched_frac": _share([bool(row["matched"]) for row in mine if isinstance(row.get("matched"), bool)]),
        "wrong_equations_frac": _share([row["wrong_equations"] > 0 for row in mine
                                        if is_number(row.get("wrong_equations"))]),
        "mean_explanation_chars": _mean([len(row["explanation"]) for row in mine
                                         if isinstance(row.get("explanation"), str)])}
        for name, mine in kept.items()}}


def _figures(entry: dict, where: dict) -> str:
    return json.dumps({key: value for key, value in entry.items() if key not in where}, sort_keys=True)


def write_teachers(root: Path, out: Path, where: dict) -> tuple[list[str], list[str], dict | None]:
    """``out``: the teachers file with the finished teachers and distills of ``root`` (each with ``where``) added
    to what it held, and, where ``root`` has distills, its ``common`` block (``common_block``) in place of the one
    the file held (none when no question is common to them all); returns ``(added, already there, common)``, as
    ``teacher <name>`` / ``distill <name>``. A teacher or distill already in the file with other figures is
    refused: one is added once."""
    found = read_teachers(root)
    common = common_block(root) if distill_files(root) else None
    try:
        merged = json.loads(out.read_text()) if out.is_file() else {"teachers": {}, "distills": {}}
    except json.JSONDecodeError as err:
        raise StudyError(f"{out}: not a teachers file ({err.msg}); pass another --out") from err
    added, kept = [], []
    for kind, entries in found.items():
        held = merged.setdefault(kind, {})
        for name, entry in entries.items():
            entry = json.loads(json.dumps({**entry, **where}))
            label = f"{kind[:-1]} {name}"
            if name not in held:
                held[name] = entry
                added.append(label)
            elif _figures(held[name], where) == _figures(entry, where):
                kept.append(label)
            else:
                raise StudyError(f"{out} has {label} already, from commit {held[name].get('commit', '?')} on "
                                 f"{held[name].get('device', '?')}, with other figures: one is added once (delete "
                                 "its entry to replace it)")
        merged[kind] = dict(sorted(held.items()))
    if distill_files(root):
        merged.pop("common", None)
        if common is None:
            logger.warning("%s: no question every distill explained: no common block", root)
        else:
            merged["common"] = common
    out.parent.mkdir(parents=True, exist_ok=True)
    write_json(out, merged, indent=1)
    return added, kept, common


def read_teachers_file(path: Path | None) -> dict | None:
    """The teachers file ``write_teachers`` writes; None for no path."""
    if path is None:
        return None
    if not path.is_file():
        raise StudyError(f"--teachers {path}: no such file (bench/study_fair.py teachers <root> --out {path} "
                         "writes it)")
    try:
        teachers = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise StudyError(f"--teachers {path}: not JSON ({err.msg})") from err
    if not isinstance(teachers, dict) or not isinstance(teachers.get("teachers"), dict):
        raise StudyError(f"--teachers {path}: no \"teachers\" entry; pass the file bench/study_fair.py teachers "
                         "wrote")
    return teachers


def read_teachers_files(paths: list[Path], explanations: Path | None = None) -> dict | None:
    """The teachers files of several parts, in the order given, as one (``read_teachers_file`` each): their
    teachers and distills. RETRAINED_TEACHER, which every part trains and distils again, is taken from the later
    file (a warning says so); any other name two files hold must read the same there (a teacher is added once).
    The common block is computed from ``explanations`` (``keep``'s folder: the rows the students read, the
    questions every kept teacher explained) where given, with a warning where a kept teacher's commit is not the
    merged distill's; else it is the block of the last file that has one. None for no file."""
    if not paths:
        if explanations is not None:
            raise StudyError("--explanations needs --teachers: the teachers files it gives a common block")
        return None
    merged: dict = {"teachers": {}, "distills": {}}
    where = dict.fromkeys(PROVENANCE_KEYS)
    for path in paths:
        one = read_teachers_file(path)
        for kind in ("teachers", "distills"):
            for name, entry in one.get(kind, {}).items():
                held = merged[kind].get(name)
                if held is not None and _figures(held, where) != _figures(entry, where):
                    if name != RETRAINED_TEACHER:
                        raise StudyError(f"--teachers: {kind[:-1]} {name} is in two files with other figures (the "
                                         f"later: {path}): only {RETRAINED_TEACHER} is trained again by each part")
                    logger.warning("%s %s: taken from %s, the later part", kind[:-1], name, path)
                merged[kind][name] = entry
        if one.get("common"):
            merged["common"] = one["common"]
    if explanations is not None:
        rows = read_kept(explanations)
        common = rows_common_block(rows, _questions_in_all(rows))
        if common is None:
            raise StudyError(f"--explanations {explanations}: no question every kept teacher explained")
        merged["common"] = {**common, "from": str(explanations)}
        for name, entry in _read_manifest(explanations)["teachers"].items():
            distill = merged["distills"].get(name, {})
            if entry.get("commit") and distill.get("commit") and entry["commit"] != distill["commit"]:
                logger.warning("%s: kept at commit %s, but the teachers files' distill %s is from %s: its figures "
                               "are not the kept rows'", explanations, entry["commit"], name, distill["commit"])
    return merged


def tagged_teachers(paths: list[Path], tags: str) -> dict:
    """The teachers of several files for a plot, each file's named ``<name> <tag>`` (tags in the files' order): two
    runs of one seed (in bfloat16 and in float32, say), which ``read_teachers_files`` refuses to merge, side by
    side."""
    labels = [tag.strip() for tag in tags.split(",")]
    if len(labels) != len(paths) or not all(labels) or len(set(labels)) != len(labels):
        raise StudyError(f"--tags {tags}: one distinct label per teachers file ({len(paths)} given)")
    return {"teachers": {f"{name} {tag}": entry for path, tag in zip(paths, labels, strict=True)
                         for name, entry in read_teachers_file(path)["teachers"].items()}}
