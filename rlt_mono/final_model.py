"""The model a training stage leaves in ``<output_dir>/final``: written aside, renamed once complete.

The RL stage (``rlt_mono.teacher_rlt``) and the SFT stages (``rlt_mono.sft``) end here. A LoRA teacher is saved
merged, a plain model that distill, eval and the next stage load like any other, with its adapter alone in
``final/adapter`` (``rlt_mono.lora``). Kept apart from ``rlt_mono.checkpoints``, which imports no torch.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from rlt_mono import lora
from rlt_mono.atomic_write import check_free_space
from rlt_mono.checkpoints import STAGING_PREFIX, publish, resume_hint

FINAL_DIR = "final"


def save_final(trainer, output_dir: Path) -> Path:
    """Save the trained model (and tokenizer) to ``final/``, written aside and renamed once complete. A LoRA
    teacher is saved merged (a plain model), its adapter in ``final/adapter`` (``rlt_mono.lora``). Stops first, in
    one line, when the disk has less free than the weights need."""
    weights = sum(p.numel() * p.element_size() for p in trainer.model.parameters())
    check_free_space(output_dir, weights, f"{FINAL_DIR}/ (the model's weights)",
                     then=f"resume with {resume_hint(output_dir)}")
    staging = Path(output_dir) / f"{STAGING_PREFIX}{FINAL_DIR}"
    main_process = trainer.args.should_save  # data parallel: rank 0 writes, the other ranks wait
    if main_process:
        shutil.rmtree(staging, ignore_errors=True)
    trainer.accelerator.wait_for_everyone()
    if lora.is_peft(trainer.model):
        if main_process:
            lora.save_merged(trainer.model, trainer.processing_class, staging)
        trainer.save_model(str(staging / "adapter"))
    else:
        trainer.save_model(str(staging))
    trainer.accelerator.wait_for_everyone()
    if main_process:
        publish(staging, Path(output_dir) / FINAL_DIR)
    trainer.accelerator.wait_for_everyone()
    return Path(output_dir) / FINAL_DIR
