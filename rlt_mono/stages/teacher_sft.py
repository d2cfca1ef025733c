"""The SFT warm-up of the teacher (``stage: teacher_sft``): supervised fine-tuning of ``model`` on the data's reasoning
traces in the teacher chat, RLT's warm-up before the RL stage. Its code, shared with ``student_sft``, is
``rlt_mono.stages.sft`` (TRL's SFTTrainer), imported when the stage runs."""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig

from rlt_mono.stages.base import Stage


def run(cfg: DictConfig) -> Path:
    """Fine-tune the teacher; returns the run folder (the model is in ``final/``)."""
    from rlt_mono.stages.sft import run_sft

    return run_sft(cfg)


# Run config: cfgs/run_cfg/teacher_sft.yaml.
STAGE = Stage(
    name="teacher_sft",
    run=run,
    config_groups=("model", "data", "sft", "logging"),
    trains="model",
    keeps_checkpoints=True,
    reads_data=True,
    data_parallel=True,
    trainer_group="sft",
)
