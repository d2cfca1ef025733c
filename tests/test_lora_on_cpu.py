"""A LoRA teacher (rlt_mono/rl/lora.py) on CPU: the merged weights vLLM receives, the reference pass with adapters
disabled, the RL stage end to end (only adapters train, final/ is the merged teacher), the config errors, and the
planner's LoRA and QLoRA terms against hand-computed bytes."""

from __future__ import annotations

import copy

import pytest
import torch
from peft import LoraConfig, PeftModel, get_peft_model
from safetensors.torch import load_file
from test_memory_on_cpu import TINY, rl_settings, tiny_settings
from transformers import AutoModelForCausalLM

from rlt_mono import compose
from rlt_mono.config import ConfigError
from rlt_mono.memory import model as memory
from rlt_mono.memory.model import GIB, QWEN25_ARCHS, Arch, optimizer_bytes, teacher_weight_bytes
from rlt_mono.memory.planner import plan
from rlt_mono.rl import lora
from rlt_mono.rl.trainer import REFERENCE_FILE


def _lora_teacher(teacher, rank=4, seed=0):
    model = get_peft_model(copy.deepcopy(teacher), LoraConfig(r=rank, lora_alpha=8, target_modules="all-linear"))
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():  # B starts at zero: give it values, so the merge changes something
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.1)
    return model


def test_merged_params_equal_peft_merge_and_leave_the_model_alone(teacher):
    model = _lora_teacher(teacher)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    merged = dict(lora.merged_named_params(model))
    # the names vLLM expects: the base model's own, adapters left out, the tied embedding once
    assert sorted(merged) == sorted(n for n, _ in teacher.named_parameters())
    assert all(torch.equal(p.detach(), before[n]) for n, p in model.named_parameters())
    assert not any(layer.merged for layer in lora._lora_layers(model).values())
    expected = copy.deepcopy(model).merge_and_unload().state_dict()
    for name, tensor in merged.items():
        torch.testing.assert_close(tensor, expected[name], rtol=0, atol=1e-6)
    down = "model.layers.0.mlp.down_proj.weight"  # adapted: differs from the base weight
    assert not torch.allclose(merged[down], dict(teacher.named_parameters())[down])
    # a model without adapters: its parameters as they are
    assert [n for n, _ in lora.merged_named_params(teacher)] == [n for n, _ in teacher.named_parameters()]


def test_disabled_adapters_are_seen_and_merge_to_the_base(teacher):
    model = _lora_teacher(teacher)
    assert lora.adapters_enabled(model)
    with model.disable_adapter():
        assert not lora.adapters_enabled(model)
        base = dict(teacher.named_parameters())
        for name, tensor in lora.merged_named_params(model):
            assert torch.equal(tensor, base[name].detach()), name
    assert lora.adapters_enabled(model) and lora.adapters_enabled(teacher)


def test_rl_stage_with_a_lora_teacher_trains_adapters_and_saves_the_merged_teacher(tmp_path):
    from rlt_mono.runs.outputs import METRICS_FILE, read_metrics
    from rlt_mono.stages.teacher_rlt import run_teacher_rlt

    out = tmp_path / "run"
    cfg = compose("demo_tiny", [f"output_dir={out}", "trainer.max_steps=2", "trainer.save_steps=1",
                                "trainer.ref_model_sync_steps=1", "model.lora_r=4", "model.lora_alpha=8",
                                "trainer.learning_rate=0.05"])
    run_teacher_rlt(cfg)
    final = out / "final"
    config = (final / "config.json").read_text()
    assert "quantization_config" not in config
    assert (final / "adapter" / "adapter_model.safetensors").is_file()
    assert (out / "checkpoint-1" / "adapter_model.safetensors").is_file()
    # final/ is the merged teacher: peft's own merge of base + saved adapter gives the same weights
    from rlt_mono.data.embedded import build_tiny_pair

    base = AutoModelForCausalLM.from_pretrained(build_tiny_pair().teacher_path)
    base_weights = {n: p.detach().clone() for n, p in base.named_parameters()}
    reference = PeftModel.from_pretrained(base, final / "adapter").merge_and_unload().state_dict()
    saved = load_file(final / "model.safetensors")
    changed = [name for name in saved if not torch.equal(saved[name], base_weights[name])]
    for name, tensor in saved.items():
        torch.testing.assert_close(tensor, reference[name], rtol=0, atol=1e-6)
    # adapters on every linear layer trained; embeddings and norms did not
    assert changed and all(name.endswith("proj.weight") for name in changed)
    loaded = AutoModelForCausalLM.from_pretrained(final)
    assert sum(p.numel() for p in loaded.parameters()) == sum(base_weights[n].numel() for n in base_weights)
    rows = [r for r in read_metrics(out / METRICS_FILE) if "teacher_reward/total" in r]
    assert [r["step"] for r in rows] == [1, 2]
    # no reference mixup, and the reference pass (adapters disabled) was not taken for the policy's log-probs:
    # with aligned steps TRL computes none, so the reward ran the teacher itself
    assert all(r["score/reward_teacher_passes"] == 1 and "score/teacher_log_probs_reused" not in r for r in rows)
    assert not (out / "checkpoint-1" / REFERENCE_FILE).exists()


def model_group(**keys) -> dict:
    """The model group as the configs compose it (every model.lora_* key with cfgs/model/_base.yaml's value), with
    ``keys`` changed."""
    from omegaconf import OmegaConf

    return {**OmegaConf.to_container(compose("demo_tiny").model), **keys}


def test_lora_config_errors_say_what_to_set():
    with pytest.raises(ConfigError, match="model.lora_r"):
        lora.lora_rank(model_group(lora_r=0, load_in_4bit=True))
    with pytest.raises(ConfigError, match="model.lora_r=-1"):
        lora.lora_rank(model_group(lora_r=-1))
    with pytest.raises(ConfigError, match="needs a CUDA GPU"):
        lora.quantization_kwargs(model_group(lora_r=8, load_in_4bit=True), "cpu")
    for key, value, expected in (("load_in_4bit", "maybe", "true or false"),
                                 ("lora_alpha", "x", "a positive number"), ("lora_alpha", 0, "a positive number"),
                                 ("lora_dropout", 1.0, r"a probability in \[0, 1\)"),
                                 ("lora_target_modules", [], "all-linear or a list of module names"),
                                 ("lora_target_modules", [3], "all-linear or a list of module names")):
        with pytest.raises(ConfigError, match=f"model.{key}=.*: {expected}"):
            lora.lora_rank(model_group(lora_r=8, **{key: value}))
    assert lora.quantization_kwargs(model_group(lora_r=8), "cpu") == {}
    assert lora.peft_config(model_group(lora_r=0)) is None
    # the adapters' settings are the model group's: alpha 32 (the YAML's), not one the code makes up
    config = lora.peft_config(model_group(lora_r=8))
    assert (config.r, config.lora_alpha, config.lora_dropout, config.target_modules) == (8, 32, 0.0, "all-linear")
    config = lora.peft_config(model_group(lora_r=4, lora_alpha=8, lora_target_modules=["q_proj"]))
    assert (config.r, config.lora_alpha, config.target_modules) == (4, 8, {"q_proj"})
    # a group without LoRA keys (the student's) has no adapters
    assert "lora_r" not in compose("demo_tiny").student and lora.lora_rank(compose("demo_tiny").student) == 0


def test_the_lora_config_turns_the_reference_mixup_off(tmp_path):
    from rlt_mono.rl.build import trainer_kwargs

    cfg = compose("demo_tiny", ["model.lora_r=4"])
    assert cfg.trainer.sync_ref_model
    assert trainer_kwargs(cfg, tmp_path, use_vllm=False)["sync_ref_model"] is False
    assert trainer_kwargs(compose("demo_tiny", []), tmp_path, use_vllm=False)["sync_ref_model"] is True


# ---- the planner's LoRA and QLoRA terms (TINY: H=8, L=2, I=16, q_dim 8, kv_dim 4, V=32, 1480 parameters) ------
def test_lora_parameter_counts_by_hand():
    # linear layers (in, out): q (8,8), k (8,4), v (8,4), o (8,8), gate (8,16), up (8,16), down (16,8)
    # weights 64+32+32+64+128+128+128 = 576 per layer -> 1152; in+out 16+12+12+16+24+24+24 = 128 per layer
    assert TINY.linear_params() == 1152
    assert TINY.lora_params(2) == 2 * 2 * 128 == 512
    qwen_05b = Arch.from_config(QWEN25_ARCHS["0.5b"])
    # peft's all-linear adapters on Qwen2.5-0.5B at r=16: 8,798,208 trainable parameters (peft reports the same)
    assert qwen_05b.lora_params(16) == 8_798_208


def test_lora_and_qlora_teacher_bytes_by_hand():
    lora16 = tiny_settings(lora_r=2)  # float32 teacher: adapters float32 too
    assert teacher_weight_bytes(lora16) == 1480 * 4 + 512 * 4 == 7968
    qlora = tiny_settings(lora_r=2, load_in_4bit=True)
    # linear weights in NF4: ceil(1152 x (0.5 + 1/64 + 4/16384)) = 595; the other 328 in float32; bf16 adapters
    assert math_ceil(1152 * memory.NF4_BYTES_PER_PARAM) == 595
    assert teacher_weight_bytes(qlora) == 595 + 328 * 4 + 512 * 2 == 2931
    assert optimizer_bytes(TINY, "float32", "adamw_torch", (2, 4)) == 2 * 512 * 4
    assert optimizer_bytes(TINY, "float32", "paged_adamw_8bit", (2, 4)) == 1040  # ceil(512 x (2 + 8/256))
    assert optimizer_bytes(TINY, "float32", "paged_adamw_8bit") == optimizer_bytes(TINY, "float32", "adamw_bnb_8bit")


def math_ceil(value: float) -> int:
    return -int(-value // 1)


def test_lora_phases_have_no_reference_copy_and_adapter_sized_state():
    result = plan(tiny_settings(lora_r=2))
    train = dict(result.phases["TRAIN"].terms)
    assert train["teacher weights (adapters too)"] == 7968
    assert train["gradients"] == 512 * 4
    assert train["optimizer state"] == 2 * 512 * 4
    score = dict(result.phases["SCORE"].terms)
    assert not any(what.startswith("reference weights") for what in score)
    # a card of 10 KiB, so that the weight sync outgrows vLLM's pool (0.5 x 10240 = 5120 bytes)
    card = 10240 / GIB
    aside = plan(tiny_settings(lora_r=2, offload_actor_in_generation=True, total_gib=card))
    # the sync moment: the trainer's teacher 7968 and its adamw_torch state on float32 adapters 2 x 512 x 4, vLLM's
    # float32 teacher 1480 x 4, one merged layer 128 x (4 + 4 + 4); the phase adds what exceeds the pool
    generate = dict(aside.phases["GENERATE"].terms)
    assert generate["actor during the weight sync, then on the CPU"] == 7968 + 4096 + 5920 + 1536 - 5120
    qlora = plan(tiny_settings(lora_r=2, load_in_4bit=True, offload_actor_in_generation=True, total_gib=card))
    # a 4-bit layer's pass dequantizes two of the largest linear weights (128) in 2 bytes: 512
    assert dict(qlora.phases["TRAIN"].terms)["4-bit dequantization"] == 512
    # a 4-bit teacher moved aside freed nothing on an H100: it stays counted while vLLM generates
    generate = dict(qlora.phases["GENERATE"].terms)
    assert generate["teacher weights (NF4 base, adapters)"] == 2931
    assert not any(what.startswith("actor during") for what in generate)


def test_advice_offers_a_lora_teacher_when_only_it_fits():
    qwen7 = Arch.from_config(QWEN25_ARCHS["7b"])
    settings = rl_settings(qwen7, max_completion_length=4096, per_device_train_batch_size=1,
                           gradient_accumulation_steps=32, steps_per_generation=32, reward_micro_batch_size=1,
                           vllm_gpu_memory_utilization=0.5, offload_actor_in_generation=True, total_gib=48.0)
    result = plan(settings)
    assert not result.fits
    assert result.refusal().endswith(": model.lora_r=16")
    with pytest.raises(Exception, match="needs lora_r > 0"):
        rl_settings(qwen7, load_in_4bit=True)


def test_target_modules_the_teacher_lacks_are_one_config_error(tmp_path):
    from rlt_mono import build_trainer

    # a list is checked against the teacher's layers before peft (tests/test_hostile_inputs_on_cpu.py); a string is a
    # pattern peft matches itself
    cfg = compose("demo_tiny", [f"output_dir={tmp_path / 'run'}", "model.lora_r=4", "model.lora_target_modules=nope"])
    with pytest.raises(ConfigError, match=r"model.lora_target_modules=nope: .*Use all-linear, or names"):
        build_trainer(cfg)
