"""Each memory setting is declared once: the composed YAML config (cfgs/) holds its only default, ``memory.Settings``
names its config key once (``memory.setting``), the planner reads it there and ``memory=auto`` writes it back there,
and every setting the planner is given changes what it predicts or picks."""

import dataclasses

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from rlt_mono.config import CONFIG_DIR, register_group_defaults
from rlt_mono.memory import model as memory
from rlt_mono.memory import planner as memory_planner
from rlt_mono.memory.model import QWEN25_ARCHS, Arch, Settings

ARCH = Arch.from_config(QWEN25_ARCHS["1.5b"])
# The Settings fields that are no run setting, and where each comes from instead of the config.
NOT_RUN_SETTINGS = {
    "teacher": "the teacher's config.json",
    "student": "the student's config.json",
    "prompt_length": "the data's longest prompt",
    "data_parallel_ranks": "placement.mode, placement.num_processes and the GPUs present",
    "sharded": "placement.mode and placement.strategy",
    "total_gib": "the card",
    "free_gib": "the card less what other processes hold",
    "context_gib": "a measurement (memory.CONTEXT_GIB)",
    "slack": "a measurement (memory.ALLOCATOR_SLACK)",
    "startup_context_gib": "a measurement (memory.STARTUP_CONTEXT_GIB)",
}
# Each run setting's config key -> a value other than the default's, and the overrides under which that value
# changes memory (bf16: with 16-bit weights the activations are 16-bit either way; gradient accumulation: at 4096
# tokens memory=auto keeps the configured micro-batch of 4 either way, at 1024 it picks 16 and the accumulation).
VARIATIONS = {
    "trainer.vllm_gpu_memory_utilization": (0.5, []),
    "trainer.per_device_train_batch_size": (2, []),
    "trainer.gradient_accumulation_steps": (16, ["trainer.max_completion_length=1024"]),
    "trainer.steps_per_generation": (16, []),
    "reward.micro_batch_size": (8, []),
    "trainer.gradient_checkpointing": (False, []),
    "trainer.optim": ("adamw_torch", []),
    "trainer.offload_actor_in_generation": (True, []),
    "trainer.max_completion_length": (2048, []),
    "model.lora_r": (16, []),
    "model.load_in_4bit": (True, ["model.lora_r=16"]),
    "model.dtype": ("float32", []),
    "student.dtype": ("float32", []),
    "trainer.bf16": (False, ["model.dtype=float32"]),
    "trainer.vllm_enable_sleep_mode": (False, []),
    "placement.offload_reference": (False, []),
    "placement.offload_student": (False, []),
}
# Config keys the planner reads besides the run settings (into data_parallel_ranks and sharded).
PLACEMENT_VARIATIONS = {
    "placement.num_processes": (2, ["placement=dp"]),
    "placement.strategy": ("fsdp2", ["placement=dp", "placement.num_processes=2", "trainer.optim=adamw_torch"]),
}


def compose_rl(*overrides: str):
    """``run_cfg/teacher_rlt_mono`` composed by Hydra's own compose API (after the groups' dataclass defaults are in
    its ConfigStore, as ``rlt_mono.config.compose`` puts them)."""
    register_group_defaults()
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        return compose(config_name="run_cfg/teacher_rlt_mono", overrides=list(overrides))


def planned(cfg) -> Settings:
    return memory_planner.settings_from_config(cfg, total_gib=80.0, teacher=ARCH, student=ARCH, prompt_length=200)


def estimate(s: Settings) -> tuple:
    """All the planner makes of ``s``: each phase's terms, the full-length sequences of KV cache in vLLM's pool,
    what vLLM's start needs, a process's CPU memory, and the values memory=auto picks."""
    phases, kv_sequences = memory.predict(s)
    picked = {name: after for name, (_, after) in memory_planner.changes(s, memory_planner.choose(s)).items()}
    return ({name: phase.terms for name, phase in phases.items()}, kv_sequences, memory.start_bytes(s),
            memory.host_memory_terms(s), picked)


@pytest.fixture(scope="module")
def default():
    cfg = compose_rl()
    return cfg, planned(cfg)


@pytest.mark.parametrize("field", dataclasses.fields(Settings), ids=lambda field: field.name)
def test_each_settings_field_is_read_from_the_yaml_or_is_no_run_setting(default, field):
    cfg, settings = default
    key = field.metadata.get("config")
    if key is None:
        assert field.name in NOT_RUN_SETTINGS, f"Settings.{field.name}: declare it with memory.setting(<config key>)"
        assert all(field.name not in cfg[group] for group in ("model", "student", "reward", "trainer", "placement"))
        return
    assert (field.default, field.default_factory) == (dataclasses.MISSING, dataclasses.MISSING), \
        f"Settings.{field.name} has a Python default besides {key} in the YAML"
    declared = OmegaConf.select(cfg, key, throw_on_missing=True)
    assert type(declared).__name__ == field.type  # the YAML's value has the field's type
    assert getattr(settings, field.name) == declared


def test_settings_need_every_run_setting():
    with pytest.raises(TypeError, match="vllm_gpu_memory_utilization"):
        Settings(teacher=ARCH, student=ARCH, prompt_length=200, data_parallel_ranks=1, sharded=False, total_gib=80.0)


def test_a_run_setting_missing_from_the_config_is_one_user_error():
    from rlt_mono.errors import UserError

    cfg = compose_rl("~trainer.vllm_enable_sleep_mode")
    with pytest.raises(UserError, match=r"^trainer.vllm_enable_sleep_mode is not set: the memory planner reads it"):
        planned(cfg)


def test_every_run_setting_has_a_variation():
    assert set(VARIATIONS) == set(memory.CONFIG_KEYS.values())


@pytest.mark.parametrize("key", [*VARIATIONS, *PLACEMENT_VARIATIONS])
def test_the_planner_reads_each_setting_that_changes_memory(default, key):
    value, context = {**VARIATIONS, **PLACEMENT_VARIATIONS}[key]
    before = planned(compose_rl(*context))
    after = planned(compose_rl(*context, f"{key}={str(value).lower() if isinstance(value, bool) else value}"))
    assert estimate(after) != estimate(before), f"{key}={value} changes nothing the planner predicts or picks"


@pytest.mark.parametrize("name", list(memory.CONFIG_KEYS))
def test_each_run_setting_is_changed_where_it_was_read(name):
    value, context = VARIATIONS[memory.CONFIG_KEYS[name]]
    cfg = compose_rl(*context)
    before = planned(cfg)
    varied = dataclasses.replace(before, **{name: value})
    changes = memory_planner.config_changes(before, varied)
    assert changes == {memory.CONFIG_KEYS[name]: value}
    for key, new in changes.items():  # as rlt_mono.rl.build.fit_memory applies them
        OmegaConf.update(cfg, key, new)
    assert planned(cfg) == varied


def test_memory_auto_changes_its_choice_where_it_reads_it():
    cfg = compose_rl()
    before = memory_planner.settings_from_config(cfg, total_gib=24.0, free_gib=23.5, teacher=ARCH, student=ARCH,
                                                 prompt_length=200)
    result, changes = memory_planner.fit_plan(cfg.memory, before)
    chosen = result.settings
    assert chosen != before
    for key, new in changes.items():  # as rlt_mono.rl.build.fit_memory applies them
        OmegaConf.update(cfg, key, new)
    assert memory_planner.settings_from_config(cfg, total_gib=24.0, free_gib=23.5, teacher=ARCH, student=ARCH,
                                               prompt_length=200) == chosen
