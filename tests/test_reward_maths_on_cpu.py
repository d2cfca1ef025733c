"""The reward maths against values computed by hand (docs/METHOD.md, "The reward")."""

import dataclasses
import math

import pytest
import torch
from omegaconf import OmegaConf

from rlt_mono.config import compose
from rlt_mono.rewards import TeacherRewardConfig
from rlt_mono.rewards.maths import kl_estimate, masked_reduce, normalize, teacher_reward_terms

VALUES = torch.tensor([[4.0, 1.0, 3.0, 2.0], [5.0, 9.0, 9.0, 9.0], [7.0, 7.0, 7.0, 7.0]])
MASK = torch.tensor([[1, 1, 1, 1], [1, 0, 0, 0], [0, 0, 0, 0]], dtype=torch.bool)


@pytest.mark.parametrize(
    "reduction, expected",
    [
        ("mean", [2.5, 5.0]),
        ("sum", [10.0, 5.0]),
        ("min", [1.0, 5.0]),
        ("max", [4.0, 5.0]),
        ("median", [2.0, 5.0]),  # lower median of 1,2,3,4
        ("first_quartile", [1.75, 5.0]),  # 1 + 0.75 * (2 - 1)
        ("last_quartile", [3.25, 5.0]),  # 3 + 0.25 * (4 - 3)
    ],
)
def test_masked_reduce_ignores_padding_and_gives_nan_for_empty_rows(reduction, expected):
    out = masked_reduce(VALUES, MASK, reduction)
    assert out[:2].tolist() == pytest.approx(expected)
    assert math.isnan(out[2])


def test_unknown_reduction_is_rejected():
    with pytest.raises(ValueError, match="unknown reduction 'mode'"):
        masked_reduce(VALUES, MASK, "mode")


def test_normalisations():
    x = torch.tensor([0.0, math.log(2.0)])
    assert normalize(x, "none").tolist() == pytest.approx([0.0, math.log(2.0)])
    assert normalize(x, "exp").tolist() == pytest.approx([1.0, 2.0])
    assert normalize(x, "exp_norm").tolist() == pytest.approx([0.0, 0.5])
    with pytest.raises(ValueError, match="unknown normalisation"):
        normalize(x, "softmax")


def test_kl_estimates():
    teacher, student = torch.tensor([[-0.2, -1.0]]), torch.tensor([[-0.5, -1.0]])
    assert kl_estimate(teacher, student, schulman=False).tolist()[0] == pytest.approx([0.3, 0.0])
    k3 = 0.3 - 1 + math.exp(-0.3)
    assert kl_estimate(teacher, student, schulman=True).tolist()[0] == pytest.approx([k3, 0.0])


def _batch():
    """Two completions: #0 closes its explanation, #1 does not and has an empty explanation."""
    return dict(
        student_solution_log_probs=torch.tensor([[-1.0, -3.0], [-0.5, 0.0]]),
        solution_mask=torch.tensor([[1, 1], [1, 0]], dtype=torch.bool),
        teacher_explanation_log_probs=torch.tensor([[-0.5, -1.0, -2.0], [0.0, 0.0, 0.0]]),
        student_explanation_log_probs=torch.tensor([[-1.0, -1.0, -1.0], [0.0, 0.0, 0.0]]),
        explanation_mask=torch.tensor([[1, 1, 1], [0, 0, 0]], dtype=torch.bool),
        matched=torch.tensor([True, False]),
    )


def _terms(**options):
    cfg = TeacherRewardConfig(**options)
    return teacher_reward_terms(
        **_batch(),
        answer_log_prob_coeff=cfg.answer_log_prob_coeff,
        reduction_log_prob_fn=cfg.reduction_log_prob_fn,
        kl_penalty_reward_coeff=cfg.kl_penalty_reward_coeff,
        reduction_kl_fn=cfg.reduction_kl_fn,
        normalize_log_prob_fn=cfg.normalize_log_prob_fn,
        normalize_kl_fn=cfg.normalize_kl_fn,
        clip_log_prob=cfg.clip_log_prob,
        clip_kl=cfg.clip_kl,
        use_schulman_kl_estimation=cfg.use_schulman_kl_estimation,
        include_teacher_think_entropy=cfg.include_teacher_think_entropy,
        not_matched_penalty=cfg.not_matched_penalty,
    )


def test_rlt_run_defaults_by_hand():
    t = _terms()
    # #0: r_SS = mean(-1,-3) + 0.01 min = -2 - 0.03; k = [0.5, 0, -1]: r_KL = 3 (-0.5/3) + 0.03 (0.5)
    # #1: r_SS = -0.5 + 0.01 (-0.5); empty explanation -> KL scores = -penalty = 1: r_KL = 3 + 0.03; unmatched -1
    assert t.solution_scores.tolist() == [pytest.approx([-2.0, -3.0]), pytest.approx([-0.5, -0.5])]
    assert t.kl_scores.tolist() == [pytest.approx([-1 / 6, 0.5]), pytest.approx([1.0, 1.0])]
    assert t.r_ss.tolist() == pytest.approx([-2.03, -0.505])
    assert t.r_kl.tolist() == pytest.approx([-0.485, 3.03])
    assert t.match_penalty.tolist() == [0.0, -1.0]
    assert t.total.tolist() == pytest.approx([-2.03 + 0.485, -0.505 - 3.03 - 1.0])


def test_without_teacher_entropy_the_kl_is_minus_student_log_prob():
    t = _terms(include_teacher_think_entropy=False)
    assert t.r_kl.tolist()[0] == pytest.approx(3 * 1.0 + 0.03 * 1.0)
    assert t.total.tolist()[0] == pytest.approx(-2.03 - 3.03)


def test_clips():
    t = _terms(clip_kl=0.2, clip_log_prob=2.0)
    assert t.r_kl.tolist()[0] == pytest.approx(3 * (0.2 + 0 - 1) / 3 + 0.03 * 0.2)
    assert t.r_ss.tolist()[0] == pytest.approx(-1.5 + 0.01 * -2.0)  # -3 clipped to -2


def test_exp_normalisations_and_schulman():
    t = _terms(normalize_log_prob_fn="exp", normalize_kl_fn="exp_norm", use_schulman_kl_estimation=True)
    e1, e3 = math.exp(-1), math.exp(-3)
    assert t.r_ss.tolist()[0] == pytest.approx((e1 + e3) / 2 + 0.01 * e3, rel=1e-5)
    k3 = [k - 1 + math.exp(-k) for k in (0.5, 0.0, -1.0)]
    per_token = [1 - math.exp(-k) for k in k3]
    expected = 3 * sum(per_token) / 3 + 0.03 * max(per_token)
    assert t.r_kl.tolist()[0] == pytest.approx(expected, rel=1e-5)


def test_sum_median_quartile_reductions_with_custom_coefficients():
    t = _terms(
        reduction_log_prob_fn=["sum", "median"], answer_log_prob_coeff=[0.5, 2.0],
        reduction_kl_fn=["first_quartile", "last_quartile"], kl_penalty_reward_coeff=[1.0, 1.0],
        not_matched_penalty=-2.0,
    )
    assert t.r_ss.tolist()[0] == pytest.approx(0.5 * -4.0 + 2.0 * -3.0)  # lower median of (-3, -1)
    assert t.r_kl.tolist()[0] == pytest.approx(-0.5 + 0.25)  # quartiles of (-1, 0, 0.5)
    assert t.r_kl.tolist()[1] == pytest.approx(4.0)  # empty: each score -(-2)
    assert t.match_penalty.tolist() == [0.0, -2.0]


@pytest.mark.parametrize(
    "options, message",
    [
        (dict(answer_log_prob_coeff=[1.0]), "answer_log_prob_coeff has 1 entries but reduction_log_prob_fn has 2"),
        (dict(reduction_kl_fn=["mean", "p99"]), r"reduction_kl_fn has unknown reductions \['p99'\]"),
        (dict(normalize_kl_fn="log"), "normalize_kl_fn='log' is not one of"),
        (dict(unbias_student_log_probs_temp=0.0), "unbias_student_log_probs_temp must be > 0"),
        # Sign errors: each would turn a penalty into a bonus (clip_kl=-1 caps every KL at -1).
        (dict(clip_kl=-1.0), r"clip_kl must be > 0 or null, got -1.0"),
        (dict(clip_kl=0.0), r"clip_kl must be > 0 or null, got 0.0"),
        (dict(clip_log_prob=-5.0), r"clip_log_prob must be > 0 or null, got -5.0"),
        (dict(answer_log_prob_coeff=[1.0, -0.01]),
         r"answer_log_prob_coeff must hold coefficients >= 0, got \[1.0, -0.01\]"),
        (dict(kl_penalty_reward_coeff=[-3.0, 0.03]),
         r"kl_penalty_reward_coeff must hold coefficients >= 0, got \[-3.0, 0.03\]"),
        (dict(not_matched_penalty=1.0), r"not_matched_penalty must be <= 0 \(a penalty\), got 1.0"),
    ],
)
def test_config_errors_name_the_field(options, message):
    with pytest.raises(ValueError, match=message) as raised:
        TeacherRewardConfig(**options)
    assert "\n" not in str(raised.value)


def test_zero_coefficients_and_penalty_are_allowed():
    config = TeacherRewardConfig(answer_log_prob_coeff=[1.0, 0.0], kl_penalty_reward_coeff=[0.0, 0.0],
                                 not_matched_penalty=0.0, clip_kl=0.5, clip_log_prob=10.0)
    assert config.clip_kl == 0.5


def test_the_reward_group_runs_the_dataclass_defaults():
    """cfgs/reward/rlt.yaml sets nothing of its own: a run's reward is TeacherRewardConfig's defaults."""
    composed = OmegaConf.to_container(compose("demo_tiny")["reward"])
    defaults = dataclasses.asdict(TeacherRewardConfig())
    assert composed == defaults
    assert defaults["micro_batch_size"] == 4
