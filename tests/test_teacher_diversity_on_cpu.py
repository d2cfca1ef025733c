"""A teacher SFT that stays a teacher: early stopping on the held-out loss, and the explanation diversity measurement
(rlt_mono.study.diversity) written into sft_summary.json, with its collapse warning."""

import json
import logging
import math

import pytest
import torch
from safetensors.torch import load_file

from rlt_mono.config import ConfigError, compose
from rlt_mono.stages.sft import SUMMARY_FILE, StageSFTTrainer, check_early_stopping, run_sft
from rlt_mono.study.diversity import Diversity, collapse_problem, distinct_counts, token_entropies

pytestmark = pytest.mark.usefixtures("one_thread")
FAST = ["sft.per_device_train_batch_size=8", "sft.gradient_accumulation_steps=1", "+sft.disable_tqdm=true",
        "data.embedded_rows=96", "data.eval_rows=16"]


def test_distinct_counts_per_prompt():
    assert distinct_counts(["a", "a", "b", "c", "c", "c"], 3) == [2, 1]
    with pytest.raises(ValueError, match="whole groups of 4"):
        distinct_counts(["a"] * 6, 4)


def test_token_entropies_by_hand():
    # one position with two equal logits (entropy ln 2), one with a certain token (about 0), one after the end
    logits = torch.tensor([[[0.0, 0.0, -1e9], [50.0, 0.0, 0.0], [0.0, 0.0, 0.0]]])
    generated = torch.tensor([[True, True, False]])
    entropies = token_entropies(logits, 1.0, generated)
    assert entropies.shape == (2,)
    assert entropies[0].item() == pytest.approx(math.log(2), abs=1e-6)
    assert entropies[1].item() == pytest.approx(0.0, abs=1e-12)
    # temperature 2 halves the logits: p = softmax([0, 1]) at [0, 2] -> known entropy
    p = torch.softmax(torch.tensor([0.0, 1.0]), dim=0)
    expected = -(p * p.log()).sum().item()
    assert token_entropies(torch.tensor([[[0.0, 2.0]]]), 2.0, torch.tensor([[True]])).item() == pytest.approx(expected)


def test_collapse_problem_names_what_shows_the_collapse():
    varied = Diversity(prompts=8, samples=4, temperature=0.7, distinct_per_prompt=3.5, all_same_frac=0.0,
                       mean_token_entropy=0.6, tokens=900)
    assert collapse_problem(varied) is None
    collapsed = Diversity(prompts=8, samples=4, temperature=0.7, distinct_per_prompt=1.25, all_same_frac=0.75,
                          mean_token_entropy=0.001, tokens=900)
    problem = collapse_problem(collapsed)
    assert problem.startswith("COLLAPSED TEACHER: 75% of held-out prompts got 4 identical explanations; mean token "
                              "entropy 0.0010 nats")
    sharp_only = Diversity(prompts=8, samples=4, temperature=0.7, distinct_per_prompt=3.0, all_same_frac=0.25,
                           mean_token_entropy=0.01, tokens=900)
    assert "identical" not in collapse_problem(sharp_only)


def test_early_stopping_needs_steps_evaluations_and_aligned_checkpoints():
    base = {"early_stopping_patience": 2, "eval_strategy": "steps", "eval_steps": 2, "save_steps": 4}
    check_early_stopping(base)
    with pytest.raises(ConfigError, match="set sft.eval_strategy=steps"):
        check_early_stopping({**base, "eval_strategy": "epoch"})
    with pytest.raises(ConfigError, match=r"sft.save_steps \(3\) must be a multiple of sft.eval_steps \(2\)"):
        check_early_stopping({**base, "save_steps": 3})
    with pytest.raises(ConfigError, match="whole number >= 0"):
        check_early_stopping({**base, "early_stopping_patience": -1})


def test_sft_stops_on_a_rising_heldout_loss_and_keeps_the_best_checkpoint(tmp_path, tiny_pair, monkeypatch, caplog):
    # The held-out loss is made to rise by 1 per step after step 2 (on top of its real value, which moves by far
    # less): with patience 2 the run must stop at step 4 of 12, and final/ must be the step-2 checkpoint.
    def prediction_step(self, model, inputs, prediction_loss_only, ignore_keys=None):
        loss, logits, labels = original_prediction_step(self, model, inputs, prediction_loss_only, ignore_keys)
        return loss + max(0, self.state.global_step - 2), logits, labels

    original_prediction_step = StageSFTTrainer.prediction_step
    monkeypatch.setattr(StageSFTTrainer, "prediction_step", prediction_step)
    out = tmp_path / "run"
    with caplog.at_level(logging.INFO, logger="rlt_mono.stages.sft"):
        run_sft(compose("teacher_sft", ["size=tiny", f"output_dir={out}", "model.model_name_or_path=embedded:student",
                                        "sft.max_steps=12", "sft.eval_strategy=steps", "sft.eval_steps=1",
                                        "sft.save_steps=1", "sft.save_total_limit=1",
                                        "sft.early_stopping_patience=2", "sft.learning_rate=1e-3",
                                        "sft.diversity_prompts=4", "sft.diversity_samples=3",
                                        "sft.diversity_max_new_tokens=24", *FAST]))
    summary = json.loads((out / SUMMARY_FILE).read_text())
    assert summary["steps"] == 4
    assert summary["early_stopping"] == {"patience": 2, "stopped_early": True, "best_step": 2,
                                         "best_heldout_loss": summary["heldout_curve"][2]["eval_loss"]}
    assert [point["step"] for point in summary["heldout_curve"]] == [0, 1, 2, 3, 4]
    assert summary["heldout_loss_after"] == summary["early_stopping"]["best_heldout_loss"]
    # the published checkpoint, not its staging folder, is the best one in the state a resume reads
    state = json.loads((out / "checkpoint-2" / "trainer_state.json").read_text())
    assert state["best_model_checkpoint"] == str(out / "checkpoint-2")
    best = load_file(out / "checkpoint-2" / "model.safetensors")
    final = load_file(out / "final" / "model.safetensors")
    assert best.keys() == final.keys() and all(torch.equal(best[k], final[k]) for k in best)

    diversity = summary["diversity"]
    assert (diversity["prompts"], diversity["samples"], diversity["temperature"]) == (4, 3, 0.7)
    assert 1 <= diversity["distinct_per_prompt"] <= 3 and 0 <= diversity["all_same_frac"] <= 1
    assert diversity["mean_token_entropy"] > 0 and diversity["tokens"] > 0
    assert any("explanation diversity on 4 held-out prompts x 3 samples" in r.getMessage() for r in caplog.records)


def test_a_sharded_teacher_is_not_sampled_and_the_log_says_why(monkeypatch, caplog):
    # Found on an H200: transformers' generate on a teacher FSDP2 shards (placement.strategy=fsdp2, one rank)
    # stopped teacher_sft after training with "aten.embedding.default got mixed torch.Tensor and DTensor".
    from types import SimpleNamespace

    from rlt_mono.stages import sft

    sampled = []
    monkeypatch.setattr(sft.diversity, "measure", lambda *a, **k: sampled.append(a))
    trainer = SimpleNamespace(args=SimpleNamespace(), is_fsdp_enabled=True)
    with caplog.at_level(logging.INFO, logger="rlt_mono.stages.sft"):
        assert sft._diversity(SimpleNamespace(trainer=trainer, diversity_prompts=["q"])) is None
    assert sampled == []
    assert any("not measured on a sharded teacher (placement.strategy=fsdp2)" in r.getMessage()
               for r in caplog.records)
