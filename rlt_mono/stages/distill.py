"""The distill stage (``stage: distill``): a teacher explains every training row; the RLT reward picks.

For each training row (``rlt_mono.data.rows.load_split``: the held-out questions that eval uses are left out) the
teacher (``model.model_name_or_path``, e.g. a teacher_rlt run's ``final/``) sees the same
prompt as in RL training (``rlt_mono.data.rows.render_prompts``: question + solution, prefilled up to the
opened explanation tag) and samples ``distill.samples_per_question`` explanations, each ending at
``<|end_of_explanation|>`` or EOS. ``TeacherKLReward`` scores every one with the student (``student``) and the
teacher's own log-probs (it runs the teacher itself, as it does when TRL hands none over). With
``distill.selection: best`` the highest total is kept, with ``all`` every sample, with ``best_correct`` the
highest total among the samples whose equations are all right (``rlt_mono.study.arithmetic``), or the highest
total when none is.

Output, in ``<output_dir>/distill.jsonl``, one JSON line per kept explanation: ``question``, ``solution``,
``explanation`` (the generated text before the closing tag, exactly what the reward scored), the row's own
``reasoning_trace``, ``answer`` and ``template`` when it has them (the raw-trace student baseline trains on the same
rows), ``r_ss``, ``r_kl``, ``match_penalty``, ``total``, ``matched`` (the tag was closed), ``wrong_equations`` (the
explanation's equations that ``rlt_mono.study.arithmetic.check`` finds wrong), ``teacher`` (as configured) and
``sample_index``. This file *is* the student SFT dataset: the student SFT stage reads its ``question``, ``solution``
and ``explanation`` columns and renders ``PromptFormat.student_completion`` itself, so no second file is written
(filter on ``matched`` or ``total`` there if wanted).

Rows are generated, scored and appended in batches of ``distill.rows_per_batch`` (flushed and synced each
time). Run again with the same ``output_dir`` to resume: a truncated last line is dropped and questions already
written are skipped; a file that holds every row already ends the run at once, before any model loads. A
question's samples are seeded by ``seed`` and the question alone (``rlt_mono.stages.sampler.prompt_seed``), and a
crash loses whole batches, so a resumed run writes the lines of an uninterrupted one. Resumed with another
``rows_per_batch``, it writes the same explanations, but where the padding to other batches' widths moves the logits
in their last digits enough to flip a near-tie of a sampled token; and a question scored beside other questions can
get scores that differ in the last digits (the reward pads its micro-batches to other widths), which may change the
best of near-tied samples. Appends are keyed by question
(``DistillFile``): each batch first reads what is in the file (under a lock of the file) and writes only the
questions not there yet, so no path writes a question twice.
Generation uses vLLM on a GPU (asleep while the reward's models score) and
``transformers`` ``generate`` on CPU (``placement.rollout``). This module declares the stage and checks its options;
its code (``rlt_mono.stages.distill_run``: the models, the sampling, the file) is imported when it runs.

Run::

    ./launch_mono.sh cfgs/run_cfg/distill.yaml model.model_name_or_path=outputs/teacher_rlt_mono/<time>/final
    ./launch_mono.sh cfgs/run_cfg/distill.yaml size=tiny output_dir=outputs/distill_tiny/x   # CPU, embedded pair
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from omegaconf import DictConfig

from rlt_mono.config import ConfigError, config_group, instantiate
from rlt_mono.stages.base import Stage
from rlt_mono.stages.sampling_options import SamplingOptions

if TYPE_CHECKING:
    from rlt_mono.rewards import TeacherRewardConfig

DISTILL_FILE = "distill.jsonl"
SELECTIONS = ("best", "all", "best_correct")
# A resumed run must score like the run that wrote the file, or the rows of one file would not be comparable.
RESUME_KEYS = ("model.model_name_or_path", "model.gguf_file", "student.model_name_or_path", "student.gguf_file",
               "reward", "distill.samples_per_question", "distill.selection", "distill.temperature")


@config_group("distill")
@dataclass
class DistillConfig(SamplingOptions):
    """The ``distill`` config group (``cfgs/distill/default.yaml`` documents each field)."""

    samples_per_question: int = 4
    selection: str = "best"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.samples_per_question < 1:
            raise ValueError(f"samples_per_question must be >= 1, got {self.samples_per_question}")
        if self.selection not in SELECTIONS:
            raise ValueError(f"selection must be one of {SELECTIONS}, got {self.selection!r}")


def check_options(cfg: DictConfig) -> tuple[DistillConfig, TeacherRewardConfig]:
    """The stage's options and the reward's, checked before any model loads (also by the pipeline, when it plans)."""
    from rlt_mono.rewards import TeacherRewardConfig  # with the reward, which imports torch

    options = instantiate(DistillConfig, cfg.distill, "distill")
    reward_config = instantiate(TeacherRewardConfig, cfg.reward, "reward")
    if cfg.model.model_name_or_path is None:
        raise ConfigError("model.model_name_or_path is null: distill needs a teacher (e.g. "
                          "model.model_name_or_path=outputs/teacher_rlt_mono/<time>/final)")
    return options, reward_config


def run_distill(cfg: DictConfig) -> Path:
    """Write the teacher's explanations of every row to ``<output_dir>/distill.jsonl``; returns ``output_dir``."""
    from rlt_mono.stages.distill_run import distill

    options, reward_config = check_options(cfg)
    return distill(cfg, options, reward_config)


# The trained teacher writes explanations for the dataset's questions (distill.jsonl). Run config:
# cfgs/run_cfg/distill.yaml. It keeps no checkpoints: run again with the same output_dir, it continues where it stopped.
STAGE = Stage(
    name="distill",
    run=run_distill,
    config_groups=("model", "student", "data", "reward", "placement", "logging", "distill"),
    reads_data=True,
    sampling_group="distill",
    check=check_options,
)
