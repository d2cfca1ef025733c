"""Batched per-token log-probs of chosen token ranges, without materialising full-vocabulary logits.

Sequences are sorted by length and run in right-padded micro-batches through the model's decoder; the
language-model head is applied only to the hidden states that predict the requested tokens, in chunks, so
a 4K-token completion with a 152K vocabulary never builds a ``(B, T, V)`` tensor. The one exception is
``whole_forward`` (a sharded teacher, whose own forward must run): it keeps the logits of the positions the
micro-batch's ranges span (counted by ``rlt_mono.memory.teacher_pass_logits_bytes``).
"""

from __future__ import annotations

import contextlib

import torch
from torch import nn

# Hidden states per lm-head chunk: (chunk, V) fp32 logits = 1024 * 152K * 4 B = 0.6 GB for Qwen2.5.
_HEAD_CHUNK = 1024


@torch.no_grad()
def range_log_probs(
    model: nn.Module,
    sequences: list[list[int]],
    ranges: list[tuple[int, int]],
    *,
    temperature: float,
    micro_batch_size: int,
    pad_token_id: int,
    whole_forward: bool = False,
) -> list[torch.Tensor]:
    """Log-probs ``log p(x_t | x_<t)`` for ``t`` in ``ranges[i] = [start, end)`` of each sequence.

    Args:
        model: a causal LM with ``get_decoder()`` and ``get_output_embeddings()`` (Qwen2, Llama, ...).
        sequences: B token-id lists.
        ranges: B ``(start, end)`` with ``1 <= start <= end <= len(sequence)``.
        temperature: logits are divided by it before the softmax.
        micro_batch_size: sequences per forward.
        pad_token_id: id used to right-pad a micro-batch (masked out).
        whole_forward: call the model itself, keeping only the logits of the positions the micro-batch's ranges
            span (``logits_to_keep``), instead of its decoder and head apart: the model's own hooks then run, as
            FSDP's, which gather a sharded model's weights around its forward.

    Returns:
        B float32 CPU tensors of shape ``(end - start,)``.
    """
    if micro_batch_size < 1:
        raise ValueError(f"micro_batch_size must be >= 1, got {micro_batch_size}")
    for seq, (start, end) in zip(sequences, ranges):
        if not 1 <= start <= end <= len(seq):
            raise ValueError(f"range ({start}, {end}) is invalid for a sequence of {len(seq)} tokens")
    device = next(model.parameters()).device
    decoder, head = (None, None) if whole_forward else (model.get_decoder(), model.get_output_embeddings())
    results: list[torch.Tensor | None] = [None] * len(sequences)
    order = sorted(range(len(sequences)), key=lambda i: len(sequences[i]), reverse=True)
    for first in range(0, len(order), micro_batch_size):
        chunk = order[first : first + micro_batch_size]
        width = max(len(sequences[i]) for i in chunk)
        input_ids = torch.full((len(chunk), width), pad_token_id, dtype=torch.long)  # (b, T)
        attention_mask = torch.zeros((len(chunk), width), dtype=torch.long)  # (b, T)
        for row, i in enumerate(chunk):
            input_ids[row, : len(sequences[i])] = torch.tensor(sequences[i])
            attention_mask[row, : len(sequences[i])] = 1
        input_ids, attention_mask = input_ids.to(device), attention_mask.to(device)
        with torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext():
            if whole_forward:
                spans = [ranges[i] for i in chunk if ranges[i][0] < ranges[i][1]] or [(1, 1)]
                first_pos = min(start for start, _ in spans) - 1  # logits at position t predict token t + 1
                keep = torch.arange(first_pos, max(end for _, end in spans) - 1, device=device)
                kept = model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False,
                             logits_to_keep=keep).logits  # (b, K, V)
            else:
                hidden = decoder(input_ids=input_ids, attention_mask=attention_mask,
                                 use_cache=False).last_hidden_state  # (b, T, H)
        for row, i in enumerate(chunk):
            start, end = ranges[i]
            parts = []
            for lo in range(start, end, _HEAD_CHUNK):
                hi = min(lo + _HEAD_CHUNK, end)
                if whole_forward:
                    logits = kept[row, lo - 1 - first_pos : hi - 1 - first_pos]  # (L, V)
                else:
                    logits = head(hidden[row, lo - 1 : hi - 1])  # (L, V)
                log_probs = (logits.float() / temperature).log_softmax(-1)
                parts.append(log_probs.gather(-1, input_ids[row, lo:hi, None]).squeeze(-1))
            results[i] = torch.cat(parts).cpu() if parts else torch.zeros(0)
    return results  # type: ignore[return-value]
