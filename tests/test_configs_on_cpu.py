"""Every run config composes and instantiates; every YAML key is commented; no field shadows TRL's."""

import dataclasses
from pathlib import Path

import pytest
import trl
from omegaconf import OmegaConf

from rlt_mono.config import CONFIG_DIR, ConfigError, available_run_configs, compose
from rlt_mono.config import instantiate as _instantiate
from rlt_mono.data import DataConfig
from rlt_mono.grpo_config import RLTConfig
from rlt_mono.rewards import TeacherRewardConfig


def _stage(name: str) -> str:
    return compose(name).get("stage")


def test_every_run_config_composes_and_names_a_known_stage():
    from rlt_mono.train import STAGES

    assert {name: _stage(name) in STAGES for name in available_run_configs()} == \
        {name: True for name in available_run_configs()}


@pytest.mark.parametrize("name", [n for n in available_run_configs() if _stage(n) == "teacher_rlt"])
def test_run_config_composes_and_instantiates(name, tmp_path):
    cfg = compose(name, [f"output_dir={tmp_path}"])
    assert set(cfg) >= {"model", "student", "data", "reward", "trainer", "placement", "logging", "seed"}
    _instantiate(TeacherRewardConfig, cfg.reward, "reward")
    _instantiate(DataConfig, cfg.data, "data")
    trainer = OmegaConf.to_container(cfg.trainer)
    trainer.update(output_dir=str(tmp_path), bf16=False, use_cpu=True, optim="adamw_torch")  # CPU-checkable
    args = _instantiate(RLTConfig, trainer, "trainer")
    assert args.per_device_train_batch_size * args.gradient_accumulation_steps % args.num_generations == 0


def test_mono_run_has_the_reference_batch_sizes(tmp_path):
    cfg = compose("teacher_rlt_mono")
    t = cfg.trainer
    assert t.per_device_train_batch_size * t.gradient_accumulation_steps == 32  # completions per step
    assert (t.num_generations, t.max_completion_length, t.steps_per_generation) == (8, 4096, 8)
    assert (t.beta, t.temperature, t.loss_type, t.scale_rewards) == (0.04, 0.7, "grpo", "group")
    assert (t.ref_model_mixup_alpha, t.vllm_mode, t.vllm_gpu_memory_utilization) == (0.9, "colocate", 0.7)
    assert cfg.placement.offload_reference and cfg.placement.offload_student
    assert cfg.model.model_name_or_path.startswith("Qwen/Qwen2.5")
    assert cfg.student.model_name_or_path.startswith("Qwen/Qwen2.5")


def test_overrides_and_errors():
    cfg = compose("cfgs/run_cfg/demo_tiny.yaml", ["trainer.max_steps=3", "reward.clip_kl=5"])
    assert cfg.trainer.max_steps == 3 and cfg.reward.clip_kl == 5
    with pytest.raises(ConfigError, match="Could not override 'trainer.max_stepz'"):
        compose("demo_tiny", ["trainer.max_stepz=3"])
    with pytest.raises(ConfigError, match="Could not find 'placement/nowhere'"):
        compose("demo_tiny", ["placement=nowhere"])
    with pytest.raises(ConfigError, match="no run config named 'nope'"):
        compose("nope")
    with pytest.raises(ConfigError, match=r"reward: .*answer_log_prob_coeff has 1 entries"):
        _instantiate(TeacherRewardConfig, compose("demo_tiny", ["reward.answer_log_prob_coeff=[1.0]"]).reward,
                     "reward")


def test_rlt_fields_do_not_shadow_grpo_config():
    ours = {f.name for f in dataclasses.fields(RLTConfig)} - {f.name for f in dataclasses.fields(trl.GRPOConfig)}
    assert ours == {"explanation_samples_per_step", "plot_metrics", "vllm_detokenize"}
    with pytest.raises(ValueError, match="explanation_samples_per_step must be >= 0"):
        RLTConfig(output_dir="/tmp/x", max_steps=1, explanation_samples_per_step=-1, use_cpu=True)


def test_vllm_rollouts_skip_detokenization_unless_stop_strings_need_it():
    args = RLTConfig(output_dir="/tmp/x", max_steps=1, use_cpu=True, use_vllm=True, generation_kwargs={"min_tokens": 3})
    assert args.generation_kwargs == {"detokenize": False, "min_tokens": 3}
    args = RLTConfig(output_dir="/tmp/x", max_steps=1, use_cpu=True, use_vllm=True, vllm_detokenize=True)
    assert args.generation_kwargs == {"detokenize": True}
    # transformers rollouts: GenerationConfig has no such flag, nothing is added
    assert RLTConfig(output_dir="/tmp/x", max_steps=1, use_cpu=True).generation_kwargs is None
    with pytest.raises(ValueError, match="trainer.vllm_detokenize=true"):
        RLTConfig(output_dir="/tmp/x", max_steps=1, use_cpu=True, use_vllm=True,
                  generation_kwargs={"stop": ["</think>"]})


@pytest.mark.parametrize("path", sorted(CONFIG_DIR.rglob("*.yaml")), ids=lambda p: str(p.relative_to(CONFIG_DIR)))
def test_every_yaml_key_has_a_comment_above_it(path: Path):
    lines = path.read_text().splitlines()
    for i, line in enumerate(lines):
        if not line or line.startswith((" ", "#", "-")) or ":" not in line:
            continue
        assert i > 0 and lines[i - 1].lstrip().startswith("#"), f"{path.name}:{i + 1} {line!r} has no comment"


def test_no_key_is_declared_twice_across_groups():
    cfg = compose("teacher_rlt_mono")
    groups = ["model", "student", "data", "reward", "trainer", "placement", "logging"]
    seen = {}
    for group in groups:
        for key in cfg[group]:
            if group in ("model", "student") and key in ("model_name_or_path", "dtype", "gguf_file"):
                continue  # the same field of two different models
            assert key not in seen, f"{group}.{key} also declared in {seen.get(key)}"
            seen[key] = group
