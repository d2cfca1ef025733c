"""Tied GRPO groups and dynamic sampling (rlt_mono.rl.dynamic_sampling), on hand-made batches, and in a tiny RL run."""

import math

import pytest
import torch

from rlt_mono import build_trainer, compose, release_trainer
from rlt_mono.config import ConfigError
from rlt_mono.rl.dynamic_sampling import fresh_prompts, refill_tied_groups, replace_groups, tied_groups
from rlt_mono.runs.outputs import METRICS_FILE, read_metrics

NAN = math.nan


def test_tied_groups_follow_trl_zero_std_rule():
    rewards = torch.tensor([
        1.0, 1.0, 1.0, 1.0,      # all equal: tied
        0.0, 1.0, 0.0, 1.0,      # spread: not tied
        -2.5, -2.5 + 1e-10, -2.5, -2.5,  # equal within isclose's tolerance: tied
        NAN, 3.0, 3.0, 3.0,      # an unscorable completion is left out; the rest tie
        NAN, NAN, NAN, 4.0,      # one scorable completion: no spread, tied
        NAN, 1.0, 2.0, NAN,      # two scorable, different: not tied
    ])
    assert tied_groups(rewards, 4).tolist() == [True, False, True, True, True, False]
    assert tied_groups(rewards, 4).float().mean().item() == pytest.approx(4 / 6)
    with pytest.raises(ValueError, match="multiple of group_size=4"):
        tied_groups(torch.zeros(6), 4)


def _batch(prompt_width: int, completion_width: int, first_id: int) -> dict:
    """A scored batch of 4 completions (2 groups of 2) whose ids say where they came from."""
    ids = torch.arange(first_id, first_id + 4)[:, None]
    return {
        "prompt_ids": ids.repeat(1, prompt_width), "prompt_mask": torch.ones(4, prompt_width, dtype=torch.long),
        "completion_ids": ids.repeat(1, completion_width) + 100,
        "completion_mask": torch.ones(4, completion_width, dtype=torch.long),
        "advantages": torch.tensor([0.0, 0.0, 1.0, -1.0]) + first_id,
        "old_per_token_logps": torch.full((4, completion_width), -1.0 * first_id),
        "num_items_in_batch": torch.tensor(4 * completion_width),
    }


def test_replace_groups_pads_prompts_left_completions_right_and_recounts_tokens():
    batch, donor = _batch(2, 3, first_id=0), _batch(4, 5, first_id=10)
    merged = replace_groups(batch, donor, places=[0], donors=[1], group_size=2, pad_token_id=-7)
    assert merged["prompt_ids"].tolist() == [[12] * 4, [13] * 4, [-7, -7, 2, 2], [-7, -7, 3, 3]]
    assert merged["prompt_mask"].tolist() == [[1] * 4, [1] * 4, [0, 0, 1, 1], [0, 0, 1, 1]]
    assert merged["completion_ids"].tolist() == [[112] * 5, [113] * 5, [102, 102, 102, -7, -7],
                                                 [103, 103, 103, -7, -7]]
    assert merged["completion_mask"].sum(dim=1).tolist() == [5, 5, 3, 3]
    assert merged["advantages"].tolist() == [11.0, 9.0, 1.0, -1.0]
    assert merged["old_per_token_logps"][0].tolist() == [-10.0] * 5
    assert merged["old_per_token_logps"][2].tolist() == [-0.0, -0.0, -0.0, 0.0, 0.0]
    assert int(merged["num_items_in_batch"]) == 16
    assert batch["prompt_ids"].shape == (4, 2)  # the input batch is not modified


def test_dynamic_sampling_keeps_the_batch_size_and_replaces_only_tied_groups():
    group = 2
    batch = _batch(2, 3, first_id=0)
    rewards = torch.tensor([5.0, 5.0, 1.0, 2.0])  # group 0 tied, group 1 not
    calls = []

    def score(rows):
        calls.append(rows)
        donor = _batch(2, 3, first_id=20 + 10 * len(calls))
        # the first refill ties again; the second brings an untied group first
        donor_rewards = torch.tensor([0.0, 0.0, 0.0, 0.0]) if len(calls) == 1 else torch.tensor([1.0, 3.0, 2.0, 2.0])
        return donor, donor_rewards

    merged, stats = refill_tied_groups(batch, rewards, group, rounds=3, score=score,
                                       draw=lambda count, round_: [round_] * count, pad_token_id=0)
    assert calls == [[1], [2]]  # one fresh prompt per tied place, round numbers 1 and 2; stops once none is tied
    assert merged["completion_ids"].shape == batch["completion_ids"].shape
    assert merged["prompt_ids"][:, 0].tolist() == [40, 41, 2, 3]  # group 0 from the second refill, group 1 kept
    assert stats.metrics == {"groups/tied_frac": 0.5, "groups/tied_frac_after_refill": 0.0,
                             "groups/refill_rounds": 2.0, "groups/refilled": 1.0}

    unchanged, counted = refill_tied_groups(batch, rewards, group, rounds=0, score=score,
                                            draw=lambda count, round_: [0] * count, pad_token_id=0)
    assert unchanged is batch and len(calls) == 2
    assert counted.metrics["groups/tied_frac"] == counted.metrics["groups/tied_frac_after_refill"] == 0.5


def test_fresh_prompts_are_a_function_of_seed_step_and_round():
    first = fresh_prompts(100, 5, seed=0, step=3, round_=1)
    assert first == fresh_prompts(100, 5, seed=0, step=3, round_=1)
    assert len(set(first)) == 5 and all(0 <= i < 100 for i in first)
    assert first != fresh_prompts(100, 5, seed=0, step=4, round_=1)
    assert sorted(fresh_prompts(3, 5, seed=0, step=0, round_=1)) == [0, 1, 2]


def test_tiny_run_logs_tied_groups_and_refills_them(tmp_path):
    # A near-zero temperature makes the tiny teacher write one explanation for most prompts: most groups tie.
    out = tmp_path / "run"
    cfg = compose("demo_tiny", [f"output_dir={out}", "trainer.max_steps=1", "trainer.save_steps=1",
                                "trainer.temperature=0.001", "trainer.dynamic_sampling_rounds=2"])
    trainer = build_trainer(cfg)
    trainer.train()
    release_trainer(trainer)
    [row] = [r for r in read_metrics(out / METRICS_FILE) if "teacher_reward/total" in r]
    groups = cfg.trainer.per_device_train_batch_size * cfg.trainer.steps_per_generation // cfg.trainer.num_generations
    assert row["groups/tied_frac"] >= 0.5
    assert row["groups/refill_rounds"] >= 1
    assert row["groups/tied_frac"] - row["groups/tied_frac_after_refill"] == pytest.approx(
        row["groups/refilled"] / groups)
    if row["groups/tied_frac_after_refill"] > 0:  # stops early only once no group is left tied
        assert row["groups/refill_rounds"] == 2


def test_dynamic_sampling_with_several_ranks_is_refused_before_launch():
    from rlt_mono.launch import plan_launch

    cfg = compose("demo_tiny", ["placement=dp", "placement.num_processes=2", "trainer.dynamic_sampling_rounds=1"])
    with pytest.raises(ConfigError, match="dynamic_sampling_rounds=1 needs one rank"):
        plan_launch(cfg, gpus_present=0)
