"""The whole RLT method in one command (``stage: pipeline``): teacher SFT -> RL -> distill -> student SFT -> eval.

Each stage is its own run config (``pipeline.<stage>.config``) launched in its own process, exactly as
``./launch_mono.sh <config>`` would launch it, so a stage gets the whole GPU and gives all of it back (vLLM
included) when it ends. The pipeline adds only the wiring between stages, as overrides after the stage's own:

    teacher_sft   output_dir=<root>/1_teacher_sft
    teacher_rlt   output_dir=<root>/2_teacher_rlt  model.model_name_or_path=<root>/1_teacher_sft/final
    distill       output_dir=<root>/3_distill      model.model_name_or_path=<root>/2_teacher_rlt/final
    student_sft   output_dir=<root>/4_student_sft  data=custom data.source=<root>/3_distill/distill.jsonl
                  sft.explanation_column=explanation
    eval_teacher  output_dir=<root>/5_eval_teacher model.model_name_or_path=<root>/2_teacher_rlt/final
                  (the student stays the frozen one the RL reward used: the teacher's held-out reward)
    eval_student  output_dir=<root>/6_eval_student model.model_name_or_path=null
                  student.model_name_or_path=<root>/4_student_sft/final   (the distilled student's accuracy)

with ``<group>.gguf_file=null`` beside each trained folder, and ``data.on_bad_row=skip`` for student SFT (a
distilled explanation can be empty).

``steps=[...]`` (``+steps=[...]`` where the config has no ``steps`` key) launches only the named steps and
leaves the others as they are, their outputs read where a later step needs them.

``study: true`` adds the controls that say whether RL made the teacher better (the "Does it teach?" study):

    distill_sft_teacher      the SFT-only teacher (1_teacher_sft) explains the same rows as distill
    student_sft_sft_teacher  the student trained on those explanations
    student_sft_raw_traces   the student trained on the same rows' own reasoning traces (3_distill's rows carry them)
    eval_sft_teacher         the SFT-only teacher scored on the held-out questions, like eval_teacher
    eval_student_sft_teacher, eval_student_raw_traces   the two control students' held-out accuracy

and writes ``study.json`` / ``study_table.md``: each figure per arm with its bootstrap interval, and the paired
differences RL - SFT teacher and between students, over the same held-out questions
(``rlt_mono.study.paired_difference``). Run it again with ``output_dir=<root>`` to continue: a stage whose output
exists (``final/``, ``eval.json``) is skipped, a training stage with a complete checkpoint resumes from it, and
distill skips the rows it wrote.

    ./launch_mono.sh cfgs/run_cfg/pipeline_tiny.yaml                      # CPU, embedded pair
    ./launch_mono.sh cfgs/run_cfg/pipeline_tiny.yaml output_dir=outputs/pipeline_tiny/<time>   # continue
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from rlt_mono import checkpoints
from rlt_mono.config import ConfigError, compose
from rlt_mono.errors import UserError

logger = logging.getLogger(__name__)

ORDER = ("teacher_sft", "teacher_rlt", "distill", "student_sft", "eval")
# The eval config runs twice: the RL teacher scored by the frozen student the RL reward used (its reward, r_ss,
# r_kl, unmatched fraction, solution log-prob), then the distilled student alone (its held-out accuracy).
STEPS = (*ORDER[:-1], "eval_teacher", "eval_student")
# With ``study: true``, the controls (module docstring), after the main steps so their folders keep their numbers.
STUDY_STEPS = ("distill_sft_teacher", "student_sft_sft_teacher", "student_sft_raw_traces", "eval_sft_teacher",
               "eval_student_sft_teacher", "eval_student_raw_traces")
SUMMARY_FILE = "pipeline.json"
# The two evaluations side by side: the RL teacher (scored by the frozen student; the frozen student's accuracy)
# and the distilled student's accuracy.
TABLE_FILE = "eval_table.md"
DISTILL_FILE = "distill.jsonl"  # rlt_mono.distill.DISTILL_FILE (not imported: it pulls in torch)


@dataclass(frozen=True)
class StagePlan:
    """One stage of a pipeline run: its run config, every override (its own, then the wiring) and its folder."""

    stage: str
    config: str
    overrides: tuple[str, ...]
    folder: Path


def plan(cfg: DictConfig, root: Path) -> list[StagePlan]:
    """The five stages with their wiring; each stage config is composed now, so a mistake in any of them
    stops the pipeline before the first stage runs."""
    stages = cfg.pipeline
    unknown = sorted(set(stages) - set(ORDER))
    if unknown:
        raise ConfigError(f"pipeline: unknown stages {unknown}; the stages are {list(ORDER)}")
    # Numbered in the order of STEPS then STUDY_STEPS (a study's main folders are named as without it).
    folders = {step: root / f"{i}_{step}" for i, step in enumerate((*STEPS, *STUDY_STEPS), start=1)}
    def load(group: str, folder: Path) -> list[str]:  # a trained folder replaces the group's model (and GGUF)
        return [f"{group}.model_name_or_path={folder / 'final'}", f"{group}.gguf_file=null"]

    def student_sft_on(distilled: str, column: str) -> list[str]:
        return ["data=custom", f"data.source={folders[distilled] / DISTILL_FILE}", "data.on_bad_row=skip",
                f"sft.explanation_column={column}"]

    def student_alone(trained: str) -> list[str]:
        return ["model.model_name_or_path=null", "model.gguf_file=null", *load("student", folders[trained])]

    wiring = {
        "teacher_sft": [],
        "teacher_rlt": load("model", folders["teacher_sft"]),
        "distill": load("model", folders["teacher_rlt"]),
        "student_sft": student_sft_on("distill", "explanation"),
        "eval_teacher": load("model", folders["teacher_rlt"]),
        "eval_student": student_alone("student_sft"),
        # the study's controls
        "distill_sft_teacher": load("model", folders["teacher_sft"]),
        "student_sft_sft_teacher": student_sft_on("distill_sft_teacher", "explanation"),
        "student_sft_raw_traces": student_sft_on("distill", "reasoning_trace"),
        "eval_sft_teacher": load("model", folders["teacher_sft"]),
        "eval_student_sft_teacher": student_alone("student_sft_sft_teacher"),
        "eval_student_raw_traces": student_alone("student_sft_raw_traces"),
    }
    for stage in ORDER:
        if stage not in stages:
            raise ConfigError(f"pipeline.{stage} is missing: give its run config (pipeline.{stage}.config=<name>)")
    plans = []
    for step in steps_of(cfg):
        stage = stage_of(step)
        own = [str(o) for o in stages[stage].get("overrides") or []]
        overrides = (*own, f"seed={cfg.seed}", f"output_dir={folders[step]}", *wiring[step])
        composed = compose(stages[stage].config, list(overrides))
        if composed.get("stage") != stage:
            raise ConfigError(f"pipeline.{stage}.config={stages[stage].config} runs stage "
                              f"{composed.get('stage')!r}, not {stage!r}")
        plans.append(StagePlan(step, str(stages[stage].config), overrides, folders[step]))
    return plans


def steps_of(cfg: DictConfig) -> tuple[str, ...]:
    """The steps a pipeline config runs: ``STEPS``, then ``STUDY_STEPS`` with ``study: true``."""
    return (*STEPS, *STUDY_STEPS) if cfg.get("study", False) else STEPS


def stage_of(step: str) -> str:
    """The stage (``ORDER``) whose run config a step launches, e.g. ``student_sft_raw_traces`` -> ``student_sft``."""
    return next(stage for stage in ORDER if step.startswith(stage))


def selected_steps(cfg: DictConfig, steps: list[str]) -> set[str]:
    """The steps this run may launch: ``steps`` (a list of step names, e.g. to finish a study's controls with the
    main steps' outputs already in place), or all of them when it is unset."""
    chosen = cfg.get("steps")
    if chosen is None:
        return set(steps)
    unknown = sorted(set(chosen) - set(steps))
    if unknown:
        raise ConfigError(f"steps: unknown steps {unknown}; this pipeline's steps are {steps}")
    return set(chosen)


def stage_done(plan_: StagePlan) -> bool:
    """Whether a stage's output is complete (distill is never 'done': rerunning it skips rows it wrote)."""
    if stage_of(plan_.stage) == "eval":
        return (plan_.folder / "eval.json").is_file()
    if stage_of(plan_.stage) == "distill":
        return False
    return (plan_.folder / "final" / "config.json").is_file()


def resume_overrides(plan_: StagePlan) -> list[str]:
    """A training stage whose folder holds a complete checkpoint continues from it."""
    if stage_of(plan_.stage) in ("distill", "eval") or not plan_.folder.is_dir():
        return []
    try:
        checkpoints.newest_complete_checkpoint(plan_.folder)
    except checkpoints.CheckpointError:
        if checkpoints.previous_run_files(plan_.folder):  # started, no checkpoint yet: start the stage again
            aside = plan_.folder.with_name(f"{plan_.folder.name}.incomplete-{time.strftime('%Y%m%d-%H%M%S')}")
            plan_.folder.rename(aside)
            logger.warning("%s stopped before its first checkpoint; moved aside to %s", plan_.folder, aside)
        return []
    return ["resume_from_checkpoint=true"]


def run_pipeline(cfg: DictConfig) -> Path:
    """Run (or continue) every stage in order; returns the pipeline folder (``pipeline.json`` sums it up)."""
    root = Path(cfg.output_dir) if cfg.output_dir else checkpoints.new_run_dir(cfg.run_dir)
    root.mkdir(parents=True, exist_ok=True)
    plans = plan(cfg, root)
    selected = selected_steps(cfg, [p.stage for p in plans])
    OmegaConf.save(cfg, root / "config.yaml", resolve=True)
    summary_path = root / SUMMARY_FILE  # a continued pipeline keeps the timings of the stages it skips
    summary = json.loads(summary_path.read_text()) if summary_path.is_file() else {"stages": {}}
    for i, stage in enumerate(plans, start=1):
        if stage.stage not in selected:
            logger.info("[%d/%d] %s: not in steps=%s, left as it is", i, len(plans), stage.stage, sorted(selected))
            continue
        if stage_done(stage):
            logger.info("[%d/%d] %s: done already (%s), skipped", i, len(plans), stage.stage, stage.folder)
            summary["stages"].setdefault(stage.stage, {"folder": str(stage.folder)})
            continue
        overrides = [*stage.overrides, *resume_overrides(stage)]
        logger.info("[%d/%d] %s: ./launch_mono.sh %s %s", i, len(plans), stage.stage, stage.config,
                    " ".join(overrides))
        start = time.perf_counter()
        code = subprocess.run([sys.executable, "-m", "rlt_mono.train", stage.config, *overrides],
                              env=os.environ.copy(), check=False).returncode
        seconds = time.perf_counter() - start
        if code != 0:
            raise UserError(f"pipeline stage {stage.stage} failed (exit {code}, message above); fix it and run the "
                            f"same command with output_dir={root} to continue from this stage")
        summary["stages"][stage.stage] = {"folder": str(stage.folder), "seconds": round(seconds, 1)}
        summary_path.write_text(json.dumps(summary, indent=1))
    from rlt_mono.evaluate import compare_table

    folders = {p.stage: p.folder for p in plans}
    evals = [folders[step] / "eval.json" for step in ("eval_teacher", "eval_student")]
    if not all(path.is_file() for path in evals):  # steps=[...] stopped before the evaluations
        logger.info("pipeline done: %s (no %s: eval_teacher and eval_student have not both run)", root, TABLE_FILE)
        return root
    table = compare_table(evals)
    (root / TABLE_FILE).write_text(table + "\n")
    logger.info("pipeline done: %s\n%s", root, table)
    if cfg.get("study", False):
        from rlt_mono.study import write_study

        logger.info("study:\n%s", write_study(root, folders, seed=cfg.seed))
    return root
