"""``trainer.use_liger_kernel``: what a run refuses before any model loads, and which models get liger-kernel's layer
kernels (transformers patches the policy when training starts; the trainer patches the reference and the student).
The kernels themselves are Triton GPU kernels: tests/test_gpu.py compares their log-probs with the plain layers'."""

from __future__ import annotations

import re

import pytest

from rlt_mono.rl import grpo_config
from rlt_mono.rl.grpo_config import RLTConfig


def test_a_cpu_config_is_refused(tmp_path):
    """Built directly (a notebook): RLTConfig says it, before any placement is resolved."""
    with pytest.raises(ValueError, match="^use_liger_kernel runs liger-kernel's Triton kernels, which need a GPU: set "
                                         "use_liger_kernel=false for a CPU run$"):
        RLTConfig(output_dir=str(tmp_path), max_steps=1, use_liger_kernel=True, use_cpu=True, report_to=[])


def test_without_the_package_the_config_says_how_to_install_it(tmp_path, monkeypatch):
    monkeypatch.setattr(grpo_config, "is_liger_kernel_available", lambda: False)  # whether or not it is installed here
    expected = ("use_liger_kernel=true needs the liger-kernel package: pip install -e '.[gpu]' (or pip install "
                "liger-kernel), or set use_liger_kernel=false")
    with pytest.raises(ValueError, match=f"^{re.escape(expected)}$"):
        RLTConfig(output_dir=str(tmp_path), max_steps=1, use_liger_kernel=True, report_to=[])


def test_liger_keeps_trls_log_prob_head(tmp_path, monkeypatch):
    monkeypatch.setattr(grpo_config, "is_liger_kernel_available", lambda: True)
    with pytest.raises(ValueError, match="^liger_kernel_config.fused_linear_cross_entropy=true replaces the model's "
                                         "forward"):
        RLTConfig(output_dir=str(tmp_path), max_steps=1, use_liger_kernel=True, report_to=[],
                  liger_kernel_config={"fused_linear_cross_entropy": True})
    args = RLTConfig(output_dir=str(tmp_path), max_steps=1, use_liger_kernel=True, report_to=[], bf16=False,
                     liger_kernel_config={"rope": False})
    assert args.liger_kernel_config == {"rope": False}  # TRL adds fused_linear_cross_entropy=False when it starts


def test_a_run_without_a_gpu_is_refused_before_any_model_loads(tmp_path):
    from rlt_mono import build_trainer, compose
    from rlt_mono.config import ConfigError

    # this machine has no CUDA device: the placement puts every role on the CPU, whatever trainer.use_cpu says
    with pytest.raises(ConfigError, match=r"^trainer.use_liger_kernel=true runs liger-kernel's Triton kernels on a "
                                          r"GPU, and this run has none \(no CUDA device, or trainer.use_cpu=true\)"):
        build_trainer(compose("demo_tiny", [f"output_dir={tmp_path}", "trainer.use_cpu=false",
                                            "trainer.use_liger_kernel=true"]))
    assert not (tmp_path / "config.yaml").exists()


def test_the_trainer_gives_the_reference_and_the_student_liger_kernels(tmp_path, monkeypatch):
    """The trainer's wiring, on this CPU machine: the GPU check and the package check let through, liger's function
    replaced by a recorder."""
    from transformers import PreTrainedModel

    from rlt_mono import build_trainer, compose, release_trainer
    from rlt_mono.rl import build, trainer

    monkeypatch.setattr(grpo_config, "is_liger_kernel_available", lambda: True)
    monkeypatch.setattr(build, "check_gpu_kernels", lambda cfg, on_gpu: None)
    patched = []
    monkeypatch.setattr(trainer, "apply_liger_kernel", lambda model, config: patched.append((model, config)))
    built = build_trainer(compose("demo_tiny", [f"output_dir={tmp_path}", "trainer.use_cpu=false",
                                                "trainer.use_liger_kernel=true"]))
    try:
        assert built.args.use_liger_kernel is True
        assert [model for model, _ in patched] == [built.ref_model, built.teacher_reward.student_model]
        assert built.model not in [model for model, _ in patched]  # transformers' own, at train()
        assert all(isinstance(model, PreTrainedModel) for model, _ in patched)  # what liger's patch accepts
        # TRL's GRPOTrainer set the config's fused_linear_cross_entropy to False before the trainer applied it
        assert all(config == {"fused_linear_cross_entropy": False} for _, config in patched)
    finally:
        release_trainer(built)
