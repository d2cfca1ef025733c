"""The RL stage: GRPO on the teacher with the RLT reward (``stage: teacher_rlt``).

``run_teacher_rlt(cfg)`` builds the trainer (``rlt_mono.build``), trains or resumes, and saves the teacher
atomically in ``<output_dir>/final``. Failures a user can act on (a full disk, a card out of memory, a run
that could not make its steps) become one-line ``UserError``s that say where the last good checkpoint is.
"""

from __future__ import annotations

import errno
import logging
import shutil
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf

from rlt_mono import checkpoints
from rlt_mono.errors import RunInterrupted, UserError
from rlt_mono.outputs import METRICS_FILE, launch_command, read_metrics, write_run_readme

logger = logging.getLogger(__name__)

FINAL_DIR = "final"


def run_teacher_rlt(cfg: DictConfig) -> Path:
    """Train the teacher a run config describes; returns the run folder (the teacher is in ``final/``)."""
    from rlt_mono.build import build_trainer

    trainer = build_trainer(cfg)
    output_dir = Path(trainer.args.output_dir)
    try:
        trainer.train(resume_from_checkpoint=trainer.resume_checkpoint)
        if trainer.state.global_step < trainer.args.max_steps:
            raise UserError(
                f"training stopped at step {trainer.state.global_step} of {trainer.args.max_steps} (the data loader "
                "ran dry): add rows, or lower trainer.max_steps; no final teacher was saved"
            )
        final = save_final(trainer, output_dir)
        write_run_readme(output_dir, OmegaConf.to_container(cfg, resolve=True),
                         read_metrics(output_dir / METRICS_FILE), command=launch_command())
    except OSError as err:
        if err.errno != errno.ENOSPC:
            raise
        raise UserError(f"disk full while writing {err.filename or output_dir}: free space, then resume with "
                        f"output_dir={output_dir} resume_from_checkpoint=true ({_last_checkpoint(output_dir)})"
                        ) from err
    except torch.OutOfMemoryError as err:
        raise UserError(
            f"out of GPU memory at step {trainer.state.global_step + 1}: lower trainer.per_device_train_batch_size "
            "(raise gradient_accumulation_steps to keep completions per step), trainer.max_completion_length, "
            "trainer.vllm_gpu_memory_utilization or reward.micro_batch_size; resume with "
            f"output_dir={output_dir} resume_from_checkpoint=true ({_last_checkpoint(output_dir)})"
        ) from err
    except KeyboardInterrupt as err:
        raise RunInterrupted(f"interrupted at step {trainer.state.global_step}; resume with output_dir={output_dir} "
                        f"resume_from_checkpoint=true ({_last_checkpoint(output_dir)})") from err
    logger.info("final teacher saved to %s", final)
    return output_dir


def save_final(trainer, output_dir: Path) -> Path:
    """Save the trained teacher (and tokenizer) to ``final/``, written aside and renamed once complete."""
    staging = output_dir / f"{checkpoints.STAGING_PREFIX}{FINAL_DIR}"
    shutil.rmtree(staging, ignore_errors=True)
    trainer.save_model(str(staging))
    checkpoints.publish(staging, output_dir / FINAL_DIR)
    return output_dir / FINAL_DIR


def _last_checkpoint(output_dir: Path) -> str:
    try:
        return f"last complete checkpoint: {checkpoints.newest_complete_checkpoint(output_dir)}"
    except checkpoints.CheckpointError:
        return "no complete checkpoint yet"
