"""Padded batches through the flash attention kernel: left-align each row and drop the mask (rotary models).

PyTorch's scaled-dot-product attention takes its flash kernel only when no mask is given; a padded batch's mask
sends it to the memory-efficient kernel instead, which the 7B profile measured at about 4x the flash kernel's time
per call (docs/PERFORMANCE.md, "Where the score and train phases go"). TRL's batches are left-padded prompts
followed by right-padded completions, and rlt_mono's reward passes are right-padded.

``install(decoder)`` hooks a decoder (``model.get_decoder()``, e.g. ``Qwen2Model``) so that a call with a padding
mask and ``use_cache=False`` (as TRL's log-prob and training passes and rlt_mono's reward make) runs differently:
each row is rolled left by its count of leading pads, which leaves only right padding; under causal attention no
real token looks at a later one, so the mask is dropped and the decoder runs causal-only (the flash kernel); its
hidden states are rolled back into place. Every real token then sees the same tokens at the same relative
distances. Rotary position embeddings make attention depend only on those distances, so the real positions'
outputs are the masked run's, to float rounding; the pad positions get values no loss reads (TRL masks them,
rlt_mono's reward reads only its spans). A row whose real tokens are not one contiguous run, a call with a cache
or explicit positions, and a model whose positions are not rotary are left as they are.
"""

from __future__ import annotations

import logging

import torch
from torch import nn

logger = logging.getLogger(__name__)

_MARK = "_rlt_left_align_hooks"
_SHIFT = "_rlt_left_align_shift"


def is_rotary(config) -> bool:
    """Whether the model's positions are rotary (so attention sees only relative distances)."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    return bool(getattr(text, "rope_parameters", None) or getattr(text, "rope_theta", None))


def install(decoder: nn.Module) -> bool:
    """Hook ``decoder`` (once; a copy of a hooked decoder is hooked already). False, and no hook, when its positions
    are not rotary."""
    if getattr(decoder, _MARK, False):
        return True
    if not is_rotary(decoder.config):
        logger.info("%s has no rotary positions: its padded batches keep their attention mask",
                    type(decoder).__name__)
        return False
    decoder.register_forward_pre_hook(_left_align, with_kwargs=True)
    decoder.register_forward_hook(_roll_back)
    setattr(decoder, _MARK, True)
    return True


def left_aligned(attention_mask: torch.Tensor) -> torch.Tensor | None:
    """Per row, the count of leading pads (``(B,)``), when rolling each row left by it leaves only right padding;
    None when some row's real tokens are not one contiguous run."""
    real = attention_mask.bool()
    lead = (real.cumsum(-1) == 0).sum(-1)  # (B,)
    rolled = _roll(real, lead)
    if bool((rolled[:, 1:] & ~rolled[:, :-1]).any()):  # a real token after a pad: a hole
        return None
    return lead


def _roll(tensor: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
    """Row ``b`` of ``tensor`` (``(B, T, ...)``) rolled left by ``shift[b]``."""
    width = tensor.shape[1]
    index = (torch.arange(width, device=tensor.device) + shift[:, None]) % width  # (B, T)
    index = index.view(*index.shape, *([1] * (tensor.dim() - 2))).expand_as(tensor)
    return tensor.gather(1, index)


def _left_align(module: nn.Module, args: tuple, kwargs: dict):
    setattr(module, _SHIFT, None)
    mask, input_ids = kwargs.get("attention_mask"), kwargs.get("input_ids")
    if (args or input_ids is None or not isinstance(mask, torch.Tensor) or mask.dim() != 2
            or kwargs.get("past_key_values") is not None or kwargs.get("use_cache") is not False
            or kwargs.get("position_ids") is not None):
        return None
    lead = left_aligned(mask)
    if lead is None:
        return None
    setattr(module, _SHIFT, lead)
    return args, {**kwargs, "input_ids": _roll(input_ids, lead), "attention_mask": None}


def _roll_back(module: nn.Module, args: tuple, output):
    lead = getattr(module, _SHIFT, None)
    if lead is None:
        return output
    setattr(module, _SHIFT, None)
    output.last_hidden_state = _roll(output.last_hidden_state, -lead)
    return output
