"""SFT of the student (``stage: student_sft``): supervised fine-tuning of ``student`` on distilled explanations (or
raw traces) in the student chat. Its code, shared with ``teacher_sft``, is ``rlt_mono.stages.sft`` (TRL's
SFTTrainer), imported when the stage runs."""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig

from rlt_mono.stages.base import Stage


def run(cfg: DictConfig) -> Path:
    """Fine-tune the student; returns the run folder (the model is in ``final/``)."""
    from rlt_mono.stages.sft import run_sft

    return run_sft(cfg)


# Run config: cfgs/run_cfg/student_sft.yaml. It reads the distilled rows (data=custom data.source=...), not the
# dataset a pipeline's data=... names.
STAGE = Stage(
    name="student_sft",
    run=run,
    config_groups=("student", "data", "sft", "logging"),
    trains="student",
    keeps_checkpoints=True,
    data_parallel=True,
    trainer_group="sft",
)
