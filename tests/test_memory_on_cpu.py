"""The memory planner's arithmetic (rlt_mono/memory.py) against hand-computed bytes, its advice and its CLI."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from rlt_mono.errors import UserError
from rlt_mono.memory import GIB, QWEN25_ARCHS, Arch, Settings, plan

ROOT = Path(__file__).resolve().parent.parent

# H=8, L=2, I=16, 2 heads of 4, 1 KV head, V=32, tied: q_dim 8, kv_dim 4.
TINY = Arch.from_config(dict(hidden_size=8, num_hidden_layers=2, intermediate_size=16, num_attention_heads=2,
                             num_key_value_heads=1, vocab_size=32, tie_word_embeddings=True, model_type="qwen2"))


def test_qwen25_05b_parameter_count_matches_the_model_built_on_meta():
    config = dict(QWEN25_ARCHS["0.5b"])
    with torch.device("meta"):
        model = Qwen2ForCausalLM(Qwen2Config(**{k: v for k, v in config.items() if k != "model_type"}))
    built = sum(p.numel() for p in model.parameters())  # a tied embedding counts once
    assert built == 494_032_768
    assert Arch.from_config(config).params() == 494_032_768


def test_tiny_parameter_count_by_hand():
    # layer: q 8*8 + k,v 2*8*4 + o 8*8 = 192, q/k/v biases 8+4+4 = 16, MLP 3*8*16 = 384, norms 2*8 = 16 -> 608
    # model: embedding 32*8 = 256 + 2 layers 1216 + final norm 8 = 1480 (tied: no separate head)
    assert TINY.layer_params() == 608
    assert TINY.params() == 1480
    untied = dataclasses.replace(TINY, tie_word_embeddings=False)
    assert untied.params() == 1480 + 256


def tiny_settings(**changes) -> Settings:
    values = dict(teacher=TINY, student=TINY, teacher_dtype="float32", student_dtype="float32", optim="adamw_torch",
                  gradient_checkpointing=False, bf16=False, prompt_length=4, max_completion_length=12,
                  per_device_train_batch_size=2, gradient_accumulation_steps=4, steps_per_generation=4,
                  reward_micro_batch_size=1, vllm_gpu_memory_utilization=0.5, total_gib=1.0, overhead_gib=0.0)
    return Settings(**{**values, **changes})


def test_tiny_phases_by_hand():
    result = plan(tiny_settings())
    weights, optimizer, grads = 1480 * 4, 2 * 1480 * 4, 1480 * 4  # float32; adamw_torch: two float32 states
    pool = GIB // 2  # 0.5 x 1 GiB
    assert dict(result.phases["GENERATE"].terms) == {"vLLM pool": pool, "teacher weights": weights,
                                                     "optimizer state": optimizer, "overhead": 0}
    # TRAIN, activations (4 bytes, no autocast), micro-batch 2 x (4 + 12) = 32 tokens:
    #   saved per token per layer: attention 3*8 + 2*8 + 3*4 + 4*8 = 84, MLP 3*8 + 4*16 = 88 -> 172 * 4 = 688 B
    #   no checkpointing: 2 layers * 688 * 32 = 44032, + final norm in/out 2 * 32 * 8 * 4 = 2048 -> 46080
    #   loss head: 24 completion tokens, tile 24 * 32 * 4 * 2 = 6144, head grad 32*8*4 = 1024,
    #   hidden grad 24*8*4 = 768 -> 7936
    train = dict(result.phases["TRAIN"].terms)
    assert train["activations"] == 46080
    assert train["loss head"] == 7936
    assert result.phases["TRAIN"].bytes == weights + optimizer + grads + 46080 + 7936 == 77696
    # SCORE: the largest pass is the reference's (micro-batch 2, 32 tokens):
    #   hidden 32*8*4 = 1024, one layer live 32 * 4*(4*8 + 3*16) = 10240, fused head tile 6144 -> 17408,
    #   + its weights swapped in 5920 = 23328; the student's (micro-batch 1, 16 tokens): 512 + 5120 +
    #   head 12*32*(4+8) = 4608 -> 10240 + 5920 = 16160
    score = dict(result.phases["SCORE"].terms)
    assert score["reference pass activations"] == 17408
    assert score["reference weights (swapped in)"] == weights
    assert result.phases["SCORE"].bytes == weights + optimizer + weights + 17408 == 41088
    assert result.peak.name == "GENERATE"
    # KV: (pool - vLLM weights) // (2 layers * 2 (k, v) * kv_dim 4 * 4 B * 16 tokens)
    assert result.kv_sequences == (pool - weights) // (2 * 2 * 4 * 4 * 16)
    assert result.fits


def test_checkpointing_8bit_adam_and_sleep_mode_terms():
    tokens = 32
    checkpointed = plan(tiny_settings(gradient_checkpointing=True))
    # each layer's input 2 * 32 * 8 * 4 = 2048, one layer recomputed 688 * 32 = 22016, final norm 2048
    assert dict(checkpointed.phases["TRAIN"].terms)["activations"] == 2 * tokens * 8 * 4 + 688 * tokens + 2048
    bnb = plan(tiny_settings(optim="adamw_bnb_8bit"))
    assert dict(bnb.phases["TRAIN"].terms)["optimizer state"] == 1480 * 2 + 1480 * 8 // 256 + 1  # ceil(1480*2.03125)
    awake = plan(tiny_settings(vllm_sleep=False))
    assert dict(awake.phases["TRAIN"].terms)["vLLM pool (no sleep mode)"] == GIB // 2


def test_advice_lowers_the_micro_batch_keeping_completions_per_step():
    arch = Arch.from_config(QWEN25_ARCHS["1.5b"])
    base = Settings(teacher=arch, student=arch, total_gib=24.0, vllm_gpu_memory_utilization=0.2)
    at_two = plan(dataclasses.replace(base, per_device_train_batch_size=2, gradient_accumulation_steps=16,
                                      steps_per_generation=16))
    assert at_two.peak.name == "TRAIN"
    free = round(at_two.peak.gib + 0.05, 2)
    result = plan(dataclasses.replace(base, free_gib=free))
    assert not result.fits and result.peak.name == "TRAIN"
    # lowering reward.micro_batch_size (tried first) only shrinks SCORE, so the micro-batch is the first that fits
    assert result.advice == "per_device_train_batch_size=2 gradient_accumulation_steps=16 steps_per_generation=16"
    assert result.refusal() == (f"TRAIN needs {result.peak.gib:.1f} GiB, the card has {free:.1f} free: "
                                f"{result.advice}")
    assert "does not fit: TRAIN needs" in result.table()


def test_advice_falls_through_to_completion_length_and_to_nothing():
    arch = Arch.from_config(QWEN25_ARCHS["1.5b"])
    one = Settings(teacher=arch, student=arch, total_gib=24.0, vllm_gpu_memory_utilization=0.2,
                   per_device_train_batch_size=1, reward_micro_batch_size=1)
    shorter = plan(dataclasses.replace(one, max_completion_length=2048))
    result = plan(dataclasses.replace(one, free_gib=round(shorter.peak.gib + 0.01, 2)))
    assert result.advice == "max_completion_length=2048"
    hopeless = plan(dataclasses.replace(one, free_gib=1.0))
    assert hopeless.advice == "no change of these settings fits: a smaller model pair or a larger card"


def test_bad_settings_are_user_errors():
    with pytest.raises(UserError, match="trainer.optim='sgd'"):
        tiny_settings(optim="sgd")
    with pytest.raises(UserError, match="model config has no hidden_size"):
        Arch.from_config({"vocab_size": 3})


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rlt_mono.memory", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)


def test_cli_exit_codes_and_lines(tmp_path):
    fits = run_cli("teacher_rlt_mono", "--arch", "1.5b", "--gpu-gib", "24",
                   "trainer.vllm_gpu_memory_utilization=0.33")
    assert fits.returncode == 0, fits.stderr
    assert "vLLM pool 7.92 GiB (0.33)" in fits.stdout  # 0.33 x 24
    assert "; fits" in fits.stdout.splitlines()[-1]
    # the same pair on a 12 GiB card, vLLM at 0.33: every phase is over 12 GiB
    refused = run_cli("teacher_rlt_mono", "--arch", "1.5b", "--gpu-gib", "12",
                      "trainer.vllm_gpu_memory_utilization=0.33")
    assert refused.returncode == 2
    line = refused.stderr.strip().splitlines()[-1]
    assert line.startswith("error: ") and " GiB, the card has 12.0 free: " in line
    # a hub id with no local folder and no --arch
    missing = run_cli("teacher_rlt_mono", "--gpu-gib", "24")
    assert missing.returncode == 2
    assert "model.model_name_or_path=Qwen/Qwen2.5-1.5B-Instruct is no local folder" in missing.stderr
    # local folders: config.json is read (0.5B: 0.92 GiB of bfloat16 weights)
    config = {k: v for k, v in QWEN25_ARCHS["0.5b"].items()}
    (tmp_path / "config.json").write_text(json.dumps(config))
    local = run_cli("teacher_rlt_mono", "--gpu-gib", "24", f"model.model_name_or_path={tmp_path}",
                    f"student.model_name_or_path={tmp_path}", "trainer.vllm_gpu_memory_utilization=0.3")
    assert local.returncode == 0, local.stderr
    assert f"teacher weights {494_032_768 * 2 / GIB:.2f}" in local.stdout
