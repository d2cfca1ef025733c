"""The RL stage: GRPO on the teacher with the RLT reward (``stage: teacher_rlt``).

``run_teacher_rlt(cfg)`` builds the trainer (``rlt_mono.rl.build``), trains or resumes, and saves the teacher
atomically in ``<output_dir>/final``. Failures a user can act on (a full disk, a card out of memory, Ctrl-C, a
run that could not make its steps) become one-line ``UserError``s that say where the last good checkpoint is.
The trainer and the final save (torch, TRL) are imported when the stage runs.
"""

from __future__ import annotations

import logging
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from rlt_mono.errors import UserError
from rlt_mono.runs import checkpoints
from rlt_mono.runs.outputs import METRICS_FILE, read_metrics
from rlt_mono.runs.readme import launch_command, write_run_readme
from rlt_mono.stages.base import Stage

logger = logging.getLogger(__name__)

MEMORY_HINT = ("trainer.per_device_train_batch_size (raise gradient_accumulation_steps to keep completions per "
               "step), trainer.max_completion_length, trainer.vllm_gpu_memory_utilization or reward.micro_batch_size")


def run_teacher_rlt(cfg: DictConfig) -> Path:
    """Train the teacher a run config describes; returns the run folder (the teacher is in ``final/``)."""
    from rlt_mono.rl.build import build_trainer
    from rlt_mono.stages.final_model import save_final

    trainer = build_trainer(cfg)
    output_dir = Path(trainer.args.output_dir)
    resume = trainer.resume_checkpoint
    should_save = trainer.args.should_save  # data parallel: rank 0 writes the run's files
    try:
        with checkpoints.training_failures(trainer, output_dir, MEMORY_HINT):
            if resume is not None and checkpoints.saved_step(resume) == trainer.args.max_steps:
                # Stopped after the last checkpoint, before final/: nothing left to train, only the teacher to
                # restore.
                logger.info("%s holds the last step (%d): saving the final teacher from it", resume,
                            trainer.args.max_steps)
                trainer._load_from_checkpoint(resume)
            else:
                trainer.train(resume_from_checkpoint=resume)
                stopped = trainer.time_limit is not None and trainer.time_limit.stopped_at is not None
                if trainer.state.global_step < trainer.args.max_steps and not stopped:
                    raise UserError(
                        f"training stopped at step {trainer.state.global_step} of {trainer.args.max_steps} (the "
                        "data loader ran dry): add rows, or lower trainer.max_steps; no final teacher was saved"
                    )
            final = save_final(trainer, output_dir)
    except BaseException:
        _release_after_failure(trainer)
        raise
    # What the trainer holds ends with the stage, failed or not: placement=async's rollout server and its
    # generation thread (else the process waits at exit for a generation, and the server for its parent's death),
    # and the GPU memory a next stage in the same process needs.
    trainer.release()
    if should_save:
        write_run_readme(output_dir, OmegaConf.to_container(cfg, resolve=True),
                         read_metrics(output_dir / METRICS_FILE), command=launch_command())
    logger.info("final teacher saved to %s", final)
    return output_dir


def _release_after_failure(trainer) -> None:
    """``trainer.release()`` after the stage failed: what release raises (after a CUDA error the device may fail
    again) is logged, so the stage's own error is the one that reaches the user."""
    try:
        trainer.release()
    except Exception as exc:  # noqa: BLE001 - the error being raised is the one to report
        logger.warning("releasing the trainer after the failure failed too: %s: %s", type(exc).__name__, exc)


# GRPO on the teacher with the RLT reward (the trainer: rlt_mono.rl). Run config: cfgs/run_cfg/teacher_rlt_mono.yaml
# (demo_tiny on the CPU).
STAGE = Stage(
    name="teacher_rlt",
    run=run_teacher_rlt,
    config_groups=("model", "student", "data", "reward", "trainer", "placement", "logging"),
    trains="model",
    keeps_checkpoints=True,
    reads_data=True,
    data_parallel=True,
    trainer_group="trainer",
    trains_adapters=True,
    trains_on_rollouts=True,
    plans_memory=True,
    may_split=True,
)
