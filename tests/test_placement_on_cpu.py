"""Placement logic for every mode and 0/1/2 visible GPUs, with faked device counts."""

import pytest

from rlt_mono.build import build_trainer
from rlt_mono.config import ConfigError, compose
from rlt_mono.placement import PlacementError, Role, resolve_placement

R, C = Role.REFERENCE, Role.CRITIC


@pytest.mark.parametrize(
    "mode, gpus, resolved, critic_device, offloaded",
    [
        ("mono", 0, "mono", "cpu", set()),
        ("mono", 1, "mono", "cuda:0", {R, C}),
        ("mono", 2, "mono", "cuda:0", {R, C}),
        ("auto", 0, "mono", "cpu", set()),
        ("auto", 1, "mono", "cuda:0", {R, C}),
        ("auto", 2, "split", "cuda:1", {R}),
        ("split", 2, "split", "cuda:1", {R}),
    ],
)
def test_modes_by_gpu_count(mode, gpus, resolved, critic_device, offloaded):
    placement = resolve_placement(mode, gpus)
    assert placement.mode == resolved
    assert placement.device(C) == critic_device
    expected_actor = "cpu" if gpus == 0 else "cuda:0"
    for role in (Role.ACTOR, Role.ROLLOUT, Role.REFERENCE):
        assert placement.device(role) == expected_actor
    assert placement.offloaded == frozenset(offloaded)
    assert f"placement: {resolved}" in placement.table()


@pytest.mark.parametrize("gpus", [0, 1])
def test_split_without_a_second_gpu_says_what_is_missing(gpus):
    with pytest.raises(PlacementError, match=f"placement=split needs 2 visible GPUs .*found {gpus}"):
        resolve_placement("split", gpus)


def test_unknown_mode_and_offload_switches():
    with pytest.raises(PlacementError, match="placement.mode must be one of"):
        resolve_placement("triple", 2)
    assert resolve_placement("mono", 1, offload_reference=False, offload_critic=False).offloaded == frozenset()
    assert resolve_placement("split", 2, offload_reference=True).offloaded == frozenset({R})


def test_every_placement_config_composes():
    for name in ("mono", "split", "auto"):
        assert compose("demo_tiny", [f"placement={name}"]).placement.mode == name


def test_split_is_rejected_before_any_model_loads(monkeypatch):
    import transformers

    def no_loading(*args, **kwargs):
        raise AssertionError("a model was loaded before the placement was validated")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", no_loading)
    with pytest.raises(ConfigError, match="placement=split needs 2 visible GPUs"):
        build_trainer(compose("demo_tiny", ["placement=split"]))
