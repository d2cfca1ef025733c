"""The whole RLT method in one command (``stage: pipeline``): teacher SFT -> RL -> distill -> student SFT -> eval.

Each stage is its own run config (``pipeline.<stage>.config``) launched in its own process, exactly as
``./launch_mono.sh <config>`` would launch it, so a stage gets the whole GPU and gives all of it back (vLLM
included) when it ends. The pipeline adds only the wiring between stages, as overrides after the stage's own:

    teacher_sft   output_dir=1_teacher_sft
    teacher_rlt   output_dir=2_teacher_rlt  model.model_name_or_path=1_teacher_sft/final
    distill       output_dir=3_distill      model.model_name_or_path=2_teacher_rlt/final
    student_sft   output_dir=4_student_sft  data=custom data.source=3_distill/distill.jsonl
                  sft.explanation_column=explanation
    eval_teacher  output_dir=5_eval_teacher model.model_name_or_path=2_teacher_rlt/final
                  (the student stays the frozen one the RL reward used: the teacher's held-out reward)
    eval_student  output_dir=6_eval_student model.model_name_or_path=null
                  student.model_name_or_path=4_student_sft/final   (the distilled student's accuracy)

with ``<group>.gguf_file=null`` beside each trained folder, and ``data.on_bad_row=skip`` for student SFT (a
distilled explanation can be empty). These keys (and ``seed``, the pipeline's own) are the pipeline's: a stage's
own override of one, which the wiring after it would silently replace, stops the pipeline with one line naming the
key (``check_not_wired``).

Each stage runs in the pipeline folder (``run_stage``), and these paths are relative to it: so is everything a
stage records (its ``config.yaml``, distill's ``teacher`` field, ``eval.json``, a trainer's best checkpoint), and a
pipeline folder copied or moved elsewhere continues as it would have in place. A ``model_name_or_path`` or
``data.source`` given to a stage that names a file or folder relative to where the pipeline was launched is handed
on absolute (``launch_relative``).

A ``data=<option>`` (or ``data.<key>=...``) given to the pipeline reaches every stage that reads the dataset
(teacher SFT, RL, distill, eval): its keys that differ from ``rlt_mono.data.rows.DataConfig``'s defaults go first in
those stages' overrides, so a stage's own ``data.*`` overrides (e.g. ``data.max_rows``) still apply.

Before the first stage runs, every step's composed config goes through its stage's ``check``
(``rlt_mono.stages.base.Stage``; distill's and eval's options and reward): a wrong option of the last step stops
the pipeline at once, naming the step, instead of after the stages before it.

The pipeline's own settings are root keys of ``cfgs/train.yaml`` (``rlt_mono.stages.pipeline_steps.PipelineOptions``):

``keep_checkpoints=false`` deletes a training stage's checkpoints once its ``final/`` is written, and those of
the steps found finished when a pipeline continues (``drop_checkpoints``), for a disk that cannot hold every
stage's optimizer states.

``steps=[...]`` launches only the named steps and leaves the others as they are, their outputs read where a later
step needs them.

``+pipeline.<stage>.extra_overrides=[...]`` adds overrides after the stage's own ``overrides`` without restating
them (a command line cannot append to a list), e.g. ``"+pipeline.distill.extra_overrides=['distill.selection=
best_correct']"`` (Hydra's grammar wants each quoted): bench/study_gsm.sh distils the same teachers a second way.

``study=true`` adds the controls that say whether RL made the teacher better (the "Does it teach?" study):

    distill_sft_teacher      the SFT-only teacher (1_teacher_sft) explains the same rows as distill
    student_sft_sft_teacher  the student trained on those explanations
    student_sft_raw_traces   the student trained on the same rows' own reasoning traces (the distilled rows carry
                             them; read from distill_sft_teacher's, so the controls do not wait for RL)
    eval_sft_teacher         the SFT-only teacher scored on the held-out questions, like eval_teacher
    eval_student_sft_teacher, eval_student_raw_traces   the two control students' held-out accuracy

and writes ``study.json`` / ``study_table.md``: each figure per arm with its bootstrap interval, and the paired
differences RL - SFT teacher and between students, over the same held-out questions
(``rlt_mono.study.aggregate.paired_difference``). Run it again with ``output_dir=<root>`` to continue: a stage whose
output exists (``final/``, ``eval.json``) is skipped, a training stage with a complete checkpoint resumes from it, and
distill skips the rows it wrote.

What a continued pipeline trusts: ``pipeline.json`` records each step's resolved config as it launched it (paths
inside the pipeline folder relative to it, so a moved folder still compares equal). A step whose recorded config
(or, without a record, its folder's ``config.yaml``) differs from the one it would run now stops the pipeline with
the changed keys named, before the pipeline's ``config.yaml`` is written; ``rerun_changed=true`` moves that step's
folder aside (``<folder>.changed-<time>``) and runs it again, and so every later step that reads it. A folder
that holds another kind of run is refused. Each stage runs in its own process group and dies with the pipeline
(``run_stage``): a killed pipeline leaves no stage writing beside its rerun.

    ./launch_mono.sh cfgs/run_cfg/pipeline_tiny.yaml                      # CPU, embedded pair
    ./launch_mono.sh cfgs/run_cfg/pipeline_tiny.yaml output_dir=outputs/pipeline_tiny/<time>   # continue
"""

from __future__ import annotations

import ctypes
import dataclasses
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from rlt_mono.config import ConfigError, compose, override_key
from rlt_mono.data.rows import DataConfig
from rlt_mono.errors import UserError
from rlt_mono.runs import checkpoints
from rlt_mono.runs.atomic_write import write_json, write_text
from rlt_mono.runs.outputs import write_run_config
from rlt_mono.stages import distill, student_sft, teacher_rlt, teacher_sft
from rlt_mono.stages import eval as evaluate
from rlt_mono.stages.base import Stage
from rlt_mono.stages.distill import DISTILL_FILE
from rlt_mono.stages.eval_compare import compare_table
from rlt_mono.stages.pipeline_steps import (
    ORDER,
    STEP_FOLDER_NAMES,
    PipelineOptions,
    override_value,
    pipeline_options,
)

logger = logging.getLogger(__name__)

# The stages a pipeline runs, by name, in ORDER.
PIPELINE_STAGES = {stage.name: stage for stage in (teacher_sft.STAGE, teacher_rlt.STAGE, distill.STAGE,
                                                   student_sft.STAGE, evaluate.STAGE)}
SUMMARY_FILE = "pipeline.json"
# The two evaluations side by side: the RL teacher (scored by the frozen student; the frozen student's accuracy)
# and the distilled student's accuracy.
TABLE_FILE = "eval_table.md"
# Keys that differ between two launches of one step without changing what it runs: the new-folder time, the
# folder itself (the pipeline names it) and the resume the pipeline adds.
UNCOMPARED = ("run_dir", "output_dir", "resume_from_checkpoint")
# Linux prctl(2) option: the signal a process gets when its parent dies.
PR_SET_PDEATHSIG = 1
# The keys of a stage config that may name a local file or folder, read from where the stage runs.
LOCAL_PATH_KEYS = ("model.model_name_or_path", "student.model_name_or_path", "data.source")
# The folder that holds the rlt_mono package: a stage, run in the pipeline folder, imports the same rlt_mono.
PACKAGE_PARENT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class StagePlan:
    """One stage of a pipeline run: its run config, every override (its own, then the wiring; paths relative to
    the pipeline folder, where it runs), its folder (the pipeline folder's child) and its resolved config as dotted
    keys (``stage_settings``)."""

    stage: str
    config: str
    overrides: tuple[str, ...]
    folder: Path
    settings: dict


def step_commands(cfg: DictConfig) -> list[tuple[str, str, list[str]]]:
    """Each step of the pipeline as the command line it launches: ``(step, run config, overrides)``, the stage's own
    overrides then the wiring, paths relative to the pipeline folder. Composes nothing: ``rlt_mono.cli`` checks each
    one as a command line (``Stage.steps``) before the first step runs, and ``plan`` composes them."""
    return [(step, config, overrides) for step, config, overrides, _ in _step_commands(cfg)]


def _step_commands(cfg: DictConfig) -> list[tuple[str, str, list[str], set[str]]]:
    """``step_commands`` with the keys the wiring sets for each step (handed on relative to the pipeline folder)."""
    stages = cfg.pipeline
    options = pipeline_options(cfg)
    unknown = sorted(set(stages) - set(ORDER))
    if unknown:
        raise ConfigError(f"pipeline: unknown stages {unknown}; the stages are {list(ORDER)}")
    # Numbered in the order of STEPS then STUDY_STEPS (a study's main folders are named as without it); relative to
    # the pipeline folder, where each stage runs.
    folders = {step: Path(name) for step, name in STEP_FOLDER_NAMES.items()}
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
        "student_sft_raw_traces": student_sft_on("distill_sft_teacher", "reasoning_trace"),
        "eval_sft_teacher": load("model", folders["teacher_sft"]),
        "eval_student_sft_teacher": student_alone("student_sft_sft_teacher"),
        "eval_student_raw_traces": student_alone("student_sft_raw_traces"),
    }
    for stage in ORDER:
        if stage not in stages:
            raise ConfigError(f"pipeline.{stage} is missing: give its run config (pipeline.{stage}.config=<name>)")
    data = data_overrides(cfg)
    commands = []
    for step in options.all_steps():
        stage = stage_of(step)
        own = [str(o) for key in ("overrides", "extra_overrides") for o in stages[stage].get(key) or []]
        forwarded = data if PIPELINE_STAGES[stage].reads_data else []  # student SFT reads the distilled rows
        pipelines = (f"seed={cfg.seed}", f"output_dir={folders[step]}", *wiring[step])
        check_not_wired(stages[stage], stage, step, pipelines)
        commands.append((step, str(stages[stage].config), [*forwarded, *own, *pipelines],
                         {override.split("=", 1)[0] for override in wiring[step]}))
    return commands


def plan(cfg: DictConfig, root: Path) -> list[StagePlan]:
    """The steps (``step_commands``) with their composed configs; each stage config is composed now, so a mistake
    in any of them stops the pipeline before the first stage runs."""
    plans = []
    for step, config, step_overrides, wired in _step_commands(cfg):
        stage = stage_of(step)
        overrides = tuple(step_overrides)
        composed = compose(config, list(overrides))
        if absolute := launch_relative(composed, skip=wired):
            logger.info("pipeline step %s runs in %s: %s handed on absolute", step, root, " ".join(absolute))
            overrides = (*overrides, *absolute)
            composed = compose(config, list(overrides))
        if composed.get("stage") != stage:
            raise ConfigError(f"pipeline.{stage}.config={config} runs stage "
                              f"{composed.get('stage')!r}, not {stage!r}")
        try:  # every step's own options now, before the first stage runs for hours
            PIPELINE_STAGES[stage].check_config(composed)
        except ConfigError as err:
            raise ConfigError(f"pipeline step {step}: {err}") from err
        plans.append(StagePlan(step, config, overrides, root / STEP_FOLDER_NAMES[step],
                               stage_settings(composed, root)))
    return plans


def check_not_wired(options: DictConfig, stage: str, step: str, wired: tuple[str, ...]) -> None:
    """Refuse a stage's own override (``pipeline.<stage>.overrides`` or ``extra_overrides``) of a key the pipeline
    sets for ``step`` (``wired``: its seed, the step's folder, the earlier steps' outputs it reads), which the
    pipeline's value, coming after it, would silently replace: one line naming the key and the pipeline's value."""
    owned = {override.partition("=")[0]: override for override in wired}
    for which in ("overrides", "extra_overrides"):
        for override in options.get(which) or []:
            key = override_key(override)
            if key in owned:
                where = "set it on the pipeline (seed=...)" if key == "seed" else "leave it out"
                raise ConfigError(f"pipeline.{stage}.{which}: {key} is the pipeline's to set for step {step} "
                                  f"({owned[key]}): {where}")


def launch_relative(composed: DictConfig, skip: set[str]) -> list[str]:
    """Overrides that make each ``LOCAL_PATH_KEYS`` value (but those in ``skip``: the wiring) that names an existing
    file or folder relative to this process's folder absolute, for a stage that runs in the pipeline folder."""
    found = []
    for key in LOCAL_PATH_KEYS:
        value = OmegaConf.select(composed, key, default=None)
        if key not in skip and isinstance(value, str) and value not in ("", ".") and not os.path.isabs(value) \
                and os.path.exists(value):
            found.append(f"{key}={override_value(os.path.abspath(value))}")
    return found


def data_overrides(cfg: DictConfig) -> list[str]:
    """The pipeline's own ``data`` keys that differ from ``DataConfig``'s defaults, as stage overrides."""
    if cfg.get("data") is None:
        return []
    defaults = {f.name: f.default_factory() if f.default is dataclasses.MISSING else f.default
                for f in dataclasses.fields(DataConfig)}
    values = OmegaConf.to_container(cfg.data, resolve=True)
    return [f"data.{key}={override_value(value)}" for key, value in values.items()
            if key not in defaults or value != defaults[key]]


def stage_settings(config: DictConfig, root: Path) -> dict:
    """A step's resolved config as ``{dotted key: value}``, without ``UNCOMPARED`` and with every path inside the
    pipeline folder ``root`` written relative to it (``<root>/1_teacher_sft/final`` -> ``1_teacher_sft/final``)."""
    bases = {str(root), str(root.resolve())}

    def relative(value):
        if isinstance(value, list):
            return [relative(item) for item in value]
        if isinstance(value, str):
            for base in bases:
                if value == base or value.startswith(base + "/"):
                    return value[len(base) + 1:] or "."
        return value

    flat = {}

    def walk(node, prefix: str) -> None:
        if isinstance(node, dict) and node:
            for key, value in node.items():
                walk(value, f"{prefix}{key}.")
        else:
            flat[prefix[:-1]] = relative(node)

    walk(OmegaConf.to_container(config, resolve=True), "")
    return {key: value for key, value in flat.items() if key not in UNCOMPARED}


def changed_settings(recorded: dict, now: dict) -> list[str]:
    """``key: before -> now`` for each key whose value differs (or that only one side has)."""
    def short(key: str, side: dict) -> str:
        if key not in side:
            return "(unset)"
        text = json.dumps(side[key])
        return text if len(text) <= 60 else text[:57] + "..."

    return [f"{key}: {short(key, recorded)} -> {short(key, now)}" for key in sorted(set(recorded) | set(now))
            if key not in recorded or key not in now or recorded[key] != now[key]]


def recorded_settings(plan_: StagePlan, record: dict | None, root: Path) -> dict | None:
    """What a step last ran with: the config the pipeline recorded when it launched it, else the one its folder's
    ``config.yaml`` holds (a step run before records existed); None when it never ran."""
    if record and "config" in record:
        return record["config"]
    saved = plan_.folder / "config.yaml"
    if not saved.is_file():
        return None
    try:
        return stage_settings(OmegaConf.load(saved), root)
    except (OSError, OmegaConfBaseException) as err:
        raise UserError(f"{saved}: unreadable ({err}); move {plan_.folder} aside to run the step again") from err


def stale_reasons(plan_: StagePlan, record: dict | None, root: Path, launched: list[str]) -> list[str]:
    """Why a step's folder no longer matches what the step would run now: its changed settings
    (``changed_settings``), or an input folder (``launched``: names in the pipeline folder) that a step launched by
    this run wrote again. Empty: it matches (or the step never ran)."""
    if not plan_.folder.exists():
        return []
    recorded = recorded_settings(plan_, record, root)
    reasons = changed_settings(recorded, plan_.settings) if recorded is not None else []
    reasons += [f"reads {name}, which ran again" for name in launched
                if any(f"={name}/" in override or override.endswith(f"={name}") for override in plan_.overrides)]
    return reasons


def refuse_changed(plan_: StagePlan, reasons: list[str]) -> UserError:
    """The one line that stops a pipeline at a step whose folder ran with other settings (``stale_reasons``)."""
    return UserError(f"pipeline step {plan_.stage} in {plan_.folder} ran with other settings than now "
                     f"({'; '.join(reasons[:6])}{'; ...' if len(reasons) > 6 else ''}): set them back to continue "
                     f"it, or add rerun_changed=true to run it again (its folder is moved aside)")


def check_pipeline_folder(root: Path) -> None:
    """Refuse an ``output_dir`` that holds another kind of run (its ``config.yaml`` names another stage, or it has
    a run's files without one): the pipeline would overwrite its config and mix its files with ours."""
    saved = root / "config.yaml"
    if saved.is_file():
        try:
            stage = OmegaConf.load(saved).get("stage")
        except (OSError, OmegaConfBaseException) as err:
            raise UserError(f"output_dir={root}: its config.yaml is unreadable ({err}); choose another output_dir"
                            ) from err
        if stage != "pipeline":
            raise UserError(f"output_dir={root} holds a {stage} run, not a pipeline: choose another output_dir (or "
                            "leave it unset for a new folder)")
    elif found := checkpoints.previous_run_files(root):
        raise UserError(f"output_dir={root} holds another run ({', '.join(found)}), "
                        "not a pipeline: choose another output_dir (or leave it unset for a new folder)")


def run_stage(command: list[str], folder: Path) -> int:
    """Run one stage's command in ``folder`` (the pipeline folder: the stage's paths are relative to it) and return
    its exit code. The stage imports the rlt_mono this process runs (``PACKAGE_PARENT`` first on its
    ``PYTHONPATH``) and uses the same ``$RLT_MONO_CACHE``. It runs in its own process group and gets SIGTERM
    if the pipeline dies (Linux parent-death signal), so killing the pipeline, even with ``kill -9``, stops the
    stage rather than leaving it writing beside a rerun. Ctrl-C (delivered to the pipeline only, the stage being
    in another group) is passed on to the stage, which stops as its own Ctrl-C says, and the pipeline then stops."""
    pipeline_pid = os.getpid()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (str(PACKAGE_PARENT),
                                                                      os.environ.get("PYTHONPATH"))))}
    if os.environ.get("RLT_MONO_CACHE"):
        env["RLT_MONO_CACHE"] = os.path.abspath(os.environ["RLT_MONO_CACHE"])

    def die_with_pipeline() -> None:  # runs in the child, between fork and exec
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != pipeline_pid:  # the pipeline died before the signal was armed
            os._exit(1)

    stage = subprocess.Popen(command, cwd=folder, env=env, process_group=0,
                             preexec_fn=die_with_pipeline if sys.platform == "linux" else None)
    try:
        return stage.wait()
    except BaseException:
        os.killpg(stage.pid, signal.SIGINT)
        stage.wait()
        raise


def stage_of(step: str) -> str:
    """The stage (``ORDER``) whose run config a step launches, e.g. ``student_sft_raw_traces`` -> ``student_sft``."""
    return next(stage for stage in ORDER if step.startswith(stage))


def selected_steps(options: PipelineOptions) -> set[str]:
    """The steps this run may launch: ``steps`` (step names, e.g. to finish a study's controls with the main steps'
    outputs already in place; ``PipelineOptions`` checked each), or all of them when it is unset."""
    return set(options.all_steps() if options.steps is None else options.steps)


def stage_done(plan_: StagePlan) -> bool:
    """Whether a stage's output is complete (distill is never 'done': rerunning it skips rows it wrote)."""
    if stage_of(plan_.stage) == "eval":
        return (plan_.folder / "eval.json").is_file()
    if stage_of(plan_.stage) == "distill":
        return False
    return (plan_.folder / "final" / "config.json").is_file()


def distilled_bytes(plan_: StagePlan) -> int:
    """Size of a distill step's ``distill.jsonl`` (0 when absent): a distill rerun that finds every row written
    leaves it as it was, and what was made from it stays valid."""
    path = plan_.folder / DISTILL_FILE
    return path.stat().st_size if path.is_file() else 0


def drop_checkpoints(folder: Path) -> float:
    """Delete the ``checkpoint-*`` folders of a finished stage (``keep_checkpoints=false``); its ``final/`` stays.
    Nothing is deleted without a ``final/`` (a stopped stage resumes from its checkpoints). Returns GiB freed."""
    if not (folder / "final").is_dir():
        return 0.0
    freed = 0
    for checkpoint in sorted(folder.glob("checkpoint-*")):
        freed += sum(f.stat().st_size for f in checkpoint.rglob("*") if f.is_file())
        shutil.rmtree(checkpoint)
    return freed / 2**30


def move_aside(folder: Path, why: str) -> Path:
    """Rename ``folder`` to ``<folder>.<why>-<time>`` (``_2``, ``_3``, ... when that exists) and return the name."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    aside = folder.with_name(f"{folder.name}.{why}-{stamp}")
    attempt = 1
    while aside.exists():
        attempt += 1
        aside = folder.with_name(f"{folder.name}.{why}-{stamp}_{attempt}")
    folder.rename(aside)
    return aside


def resume_overrides(plan_: StagePlan) -> list[str]:
    """A training stage whose folder holds a complete checkpoint continues from it; one stopped before its first
    checkpoint starts again in an empty folder (what it left, logs of steps it will run again, goes), so the step
    ends with the files of an uninterrupted run. A folder whose checkpoints are all damaged (none verifies) is moved
    aside, kept for a look, and the step starts again."""
    if stage_of(plan_.stage) in ("distill", "eval") or not plan_.folder.is_dir():
        return []
    try:
        checkpoints.newest_complete_checkpoint(plan_.folder)
    except checkpoints.CheckpointError:
        started = checkpoints.previous_run_files(plan_.folder)
        if any(name.startswith("checkpoint-") for name in started):  # checkpoints, none complete: keep them
            aside = move_aside(plan_.folder, "damaged")
            logger.warning("%s holds no complete checkpoint (%s); moved aside to %s, starting the step again",
                           plan_.folder, ", ".join(n for n in started if n.startswith("checkpoint-")), aside)
        elif started:  # stopped before its first checkpoint: start the stage again
            shutil.rmtree(plan_.folder)
            logger.warning("%s stopped before its first checkpoint: starting it again (deleted what it left: %s)",
                           plan_.folder, ", ".join(sorted(started)))
        return []
    return ["resume_from_checkpoint=true"]


def run_pipeline(cfg: DictConfig) -> Path:
    """Run (or continue) every stage in order; returns the pipeline folder (``pipeline.json`` sums it up)."""
    from rlt_mono.study.aggregate import write_study  # the study over seeds reads the pipeline's step folders

    options = pipeline_options(cfg)
    root = Path(cfg.output_dir) if cfg.output_dir else checkpoints.new_run_dir(cfg.run_dir)
    root.mkdir(parents=True, exist_ok=True)
    check_pipeline_folder(root)
    plans = plan(cfg, root)
    selected = selected_steps(options)
    summary_path = root / SUMMARY_FILE  # a continued pipeline keeps the records of the stages it skips
    summary = json.loads(summary_path.read_text()) if summary_path.is_file() else {"stages": {}}
    if not options.rerun_changed:  # refused before this run's config replaces the one the folder ran with
        for stage in plans:
            if stage.stage in selected and (changed := stale_reasons(stage, summary["stages"].get(stage.stage),
                                                                     root, [])):
                raise refuse_changed(stage, changed)
    write_run_config(root, cfg)
    launched: list[str] = []  # folders of the steps this run launched: a step reading one is stale
    for i, stage in enumerate(plans, start=1):
        if stage.stage not in selected:
            logger.info("[%d/%d] %s: not in steps=[%s], left as it is", i, len(plans), stage.stage,
                        ",".join(options.steps))  # as given: a step is left out only when steps is set
            continue
        changed = stale_reasons(stage, summary["stages"].get(stage.stage), root, launched)
        if changed:
            if not options.rerun_changed:
                raise refuse_changed(stage, changed)
            aside = move_aside(stage.folder, "changed")
            logger.warning("%s: %s; moved aside to %s, running it again", stage.stage, "; ".join(changed), aside)
        elif stage_done(stage):
            logger.info("[%d/%d] %s: done already (%s), skipped", i, len(plans), stage.stage, stage.folder)
            summary["stages"].setdefault(stage.stage, {"folder": stage.folder.name})
            drop_asked_checkpoints(stage, options)
            continue
        overrides = [*stage.overrides, *resume_overrides(stage)]
        logger.info("[%d/%d] %s: (in %s) ./launch_mono.sh %s %s", i, len(plans), stage.stage, root, stage.config,
                    " ".join(overrides))
        # recorded before it starts: a stage stopped half-way is checked against what it started with
        summary["stages"][stage.stage] = {"folder": stage.folder.name, "config": stage.settings}
        write_json(summary_path, summary)
        distilled = distilled_bytes(stage)
        start = time.perf_counter()
        code = run_stage([sys.executable, "-m", "rlt_mono.cli", stage.config, *overrides], root)
        seconds = time.perf_counter() - start
        if code < 0:  # killed by a signal: it wrote no message of its own
            raise UserError(f"pipeline stage {stage.stage} was killed by {signal.Signals(-code).name}; run the same "
                            f"command with output_dir={root} to continue from this stage")
        if code != 0:
            raise UserError(f"pipeline stage {stage.stage} failed (exit {code}, message above); fix it and run the "
                            f"same command with output_dir={root} to continue from this stage")
        if stage_of(stage.stage) != "distill" or distilled_bytes(stage) != distilled:
            launched.append(stage.folder.name)  # its output is new: what a later step made from the old one is stale
        summary["stages"][stage.stage]["seconds"] = round(seconds, 1)
        write_json(summary_path, summary)
        drop_asked_checkpoints(stage, options)
    folders = {p.stage: p.folder for p in plans}
    evals = [folders[step] / "eval.json" for step in ("eval_teacher", "eval_student")]
    if not all(path.is_file() for path in evals):  # steps=[...] stopped before the evaluations
        logger.info("pipeline done: %s (no %s: eval_teacher and eval_student have not both run)", root, TABLE_FILE)
        return root
    table = compare_table(evals, names=[path.parent.name for path in evals])  # the step folders: no absolute path
    write_text(root / TABLE_FILE, table + "\n")
    logger.info("pipeline done: %s\n%s", root, table)
    if options.study:
        # the study's paired intervals drawn as its evaluations drew theirs (eval.confidence, bootstrap_resamples)
        # (an eval.json written before it recorded its resamples drew the eval group's default)
        drawn = json.loads(evals[0].read_text())
        resamples = drawn.get("bootstrap_resamples", evaluate.EvalConfig.bootstrap_resamples)
        logger.info("study:\n%s", write_study(root, folders, seed=cfg.seed, confidence=drawn["confidence"],
                                              resamples=resamples))
    return root


def drop_asked_checkpoints(plan_: StagePlan, options: PipelineOptions) -> None:
    """With ``keep_checkpoints=false``, delete a finished step's checkpoints (``drop_checkpoints``)."""
    if not options.keep_checkpoints and (freed := drop_checkpoints(plan_.folder)):
        logger.info("%s: deleted its checkpoints (%.1f GiB; keep_checkpoints=false), final/ kept", plan_.stage, freed)


# Every stage in order, each a subprocess in its own folder, with the study's controls (steps and folders:
# rlt_mono.stages.pipeline_steps). Run config: cfgs/run_cfg/pipeline_smollm2.yaml. It keeps no checkpoints of its own:
# run again with the same output_dir, it continues where it stopped.
STAGE = Stage(
    name="pipeline",
    run=run_pipeline,
    # it reads no group itself; a data option it sets is handed to the stages that read data
    config_groups=("data",),
    steps=step_commands,
)
