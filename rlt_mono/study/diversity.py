"""Does an SFT teacher still vary? Its explanations sampled on held-out prompts, as the RL stage would sample them.

GRPO learns from the spread of rewards inside a group of explanations of one prompt. A teacher whose warm-up made it
deterministic writes the same explanation every time, every group ties, and RL has no signal (the first study of
this project: held-out SFT loss 0.004, token entropy about 0.001 nats, most groups tied). So after teacher SFT,
``measure`` samples ``samples`` explanations for each of ``prompts`` held-out rows at the RL temperature and reports:

- ``distinct_per_prompt``: the mean number of distinct explanations among a prompt's samples (1 = collapsed, at most
  ``samples``), and ``all_same_frac``: the fraction of prompts whose samples are all the same text;
- ``mean_token_entropy``: the mean, over every generated token, of the entropy (nats) of the distribution it was
  sampled from (the logits divided by the temperature), as the RL stage's sampling sees it.

``collapse_problem`` turns these into a warning when the teacher has collapsed.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import torch

logger = logging.getLogger(__name__)

# A teacher is called collapsed when at least this fraction of prompts got one text for all their samples ...
COLLAPSED_ALL_SAME_FRAC = 0.5
# ... or when its sampling distributions are this sharp (nats per token, mean over generated tokens).
COLLAPSED_ENTROPY = 0.05


@dataclass
class Diversity:
    """What ``measure`` found (written into sft_summary.json as ``diversity``)."""

    prompts: int
    samples: int
    temperature: float
    distinct_per_prompt: float
    all_same_frac: float
    mean_token_entropy: float
    # Generated tokens the entropy is a mean over.
    tokens: int

    def as_dict(self) -> dict:
        return asdict(self)


def distinct_counts(texts: Sequence[str], samples: int) -> list[int]:
    """Distinct texts per prompt, ``texts`` holding each prompt's ``samples`` texts next to each other."""
    if len(texts) % samples:
        raise ValueError(f"{len(texts)} texts are not whole groups of {samples}")
    return [len(set(texts[i : i + samples])) for i in range(0, len(texts), samples)]


def token_entropies(logits: torch.Tensor, temperature: float, generated: torch.Tensor) -> torch.Tensor:
    """Entropy in nats of each generated token's sampling distribution.

    Args:
        logits: (N, T, V) raw logits at each generated position.
        temperature: what sampling divided them by.
        generated: (N, T) bool, True where a token was generated (False after the sequence ended).

    Returns:
        (number of True in ``generated``,) the entropy of ``softmax(logits / temperature)`` at those positions.
    """
    log_p = torch.log_softmax(logits.float() / temperature, dim=-1)  # (N, T, V)
    entropy = -(log_p.exp() * log_p).sum(dim=-1)  # (N, T)
    return entropy[generated]


def collapse_problem(diversity: Diversity) -> str | None:
    """A warning naming what shows the collapse, or None when the teacher still varies."""
    signs = []
    if diversity.all_same_frac >= COLLAPSED_ALL_SAME_FRAC:
        signs.append(f"{diversity.all_same_frac:.0%} of held-out prompts got {diversity.samples} identical "
                     "explanations")
    if diversity.mean_token_entropy < COLLAPSED_ENTROPY:
        signs.append(f"mean token entropy {diversity.mean_token_entropy:.4f} nats (< {COLLAPSED_ENTROPY})")
    if not signs:
        return None
    return (f"COLLAPSED TEACHER: {'; '.join(signs)} at temperature {diversity.temperature}. RL will see tied groups "
            "and learn little: train less (sft.max_steps, or sft.early_stopping_patience with sft.eval_strategy=steps)"
            ", lower sft.learning_rate, or raise the RL trainer.temperature")


@torch.no_grad()
def measure(model, tokenizer, prompts: Sequence[str], samples: int, temperature: float, max_new_tokens: int,
            stop_text: str, batch_size: int = 64, seed: int = 0) -> Diversity:
    """Sample ``samples`` continuations of each prompt with transformers' ``generate`` (no top-k/top-p, as the RL
    stage's vLLM sampling) and measure them. A text counts up to ``stop_text`` (the closing explanation tag)."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    padding_side, tokenizer.padding_side = tokenizer.padding_side, "left"
    generator_state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    texts, entropies = [], []
    try:
        repeated = [prompt for prompt in prompts for _ in range(samples)]
        for first in range(0, len(repeated), batch_size):
            batch = tokenizer(repeated[first : first + batch_size], return_tensors="pt", padding=True,
                              add_special_tokens=False).to(device)
            out = model.generate(**batch, do_sample=True, temperature=temperature, top_k=0, top_p=1.0,
                                 max_new_tokens=max_new_tokens, output_logits=True, return_dict_in_generate=True,
                                 pad_token_id=tokenizer.pad_token_id)
            new = out.sequences[:, batch["input_ids"].shape[1]:]  # (n, T)
            logits = torch.stack(out.logits, dim=1)  # (n, T, V)
            ended = _ended(new, model.generation_config.eos_token_id)
            entropies.append(token_entropies(logits, temperature, ~ended).cpu())
            decoded = [tokenizer.decode(tokens[~end], skip_special_tokens=False) for tokens, end in zip(new, ended)]
            texts += [text.split(stop_text, 1)[0] for text in decoded]
    finally:
        tokenizer.padding_side = padding_side
        torch.random.set_rng_state(generator_state)
        model.train(was_training)
    counts = distinct_counts(texts, samples)
    every = torch.cat(entropies)
    return Diversity(prompts=len(prompts), samples=samples, temperature=temperature,
                     distinct_per_prompt=sum(counts) / len(counts),
                     all_same_frac=sum(c == 1 for c in counts) / len(counts),
                     mean_token_entropy=float(every.mean()) if every.numel() else 0.0, tokens=int(every.numel()))


def _ended(tokens: torch.Tensor, eos_token_id) -> torch.Tensor:
    """(N, T) True at the positions after a sequence's first end-of-sequence token (generate pads them)."""
    eos = torch.tensor(eos_token_id if isinstance(eos_token_id, list) else [eos_token_id], device=tokens.device)
    is_eos = torch.isin(tokens, eos).long()
    return (torch.cumsum(is_eos, dim=1) - is_eos) > 0
