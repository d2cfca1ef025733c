"""The model a training stage leaves in ``<output_dir>/final``: written aside, renamed once complete.

The end the training stages share: the RL stage (``rlt_mono.stages.teacher_rlt``) and the SFT stages
(``rlt_mono.stages.sft``) end here. A LoRA teacher is saved merged, a plain model that distill, eval and the next
stage load like any other, with its adapter alone in ``final/adapter`` (``rlt_mono.rl.lora``). A sharded teacher
(``placement.strategy=fsdp2``) trains float32 master weights (accelerate upcasts them under ``bf16``); ``final/``
holds them in the dtype the run loaded the model in, as a ``ddp`` run's. It sits with the stages, above
``rlt_mono.rl`` and the registry ``STAGES`` it reads; ``rlt_mono.runs.checkpoints`` (staging and publishing, no
torch) stays below both.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import torch
from omegaconf import OmegaConf
from safetensors.torch import load_file, save_file
from transformers.utils import SAFE_WEIGHTS_INDEX_NAME

from rlt_mono.rl import lora
from rlt_mono.runs import atomic_write
from rlt_mono.runs.atomic_write import check_free_space, write_text
from rlt_mono.runs.checkpoints import STAGING_PREFIX, how_to_continue, publish
from rlt_mono.stages import STAGES

logger = logging.getLogger(__name__)

FINAL_DIR = "final"


def save_final(trainer, output_dir: Path) -> Path:
    """Save the trained model (and tokenizer) to ``final/``, written aside and renamed once complete. A LoRA
    teacher is saved merged (a plain model), its adapter in ``final/adapter`` (``rlt_mono.rl.lora``). A sharded model's
    float32 master weights are saved in the dtype the run loaded it in (``cast_saved_weights``). Stops first, in
    one line, when the disk has less free than the weights need."""
    weights = sum(p.numel() * p.element_size() for p in trainer.model.parameters())
    check_free_space(output_dir, weights, f"{FINAL_DIR}/ (the model's weights)",
                     then=how_to_continue(output_dir))
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
        if trainer.is_fsdp_enabled and main_process:
            cast_saved_weights(staging, loaded_dtype(output_dir))
    trainer.accelerator.wait_for_everyone()
    if main_process:
        publish(staging, Path(output_dir) / FINAL_DIR)
    trainer.accelerator.wait_for_everyone()
    return Path(output_dir) / FINAL_DIR


def loaded_dtype(output_dir: Path) -> torch.dtype:
    """The dtype the run loaded its trained model in: ``<group>.dtype`` of the ``config.yaml`` the stage wrote in
    ``output_dir`` at its start, for the config group its stage trains (``rlt_mono.stages``)."""
    cfg = OmegaConf.load(Path(output_dir) / "config.yaml")
    return getattr(torch, cfg[STAGES[cfg.stage].trains].dtype)


def cast_saved_weights(folder: Path, dtype: torch.dtype) -> None:
    """Rewrite the floating-point tensors of the ``*.safetensors`` files that ``save_pretrained`` wrote in
    ``folder`` as ``dtype`` (one file in memory at a time; a file already in ``dtype`` stays as written), and
    record ``dtype`` in its ``config.json`` and in the shard index's total size."""
    folder = Path(folder)
    total, changed = 0, 0
    for path in sorted(folder.glob("*.safetensors")):
        tensors = load_file(path)
        cast = {name: t.to(dtype) if t.is_floating_point() else t for name, t in tensors.items()}
        total += sum(t.numel() * t.element_size() for t in cast.values())
        differ = sum(cast[name].dtype != tensors[name].dtype for name in tensors)
        if differ:
            # Written beside and renamed over: the tensors read may still be mapped from the old file.
            aside = path.with_name(f".{path.name}.tmp")
            save_file(cast, aside, metadata={"format": "pt"})  # transformers' loader requires the format
            atomic_write.publish(aside, path)
            changed += differ
    dtype_name = str(dtype).removeprefix("torch.")
    config = json.loads((folder / "config.json").read_text())
    write_text(folder / "config.json", json.dumps({**config, "dtype": dtype_name}, indent=2, sort_keys=True) + "\n")
    index_path = folder / SAFE_WEIGHTS_INDEX_NAME
    if index_path.exists():
        index = json.loads(index_path.read_text())
        index["metadata"]["total_size"] = total
        write_text(index_path, json.dumps(index, indent=2, sort_keys=True) + "\n")
    logger.info("%s: %d tensors saved as %s (the dtype the model was loaded in)", folder, changed, dtype_name)
