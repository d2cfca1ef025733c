"""Batched per-token log-probs of chosen token ranges, without materialising full-vocabulary logits.

Sequences are sorted by length and run in right-padded micro-batches through the model's decoder; only the hidden
states that predict the requested tokens go through the language-model head, all of a micro-batch's at once: on a
GPU in TRL's fused log-prob kernel (``trl.kernels.ChunkedLogProbFunction``: the head's matmul in tiles, each folded
into online log-sum-exp statistics by a Triton kernel), elsewhere as a log-softmax in chunks of positions, so a
4K-token completion with a 152K vocabulary never builds a ``(T, V)`` tensor. The one exception is
``whole_forward`` (a sharded teacher, whose own forward must run): it keeps the logits of the positions the
micro-batch's ranges span (counted by ``rlt_mono.memory.model.teacher_pass_logits_bytes``).
"""

from __future__ import annotations

import contextlib

import torch
from torch import nn

# whole_forward: kept logits per log-softmax chunk, (chunk, V) fp32 = 1024 * 152K * 4 B = 0.6 GB for Qwen2.5.
_HEAD_CHUNK = 1024
# Vocabulary entries per tile of the fused kernel (TRL's own default for its fused LM head).
_VOCAB_TILE = 32768


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
        spans = [ranges[i] for i in chunk]
        with torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext():
            if whole_forward:
                log_probs = _whole_forward_log_probs(model, input_ids, attention_mask, spans, temperature)
            else:
                log_probs = _fused_log_probs(model, input_ids, attention_mask, spans, temperature)
        for i, row_log_probs in zip(chunk, log_probs):
            results[i] = row_log_probs
    return results  # type: ignore[return-value]


def _fused_log_probs(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    spans: list[tuple[int, int]],
    temperature: float,
) -> list[torch.Tensor]:
    """The decoder over the micro-batch, then the head + log-softmax over only the hidden states that predict the
    spans' tokens (row by row, in position order), split back per row: one fused kernel call on a GPU
    (``fused_kernel_on``), a plain log-softmax in chunks of ``_HEAD_CHUNK`` positions elsewhere."""
    hidden = model.get_decoder()(input_ids=input_ids, attention_mask=attention_mask,
                                 use_cache=False).last_hidden_state  # (b, T, H)
    positions = torch.arange(input_ids.shape[1], device=input_ids.device)  # (T,)
    starts = torch.tensor([start for start, _ in spans], device=input_ids.device)[:, None]  # (b, 1)
    ends = torch.tensor([end for _, end in spans], device=input_ids.device)[:, None]  # (b, 1)
    # position p predicts token p + 1: the predictors of [start, end) are [start - 1, end - 1)
    predicts = (positions >= starts - 1) & (positions < ends - 1)  # (b, T)
    selected, targets = hidden[predicts], input_ids.roll(-1, dims=1)[predicts]  # (N, H), (N,)
    head = model.get_output_embeddings()
    softcap = getattr(model.config.get_text_config(), "final_logit_softcapping", None)
    if fused_kernel_on(hidden.device):
        from trl.kernels import ChunkedLogProbFunction  # imports TRL (seconds on a CPU): only when a pass runs

        log_probs = ChunkedLogProbFunction.apply(selected, head.weight, head.bias, targets, temperature,
                                                 _VOCAB_TILE, softcap, 1.0, ("log_probs",))[0]  # (N,)
    else:
        parts = []
        for lo in range(0, len(targets), _HEAD_CHUNK):
            logits = head(selected[lo : lo + _HEAD_CHUNK]).float()  # (L, V)
            if softcap is not None:
                logits = softcap * torch.tanh(logits / softcap)
            parts.append(_target_log_probs(logits, targets[lo : lo + _HEAD_CHUNK], temperature))
        log_probs = torch.cat(parts) if parts else selected.new_zeros(0)
    return [part.float().cpu() for part in log_probs.split([end - start for start, end in spans])]


def fused_kernel_on(device: torch.device) -> bool:
    """Whether the head goes through TRL's fused kernel on ``device``: where it runs as a Triton kernel (CUDA).
    Elsewhere TRL runs it as torch ops, measured 1.3-1.6x slower on a 2-core CPU than one log-softmax over the
    same (512 x 152K) logits, which the CPU tests would pay on every reward pass."""
    return device.type == "cuda"


def _whole_forward_log_probs(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    spans: list[tuple[int, int]],
    temperature: float,
) -> list[torch.Tensor]:
    """The model's own forward, keeping the logits of the positions the spans cover (``logits_to_keep``); their
    log-softmax in chunks of ``_HEAD_CHUNK`` positions."""
    covered = [(start, end) for start, end in spans if start < end] or [(1, 1)]
    first_pos = min(start for start, _ in covered) - 1  # logits at position t predict token t + 1
    keep = torch.arange(first_pos, max(end for _, end in covered) - 1, device=input_ids.device)
    kept = model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False,
                 logits_to_keep=keep).logits  # (b, K, V)
    out = []
    for row, (start, end) in enumerate(spans):
        parts = []
        for lo in range(start, end, _HEAD_CHUNK):
            hi = min(lo + _HEAD_CHUNK, end)
            logits = kept[row, lo - 1 - first_pos : hi - 1 - first_pos]  # (L, V)
            parts.append(_target_log_probs(logits, input_ids[row, lo:hi], temperature))
        out.append(torch.cat(parts).cpu() if parts else torch.zeros(0))
    return out


def _target_log_probs(logits: torch.Tensor, targets: torch.Tensor, temperature: float) -> torch.Tensor:
    """``log softmax(logits / temperature)`` at ``targets``, in float32: ``(L, V)``, ``(L,)`` -> ``(L,)``."""
    return (logits.float() / temperature).log_softmax(-1).gather(-1, targets[:, None]).squeeze(-1)
