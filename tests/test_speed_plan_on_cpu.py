"""What the planner decides for speed (rlt_mono/memory/speed_plan.py, rlt_mono/memory/planner.py ``choose``): gradient
checkpointing only when the train phase needs it, and memory=speed's generation batch, against hand-computed bytes
and recorded device numbers."""

from __future__ import annotations

import dataclasses
import functools
import math
import subprocess
import sys
from pathlib import Path

import pytest

from rlt_mono.config import compose
from rlt_mono.memory import model as memory
from rlt_mono.memory import planner as memory_planner
from rlt_mono.memory import speed_plan
from rlt_mono.memory.model import GIB, QWEN25_ARCHS, Arch, Settings

ROOT = Path(__file__).resolve().parent.parent
# Recorded on an H100 80 GB (bench/bench_mono.py vllm): vLLM generated 1024 tokens for each of 32 prompts of the
# 0.5B model in 3.26 s and for each of 128 prompts in 5.55 s: completion tokens per second by sequences in flight.
RECORDED_05B_TOKENS_PER_S = {32: 32 * 1024 / 3.26, 128: 128 * 1024 / 5.55}


@functools.cache
def _defaults(arch: str) -> Settings:
    a = Arch.from_config(QWEN25_ARCHS[arch])
    return memory_planner.settings_from_config(compose("teacher_rlt_mono", []), total_gib=80.0, teacher=a, student=a)


def settings(arch: str, **changes) -> Settings:
    """The composed teacher_rlt_mono settings for a Qwen2.5 pair of ``arch`` (512-token prompts, 80 GiB), changed."""
    return dataclasses.replace(_defaults(arch), **changes)


def half_b(**changes) -> Settings:
    """The 0.5B pair, 1024-token completions: 1536-token sequences."""
    return settings("0.5b", max_completion_length=1024, **changes)


def seven_b(total_gib: float) -> Settings:
    """The 7B + 7B pair at 4096-token completions and 200-token prompts (docs/PERFORMANCE.md's 7B step)."""
    return settings("7b", max_completion_length=4096, prompt_length=200, total_gib=total_gib)


def generation(s: Settings) -> int:
    return s.per_device_train_batch_size * s.steps_per_generation


def test_the_05b_train_phase_without_recomputation_at_micro_batch_1_by_hand():
    """The threshold of the checkpointing rule for the 0.5B pair at 1536 tokens (bf16, 8-bit Adam, by hand)."""
    weights = 494_032_768 * 2
    embedding = 151936 * 896
    optimizer = embedding * 8 + (494_032_768 - embedding) * (2 * 32 + 1) // 32  # two 8-bit states + absmax / 256
    # per token per layer: attention 3*896 + 2*896 + 3*128 + 4*896 = 8448, MLP 3*896 + 4*4864 = 22144 -> x 2 B
    activations = 24 * (8448 + 22144) * 2 * 1536 + 2 * 1536 * 896 * 2
    # fused head: 1024 x 32768 tile x 2 B x 2, head gradient 151936 x 896 x 4, hidden gradient 1024 x 896 x 4
    loss_head = 1024 * 32768 * 4 + 151936 * 896 * 4 + 1024 * 896 * 4
    torch_bytes = weights + optimizer + weights + activations + loss_head
    assert (optimizer, activations, torch_bytes) == (1_816_057_788, 2_260_992_000, 6_735_607_228)
    device = torch_bytes + int(0.12 * torch_bytes) + int(1.5 * GIB)  # slack and CUDA context
    without = half_b(per_device_train_batch_size=1, gradient_accumulation_steps=32, steps_per_generation=32,
                     reward_micro_batch_size=1, gradient_checkpointing=False)
    assert memory.predict(without)[0]["TRAIN"].bytes == device == 9_154_492_831


@pytest.mark.parametrize("above", [True, False])
def test_auto_recomputes_only_when_no_micro_batch_fits_without_it(above):
    threshold = 9_154_492_831 / GIB  # TRAIN at micro-batch 1 without recomputation (above)
    s = half_b(free_gib=threshold + (0.01 if above else -0.01))
    chosen = memory_planner.choose(s)
    assert memory_planner.plan(chosen).fits
    assert chosen.gradient_checkpointing is not above
    if above:  # only micro-batch 1 fits without recomputation: taken before any larger one with it
        assert chosen.per_device_train_batch_size == 1
        assert memory_planner.fits(dataclasses.replace(chosen, per_device_train_batch_size=2,
                                                       gradient_accumulation_steps=16, steps_per_generation=16,
                                                       gradient_checkpointing=True))
        assert speed_plan.checkpointing_reason(chosen).startswith(
            "gradient checkpointing off: micro-batch 1 trains without recomputing activations (TRAIN 8.5 GiB, ")
    else:
        assert speed_plan.checkpointing_reason(chosen) == (
            f"gradient checkpointing on: without it TRAIN needs 8.5 GiB even at micro-batch 1, the run may use "
            f"{threshold - 0.01:.1f}")


def test_auto_turns_checkpointing_off_for_the_05b_pair_on_80_gib():
    chosen = memory_planner.choose(half_b())
    # 16 sequences keep 16 x 2,260,992,000 B = 33.7 GiB of activations: the largest micro-batch, no recomputation
    assert (chosen.per_device_train_batch_size, chosen.gradient_checkpointing) == (16, False)
    assert dict(memory_planner.plan(chosen).phases["TRAIN"].terms)["activations"] == 16 * 2_260_992_000


def test_auto_keeps_checkpointing_for_the_7b_pair_on_80_gib_and_drops_it_on_141():
    on_80 = memory_planner.choose(seven_b(80.0))
    assert on_80.gradient_checkpointing
    assert speed_plan.checkpointing_reason(on_80).startswith("gradient checkpointing on: without it TRAIN needs 86.0")
    on_141 = memory_planner.choose(seven_b(141.0))
    assert (on_141.per_device_train_batch_size, on_141.gradient_checkpointing) == (2, False)


def test_generation_batches_are_whole_steps_up_to_the_caps():
    # 32 completions per step and per generation: up to 8 steps per generation
    assert speed_plan.generation_batches(half_b()) == [256, 224, 192, 160, 128, 96, 64, 32]
    # 12 per step, 24 per generation: multiples of 24, up to 8 x 12 = 96
    assert speed_plan.generation_batches(half_b(per_device_train_batch_size=4, gradient_accumulation_steps=3,
                                                steps_per_generation=6)) == [96, 72, 48, 24]
    # 96 per step: up to 512 sequences in flight
    assert speed_plan.generation_batches(half_b(per_device_train_batch_size=4, gradient_accumulation_steps=24,
                                                steps_per_generation=24)) == [480, 384, 288, 192, 96]
    # 128 per step, 96 per generation: their least common multiple, 384, and no multiple of it under 512 but itself
    assert speed_plan.generation_batches(half_b(per_device_train_batch_size=4, gradient_accumulation_steps=32,
                                                steps_per_generation=24)) == [384]


def test_speed_on_the_05b_pair_puts_8_steps_of_completions_in_flight():
    s = half_b()
    chosen = memory_planner.choose(s, speed=True)
    result = memory_planner.plan(chosen)
    assert result.fits and result.peak.gib <= 80.0
    # the recorded rate at 128 sequences is more than twice that at 32: speed picks at least 4x the default's 32
    assert RECORDED_05B_TOKENS_PER_S[128] > 2 * RECORDED_05B_TOKENS_PER_S[32]
    assert generation(chosen) == 256 >= 4 * generation(s)
    assert chosen.per_device_train_batch_size * chosen.gradient_accumulation_steps == 32  # per optimizer step, kept
    # the pool: weights x 1.1, 256 x 1536 tokens x 12,288 B of KV cache (2 x 24 layers x 128 x 2 B) and 1.5 GiB
    pool = (494_032_768 * 2 * 1.1 + 256 * 1536 * 12288) / GIB + 1.5
    assert chosen.vllm_gpu_memory_utilization == math.ceil(pool / 80 * 100) / 100 == 0.09
    assert result.kv_sequences >= 256
    # the train and score phases are auto's: speed changes the generation only
    auto = memory_planner.plan(memory_planner.choose(s))
    assert result.phases["TRAIN"] == auto.phases["TRAIN"] and result.phases["SCORE"] == auto.phases["SCORE"]
    notes = speed_plan.speed_notes(s, chosen)
    assert notes[0] == ("memory=speed: generation batch 32 -> 256 sequences in flight; 32 completions per optimizer "
                        "step, as configured")
    assert "one generation feeds 8 optimizer steps" in notes[1] and "off-policy" in notes[1]


@pytest.mark.parametrize("total_gib", [80.0, 141.0])
def test_speed_on_the_7b_pair_never_picks_what_does_not_fit(total_gib):
    s = seven_b(total_gib)
    chosen = memory_planner.choose(s, speed=True)
    assert memory_planner.plan(chosen).fits
    picked = generation(chosen)
    assert picked > generation(s) and picked % 32 == 0
    assert memory_planner.plan(chosen).kv_sequences >= picked
    # every larger generation batch: its pool does not fit, with the trainer beside vLLM or aside
    for larger in [b for b in speed_plan.generation_batches(s) if b > picked]:
        for aside in (False, True):
            assert not memory_planner.fits(dataclasses.replace(
                chosen, steps_per_generation=larger // chosen.per_device_train_batch_size,
                offload_actor_in_generation=aside,
                vllm_gpu_memory_utilization=memory_planner._utilization(s, larger)))


def test_speed_on_80_gib_7b_stops_where_vllm_could_not_start():
    """By hand: a 7B sequence of 4296 tokens holds 4296 x 57,344 B (2 x 28 layers x 512 x 2 B) of KV cache, the
    pool is 1.1 x 15,231,233,024 B of weights + 1.5 GiB + the KV cache. vLLM starts beside the teacher's 14.19 GiB
    and 0.75 GiB: 224 sequences (a 68.8 GiB pool, 0.86) would need 83.7 GiB; 192 (61.6 GiB, 0.77) need 76.5."""
    s = seven_b(80.0)
    chosen = memory_planner.choose(s, speed=True)
    assert generation(chosen) == 192 and chosen.offload_actor_in_generation  # the trainer aside while vLLM generates
    pool = (15_231_233_024 * 1.1 + 192 * 4296 * 57344) / GIB + 1.5
    assert chosen.vllm_gpu_memory_utilization == math.ceil(pool / 80 * 100) / 100 == 0.77
    too_many = dataclasses.replace(chosen, vllm_gpu_memory_utilization=memory_planner._utilization(s, 224))
    assert too_many.vllm_gpu_memory_utilization == 0.86
    assert memory.start_bytes(too_many) / GIB == pytest.approx(0.86 * 80 + 15_231_233_024 / GIB + 0.75)
    assert memory.start_bytes(too_many) / GIB > 80.0 >= memory.start_bytes(chosen) / GIB


def test_fit_plan_speed_changes_the_generation_batch_and_says_what_changes(caplog):
    cfg = compose("teacher_rlt_mono", ["memory=speed", "trainer.max_completion_length=1024"])
    a = Arch.from_config(QWEN25_ARCHS["0.5b"])
    s = memory_planner.settings_from_config(cfg, total_gib=80.0, teacher=a, student=a)
    with caplog.at_level("INFO"):
        result, changes = memory_planner.fit_plan(cfg.memory, s)
    assert result.settings == memory_planner.choose(s, speed=True)
    assert changes == {"trainer.vllm_gpu_memory_utilization": 0.09, "trainer.per_device_train_batch_size": 16,
                       "trainer.gradient_accumulation_steps": 2, "trainer.steps_per_generation": 16,
                       "reward.micro_batch_size": 16, "trainer.gradient_checkpointing": False}
    assert cfg.trainer.steps_per_generation == 8  # the builder applies the changes (rlt_mono.rl.build.fit_memory)
    assert "memory=speed: generation batch 32 -> 256 sequences in flight" in caplog.text
    assert ("steps 2 to 8 of each train on completions sampled by the policy 1 to 7 optimizer steps earlier"
            in caplog.text)
    assert "gradient checkpointing off: micro-batch 16" in caplog.text


def test_cli_speed_prints_the_decisions_and_what_it_would_set():
    shown = subprocess.run([sys.executable, "-m", "rlt_mono.memory.planner", "teacher_rlt_mono", "--arch", "0.5b",
                            "--gpu-gib", "80", "--speed", "trainer.max_completion_length=1024"],
                           cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert lines[-4].startswith("gradient checkpointing off: micro-batch 16 ")
    assert lines[-3].startswith("memory=speed: generation batch 32 -> 256 sequences in flight")
    assert lines[-1] == ("memory=speed: trainer.vllm_gpu_memory_utilization=0.09 "
                         "trainer.per_device_train_batch_size=16 trainer.gradient_accumulation_steps=2 "
                         "trainer.steps_per_generation=16 "
                         "reward.micro_batch_size=16 trainer.gradient_checkpointing=false")
