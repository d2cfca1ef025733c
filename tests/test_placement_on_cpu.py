"""Placement logic for every mode, rollout choice and 0/1/2 visible GPUs, with faked device counts; build places
every role from the resolved table."""

import pytest

from rlt_mono import placement as placement_module
from rlt_mono.config import ConfigError, compose
from rlt_mono.placement import PlacementError, Role, resolve_placement
from rlt_mono.rl.build import build_trainer

R, S = Role.REFERENCE, Role.STUDENT


@pytest.mark.parametrize(
    "mode, gpus, resolved, student_device, offloaded",
    [
        ("mono", 0, "mono", "cpu", set()),
        ("mono", 1, "mono", "cuda:0", {R, S}),
        ("mono", 2, "mono", "cuda:0", {R, S}),
        ("auto", 0, "mono", "cpu", set()),
        ("auto", 1, "mono", "cuda:0", {R, S}),
        ("auto", 2, "mono", "cuda:0", {R, S}),  # in one process; the launcher makes auto on two GPUs split (dp)
        ("student_gpu", 2, "student_gpu", "cuda:1", {R}),
    ],
)
def test_modes_by_gpu_count(mode, gpus, resolved, student_device, offloaded):
    placement = resolve_placement(mode, gpus)
    assert placement.mode == resolved
    assert placement.device(S) == student_device
    assert placement.beside_actor(S) == (student_device == "cuda:1")
    expected_actor = "cpu" if gpus == 0 else "cuda:0"
    for role in (Role.ACTOR, Role.ROLLOUT, Role.REFERENCE):
        assert placement.device(role) == expected_actor
        assert not placement.beside_actor(role)
    assert placement.offloaded == frozenset(offloaded)
    assert all(placement.offloads(role) == (role in offloaded) for role in Role)
    assert f"placement: {resolved}" in placement.table()
    assert f"  student    {student_device:<8}" in placement.table()


@pytest.mark.parametrize("gpus", [0, 1])
def test_student_gpu_without_a_second_gpu_says_what_is_missing(gpus):
    with pytest.raises(PlacementError, match=f"placement=student_gpu needs 2 visible GPUs .*found {gpus}"):
        resolve_placement("student_gpu", gpus)


def test_unknown_mode_and_offload_switches():
    with pytest.raises(PlacementError, match="placement.mode must be one of"):
        resolve_placement("triple", 2)
    assert resolve_placement("mono", 1, offload_reference=False, offload_student=False).offloaded == frozenset()
    assert resolve_placement("student_gpu", 2, offload_reference=True).offloaded == frozenset({R})


@pytest.mark.parametrize(
    "choice, gpus, installed, engine",
    [
        ("auto", 0, True, "transformers"),
        ("auto", 1, False, "transformers"),
        ("auto", 1, True, "vllm"),
        ("vllm", 2, True, "vllm"),
        ("transformers", 1, True, "transformers"),
    ],
)
def test_rollout_engine_is_part_of_the_placement(monkeypatch, choice, gpus, installed, engine):
    monkeypatch.setattr(placement_module, "_vllm_installed", lambda: installed)
    placement = resolve_placement("auto", gpus, rollout=choice)
    assert placement.rollout == engine
    assert placement.use_vllm == (engine == "vllm")
    label = "vLLM colocated" if engine == "vllm" else "transformers generate"
    assert f"rollout    {placement.device(Role.ROLLOUT):<8} resident ({label})" in placement.table()


@pytest.mark.parametrize("gpus, installed", [(0, True), (1, False)])
def test_vllm_rollout_without_gpu_or_package_says_what_is_missing(monkeypatch, gpus, installed):
    monkeypatch.setattr(placement_module, "_vllm_installed", lambda: installed)
    with pytest.raises(PlacementError, match=f"rollout=vllm needs a CUDA GPU and the vllm package \\(GPU in use: "
                                             f"{gpus > 0}, vllm installed: {installed}\\)"):
        resolve_placement("mono", gpus, rollout="vllm")
    with pytest.raises(PlacementError, match="placement.rollout must be auto, vllm or transformers, got 'ray'"):
        resolve_placement("mono", gpus, rollout="ray")


def test_every_placement_config_composes():
    for name in ("mono", "student_gpu", "auto", "dp"):
        assert compose("demo_tiny", [f"placement={name}"]).placement.mode == name
    split = compose("demo_tiny", ["placement=split"]).placement  # data parallel over two GPUs
    assert (split.mode, split.num_processes) == ("dp", 2)


def test_student_gpu_is_rejected_before_any_model_loads(monkeypatch):
    import transformers

    def no_loading(*args, **kwargs):
        raise AssertionError("a model was loaded before the placement was validated")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", no_loading)
    with pytest.raises(ConfigError, match="placement=student_gpu needs 2 visible GPUs"):
        build_trainer(compose("demo_tiny", ["placement=student_gpu"]))
    with pytest.raises(ConfigError, match="placement.rollout=vllm needs a CUDA GPU"):
        build_trainer(compose("demo_tiny", ["placement.rollout=vllm"]))


def test_build_places_every_role_from_the_table(monkeypatch, tmp_path, one_thread):
    """The trainer's reference and student sit where the (faked) table puts them, and the trainer runs the
    student beside the actor only when the table gives it a device of its own."""
    import rlt_mono.rl.build as build
    from rlt_mono.placement import Placement

    placed = {}
    faked = Placement("student_gpu",
                      {Role.ACTOR: "cpu", Role.ROLLOUT: "cpu", Role.REFERENCE: "cpu", Role.STUDENT: "meta"},
                      frozenset({R}), "transformers")
    monkeypatch.setattr(build, "resolve_placement_for", lambda *args, **kwargs: faked)
    monkeypatch.setattr(build.ModelSwapper, "place",
                        lambda self, model, name, offload, device=None: placed.update({name: (offload, device)}))
    trainer = build_trainer(compose("demo_tiny", [f"output_dir={tmp_path}"]))
    assert placed == {"student": (False, "meta"), "reference": (True, "cpu")}
    assert trainer._student_pool is not None  # the student has a device of its own: it scores on a worker thread
    trainer.release()
