"""The memory plan is applied in one place, visibly: ``rlt_mono.rl.build.fit_memory`` writes the planner's changes
into the run's config, each logged as ``key: before -> after``, and the run's ``config.yaml`` and its trainer's
arguments are what the plan set (the planner itself: tests/test_memory_on_cpu.py)."""

import logging
from types import SimpleNamespace

from omegaconf import OmegaConf

from rlt_mono import compose, release_trainer
from rlt_mono.memory.model import GIB
from rlt_mono.placement import Role
from rlt_mono.rl import build

# What memory=auto might set on a card too small for the run as configured: half the micro-batch, twice the
# accumulation (the same optimizer step).
PLANNED = {"trainer.per_device_train_batch_size": 4, "trainer.gradient_accumulation_steps": 4}


class OneGpu:
    """A placement with every role on cuda:0 (fit_memory reads only these)."""

    mode = "mono"
    one_step_off = False

    def device(self, role: Role) -> str:
        return "cuda:0"

    def beside_actor(self, role: Role) -> bool:
        return False


def test_fit_memory_applies_the_plan_to_the_config_and_logs_each_change(monkeypatch, caplog):
    cfg = compose("demo_tiny", ["memory=auto"])
    monkeypatch.setattr(build.device_memory, "read_capacity", lambda device: SimpleNamespace(total=80 * GIB,
                                                                                            usable=70 * GIB))
    monkeypatch.setattr(build.memory_planner, "settings_from_config", lambda cfg, **kwargs: "settings")
    seen = []
    monkeypatch.setattr(build.memory_planner, "fit_plan",
                        lambda mode, settings: seen.append((mode, settings)) or ("plan", dict(PLANNED)))
    with caplog.at_level(logging.INFO, logger=build.__name__):
        changed = build.fit_memory(cfg, OneGpu(), teacher_config=_Config(), student_config=_Config(),
                                   prompt_length=100)
    assert changed and seen == [("auto", "settings")]
    assert (cfg.trainer.per_device_train_batch_size, cfg.trainer.gradient_accumulation_steps) == (4, 4)
    assert ("memory=auto set trainer.per_device_train_batch_size: 8 -> 4, trainer.gradient_accumulation_steps: "
            "2 -> 4") in caplog.messages


def test_fit_memory_on_the_cpu_changes_nothing(monkeypatch):
    monkeypatch.setattr(build.memory_planner, "fit_plan", lambda *args: (_ for _ in ()).throw(AssertionError))
    cfg = compose("demo_tiny", ["memory=auto"])
    before = OmegaConf.to_container(cfg)
    cpu = OneGpu()
    cpu.device = lambda role: "cpu"
    assert build.fit_memory(cfg, cpu, _Config(), _Config(), prompt_length=100) is False
    assert OmegaConf.to_container(cfg) == before


def test_the_planned_settings_reach_the_trainer_and_the_runs_config_yaml(tmp_path, monkeypatch):
    def plan_on_a_small_card(cfg, *args):
        for key, value in PLANNED.items():
            OmegaConf.update(cfg, key, value)
        return True

    monkeypatch.setattr(build, "fit_memory", plan_on_a_small_card)
    trainer = build.build_trainer(compose("demo_tiny", [f"output_dir={tmp_path / 'run'}", "trainer.max_steps=1"]))
    try:
        assert (trainer.args.per_device_train_batch_size, trainer.args.gradient_accumulation_steps) == (4, 4)
        saved = OmegaConf.load(next((tmp_path / "run").rglob("config.yaml")))
        assert (saved.trainer.per_device_train_batch_size, saved.trainer.gradient_accumulation_steps) == (4, 4)
    finally:
        release_trainer(trainer)


class _Config:
    """A model config as fit_memory reads it (Arch.from_config of its dict)."""

    def to_dict(self) -> dict:
        return {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
                "num_key_value_heads": 2, "vocab_size": 512, "tie_word_embeddings": True}


def test_data_parallel_turns_the_unused_parameter_search_off_and_says_so(tmp_path, caplog):
    """transformers searches every parameter for an unused one each step unless told not to; rlt_mono tells it
    (a causal LM has none), visibly, and keeps a value the user set."""
    with caplog.at_level(logging.INFO, logger=build.__name__):
        chosen = build.trainer_kwargs(compose("demo_tiny", ["placement=dp"]), tmp_path, use_vllm=False)
    assert chosen["ddp_find_unused_parameters"] is False
    assert any("trainer.ddp_find_unused_parameters=false" in message for message in caplog.messages)
    kept = build.trainer_kwargs(compose("demo_tiny", ["placement=dp", "+trainer.ddp_find_unused_parameters=true"]),
                                tmp_path, use_vllm=False)
    assert kept["ddp_find_unused_parameters"] is True
    assert "ddp_find_unused_parameters" not in build.trainer_kwargs(compose("demo_tiny"), tmp_path, use_vllm=False)
