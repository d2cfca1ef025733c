"""The memory planner's arithmetic (rlt_mono/memory/model.py) against hand-computed bytes; the plan, memory=auto's
choice, its advice and the CLI (rlt_mono/memory/planner.py)."""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf
from transformers import Qwen2Config, Qwen2ForCausalLM

from rlt_mono.errors import UserError
from rlt_mono.memory import model as memory
from rlt_mono.memory import planner as memory_planner
from rlt_mono.memory.model import GIB, QWEN25_ARCHS, Arch, Settings
from rlt_mono.memory.planner import plan

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


def compose_rl(*overrides):
    from rlt_mono.config import compose

    return compose("teacher_rlt_mono", list(overrides))


@functools.cache
def _rl_defaults(teacher: Arch, student: Arch) -> Settings:
    return memory_planner.settings_from_config(compose_rl(), total_gib=80.0, teacher=teacher, student=student)


def rl_settings(teacher: Arch, student: Arch | None = None, **changes) -> Settings:
    """The settings of the composed teacher_rlt_mono config (the YAML holds every run setting's only default) for
    ``teacher`` and ``student`` (default: the teacher's architecture), an 80 GiB card and 512-token prompts, with
    ``changes``."""
    return dataclasses.replace(_rl_defaults(teacher, student or teacher), **changes)


def tiny_settings(**changes) -> Settings:
    values = dict(teacher_dtype="float32", student_dtype="float32", optim="adamw_torch",
                  gradient_checkpointing=False, bf16=False, prompt_length=4, max_completion_length=12,
                  per_device_train_batch_size=2, gradient_accumulation_steps=4, steps_per_generation=4,
                  reward_micro_batch_size=1, vllm_gpu_memory_utilization=0.5, total_gib=1.0, context_gib=0.0,
                  slack=0.0, startup_context_gib=0.0)
    return dataclasses.replace(rl_settings(TINY), **{**values, **changes})


def test_tiny_phases_by_hand():
    result = plan(tiny_settings())
    weights, optimizer, grads = 1480 * 4, 2 * 1480 * 4, 1480 * 4  # float32; adamw_torch: two float32 states
    pool = GIB // 2  # 0.5 x 1 GiB
    assert dict(result.phases["GENERATE"].terms) == {"vLLM pool": pool, "vLLM beyond its pool": int(0.4 * weights),
                                                     "teacher weights": weights, "optimizer state": optimizer,
                                                     "allocator slack": 0, "CUDA context": 0,
                                                     "allocator cache from SCORE and TRAIN": 0}
    # TRAIN, activations (4 bytes, no autocast), micro-batch 2 x (4 + 12) = 32 tokens:
    #   saved per token per layer: attention 3*8 + 2*8 + 3*4 + 4*8 = 84, MLP 3*8 + 4*16 = 88 -> 172 * 4 = 688 B
    #   no checkpointing: 2 layers * 688 * 32 = 44032, + final norm in/out 2 * 32 * 8 * 4 = 2048 -> 46080
    #   loss head: 24 completion tokens, tile 24 * 32 * 4 * 2 = 6144, head grad 32*8*4 = 1024,
    #   hidden grad 24*8*4 = 768 -> 7936
    train = dict(result.phases["TRAIN"].terms)
    assert train["activations"] == 46080
    assert train["loss head"] == 7936
    assert train["allocator cache from SCORE"] == 0  # TRAIN allocates more than SCORE
    assert result.phases["TRAIN"].bytes == weights + optimizer + grads + 46080 + 7936 == 77696
    # SCORE: the largest pass is the reference's (micro-batch 2, 32 tokens):
    #   hidden 32*8*4 = 1024, one layer live 32 * 4*(4*8 + 3*16) = 10240, fused head tile 6144 -> 17408,
    #   + its weights swapped in 5920 = 23328; the student's (micro-batch 1, 16 tokens): 512 + 5120 +
    #   head 12*32*(4+8) = 4608 -> 10240 + 5920 = 16160
    score = dict(result.phases["SCORE"].terms)
    assert score["reference pass activations"] == 17408
    assert score["reference weights (swapped in)"] == weights
    # torch keeps TRAIN's reserve through SCORE: the device holds the larger of the two in both phases
    assert score["allocator cache from TRAIN"] == 77696 - 41088
    assert result.phases["SCORE"].bytes == result.phases["TRAIN"].bytes == 77696
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
    # the embedding (32 x 8 = 256) keeps float32 states (8 bytes each), the other 1224 parameters 8-bit ones:
    # ceil(1224 * (2 + 8/256)) = ceil(2486.25)
    assert dict(bnb.phases["TRAIN"].terms)["optimizer state"] == 256 * 8 + 2487
    awake = plan(tiny_settings(vllm_sleep=False))
    assert dict(awake.phases["TRAIN"].terms)["vLLM pool (no sleep mode)"] == GIB // 2


def test_advice_lowers_the_micro_batch_keeping_completions_per_step():
    arch = Arch.from_config(QWEN25_ARCHS["1.5b"])
    base = rl_settings(arch, total_gib=24.0, vllm_gpu_memory_utilization=0.2)
    at_two = plan(dataclasses.replace(base, per_device_train_batch_size=2, gradient_accumulation_steps=16,
                                      steps_per_generation=16))
    assert at_two.peak.name == "TRAIN"
    free = round(at_two.peak.gib + 0.05, 2)
    result = plan(dataclasses.replace(base, free_gib=free))
    assert not result.fits and result.peak.name == "TRAIN"
    # lowering reward.micro_batch_size (tried first) only shrinks SCORE, so the micro-batch is the first that fits
    assert result.advice == ("trainer.per_device_train_batch_size=2 trainer.gradient_accumulation_steps=16 "
                             "trainer.steps_per_generation=16")  # overrides a user can paste
    # the 24 GiB card less what other processes hold
    assert result.refusal() == (f"TRAIN needs {result.peak.gib:.1f} GiB, the card has {free:.1f} beside other "
                                f"processes' {24 - free:.1f}: {result.advice}")
    assert "does not fit: TRAIN needs" in result.table()


def test_advice_falls_through_to_completion_length_and_to_nothing():
    arch = Arch.from_config(QWEN25_ARCHS["1.5b"])
    # a QLoRA teacher already: shorter completions are the last kind of change left
    one = rl_settings(arch, total_gib=24.0, vllm_gpu_memory_utilization=0.15, per_device_train_batch_size=1,
                      reward_micro_batch_size=1, lora_r=16, load_in_4bit=True)
    shorter = plan(dataclasses.replace(one, max_completion_length=2048))
    result = plan(dataclasses.replace(one, free_gib=round(shorter.peak.gib + 0.01, 2)))
    assert result.advice == "trainer.max_completion_length=2048"
    hopeless = plan(dataclasses.replace(one, free_gib=1.0))
    assert hopeless.advice == "no change of these settings fits: a smaller model pair or a larger card"


def test_bad_settings_are_user_errors():
    with pytest.raises(UserError, match="trainer.optim='sgd'"):
        tiny_settings(optim="sgd")
    with pytest.raises(UserError, match="model config has no hidden_size"):
        Arch.from_config({"vocab_size": 3})


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rlt_mono.memory.planner", *args], cwd=ROOT, capture_output=True,
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
    assert line.startswith("error: ") and " GiB, the card has 12.0: " in line
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


# ---- memory=auto --------------------------------------------------------------------------------------------


def test_activation_offloading_is_credited_with_no_saving_and_never_advised():
    # measured on an H100: it did not lower the device-level peak (rlt_mono.memory.model), so no setting reads it
    on = memory_planner.settings_from_config(compose_rl("trainer.activation_offloading=true"), total_gib=24.0,
                                             arch="1.5b")
    assert plan(on) == plan(memory_planner.settings_from_config(compose_rl(), total_gib=24.0, arch="1.5b"))
    assert not plan(on).fits and "activation_offloading" not in plan(on).advice
    assert "trainer.activation_offloading" not in memory.CONFIG_KEYS.values()


def qwen_settings(arch: str, **changes) -> Settings:
    return rl_settings(Arch.from_config(QWEN25_ARCHS[arch]), **{**dict(prompt_length=200, max_completion_length=4096,
                                                                         total_gib=80.0, free_gib=79.0), **changes})


def test_auto_keeps_completions_per_step_and_per_generation_and_fits():
    s = qwen_settings("1.5b", total_gib=24.0, free_gib=23.5)
    chosen = memory_planner.choose(s)
    assert memory_planner.plan(chosen).fits
    assert chosen.per_device_train_batch_size * chosen.gradient_accumulation_steps == 32
    assert chosen.per_device_train_batch_size * chosen.steps_per_generation == 32
    # the largest micro-batch that fits: the next larger divisor of 32 does not
    larger = 2 * chosen.per_device_train_batch_size
    assert not memory_planner.fits(dataclasses.replace(chosen, per_device_train_batch_size=larger,
                                                       gradient_accumulation_steps=32 // larger,
                                                       steps_per_generation=32 // larger))
    # the pool holds the teacher (x 1.1), the KV cache of the 32 sequences and 1.5 GiB, as a share of 24 GiB
    kv = 32 * 4296 * 2 * 28 * 256 * 2
    pool_gib = (1_543_714_304 * 2 * 1.1 + kv) / GIB + 1.5
    assert chosen.vllm_gpu_memory_utilization == math.ceil(pool_gib / 24 * 100) / 100


def test_auto_on_a_big_card_takes_the_largest_batches_and_a_small_pool():
    chosen = memory_planner.choose(qwen_settings("0.5b"))
    # without recomputation a 4296-token sequence keeps 24 layers x 61,184 B per token (plus the final norm's
    # 2 x 896 x 2 B per token) = 6,323,712,000 B: 8 of them (47.1 GiB) fit beside the rest, 16 (94.2 GiB) do not;
    # no recomputation comes before the micro-batch's size, though 16 would fit with it
    assert memory.train_activation_bytes(dataclasses.replace(chosen, per_device_train_batch_size=1)) == 6_323_712_000
    assert (chosen.per_device_train_batch_size, chosen.reward_micro_batch_size) == (8, 16)
    assert not chosen.gradient_checkpointing
    sixteen = dict(per_device_train_batch_size=16, gradient_accumulation_steps=2, steps_per_generation=2)
    assert not memory_planner.fits(dataclasses.replace(chosen, **sixteen))
    assert memory_planner.fits(dataclasses.replace(chosen, **sixteen, gradient_checkpointing=True))
    assert chosen.vllm_gpu_memory_utilization < 0.1  # the configured 0.3 would waste 17 GiB of an 80 GiB card


def test_auto_moves_the_actor_aside_before_it_shrinks_the_kv_cache(caplog):
    s = qwen_settings("1.5b", total_gib=16.0, free_gib=15.5)
    with caplog.at_level("WARNING"):
        chosen = memory_planner.choose(s)
    # the whole generation batch's KV cache fits once the trainer waits on the CPU while vLLM generates
    assert memory_planner.plan(chosen).fits and chosen.offload_actor_in_generation
    assert chosen.vllm_gpu_memory_utilization == memory_planner._utilization(s, 32)
    assert "vLLM queues the rest" not in caplog.text
    assert not memory_planner.fits(dataclasses.replace(chosen, offload_actor_in_generation=False))
    # 30,000-token completions: even then only half a generation batch's KV cache fits
    long = qwen_settings("0.5b", max_completion_length=30000, total_gib=14.0, free_gib=13.5)
    with caplog.at_level("WARNING"):
        chosen = memory_planner.choose(long)
    assert memory_planner.plan(chosen).fits
    assert chosen.vllm_gpu_memory_utilization == memory_planner._utilization(long, 16)
    assert "holds the KV cache of 16 of the 32 sequences a generation makes (vLLM queues the rest" in caplog.text


def test_auto_refusal_says_what_is_missing_and_the_cheapest_change():
    refused = memory_planner.plan(memory_planner.choose(qwen_settings("7b", total_gib=48.0, free_gib=47.5)))
    assert not refused.fits
    line = refused.refusal()
    assert line.startswith(f"{refused.peak.name} needs {refused.peak.gib:.1f} GiB, the card has 47.5 beside other "
                           "processes' 0.5: ")


def test_fit_plan_auto_returns_its_choice_as_config_changes(caplog):
    cfg = compose_rl()
    assert cfg.memory == "auto"  # the GPU run config's default
    s = memory_planner.settings_from_config(cfg, total_gib=24.0, free_gib=23.5, arch="1.5b", prompt_length=200)
    untouched = OmegaConf.to_container(cfg)
    with caplog.at_level("INFO"):
        result, changes = memory_planner.fit_plan(cfg.memory, s)
    chosen = memory_planner.choose(s)
    assert result.fits and result.settings == chosen
    assert changes["trainer.per_device_train_batch_size"] == chosen.per_device_train_batch_size
    assert changes["trainer.gradient_accumulation_steps"] == chosen.gradient_accumulation_steps
    assert changes["trainer.vllm_gpu_memory_utilization"] == chosen.vllm_gpu_memory_utilization != 0.7
    assert changes["reward.micro_batch_size"] == chosen.reward_micro_batch_size
    assert OmegaConf.to_container(cfg) == untouched  # the builder applies them (rlt_mono.rl.build.fit_memory)
    assert "memory plan (predicted device-level peaks)" in caplog.text


def test_fit_plan_manual_keeps_the_settings_and_warns(caplog):
    cfg = compose_rl("memory=manual")
    s = memory_planner.settings_from_config(cfg, total_gib=24.0, arch="1.5b", prompt_length=200)
    with caplog.at_level("INFO"):
        result, changes = memory_planner.fit_plan(cfg.memory, s)
    assert not result.fits  # vLLM at 0.7 of a 24 GiB card leaves too little for the rest
    assert result.settings == s and changes == {}
    assert "memory=manual: these settings will likely run out of GPU memory" in caplog.text


def test_fit_plan_auto_refuses_in_one_line():
    cfg = compose_rl()
    s = memory_planner.settings_from_config(cfg, total_gib=48.0, arch="7b", prompt_length=200)
    with pytest.raises(UserError, match=r"^memory=auto: nothing fits this card: (GENERATE|SCORE|TRAIN) needs [0-9.]+ "
                                        r"GiB, the card has 48.0: "):
        memory_planner.fit_plan(cfg.memory, s)
    # a 12 GiB card cannot even hold vLLM's copy of a 7B teacher
    tiny_card = memory_planner.settings_from_config(cfg, total_gib=12.0, arch="7b", prompt_length=200)
    with pytest.raises(UserError, match=r"vLLM needs 17\.\d GiB for the teacher's weights and one sequence's KV "
                                        r"cache, the card has 12.0: a smaller teacher or a larger card$"):
        memory_planner.fit_plan(cfg.memory, tiny_card)


def test_unknown_memory_mode_is_a_user_error():
    cfg = compose_rl("memory=fast")
    with pytest.raises(UserError, match="memory='fast': choose one of auto, speed, manual"):
        memory_planner.fit_plan(cfg.memory, memory_planner.settings_from_config(cfg, total_gib=80.0, arch="0.5b"))


def test_cli_auto_prints_what_it_would_set():
    shown = run_cli("teacher_rlt_mono", "--arch", "1.5b", "--gpu-gib", "24", "--auto")
    assert shown.returncode == 0, shown.stderr
    chosen = memory_planner.choose(memory_planner.settings_from_config(compose_rl(), total_gib=24.0, arch="1.5b"))
    assert (f"memory=auto: trainer.vllm_gpu_memory_utilization={chosen.vllm_gpu_memory_utilization} "
            in shown.stdout)


def test_placement_auto_is_planned_as_mono_and_split_is_refused():
    auto = memory_planner.settings_from_config(compose_rl("placement=auto"), total_gib=80.0, arch="0.5b")
    assert auto == memory_planner.settings_from_config(compose_rl(), total_gib=80.0, arch="0.5b")
    with pytest.raises(UserError, match="placement=student_gpu: the memory planner covers every role on one GPU"):
        memory_planner.settings_from_config(compose_rl("placement=student_gpu"), total_gib=80.0, arch="0.5b")


def test_vllm_start_needs_its_pool_free_beside_the_teacher():
    # With the actor aside, GENERATE holds the pool and vLLM's extra (0.4 x 5920 = 2368 bytes). vLLM starts while
    # the teacher (5920 bytes; the reference is still on the CPU) is on the GPU, and needs its pool free beside it.
    pool = GIB // 2
    free = (pool + 5920 - 1) / GIB
    result = plan(tiny_settings(total_gib=1.0, free_gib=free, offload_actor_in_generation=True))
    assert memory.start_bytes(result.settings) == pool + 5920
    assert result.phases["GENERATE"].bytes == pool + 2368 and result.peak.gib <= free
    assert not result.starts and not result.fits and not memory_planner.fits(result.settings)
    assert result.refusal().startswith("vLLM's start needs 0.5 GiB free (its pool 0.50 GiB beside the teacher's")
    assert plan(tiny_settings(total_gib=1.0, free_gib=free + 1 / GIB, offload_actor_in_generation=True)).fits
    # a LoRA teacher: its own weights (5920 + float32 adapters 512 x 4) are what vLLM meets;
    # the process's own 0.75 GiB (measured) is added by default
    lora = tiny_settings(total_gib=1.0, offload_actor_in_generation=True, lora_r=2, startup_context_gib=0.75)
    assert memory.start_bytes(lora) == pool + 5920 + 2048 + int(0.75 * GIB)


def test_a_sharded_teacher_holds_its_share_and_the_gathered_units():
    """placement.strategy=fsdp2 over 2 ranks (tiny pair, float32, adamw_torch), by hand: the teacher's weights,
    gradients and optimizer state and the reference (resident: FSDP keeps it on the GPU) are halved; a teacher pass
    holds accelerate's tail unit (tied embedding 256 + norm 8 = 264), the layer it runs and the next (608 each):
    1480 parameters x 4 B = 5920 B (twice in TRAIN, with their unsharded gradients); a reference pass gathers the
    whole reference (TRL shards it as one unit): 5920 B."""
    assert memory.fsdp_gathered_bytes(tiny_settings()) == 5920
    # Qwen2.5-1.5B (tied, bf16): tail 151936 x 1536 + 1536, layer 46,797,824 (q, o 1536^2; k, v 1536 x 256; biases
    # 2048; MLP 3 x 1536 x 8960; norms 3072), twice.
    big = Arch.from_config(QWEN25_ARCHS["1.5b"])
    assert big.layer_params() == 46_797_824
    assert memory.fsdp_gathered_bytes(rl_settings(big)) == (
        151936 * 1536 + 1536 + 2 * 46_797_824) * 2
    untied = dataclasses.replace(TINY, tie_word_embeddings=False)  # its embedding a unit of its own: 256 < 608
    assert memory.fsdp_gathered_bytes(tiny_settings(teacher=untied)) == (264 + 608 + 608) * 4
    result = plan(tiny_settings(data_parallel_ranks=2, sharded=True))
    pool = GIB // 2
    assert dict(result.phases["GENERATE"].terms) == {
        "vLLM pool": pool, "vLLM beyond its pool": int(0.4 * 5920), "teacher weights (1/2 shard)": 2960,
        "optimizer state": 5920, "reference weights (resident)": 2960, "allocator slack": 0, "CUDA context": 0,
        "allocator cache from SCORE and TRAIN": 0}
    train = dict(result.phases["TRAIN"].terms)
    assert train["gradients"] == 2960 and train["FSDP gathered units and their gradients"] == 2 * 5920
    assert "DDP gradient buckets" not in train
    assert result.phases["TRAIN"].bytes == 2960 + 5920 + 2960 + 2960 + 46080 + 7936 + 2 * 5920 == 80656
    score = dict(result.phases["SCORE"].terms)  # the reference pass: nothing swapped in, the reference gathered
    assert score["reference pass activations"] == 5920 + 17408 and "reference weights (swapped in)" not in score
    # vLLM starts while the teacher and reference wait on the CPU for accelerate and TRL to shard them.
    assert memory.start_bytes(tiny_settings(data_parallel_ranks=2, sharded=True)) == pool
    # the reward's pass on a sharded teacher keeps the logits of its micro-batch's completions (1 x 12 x 32 float32)
    assert memory.teacher_pass_logits_bytes(tiny_settings(data_parallel_ranks=2, sharded=True)) == 12 * 32 * 4
    assert memory.teacher_pass_logits_bytes(tiny_settings()) == 0
    # bf16: accelerate upcasts the trained weights to float32 masters (gradients and Adam states follow); the
    # reference stays bfloat16. Halved over 2 ranks: weights 1480 x 4 / 2, Adam 2 x 1480 x 4 / 2, reference
    # 1480 x 2 / 2; the gathered units are bfloat16 (1480 x 2).
    bf16 = dict(plan(tiny_settings(data_parallel_ranks=2, sharded=True, bf16=True, teacher_dtype="bfloat16"))
                .phases["TRAIN"].terms)
    assert (bf16["teacher weights (1/2 shard)"], bf16["optimizer state"], bf16["gradients"],
            bf16["reference weights (resident)"], bf16["FSDP gathered units and their gradients"]) == (
        2960, 5920, 2960, 1480, 2 * 1480 * 2)
    with pytest.raises(UserError, match="a LoRA teacher is replicated"):
        tiny_settings(data_parallel_ranks=2, sharded=True, lora_r=4)
    sharded = memory_planner.settings_from_config(compose_rl("placement=dp", "placement.num_processes=4",
                                                             "placement.strategy=fsdp2"), total_gib=80.0, arch="0.5b")
    assert sharded.sharded and sharded.shards == 4
    assert not memory_planner.settings_from_config(compose_rl("placement=dp"), total_gib=80.0, arch="0.5b").sharded


def data_parallel_ranks(*overrides: str) -> int:
    """The ranks the planner plans for a ``placement=dp`` run of the RL config with ``overrides``."""
    return memory_planner.settings_from_config(compose_rl("placement=dp", *overrides), total_gib=80.0,
                                               arch="0.5b").data_parallel_ranks


def test_data_parallel_ranks_hold_ddp_gradient_buckets_in_every_phase(monkeypatch):
    one, two = plan(tiny_settings()), plan(tiny_settings(data_parallel_ranks=2))
    for phase in ("GENERATE", "SCORE", "TRAIN"):
        assert dict(two.phases[phase].terms)["DDP gradient buckets"] == 1480 * 4  # a float32 copy of the gradients
        assert "DDP gradient buckets" not in dict(one.phases[phase].terms)
    assert two.phases["TRAIN"].bytes == one.phases["TRAIN"].bytes + 1480 * 4
    assert data_parallel_ranks("placement.num_processes=4") == 4
    # num_processes unset: one rank per GPU this machine shows (CUDA_VISIBLE_DEVICES here), as the launcher starts
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2")
    assert data_parallel_ranks() == 3
    assert data_parallel_ranks("+trainer.use_cpu=true") == 1  # one CPU rank, as the launcher starts
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert data_parallel_ranks() == 1


def test_what_a_process_holds_on_the_cpu_by_hand():
    weights = 1480 * 4  # the tiny pair in float32
    assert memory.host_memory_terms(tiny_settings()) == [("reference", weights), ("student", weights)]
    # the actor aside: weights, gradients and adamw_torch's two float32 states
    aside = memory.host_memory_terms(tiny_settings(offload_actor_in_generation=True, offload_student=False))
    assert aside == [("reference", weights), ("teacher aside", weights + weights + 2 * weights)]
    # sharded: the teacher and its reference wait whole on the CPU until they are sharded (and there is no aside)
    assert memory.host_memory_terms(tiny_settings(sharded=True, data_parallel_ranks=2,
                                                  offload_actor_in_generation=True)) == [
        ("teacher and reference while loading", 2 * weights), ("student", weights)]
    # a LoRA teacher has no reference copy
    assert memory.host_memory_terms(tiny_settings(lora_r=2, offload_reference=True)) == [("student", weights)]
