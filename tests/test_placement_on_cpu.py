"""Placement logic for every mode, rollout choice and 0/1/2 visible GPUs, with faked device counts; build places
every role from the resolved table."""

import pytest
from omegaconf import OmegaConf

from rlt_mono import placement as placement_module
from rlt_mono.config import CONFIG_DIR, ConfigError, compose
from rlt_mono.placement import PlacementError, Role, resolve_placement
from rlt_mono.rl.build import build_trainer


def placed(mode, gpus, **given):
    """``resolve_placement`` with the placement group's defaults (cfgs/placement/_base.yaml) for what ``given`` leaves
    out, as a composed run passes them (the function itself has no defaults)."""
    defaults = OmegaConf.load(CONFIG_DIR / "placement" / "_base.yaml")
    chosen = {key: defaults[key] for key in ("offload_reference", "offload_student", "rollout")}
    return resolve_placement(mode, gpus, **{**chosen, "local_rank": 0, **given})


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
    placement = placed(mode, gpus)
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
        placed("student_gpu", gpus)


def test_unknown_mode_and_offload_switches():
    with pytest.raises(PlacementError, match="placement.mode must be one of"):
        placed("triple", 2)
    assert placed("mono", 1, offload_reference=False, offload_student=False).offloaded == frozenset()
    assert placed("student_gpu", 2, offload_reference=True).offloaded == frozenset({R})


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
    placement = placed("auto", gpus, rollout=choice)
    assert placement.rollout == engine
    assert placement.use_vllm == (engine == "vllm")
    label = "vLLM colocated" if engine == "vllm" else "transformers generate"
    assert f"rollout    {placement.device(Role.ROLLOUT):<8} resident ({label})" in placement.table()


@pytest.mark.parametrize("gpus, installed", [(0, True), (1, False)])
def test_vllm_rollout_without_gpu_or_package_says_what_is_missing(monkeypatch, gpus, installed):
    monkeypatch.setattr(placement_module, "_vllm_installed", lambda: installed)
    with pytest.raises(PlacementError, match=f"rollout=vllm needs a CUDA GPU and the vllm package \\(GPU in use: "
                                             f"{gpus > 0}, vllm installed: {installed}\\)"):
        placed("mono", gpus, rollout="vllm")
    with pytest.raises(PlacementError, match="placement.rollout must be auto, vllm or transformers, got 'ray'"):
        placed("mono", gpus, rollout="ray")


def test_every_placement_config_composes():
    for name in ("mono", "student_gpu", "auto", "dp", "async"):
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


# ---- placement=async: the rollout one step ahead on a vLLM server of its own ----------------------------------
def test_async_puts_the_rollout_on_the_second_gpu_and_the_rest_as_mono(monkeypatch):
    monkeypatch.setattr(placement_module, "_vllm_installed", lambda: True)
    placement = placed("async", 2)
    assert (placement.mode, placement.one_step_off, placement.use_vllm) == ("async", True, True)
    assert placement.device(Role.ROLLOUT) == "cuda:1" and placement.beside_actor(Role.ROLLOUT)
    assert all(placement.device(role) == "cuda:0" for role in (Role.ACTOR, R, S))
    assert placement.offloaded == frozenset({R, S})
    assert "rollout    cuda:1   resident (vLLM server, one step ahead)" in placement.table()
    assert placement_module.gpus_to_expose("async", 4) == 2 and placement_module.gpus_to_expose("async", 1) == 1
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert placement_module.physical_gpu("cuda:1") == "1"
    assert not placed("mono", 1).one_step_off


@pytest.mark.parametrize("gpus", [0, 1])
def test_async_without_a_second_gpu_or_without_vllm_says_what_is_missing(monkeypatch, gpus):
    monkeypatch.setattr(placement_module, "_vllm_installed", lambda: True)
    with pytest.raises(PlacementError, match=f"placement=async generates on a second GPU .*found {gpus} visible"):
        placed("async", gpus)
    monkeypatch.setattr(placement_module, "_vllm_installed", lambda: False)
    with pytest.raises(PlacementError, match=r"placement=async runs vLLM as a server on GPU 1, and the rollout here "
                                             r"is transformers \(placement.rollout=auto, vllm installed: False\)"):
        placed("async", 2)


@pytest.mark.parametrize(("override", "why"), [
    ("trainer.dynamic_sampling_rounds=1", "trainer.dynamic_sampling_rounds > 0 generates again inside a step"),
    ("trainer.offload_actor_in_generation=true", "trainer.offload_actor_in_generation frees the actor's GPU"),
    ("trainer.steps_per_generation=8", "it generates once per optimizer step: set trainer.steps_per_generation to "
                                       "trainer.gradient_accumulation_steps"),
])
def test_async_refuses_what_generates_inside_a_step_before_the_server_starts(override, why, monkeypatch, tmp_path):
    from rlt_mono.rl.build import rollout_server, trainer_and_reward_configs

    monkeypatch.setattr(placement_module, "_vllm_installed", lambda: True)
    cfg = compose("demo_tiny", ["placement=async", override])
    args, _ = trainer_and_reward_configs(cfg, tmp_path, use_vllm=True)
    assert args.gradient_accumulation_steps != 8
    with pytest.raises(ConfigError, match=f"^placement=async: {why}"):
        rollout_server(cfg, args, placed("async", 2), tmp_path / "teacher", tmp_path)


def test_async_refuses_a_second_process(monkeypatch, tmp_path):
    from rlt_mono.rl.build import rollout_server, trainer_and_reward_configs

    monkeypatch.setattr(placement_module, "_vllm_installed", lambda: True)
    cfg = compose("demo_tiny", ["placement=async"])
    args, _ = trainer_and_reward_configs(cfg, tmp_path, use_vllm=True)
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ConfigError, match=r"^placement=async: it trains in one process .* found WORLD_SIZE=2: start "
                                          r"it with launch_mono.sh, not torchrun$"):
        rollout_server(cfg, args, placed("async", 2), tmp_path / "teacher", tmp_path)


def test_async_points_trls_server_mode_at_a_server_on_the_rollouts_gpu(monkeypatch, tmp_path):
    from rlt_mono.rl.build import rollout_server, trainer_and_reward_configs

    monkeypatch.setattr(placement_module, "_vllm_installed", lambda: True)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,5")  # cuda:1 of this process is the machine's GPU 5
    cfg = compose("demo_tiny", ["placement=async", "trainer.vllm_gpu_memory_utilization=0.85"])
    args, _ = trainer_and_reward_configs(cfg, tmp_path, use_vllm=True)
    server = rollout_server(cfg, args, placed("async", 2), tmp_path / "teacher", tmp_path)
    assert server.process is None  # the trainer starts it
    assert (server.gpu, server.log_path) == ("5", tmp_path / "rollout_server.log")
    assert args.vllm_mode == "server" and args.vllm_server_base_url == server.base_url
    assert args.vllm_group_port != server.port
    command = " ".join(server.command)
    assert f"serve {tmp_path / 'teacher'} " in command and f"--port {server.port}" in command
    assert "--gpu-memory-utilization 0.85" in command and f"--dtype {cfg.model.dtype}" in command
