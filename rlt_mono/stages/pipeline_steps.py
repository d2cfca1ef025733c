"""The pipeline's steps and their folders: what ``rlt_mono.stages.pipeline`` runs and ``rlt_mono.study.aggregate``
reads; and the pipeline's own settings (``PipelineOptions``), which ``rlt_mono.cli`` checks for every run.

A floor below both, so that neither imports the other's module for its names.
"""

from __future__ import annotations

import difflib
import logging
import re
from collections.abc import Iterable
from dataclasses import dataclass, fields

from omegaconf import DictConfig, ListConfig, OmegaConf

from rlt_mono.config import CONFIG_DIR, ConfigError

logger = logging.getLogger(__name__)

ORDER = ("teacher_sft", "teacher_rlt", "distill", "student_sft", "eval")
# The eval config runs twice: the RL teacher scored by the frozen student the RL reward used (its reward, r_ss,
# r_kl, unmatched fraction, solution log-prob), then the distilled student alone (its held-out accuracy).
STEPS = (*ORDER[:-1], "eval_teacher", "eval_student")
# With ``study: true``, the controls (module docstring), after the main steps so their folders keep their numbers.
STUDY_STEPS = ("distill_sft_teacher", "student_sft_sft_teacher", "student_sft_raw_traces", "eval_sft_teacher",
               "eval_student_sft_teacher", "eval_student_raw_traces")
# Each step's folder inside a pipeline folder, numbered in the order of STEPS then STUDY_STEPS (a study's main
# folders are named as without it).
STEP_FOLDER_NAMES = {step: f"{i}_{step}" for i, step in enumerate((*STEPS, *STUDY_STEPS), start=1)}
# The root key of a pipeline run config that holds its stages (each one's run config and overrides).
STAGES_KEY = "pipeline"


@dataclass(frozen=True)
class PipelineOptions:
    """The pipeline's own settings: root keys of every config, read by ``stage: pipeline`` alone. Their defaults
    live in ``cfgs/train.yaml`` alone, which documents each (``pipeline_options`` reads them from a run's config)."""

    study: bool
    steps: list[str] | None
    rerun_changed: bool
    keep_checkpoints: bool

    def __post_init__(self) -> None:
        for name in ("study", "rerun_changed", "keep_checkpoints"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be true or false, got {getattr(self, name)!r}")
        steps = self.steps
        if steps is not None and (not isinstance(steps, list | tuple) or not steps
                                  or not all(isinstance(step, str) for step in steps)):
            raise ValueError(f"steps must be a list of step names, e.g. steps=[distill,student_sft] (or null: every "
                             f"step), got {steps!r}")
        for step in steps or ():
            if step not in self.all_steps():
                raise ValueError(unknown_step(step, self.all_steps()))

    def all_steps(self) -> tuple[str, ...]:
        """The steps a pipeline with these settings runs: ``STEPS``, then ``STUDY_STEPS`` with ``study=true``."""
        return (*STEPS, *STUDY_STEPS) if self.study else STEPS


def unknown_step(step: str, steps: tuple[str, ...]) -> str:
    """The one line for a name in ``steps=[...]`` that is none of the pipeline's ``steps``: the close name, or that
    it is a step of ``study=true``, or the steps there are."""
    if step in STUDY_STEPS:
        return f"steps: {step} is a step of study=true: add study=true, or leave it out of steps"
    close = difflib.get_close_matches(step, steps, n=1)
    hint = f"did you mean {close[0]}?" if close else f"this pipeline's steps are {', '.join(steps)}"
    return f"steps: unknown step {step!r}: {hint}"


def pipeline_options(cfg: DictConfig, stage_groups: Iterable[str] = ()) -> PipelineOptions:
    """The pipeline's settings of ``cfg``, checked for any stage: a value of the wrong type, or a root key that
    neither ``cfgs/train.yaml`` nor the stage (``stage_groups``: the config groups it declares) declares (a typo such
    as ``+keep_checkpoint=false``), is one ``ConfigError`` line. Another stage ignores them: each one set away from
    its default there is a warning that names it."""
    root = OmegaConf.load(CONFIG_DIR / "train.yaml")
    declared = {key for key in root if key != "defaults"} | set(stage_groups)
    declared |= {next(iter(entry)) for entry in root.defaults if isinstance(entry, DictConfig)}  # the groups
    if cfg.stage == "pipeline":
        declared.add(STAGES_KEY)
    for key in sorted(set(cfg) - declared):
        close = difflib.get_close_matches(key, sorted(declared), n=1)
        raise ConfigError(f"unknown key {key}: did you mean {close[0]}?" if close else
                          f"unknown key {key}: a run's keys are those of cfgs/train.yaml and its groups")
    names = [f.name for f in fields(PipelineOptions)]
    values = {name: cfg[name] for name in names}
    try:
        options = PipelineOptions(**{name: _plain(value) for name, value in values.items()})
    except ValueError as err:
        raise ConfigError(str(err)) from err
    if cfg.stage != "pipeline":
        for name in names:
            if getattr(options, name) != root[name]:
                logger.warning("%s=%s is a pipeline's setting: stage %s ignores it", name,
                               override_value(_plain(values[name])), cfg.stage)
    return options


def override_value(value) -> str:
    """A value as Hydra's override grammar reads it back."""
    if value is None:
        return "null"
    if isinstance(value, list | tuple):
        return "[" + ",".join(override_value(v) for v in value) + "]"
    if isinstance(value, str) and not re.fullmatch(r"[\w./~:+-]+", value):
        return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"
    return str(value).lower() if isinstance(value, bool) else str(value)


def _plain(value):
    return OmegaConf.to_container(value, resolve=True) if isinstance(value, DictConfig | ListConfig) else value
