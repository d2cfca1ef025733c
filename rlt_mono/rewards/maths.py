"""Pure tensor maths of the RLT teacher reward (docs/METHOD.md, "The reward").

Every function takes right-padded ``(B, T)`` tensors with a boolean ``(B, T)`` mask of the valid
positions and is independent of models and tokenizers, so it is unit-tested against hand-computed values.

Conventions carried over from the RLT code:
- ``median`` is the *lower* median of the valid values (``torch.nanmedian``); the quartiles interpolate
  linearly (``torch.nanquantile``).
- A reduction over an empty span gives NaN; the reward then replaces a NaN solution score by
  ``not_matched_penalty`` and a NaN KL score by ``-not_matched_penalty`` (an empty explanation is penalised).
  As in the original for an empty explanation, whose width-0 span gives NaN for ``mean`` (0/0) and for ``min``,
  ``max``, ``median`` and the quartiles (torch raises on an empty dimension; the original catches it and writes
  NaN). Deliberately unlike it for ``sum`` (0 there) and the no-entropy variant (whose NaN KL became
  ``+not_matched_penalty`` there, a bonus for an empty explanation): every empty reduction is penalised the same
  way here (docs/METHOD.md, "Where rlt_mono deliberately differs", 4).
- Normalisation is applied per token before the reduction; clipping after normalisation:
  ``clip_log_prob`` bounds the solution term from below at ``-clip_log_prob``, ``clip_kl`` bounds the KL from above.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

REDUCTIONS = ("mean", "sum", "min", "max", "median", "first_quartile", "last_quartile")
NORMALIZATIONS = ("none", "exp", "exp_norm")
_QUANTILES = {"first_quartile": 0.25, "last_quartile": 0.75}


def masked_reduce(values: torch.Tensor, mask: torch.Tensor, reduction: str) -> torch.Tensor:
    """Reduce each row of ``values`` over its masked positions.

    Args:
        values: ``(B, T)`` float tensor.
        mask: ``(B, T)`` bool tensor, True where a value counts.
        reduction: one of ``REDUCTIONS``.

    Returns:
        ``(B,)`` tensor; NaN for a row whose mask is empty.
    """
    if reduction not in REDUCTIONS:
        raise ValueError(f"unknown reduction {reduction!r}; expected one of {REDUCTIONS}")
    mask = mask.bool()
    values = values.float()
    counts = mask.sum(dim=-1)  # (B,)
    empty = counts == 0
    nan = torch.full_like(values[..., 0], float("nan"))
    if reduction == "mean":
        out = (values * mask).sum(-1) / counts.clamp(min=1)
    elif reduction == "sum":
        out = (values * mask).sum(-1)
    elif reduction == "min":
        out = values.masked_fill(~mask, float("inf")).amin(-1)
    elif reduction == "max":
        out = values.masked_fill(~mask, float("-inf")).amax(-1)
    elif reduction == "median":
        out = values.masked_fill(~mask, float("nan")).nanmedian(dim=-1).values
    else:
        out = torch.nanquantile(values.masked_fill(~mask, float("nan")), _QUANTILES[reduction], dim=-1)
    return torch.where(empty, nan, out)


def normalize(values: torch.Tensor, fn: str) -> torch.Tensor:
    """Per-token normalisation: ``none`` -> x, ``exp`` -> exp(x), ``exp_norm`` -> 1 - exp(-x)."""
    if fn == "none":
        return values
    if fn == "exp":
        return torch.exp(values)
    if fn == "exp_norm":
        return 1.0 - torch.exp(-values)
    raise ValueError(f"unknown normalisation {fn!r}; expected one of {NORMALIZATIONS}")


def kl_estimate(teacher_log_probs: torch.Tensor, student_log_probs: torch.Tensor, schulman: bool) -> torch.Tensor:
    """Per-token KL(teacher || student) estimate on the explanation tokens, both ``(B, T)``.

    ``k = lp_teacher - lp_student``; Schulman's k3 estimator is ``k - 1 + exp(-k)`` (non-negative).
    """
    k = teacher_log_probs.float() - student_log_probs.float()
    if schulman:
        k = k - 1.0 + torch.exp(-k)
    return k


@dataclass(frozen=True)
class RewardTerms:
    """The reward of a batch of B completions, with every component.

    Shapes: ``solution_scores (B, n_lp)`` (one column per ``reduction_log_prob_fn``), ``kl_scores (B, n_kl)``
    (one column per ``reduction_kl_fn``), and ``(B,)`` for the rest. ``total = r_ss - r_kl + match_penalty``.
    """

    solution_scores: torch.Tensor
    kl_scores: torch.Tensor
    r_ss: torch.Tensor
    r_kl: torch.Tensor
    match_penalty: torch.Tensor
    total: torch.Tensor


def teacher_reward_terms(
    *,
    student_solution_log_probs: torch.Tensor,
    solution_mask: torch.Tensor,
    student_explanation_log_probs: torch.Tensor,
    teacher_explanation_log_probs: torch.Tensor | None,
    explanation_mask: torch.Tensor,
    matched: torch.Tensor,
    answer_log_prob_coeff: list[float],
    reduction_log_prob_fn: list[str],
    kl_penalty_reward_coeff: list[float],
    reduction_kl_fn: list[str],
    normalize_log_prob_fn: str,
    normalize_kl_fn: str,
    clip_log_prob: float | None,
    clip_kl: float | None,
    use_schulman_kl_estimation: bool,
    include_teacher_think_entropy: bool,
    not_matched_penalty: float,
) -> RewardTerms:
    """Combine per-token log-probs into the RLT teacher reward.

    Args:
        student_solution_log_probs: ``(B, S)`` student log-probs of the solution tokens (temperature-scaled).
        solution_mask: ``(B, S)`` bool.
        student_explanation_log_probs: ``(B, E)`` student log-probs of the explanation tokens.
        teacher_explanation_log_probs: ``(B, E)`` teacher log-probs of the *same* tokens, aligned position by
            position; unused (may be None) when ``include_teacher_think_entropy`` is False.
        explanation_mask: ``(B, E)`` bool.
        matched: ``(B,)`` bool, whether the completion closed the explanation tag.
        The rest: see ``TeacherRewardConfig``.

    Returns:
        ``RewardTerms``.
    """
    lp = normalize(student_solution_log_probs.float(), normalize_log_prob_fn)
    if clip_log_prob is not None:
        lp = lp.clamp(min=-clip_log_prob)
    solution_scores = torch.stack([masked_reduce(lp, solution_mask, r) for r in reduction_log_prob_fn], dim=-1)
    solution_scores = torch.nan_to_num(solution_scores, nan=not_matched_penalty)

    if include_teacher_think_entropy:
        if teacher_explanation_log_probs is None:
            raise ValueError("teacher_explanation_log_probs is required when include_teacher_think_entropy=True")
        per_token_kl = kl_estimate(teacher_explanation_log_probs, student_explanation_log_probs,
                                   use_schulman_kl_estimation)
    else:
        per_token_kl = -student_explanation_log_probs.float()
    kl = normalize(per_token_kl, normalize_kl_fn)
    if clip_kl is not None:
        kl = kl.clamp(max=clip_kl)
    kl_scores = torch.stack([masked_reduce(kl, explanation_mask, r) for r in reduction_kl_fn], dim=-1)
    kl_scores = torch.nan_to_num(kl_scores, nan=-not_matched_penalty)

    ss_coeff = torch.tensor(answer_log_prob_coeff, dtype=solution_scores.dtype, device=solution_scores.device)
    kl_coeff = torch.tensor(kl_penalty_reward_coeff, dtype=kl_scores.dtype, device=kl_scores.device)
    r_ss = (solution_scores * ss_coeff).sum(-1)
    r_kl = (kl_scores * kl_coeff).sum(-1)
    match_penalty = torch.where(matched.to(r_ss.device).bool(), 0.0, not_matched_penalty).to(r_ss.dtype)
    return RewardTerms(
        solution_scores=solution_scores,
        kl_scores=kl_scores,
        r_ss=r_ss,
        r_kl=r_kl,
        match_penalty=match_penalty,
        total=r_ss - r_kl + match_penalty,
    )
