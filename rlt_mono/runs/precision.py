"""Whether an optimizer step survives the trained weights' own precision.

An optimizer writes each step into the weights in their dtype. In bfloat16 (8 significant bits) a weight of
magnitude w moves only when the step exceeds half its spacing there (w / 512 to w / 256), so a step of 5e-6 (the RL
stage's learning rate) leaves a weight of 0.01 where it was: on Qwen2.5-Coder-0.5B's weights it changes 10% of them,
1e-5 22%, 1e-4 93% (docs/STUDY.md, "Steps that round away"). Float32 weights under bfloat16 autocast
(``<model group>.dtype=float32``, ``bf16=true``) keep every step, as the float32 master weights of DeepSpeed's and
FSDP's mixed precision do.
"""

from __future__ import annotations

import logging

import torch
from torch import nn

logger = logging.getLogger(__name__)

# The dtypes whose 8 or 11 significant bits round away small steps: by name (as configs spell them; read from this
# source by bench/study/kept.py), and as torch's.
LOW_PRECISION_NAMES = ("bfloat16", "float16")
LOW_PRECISION = tuple(getattr(torch, name) for name in LOW_PRECISION_NAMES)
SAMPLE_PER_TENSOR = 4096  # at most this many elements read of each trained tensor (evenly spaced)
WARN_BELOW = 0.5  # a step that changes fewer of the trained weights than this is mostly lost


def update_share(model: nn.Module, step: float) -> float | None:
    """The share of ``model``'s trained weights (``requires_grad``) that a step of ``step`` changes when written in
    the weights' own dtype, each tensor weighted by its size and read at up to SAMPLE_PER_TENSOR evenly spaced
    elements; None when no trained weight is bfloat16 or float16 (a float32 weight keeps any step of this size)."""
    changed = total = 0.0
    for param in model.parameters():
        if not param.requires_grad or param.dtype not in LOW_PRECISION or param.numel() == 0:
            continue
        flat = param.detach().reshape(-1)
        sample = flat[:: -(-flat.numel() // SAMPLE_PER_TENSOR)]  # a stride rounded up: at most SAMPLE_PER_TENSOR
        moved = ((sample - step) != sample).float().mean().item()  # the rounded write of a step of -step
        changed += moved * param.numel()
        total += param.numel()
    return changed / total if total else None


def warn_if_steps_round_away(trainer, model_group: str, args_group: str) -> None:
    """Log a warning when a step of the trainer's learning rate (an Adam step is about that size) changes fewer than
    WARN_BELOW of its model's trained weights in their own dtype, naming the keys that fix it (``model_group``'s
    dtype, the ``args_group``'s learning rate; a 4-bit base model's adapters: the learning rate). Not under FSDP,
    whose mixed precision trains float32 copies of the weights (accelerate makes them when training starts)."""
    if getattr(trainer, "is_fsdp_enabled", False):
        return
    model, learning_rate = trainer.model, trainer.args.learning_rate
    share = update_share(model, learning_rate)
    if share is None or share >= WARN_BELOW:
        return
    dtype = str(next(p.dtype for p in model.parameters() if p.requires_grad and p.dtype in LOW_PRECISION))
    dtype = dtype.removeprefix("torch.")
    fix = (f"raise {args_group}.learning_rate" if getattr(model, "is_loaded_in_4bit", False) else
           f"load them in float32 ({model_group}.dtype=float32; {args_group}.bf16=true still computes in bfloat16) "
           "if memory allows, or raise the learning rate")
    logger.warning("%s.dtype=%s: a step of %s.learning_rate=%g changes %.0f%% of the trained weights; the rest of "
                   "each step rounds away in %s: %s", model_group, dtype, args_group, learning_rate, 100 * share,
                   dtype, fix)
