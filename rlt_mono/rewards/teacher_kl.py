"""``TeacherKLReward``: the RLT teacher reward as a plain TRL reward function.

reward = r_SS - r_KL + match_penalty (docs/METHOD.md), where r_SS scores how likely the frozen student
finds the solution after reading the teacher's explanation, and r_KL how unnatural the explanation is to the
student (KL between teacher and student on the explanation tokens).

Called by TRL as ``reward(prompts=..., completions=..., completion_ids=..., question=..., solution=...,
log_metric=..., **other_columns)``. The trainer may add ``teacher_log_probs`` (per completion, TRL's own
temperature-scaled policy log-probs of the completion tokens) so no second teacher forward is needed;
without it the reward runs the teacher itself. Each call scores the batch in padded micro-batches.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn
from transformers import PreTrainedTokenizerBase

from rlt_mono.config import config_group
from rlt_mono.data.prompts import PromptFormat
from rlt_mono.rewards.alignment import AlignedSample, align_samples, token_bytes
from rlt_mono.rewards.log_probs import range_log_probs
from rlt_mono.rewards.maths import NORMALIZATIONS, REDUCTIONS, RewardTerms, teacher_reward_terms

logger = logging.getLogger(__name__)

# Places the model on its compute device for the duration of a scoring pass (the phase controller).
ModelContext = Callable[[nn.Module], contextlib.AbstractContextManager]


@config_group("reward")
@dataclass
class TeacherRewardConfig:
    """Options of the teacher reward; defaults are the RLT run's (``cfgs/reward/rlt.yaml``)."""

    # Coefficients of the solution log-prob reductions, one per entry of reduction_log_prob_fn.
    answer_log_prob_coeff: list[float] = field(default_factory=lambda: [1.0, 0.01])
    # Reductions of the student's per-token solution log-probs (see REDUCTIONS).
    reduction_log_prob_fn: list[str] = field(default_factory=lambda: ["mean", "min"])
    # Coefficients of the KL reductions, one per entry of reduction_kl_fn.
    kl_penalty_reward_coeff: list[float] = field(default_factory=lambda: [3.0, 0.03])
    # Reductions of the per-token explanation KL.
    reduction_kl_fn: list[str] = field(default_factory=lambda: ["mean", "max"])
    # Per-token normalisation of the solution log-probs: none | exp | exp_norm.
    normalize_log_prob_fn: str = "none"
    # Per-token normalisation of the KL: none | exp | exp_norm.
    normalize_kl_fn: str = "none"
    # Lower bound -clip_log_prob on the normalised solution log-probs (None: no clip; the RLT run's 100000 never
    # binds, so None is the same reward).
    clip_log_prob: float | None = None
    # Upper bound on the normalised per-token KL (None: no clip; likewise for the RLT run's 100000).
    clip_kl: float | None = None
    # Use Schulman's k3 estimator k - 1 + exp(-k) instead of k = lp_teacher - lp_student.
    use_schulman_kl_estimation: bool = False
    # False: penalise -lp_student on the explanation instead of the KL (drops the teacher's entropy term).
    include_teacher_think_entropy: bool = True
    # Added to the reward when the completion never closes the explanation tag.
    not_matched_penalty: float = -1.0
    # Temperature dividing the student's logits.
    unbias_student_log_probs_temp: float = 0.7
    # Divide the teacher's logits by the generation temperature (else by 1).
    unbias_teacher_log_probs: bool = True
    # Completions per scoring forward pass (student and teacher).
    micro_batch_size: int = 4

    def __post_init__(self) -> None:
        pairs = (("answer_log_prob_coeff", "reduction_log_prob_fn"), ("kl_penalty_reward_coeff", "reduction_kl_fn"))
        for coeff_name, reduction_name in pairs:
            coeffs, reductions = getattr(self, coeff_name), getattr(self, reduction_name)
            if len(coeffs) != len(reductions):
                raise ValueError(
                    f"{coeff_name} has {len(coeffs)} entries but {reduction_name} has {len(reductions)}: "
                    f"give one coefficient per reduction ({coeff_name}={list(coeffs)}, "
                    f"{reduction_name}={list(reductions)})"
                )
            bad = [r for r in reductions if r not in REDUCTIONS]
            if bad:
                raise ValueError(f"{reduction_name} has unknown reductions {bad}; choose from {REDUCTIONS}")
        for name in ("normalize_log_prob_fn", "normalize_kl_fn"):
            if getattr(self, name) not in NORMALIZATIONS:
                raise ValueError(f"{name}={getattr(self, name)!r} is not one of {NORMALIZATIONS}")
        for name in ("clip_log_prob", "clip_kl"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ValueError(f"{name} must be > 0 or null, got {value} (a bound <= 0 flips the sign of its term)")
        for name in ("answer_log_prob_coeff", "kl_penalty_reward_coeff"):
            negative = [c for c in getattr(self, name) if c < 0]
            if negative:
                raise ValueError(f"{name} must hold coefficients >= 0, got {list(getattr(self, name))}")
        if self.not_matched_penalty > 0:
            raise ValueError(f"not_matched_penalty must be <= 0 (a penalty), got {self.not_matched_penalty}")
        if self.unbias_student_log_probs_temp <= 0:
            raise ValueError(f"unbias_student_log_probs_temp must be > 0, got {self.unbias_student_log_probs_temp}")
        if self.micro_batch_size < 1:
            raise ValueError(f"micro_batch_size must be >= 1, got {self.micro_batch_size}")


def check_shared_vocabulary(
    teacher_tokenizer: PreTrainedTokenizerBase,
    student_tokenizer: PreTrainedTokenizerBase,
    student_model: nn.Module | None = None,
    *,
    teacher_name: str = "teacher",
    student_name: str = "student",
) -> None:
    """Raise ``ValueError`` unless the student reads exactly the teacher's token ids.

    The reward feeds the teacher's generated ids to the student unchanged, so both tokenizers must map
    every token to the same id, and the student's embedding table must cover them.
    """
    teacher_vocab, student_vocab = teacher_tokenizer.get_vocab(), student_tokenizer.get_vocab()
    if teacher_vocab != student_vocab:
        differing = sorted(set(teacher_vocab.items()) ^ set(student_vocab.items()), key=lambda kv: kv[1])[:3]
        raise ValueError(
            f"The student ({student_name}, {len(student_vocab)} tokens) does not share the teacher's vocabulary "
            f"({teacher_name}, {len(teacher_vocab)} tokens); e.g. {differing}. The RLT reward scores the "
            "teacher's token ids with the student, so pick a student of the same tokenizer family "
            "(e.g. a Qwen2.5 student for a Qwen2.5 teacher): set student.model_name_or_path."
        )
    if student_model is not None:
        rows = student_model.get_input_embeddings().num_embeddings
        if rows < len(teacher_tokenizer):
            raise ValueError(
                f"The student ({student_name}) has {rows} embedding rows but the tokenizer has "
                f"{len(teacher_tokenizer)} tokens; the student cannot read every teacher token. Use a student "
                "whose embedding table covers the teacher's tokenizer (resize_token_embeddings before saving it)."
            )


@dataclass(frozen=True)
class StudentScore:
    """The student's view of one completion: its alignment and the student log-probs of both spans,
    ``solution_log_probs (S,)`` and ``explanation_log_probs (E,)`` (float32, CPU)."""

    sample: AlignedSample
    solution_log_probs: torch.Tensor
    explanation_log_probs: torch.Tensor


class TeacherKLReward:
    """RLT teacher reward; a TRL reward function (see the module docstring).

    After each call ``last_scores`` holds one dict per completion (question, solution, completion, explanation
    text, every reward component, alignment flags) for inspection in notebooks and ``samples.jsonl``. Metrics:
    ``teacher_reward/*`` (each component's batch mean) and ``alignment/*_frac`` (unmatched, trimmed, retokenized,
    noncanonical: see ``rlt_mono.rewards.alignment``).
    """

    __name__ = "teacher_kl"

    def __init__(
        self,
        student_model: nn.Module,
        tokenizer: PreTrainedTokenizerBase,
        config: TeacherRewardConfig | None = None,
        *,
        teacher_model: nn.Module | None = None,
        teacher_temperature: float = 1.0,
        prompt_format: PromptFormat | None = None,
        student_tokenizer: PreTrainedTokenizerBase | None = None,
        model_context: ModelContext | None = None,
        stop_token_ids: set[int] | None = None,
        names: tuple[str, str] = ("teacher", "student"),
    ):
        self.config = config or TeacherRewardConfig()
        self.student_model = student_model.eval()
        self.teacher_model = teacher_model
        self.tokenizer = tokenizer
        self.prompt_format = prompt_format or PromptFormat()
        self.teacher_temperature = teacher_temperature if self.config.unbias_teacher_log_probs else 1.0
        self.model_context = model_context or (lambda model: contextlib.nullcontext())
        check_shared_vocabulary(tokenizer, student_tokenizer or tokenizer, student_model,
                                teacher_name=names[0], student_name=names[1])
        default_stops = {i for i in (tokenizer.eos_token_id, tokenizer.pad_token_id) if i is not None}
        self.stop_ids = stop_token_ids if stop_token_ids is not None else default_stops
        self._logged_teacher_pass = False
        # Set when the teacher is sharded over ranks (FSDP: each of its forwards gathers its weights, a collective
        # every rank must join as often): maps this rank's count of teacher forwards to the largest count over the
        # ranks (rlt_mono.rl.trainer).
        self.sharded_teacher: Callable[[int], int] | None = None
        self.last_scores: list[dict] = []
        token_bytes(tokenizer, [])  # build the id -> bytes table now, not inside the first step

    @property
    def pad_token_id(self) -> int:
        return self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.tokenizer.eos_token_id

    def __call__(
        self,
        prompts: list[str],
        completions: list[str],
        completion_ids: list[list[int]],
        question: list[str],
        solution: list[str],
        teacher_log_probs: list[torch.Tensor] | None = None,
        student_scores: list[StudentScore] | None = None,
        log_metric: Callable[[str, float], None] | None = None,
        **_: object,
    ) -> list[float]:
        """TRL reward call. ``student_scores`` (from ``score_students``, e.g. computed ahead on the student's
        GPU) and ``teacher_log_probs`` (TRL's policy log-probs) are optional precomputed inputs."""
        if student_scores is None:
            student_scores = self.score_students(question, solution, completion_ids)
        samples = [s.sample for s in student_scores]
        teacher_explanation = None
        if self.config.include_teacher_think_entropy:
            teacher_explanation = self._teacher_log_probs(prompts, samples, teacher_log_probs)
        terms = self.score(
            samples,
            [s.solution_log_probs for s in student_scores],
            [s.explanation_log_probs for s in student_scores],
            teacher_explanation,
        )
        self._record(samples, completions, question, solution, terms, log_metric)
        return terms.total.tolist()

    def score_students(
        self, question: list[str], solution: list[str], completion_ids: list[list[int]]
    ) -> list[StudentScore]:
        """The student half of the reward: align every completion, then one batched student pass."""
        return self.student_pass(self.align(question, solution, completion_ids))

    def align(self, question: list[str], solution: list[str], completion_ids: list[list[int]]) -> list[AlignedSample]:
        """Token alignment of every completion (tokenizer work: keep it on the calling thread)."""
        return align_samples(self.tokenizer, self.prompt_format, list(question), list(solution),
                             [list(ids) for ids in completion_ids], self.stop_ids)

    def student_pass(self, samples: list[AlignedSample]) -> list[StudentScore]:
        """One batched student pass over aligned samples. Needs no teacher output and no tokenizer, so with the
        student on its own GPU it runs on a worker thread while the teacher's GPU works."""
        solution_lp, explanation_lp = self._student_log_probs(samples)
        return [StudentScore(*row) for row in zip(samples, solution_lp, explanation_lp)]

    def score(
        self,
        samples: list[AlignedSample],
        student_solution: list[torch.Tensor],
        student_explanation: list[torch.Tensor],
        teacher_explanation: list[torch.Tensor] | None,
    ) -> RewardTerms:
        """Pad the per-sample log-probs into ``(B, T)`` tensors and combine them (``teacher_reward_terms``)."""
        solution_lp, solution_mask = _pad(student_solution)
        explanation_lp, explanation_mask = _pad(student_explanation)
        teacher_lp = _pad(teacher_explanation)[0] if teacher_explanation is not None else None
        cfg = self.config
        return teacher_reward_terms(
            student_solution_log_probs=solution_lp,
            solution_mask=solution_mask,
            student_explanation_log_probs=explanation_lp,
            teacher_explanation_log_probs=teacher_lp,
            explanation_mask=explanation_mask,
            matched=torch.tensor([s.matched for s in samples]),
            answer_log_prob_coeff=list(cfg.answer_log_prob_coeff),
            reduction_log_prob_fn=list(cfg.reduction_log_prob_fn),
            kl_penalty_reward_coeff=list(cfg.kl_penalty_reward_coeff),
            reduction_kl_fn=list(cfg.reduction_kl_fn),
            normalize_log_prob_fn=cfg.normalize_log_prob_fn,
            normalize_kl_fn=cfg.normalize_kl_fn,
            clip_log_prob=cfg.clip_log_prob,
            clip_kl=cfg.clip_kl,
            use_schulman_kl_estimation=cfg.use_schulman_kl_estimation,
            include_teacher_think_entropy=cfg.include_teacher_think_entropy,
            not_matched_penalty=cfg.not_matched_penalty,
        )

    def _student_log_probs(self, samples: list[AlignedSample]) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """One student pass over [explanation start, solution end) of every chat; split into the two spans."""
        ranges = [(s.explanation_span[0], s.solution_span[1]) for s in samples]
        with self.model_context(self.student_model):
            log_probs = range_log_probs(
                self.student_model,
                [s.student_ids for s in samples],
                ranges,
                temperature=self.config.unbias_student_log_probs_temp,
                micro_batch_size=self.config.micro_batch_size,
                pad_token_id=self.pad_token_id,
            )
        solution, explanation = [], []
        for s, lp in zip(samples, log_probs):
            origin = s.explanation_span[0]
            explanation.append(lp[: s.explanation_span[1] - origin])
            solution.append(lp[s.solution_span[0] - origin : s.solution_span[1] - origin])
        return solution, explanation

    def _teacher_log_probs(
        self,
        prompts: list[str],
        samples: list[AlignedSample],
        precomputed: list[torch.Tensor] | None,
    ) -> list[torch.Tensor]:
        """Teacher log-probs of each explanation: reused from TRL where given, else one batched teacher pass."""
        out: list[torch.Tensor | None] = [None] * len(samples)
        if precomputed is not None:
            for i, (s, lp) in enumerate(zip(samples, precomputed)):
                if not s.retokenized:
                    out[i] = torch.as_tensor(lp, dtype=torch.float32).flatten()[: len(s.explanation_ids)].cpu()
        missing = [i for i, lp in enumerate(out) if lp is None]
        # Retokenized samples leave a count that differs between ranks (and memory=auto may give ranks different
        # micro-batches): a rank with fewer forwards fills them with one-token sequences.
        micro_batch = self.config.micro_batch_size
        forwards = -(-len(missing) // micro_batch)
        if self.sharded_teacher is not None:
            forwards = self.sharded_teacher(forwards)
        if forwards:
            if self.teacher_model is None:
                raise ValueError(
                    f"TeacherKLReward needs teacher log-probs for {len(missing)} completions (none given, or "
                    "re-tokenized ones): pass teacher_model=... or the teacher_log_probs column"
                )
            if not self._logged_teacher_pass:
                # Expected (CPU rollouts, distill, eval): a debug note, not something a user has to act on.
                logger.debug("the reward runs the teacher for the KL term of %d completions (TRL hands its own "
                             "log-probs over only with vLLM importance sampling or when generation and optimizer "
                             "steps are misaligned)", len(missing))
                self._logged_teacher_pass = True
            prompt_ids = [self.tokenizer(prompts[i])["input_ids"] for i in missing]
            sequences = [p + samples[i].explanation_ids for p, i in zip(prompt_ids, missing)]
            ranges = [(len(p), len(p) + len(samples[i].explanation_ids)) for p, i in zip(prompt_ids, missing)]
            fillers = forwards * micro_batch - len(missing) if self.sharded_teacher is not None else 0
            with self.model_context(self.teacher_model):
                computed = range_log_probs(
                    self.teacher_model,
                    sequences + [[self.pad_token_id]] * fillers,
                    ranges + [(1, 1)] * fillers,
                    temperature=self.teacher_temperature,
                    micro_batch_size=micro_batch,
                    pad_token_id=self.pad_token_id,
                    whole_forward=self.sharded_teacher is not None,
                )
            for i, lp in zip(missing, computed):
                out[i] = lp
        return out  # type: ignore[return-value]

    def _record(
        self,
        samples: list[AlignedSample],
        completions: list[str],
        question: list[str],
        solution: list[str],
        terms: RewardTerms,
        log_metric: Callable[[str, float], None] | None,
    ) -> None:
        cfg = self.config
        columns = {f"r_ss/{r}": terms.solution_scores[:, j] for j, r in enumerate(cfg.reduction_log_prob_fn)}
        columns |= {f"r_kl/{r}": terms.kl_scores[:, j] for j, r in enumerate(cfg.reduction_kl_fn)}
        columns |= {"r_ss": terms.r_ss, "r_kl": terms.r_kl, "match_penalty": terms.match_penalty,
                    "total": terms.total}
        flags = {
            "unmatched": [not s.matched for s in samples],
            "trimmed": [s.trimmed for s in samples],
            "retokenized": [s.retokenized for s in samples],
            "noncanonical": [s.noncanonical for s in samples],
        }
        self.last_scores = [
            {
                "question": q,
                "solution": sol,
                "completion": completion,
                "explanation": s.explanation_text,
                "explanation_tokens": len(s.explanation_ids),
                **{name: float(values[i]) for name, values in columns.items()},
                **{name: values[i] for name, values in flags.items()},
            }
            for i, (s, completion, q, sol) in enumerate(zip(samples, completions, question, solution, strict=True))
        ]
        if log_metric is None:
            return
        for name, values in columns.items():
            log_metric(f"teacher_reward/{name}", float(values.mean()))
        for name, values in flags.items():
            log_metric(f"alignment/{name}_frac", sum(values) / len(values))
        log_metric("alignment/explanation_tokens", sum(len(s.explanation_ids) for s in samples) / len(samples))


def _pad(rows: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-pad 1-D tensors into ``(B, T)`` values and a ``(B, T)`` bool mask (T >= 1)."""
    width = max([1, *(len(r) for r in rows)])
    values = torch.zeros(len(rows), width)
    mask = torch.zeros(len(rows), width, dtype=torch.bool)
    for i, r in enumerate(rows):
        values[i, : len(r)] = r
        mask[i, : len(r)] = True
    return values, mask
