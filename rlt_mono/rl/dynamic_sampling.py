"""Tied GRPO groups and DAPO-style dynamic sampling: replace the groups that carry no learning signal.

GRPO's advantage of a completion is its reward minus its group's mean, over the group's std. When every completion
of a prompt gets the same reward (the group is *tied*: a collapsed teacher writes one explanation eight times), every
advantage of the group is zero and the group adds nothing to the gradient but its share of the batch. Dynamic
sampling (DAPO, Yu et al. 2025, "dynamic sampling") drops such groups and fills their places with groups of fresh
prompts, generated and scored the same way, so that a step trains on as many informative groups as it can.

Here, with one rank (a group's completions all live on it):

- ``tied_groups`` says which groups of a batch tie, with TRL's rule (``frac_reward_zero_std``: the group's std is
  close to zero; unscorable completions, NaN, are left out of the std as TRL leaves them out);
- ``replace_groups`` puts whole groups of a donor batch into chosen places of a batch, TRL's tensors padded to a
  common width (prompts are left-padded, completions right-padded);
- ``refill_tied_groups`` runs the loop: up to ``rounds`` more generations of as many fresh prompts as there are
  tied places left, each round's untied groups taking those places. The batch keeps its size and its order;
  places still tied after the last round stay as they were (zero advantages, as without dynamic sampling).

The advantages of a donor group were normalised within that group (``scale_rewards="group"``, the RLT run's), so
moving the group moves them unchanged. docs/METHOD.md ("RL with signal") has the account and what it costs.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

import torch

# Keys of TRL's scored batch whose tensors are prompts (left-padded) rather than completions (right-padded).
PROMPT_KEYS = ("prompt_ids", "prompt_mask")
# Keys of TRL's scored batch holding token ids (padded with the pad token; every other tensor pads with 0).
ID_KEYS = ("prompt_ids", "completion_ids")


def tied_groups(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """Which groups of a batch have rewards that all tie.

    Args:
        rewards: (B,) one reward per completion, the ``group_size`` completions of a prompt next to each other
            (TRL's ``RepeatSampler`` order); NaN marks an unscorable completion.
        group_size: completions per prompt (``num_generations``).

    Returns:
        (B / group_size,) bool: True where the group's std (unbiased, NaN left out, as TRL's ``nanstd``) is close
        to zero (``torch.isclose`` with its default tolerances, as TRL's ``frac_reward_zero_std``). A group with
        fewer than two scorable completions has no spread and counts as tied.
    """
    if rewards.ndim != 1 or rewards.numel() % group_size:
        raise ValueError(f"rewards must be (B,) with B a multiple of group_size={group_size}, "
                         f"got shape {tuple(rewards.shape)}")
    grouped = rewards.double().view(-1, group_size)  # (G, group_size)
    scorable = ~torch.isnan(grouped)
    count = scorable.sum(dim=1)  # (G,)
    mean = torch.where(scorable, grouped, 0.0).sum(dim=1) / count.clamp(min=1)
    squares = torch.where(scorable, (grouped - mean[:, None]) ** 2, 0.0).sum(dim=1)
    std = torch.sqrt(squares / (count - 1).clamp(min=1))
    return torch.isclose(std, torch.zeros_like(std)) | (count < 2)


def _pad(tensor: torch.Tensor, width: int, left: bool, value: float) -> torch.Tensor:
    """``tensor`` (B, W, ...) padded along dim 1 to ``width`` with ``value``, on the left or the right."""
    missing = width - tensor.shape[1]
    if missing <= 0:
        return tensor
    filler = torch.full((tensor.shape[0], missing, *tensor.shape[2:]), value, dtype=tensor.dtype,
                        device=tensor.device)
    return torch.cat([filler, tensor] if left else [tensor, filler], dim=1)


def replace_groups(batch: dict, donor: dict, places: list[int], donors: list[int], group_size: int,
                   pad_token_id: int) -> dict:
    """``batch`` with its groups ``places[i]`` replaced by ``donor``'s groups ``donors[i]`` (both TRL scored batches).

    Every per-completion tensor (first dim B) is replaced row by row; two-dimensional ones are first padded to the
    wider of the two batches (prompt keys on the left, the rest on the right; ids with ``pad_token_id``, the rest
    with 0, which the masks then exclude). ``num_items_in_batch`` becomes the completion tokens the loss counts
    (``completion_mask``, times ``tool_mask`` when present), as TRL computes it on one rank. Other entries are kept.
    """
    if len(places) != len(donors):
        raise ValueError(f"{len(places)} places but {len(donors)} donor groups")
    size = batch["completion_ids"].shape[0]
    rows = torch.tensor([p * group_size + k for p in places for k in range(group_size)], dtype=torch.long)
    donor_rows = torch.tensor([d * group_size + k for d in donors for k in range(group_size)], dtype=torch.long)
    merged = dict(batch)
    for key, value in batch.items():
        if not isinstance(value, torch.Tensor) or value.ndim == 0 or value.shape[0] != size or key not in donor:
            continue
        other = donor[key]
        if value.ndim >= 2 and value.shape[1] != other.shape[1]:
            width = max(value.shape[1], other.shape[1])
            fill = pad_token_id if key in ID_KEYS else 0
            value = _pad(value, width, key in PROMPT_KEYS, fill)
            other = _pad(other, width, key in PROMPT_KEYS, fill)
        value = value.clone()
        value[rows.to(value.device)] = other[donor_rows.to(other.device)].to(value.device)
        merged[key] = value
    if "num_items_in_batch" in batch:
        loss_mask = merged["completion_mask"] * merged["tool_mask"] if "tool_mask" in merged else \
            merged["completion_mask"]
        merged["num_items_in_batch"] = loss_mask.sum()
    return merged


def fresh_prompts(num_rows: int, count: int, seed: int, step: int, round_: int) -> list[int]:
    """``count`` distinct row indices of ``num_rows`` for refill round ``round_`` of optimizer step ``step``.

    A function of its arguments alone (no sampler state to checkpoint): a resumed run draws what an uninterrupted
    one drew. A draw may include prompts of the batch being refilled; with many rows that is rare.
    """
    rng = random.Random(f"{seed}/{step}/{round_}")
    return rng.sample(range(num_rows), min(count, num_rows))


@dataclass
class RefillStats:
    """What one batch's dynamic sampling did: tied fraction before and after, rounds run, groups replaced."""

    groups: int
    tied_before: int
    tied_after: int
    rounds: int

    @property
    def metrics(self) -> dict[str, float]:
        return {"groups/tied_frac": self.tied_before / self.groups,
                "groups/tied_frac_after_refill": self.tied_after / self.groups,
                "groups/refill_rounds": float(self.rounds),
                "groups/refilled": float(self.tied_before - self.tied_after)}


def refill_tied_groups(batch: dict, rewards: torch.Tensor, group_size: int, rounds: int,
                       score: Callable[[list[int]], tuple[dict, torch.Tensor]], draw: Callable[[int, int], list[int]],
                       pad_token_id: int) -> tuple[dict, RefillStats]:
    """Replace ``batch``'s tied groups by untied groups of fresh prompts, in at most ``rounds`` extra generations.

    Args:
        batch: TRL's scored batch (``_generate_and_score_completions``'s output), B completions.
        rewards: (B,) the batch's rewards (``tied_groups`` reads them).
        group_size: completions per prompt.
        rounds: most extra generations (0: only count the tied groups).
        score: generates and scores ``group_size`` completions for each given row index; returns the scored batch
            and its rewards.
        draw: ``draw(count, round)`` -> ``count`` row indices for that refill round.
        pad_token_id: the tokenizer's pad id (``replace_groups``).
    """
    tied = tied_groups(rewards, group_size)
    places = tied.nonzero().flatten().tolist()
    tied_before, done = len(places), 0
    while places and done < rounds:
        done += 1
        donor, donor_rewards = score(draw(len(places), done))
        usable = (~tied_groups(donor_rewards, group_size)).nonzero().flatten().tolist()
        taken = min(len(usable), len(places))
        if taken:
            batch = replace_groups(batch, donor, places[:taken], usable[:taken], group_size, pad_token_id)
        places = places[taken:]
    return batch, RefillStats(groups=tied.numel(), tied_before=tied_before, tied_after=len(places), rounds=done)
