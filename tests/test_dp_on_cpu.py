"""Data parallel (placement=dp): the launch plan, the per-rank placement and checkpoints of several ranks, then
real runs of CPU ranks through ``accelerate launch`` (gloo): two ranks on one machine, a resume that repeats the
uninterrupted run bit for bit, a rank's user error in one line, and two "machines" on this host."""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from rlt_mono import launch, runtime
from rlt_mono.config import ConfigError, compose
from rlt_mono.placement import PlacementError, Role, gpus_to_expose
from rlt_mono.rl.trainer import REFERENCE_FILE
from rlt_mono.runs import checkpoints
from tests.test_placement_on_cpu import placed

ROOT = Path(__file__).resolve().parent.parent
TINY_DP = ["placement=dp", "trainer.plot_metrics=false", "trainer.max_completion_length=24"]


def _plan(*overrides: str, gpus: int = 4, config: str = "teacher_rlt_mono"):
    return launch.plan_launch(compose(config, ["placement=dp", *overrides]), gpus)


# ---- the launch plan -----------------------------------------------------------------------------------------
def test_one_rank_per_gpu_by_default_and_the_accelerate_command():
    plan = _plan("placement.main_process_port=29555")
    assert (plan.processes, plan.world_size, plan.global_ranks()) == (4, 4, [0, 1, 2, 3])
    command = plan.command("teacher_rlt_mono", ["placement=dp", "output_dir=/runs/a"])
    assert command[:3] == [sys.executable, "-m", "rlt_mono.launch"]
    assert command[3:] == [
        "--config_file", str(ROOT / "cfgs" / "accelerate" / "ddp.yaml"), "--num_processes", "4",
        "--num_machines", "1", "--machine_rank", "0", "--main_process_ip", "127.0.0.1", "--main_process_port", "29555",
        "-m", "rlt_mono.cli", "teacher_rlt_mono", "placement=dp", "output_dir=/runs/a"]
    env = plan.environment("/tmp/errors")
    assert env[runtime.LAUNCHED_ENV] == "1" and env[launch.ERRORS_ENV] == "/tmp/errors"
    assert "ACCELERATE_USE_CPU" not in env


def test_two_machines_number_their_ranks_and_need_an_address_a_port_and_a_shared_folder():
    plan = _plan("placement.num_processes=2", "placement.num_machines=2", "placement.machine_rank=1",
                 "placement.main_process_ip=10.0.0.1", "placement.main_process_port=29500", "output_dir=/shared/run")
    assert (plan.world_size, plan.global_ranks()) == (4, [2, 3])
    assert plan.accelerate_args()[2:] == ["--num_processes", "4", "--num_machines", "2", "--machine_rank", "1",
                                          "--main_process_ip", "10.0.0.1", "--main_process_port", "29500"]
    table = plan.table(compose("teacher_rlt_mono", ["placement=dp", "placement.rollout=vllm"]))
    assert "4 ranks on 2 machines (this is machine 1, main process 10.0.0.1:29500)" in table
    assert "  2     0      cuda:0  resident, vLLM colocated at 0.7    CPU (pinned)  CPU (pinned)" in table
    assert "  3     1      cuda:1  " in table
    assert "completions per optimizer step: 32 per rank x 4 ranks = 128" in table
    with pytest.raises(ConfigError, match="set placement.main_process_ip, placement.main_process_port, output_dir"):
        _plan("placement.num_machines=2")


@pytest.mark.parametrize("port", [99999, 0])
def test_a_port_out_of_range_is_refused_before_any_rank_starts(port):
    with pytest.raises(ConfigError) as err:
        _plan(f"placement.main_process_port={port}")
    assert str(err.value) == (f"placement.main_process_port={port}: a TCP port, a whole number from 1 to 65535 (or "
                              "null for a free one)")


def test_split_on_one_gpu_says_to_run_mono():
    with pytest.raises(ConfigError, match=r"^placement.num_processes=2 but this machine has 1 GPU .*placement=split is "
                                          r"two ranks, so on one GPU run placement=mono"):
        launch.plan_launch(compose("teacher_rlt_mono", ["placement=split"]), 1)
    with pytest.raises(ConfigError) as three_on_two:
        _plan("placement.num_processes=3", gpus=2)
    assert "placement=split" not in str(three_on_two.value)


@pytest.mark.parametrize(("overrides", "message"), [
    (["placement.num_processes=8"], "placement.num_processes=8 but this machine has 4 GPUs"),
    (["placement.num_processes=0"], "placement.num_processes=0: must be a whole number >= 1"),
    (["placement.machine_rank=2", "placement.num_machines=2"], "placement.machine_rank=2: this machine's rank, from 0"),
    (["placement.strategy=zero9"], "placement.strategy='zero9': choose one of ddp"),
    (["placement.main_process_port=-1"], r"placement.main_process_port=-1: a TCP port, a whole number from 1 to 65535"),
])
def test_launch_mistakes_are_one_line_errors(overrides, message):
    with pytest.raises(ConfigError, match=message):
        _plan(*overrides)


def test_dp_keys_under_another_placement_are_an_error_not_ignored():
    with pytest.raises(ConfigError, match=r"^placement.strategy=fsdp2: placement=dp's \(one rank per GPU\), ignored "
                                          r"by placement=mono; add placement=dp, or leave it out$"):
        launch.check_dp_keys_unused(compose("demo_tiny", ["placement.strategy=fsdp2"]))
    with pytest.raises(ConfigError, match="placement.num_processes=2, placement.num_machines=2: .* leave them out"):
        launch.check_dp_keys_unused(compose("demo_tiny", ["placement=student_gpu", "placement.num_processes=2",
                                                          "placement.num_machines=2"]))
    with pytest.raises(ConfigError, match=r"^placement.main_process_port=29600: placement=dp's .* leave it out$"):
        launch.check_dp_keys_unused(compose("demo_tiny", ["placement.main_process_port=29600"]))
    with pytest.raises(ConfigError, match=r"^placement.machine_rank=1, placement.main_process_ip=10.0.0.1: "):
        launch.check_dp_keys_unused(compose("demo_tiny", ["placement.machine_rank=1",
                                                          "placement.main_process_ip=10.0.0.1"]))
    launch.check_dp_keys_unused(compose("demo_tiny", ["placement.strategy=ddp"]))  # the unset values pass


def test_the_training_stages_run_data_parallel_and_the_others_do_not():
    with pytest.raises(ConfigError, match="stage distill runs in one process: leave placement=dp out"):
        launch.plan_launch(compose("distill", ["size=tiny", "placement=dp"]), 2)
    sft = compose("teacher_sft", ["size=tiny", "placement=dp", "placement.num_processes=2"])
    table = launch.plan_launch(sft, 0).table(sft)  # sft.use_cpu (tiny_cpu): CPU ranks
    assert "  1     1      cpu     resident" in table and "the model trained by teacher_sft" in table
    assert "rows per optimizer step: 16 per rank x 2 ranks = 32" in table


def test_cpu_ranks_when_no_gpu_is_used():
    plan = _plan("placement.num_processes=3", gpus=0)
    assert plan.environment("/e")["ACCELERATE_USE_CPU"] == "true" and plan.processes == 3
    table = plan.table(compose("demo_tiny", ["placement=dp"]))
    assert "  2     2      cpu     resident, transformers generate" in table
    assert _plan(gpus=0).processes == 1  # unset: one rank per GPU, one on a machine without GPUs
    assert launch.plan_launch(compose("demo_tiny", ["placement=dp"]), 8).gpus == 0  # trainer.use_cpu


def test_fsdp2_loads_what_trl_loads_from_a_path_without_a_device_map(tmp_path):
    from rlt_mono.rl.build import trainer_kwargs

    # TRL's default device_map ("auto") spreads a model over every GPU a rank sees: each FSDP2 rank sees them all
    sharded = trainer_kwargs(compose("demo_tiny", ["placement=dp", "placement.strategy=fsdp2"]), tmp_path, True)
    assert sharded["model_init_kwargs"] == {"device_map": None}
    # under DDP (MULTI_GPU) TRL already loads without a device map
    assert "model_init_kwargs" not in trainer_kwargs(compose("demo_tiny", ["placement=dp"]), tmp_path, True)


@pytest.mark.parametrize(("overrides", "recorded"), [
    ([], {}),
    (["placement=dp"], {"ddp_find_unused_parameters": False}),
    (["placement=dp", "placement.strategy=fsdp2"], {"ddp_find_unused_parameters": False,
                                                    "model_init_kwargs": {"device_map": None}}),
    (["model.lora_r=4"], {"sync_ref_model": False}),
])
def test_config_yaml_records_the_trainer_settings_the_build_chose(tmp_path, overrides, recorded):
    from rlt_mono.rl.build import set_by_build, trainer_and_reward_configs
    from rlt_mono.runs.outputs import write_run_config

    cfg = compose("demo_tiny", ["size=tiny", *overrides])
    args, _ = trainer_and_reward_configs(cfg, tmp_path / "run", False)
    chosen = set_by_build(cfg, args)
    assert chosen == recorded
    write_run_config(tmp_path, cfg, {"trainer": chosen})
    written = OmegaConf.to_container(OmegaConf.load(tmp_path / "config.yaml").trainer)
    assert {key: written.get(key) for key in recorded} == recorded
    assert written["learning_rate"] == cfg.trainer.learning_rate  # the config's own keys as they were


def test_fsdp2_shards_the_teacher_on_gpu_ranks_through_its_accelerate_config():
    from accelerate.commands.config.config_args import load_config_from_file

    plan = _plan("placement.strategy=fsdp2", "placement.num_processes=2", "trainer.optim=adamw_torch")
    config_file = plan.accelerate_args()[1]
    assert config_file == str(ROOT / "cfgs" / "accelerate" / "fsdp2.yaml")
    accelerate_config = load_config_from_file(config_file)  # what accelerate launch reads
    assert accelerate_config.distributed_type == "FSDP" and accelerate_config.fsdp_config["fsdp_version"] == 2
    assert accelerate_config.fsdp_config["fsdp_state_dict_type"] == "FULL_STATE_DICT"
    table = plan.table(compose("teacher_rlt_mono", ["placement=dp", "placement.strategy=fsdp2",
                                                    "placement.rollout=vllm"]))
    assert "strategy fsdp2: the teacher and its reference sharded over the ranks (FSDP2)" in table
    assert "  1     1      cuda:1  1/2 sharded, vLLM colocated at 0.7 1/2 sharded   CPU (pinned)" in table
    with pytest.raises(ConfigError, match="trainer.optim=adamw_bnb_8bit with placement.strategy=fsdp2: bitsandbytes"):
        _plan("placement.strategy=fsdp2", "trainer.optim=adamw_bnb_8bit")  # found on an H100
    with pytest.raises(ConfigError, match="which accelerate runs on GPUs only .*use placement.strategy=ddp"):
        _plan("placement.strategy=fsdp2", gpus=0)
    with pytest.raises(ConfigError, match="model.lora_r=16 with placement.strategy=fsdp2: a LoRA teacher .*=ddp"):
        _plan("placement.strategy=fsdp2", "model.lora_r=16")


# ---- where a rank's roles live ---------------------------------------------------------------------------------
def test_a_rank_places_every_role_on_its_own_gpu():
    placement = placed("dp", 4, local_rank=2)
    assert placement.mode == "dp" and {placement.device(role) for role in Role} == {"cuda:2"}
    assert placement.offloaded == frozenset({Role.REFERENCE, Role.STUDENT})
    with pytest.raises(PlacementError, match="local rank 4 has no GPU of its own"):
        placed("dp", 4, local_rank=4)
    assert placed("dp", 0, local_rank=1).device(Role.ACTOR) == "cpu"
    assert (gpus_to_expose("dp", 8), gpus_to_expose("dp", 8, 2), gpus_to_expose("dp", 1, 2)) == (8, 2, 1)


# ---- checkpoints of several ranks --------------------------------------------------------------------------------
def _checkpoint(folder: Path, ranks: int) -> Path:
    folder.mkdir(parents=True)
    for name in (*checkpoints.TRAINING_STATE_FILES, *checkpoints.rng_files(ranks), "model.safetensors"):
        (folder / name).write_text(json.dumps({"global_step": 2}) if name == checkpoints.TRAINER_STATE else "x")
    return folder


def test_a_checkpoint_resumes_only_with_the_ranks_that_saved_it(tmp_path):
    two = _checkpoint(tmp_path / "checkpoint-2", 2)
    assert checkpoints.saved_world_size(two) == 2
    assert checkpoints.resolve_resume(tmp_path, str(two), max_steps=4, world_size=2) == str(two)
    with pytest.raises(checkpoints.CheckpointError, match="saved by 2 ranks and this run has 1: resume it with "
                                                          "placement=dp and as many ranks"):
        checkpoints.resolve_resume(tmp_path, str(two), max_steps=4)
    one = _checkpoint(tmp_path / "one" / "checkpoint-2", 1)
    with pytest.raises(checkpoints.CheckpointError, match="saved by 1 rank and this run has 2: resume it with "
                                                          "placement=mono"):
        checkpoints.resolve_resume(tmp_path, str(one), max_steps=4, world_size=2)
    (two / "rng_state_1.pth").unlink()  # one rank's RNG file lost: another world size, refused as such
    assert checkpoints.saved_world_size(two) == 1


def test_an_fsdp_checkpoint_keeps_its_optimizer_as_optimizer_bin(tmp_path):
    folder = _checkpoint(tmp_path / "checkpoint-2", 2)
    (folder / "optimizer.pt").rename(folder / checkpoints.FSDP_OPTIMIZER)  # accelerate's save_fsdp_optimizer
    with pytest.raises(checkpoints.CheckpointError, match="pytorch_model_fsdp.bin missing"):
        checkpoints.resolve_resume(tmp_path, str(folder), max_steps=4, world_size=2)
    (folder / checkpoints.FSDP_MODEL).write_text("x")  # the model copy an FSDP resume loads
    assert checkpoints.resolve_resume(tmp_path, str(folder), max_steps=4, world_size=2) == str(folder)
    (folder / checkpoints.FSDP_OPTIMIZER).unlink()
    with pytest.raises(checkpoints.CheckpointError, match="optimizer.pt missing"):
        checkpoints.resolve_resume(tmp_path, str(folder), max_steps=4, world_size=2)


def test_a_gathered_reference_with_tied_weights_is_written_whole(tmp_path):
    """An FSDP reference is gathered into one state dict, where a tied embedding and LM head are one tensor under
    two names: safetensors refuses that as is; ``unshared`` copies the second name, every value kept."""
    import safetensors.torch
    import torch

    from rlt_mono.rl.trainer import unshared

    embedding = torch.arange(6.0).reshape(2, 3)
    state = {"model.embed_tokens.weight": embedding, "lm_head.weight": embedding, "model.norm.weight": torch.ones(3)}
    with pytest.raises(RuntimeError, match="share memory"):
        safetensors.torch.save_file(state, tmp_path / "as_is.safetensors")
    written = unshared(state)
    assert written["model.embed_tokens.weight"] is embedding and written["lm_head.weight"] is not embedding
    safetensors.torch.save_file(written, tmp_path / "reference.safetensors")
    loaded = safetensors.torch.load_file(tmp_path / "reference.safetensors")
    assert all(torch.equal(loaded[name], state[name]) for name in state)


# ---- real CPU ranks --------------------------------------------------------------------------------------------
def _launch(*overrides: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([str(ROOT / "launch_mono.sh"), "demo_tiny", *TINY_DP, *overrides], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout, check=False)


def _rows(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("dp") / "run"
    done = _launch("placement.num_processes=2", "trainer.max_steps=4", "trainer.save_steps=2",
                   "trainer.ref_model_sync_steps=3", f"output_dir={out}")
    assert done.returncode == 0, done.stderr[-3000:]
    return out


def test_two_ranks_write_one_row_per_step_one_model_and_an_rng_file_each(two_ranks):
    rows = _rows(two_ranks)
    assert [(r["event"], r["step"]) for r in rows] == [("step", 1), ("step", 2), ("step", 3), ("step", 4),
                                                        ("summary", 4)]
    for row in (r for r in rows if r["event"] == "step"):  # rank 0's phases, and the spread over both ranks
        assert row["dp/ranks"] == 2
        for phase in ("generate", "score", "train"):
            assert 0 < row[f"dp/{phase}/seconds_min"] <= row[f"dp/{phase}/seconds_max"]
            assert row[f"dp/{phase}/seconds_min"] <= row[f"phase/{phase}/seconds"] <= row[f"dp/{phase}/seconds_max"]
    config = (two_ranks / "config.yaml").read_text()
    assert "mode: dp" in config and "num_processes: 2" in config
    # the setting the build chose for dp, recorded as used
    assert OmegaConf.load(two_ranks / "config.yaml").trainer.ddp_find_unused_parameters is False
    for step in (2, 4):
        files = {p.name for p in (two_ranks / f"checkpoint-{step}").iterdir()}
        assert {"model.safetensors", "optimizer.pt", "rng_state_0.pth", "rng_state_1.pth"} <= files
        assert "rng_state.pth" not in files
        assert checkpoints.checkpoint_problem(two_ranks / f"checkpoint-{step}") is None
    # The reference is mixed at step 3: saved once, in the checkpoint after it.
    assert not (two_ranks / "checkpoint-2" / REFERENCE_FILE).exists()
    assert (two_ranks / "checkpoint-4" / REFERENCE_FILE).is_file()
    # in a folder of its own: vLLM reads every top-level *.safetensors of a folder as one model
    assert sorted(p.name for p in (two_ranks / "checkpoint-4").glob("*.safetensors")) == ["model.safetensors"]
    assert (two_ranks / "final" / "model.safetensors").is_file()
    assert not [p.name for p in two_ranks.iterdir() if p.name.startswith(".partial-")]


def test_a_resumed_two_rank_run_repeats_the_uninterrupted_one_bit_for_bit(two_ranks, tmp_path):
    out = tmp_path / "resumed"
    shutil.copytree(two_ranks, out)
    for name in ("checkpoint-4", "final"):
        shutil.rmtree(out / name)
    done = _launch("placement.num_processes=2", "trainer.max_steps=4", "trainer.save_steps=2",
                   "trainer.ref_model_sync_steps=3", f"output_dir={out}", "resume_from_checkpoint=true")
    assert done.returncode == 0, done.stderr[-3000:]
    steps = [r for r in _rows(out) if r["event"] == "step"]
    assert [r["step"] for r in steps] == [1, 2, 3, 4]
    assert [r["reward"] for r in steps] == [r["reward"] for r in _rows(two_ranks) if r["event"] == "step"]
    one = _launch("trainer.max_steps=4", f"output_dir={out}", "resume_from_checkpoint=true", "placement=mono")
    assert one.returncode == 2 and one.stderr.strip().splitlines()[-1].startswith("error: ")
    assert "was saved by 2 ranks and this run has 1" in one.stderr


def test_a_rank_that_stops_on_a_user_error_ends_the_run_in_one_line(tmp_path):
    done = _launch("placement.num_processes=2", "trainer.max_completion_length=100000", f"output_dir={tmp_path / 'x'}")
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert lines[-1] == ("error: trainer.max_completion_length=100000 leaves no room for a prompt in a 2048-token "
                         "context (the teacher's max_position_embeddings): lower it, or raise it (rank 0)")
    assert "Traceback" not in done.stderr and "ChildFailedError" not in done.stderr
    assert sum(line.startswith("error:") for line in lines) == 1  # said once, by the launcher


def test_two_machines_on_one_host_train_one_run(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = tmp_path / "shared"
    common = ["placement.num_processes=1", "placement.num_machines=2", "placement.main_process_ip=127.0.0.1",
              f"placement.main_process_port={port}", "trainer.max_steps=2", "trainer.save_steps=2", f"output_dir={out}"]
    second = subprocess.Popen([str(ROOT / "launch_mono.sh"), "demo_tiny", *TINY_DP, *common,
                               "placement.machine_rank=1"], cwd=ROOT, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True, env=os.environ.copy())
    first = _launch(*common, "placement.machine_rank=0")
    _, second_err = second.communicate(timeout=600)
    assert first.returncode == 0, first.stderr[-3000:]
    assert second.returncode == 0, second_err[-3000:]
    assert "2 ranks on 2 machines (this is machine 1" in second_err
    assert [r["step"] for r in _rows(out) if r["event"] == "step"] == [1, 2]
    assert {"rng_state_0.pth", "rng_state_1.pth"} <= {p.name for p in (out / "checkpoint-2").iterdir()}


def test_ctrl_c_stops_every_rank_and_says_where_to_resume(tmp_path):
    out = tmp_path / "stopped"
    run = subprocess.Popen([str(ROOT / "launch_mono.sh"), "demo_tiny", *TINY_DP, "placement.num_processes=2",
                            "trainer.max_steps=200", "trainer.save_steps=1", f"output_dir={out}"], cwd=ROOT,
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.monotonic() + 300
    while not (out / "checkpoint-1").is_dir() and run.poll() is None and time.monotonic() < deadline:
        time.sleep(0.5)
    os.killpg(run.pid, signal.SIGINT)  # what Ctrl-C in the terminal does: the launcher and every rank get it
    _, stderr = run.communicate(timeout=120)
    assert run.returncode == 130, stderr[-3000:]
    last = stderr.strip().splitlines()[-1]
    assert last.startswith("error: interrupted at step ") and f"output_dir={out} resume_from_checkpoint=true" in last
    assert "Traceback" not in stderr and "SignalException" not in stderr


def test_sft_on_two_ranks_writes_one_run(tmp_path):
    out = tmp_path / "sft"
    done = subprocess.run([str(ROOT / "launch_mono.sh"), "teacher_sft", "size=tiny", "placement=dp",
                           "placement.num_processes=2", "sft.max_steps=4", "sft.save_steps=2", f"output_dir={out}"],
                          cwd=ROOT, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert [r["step"] for r in _rows(out) if r["event"] == "step"] == [1, 2, 3, 4]
    summary = json.loads((out / "sft_summary.json").read_text())
    assert summary["steps"] == 4 and summary["heldout_loss_after"] is not None
    assert {"rng_state_0.pth", "rng_state_1.pth", "optimizer.pt"} <= {p.name for p in (out / "checkpoint-4").iterdir()}
    assert (out / "final" / "model.safetensors").is_file()


def test_gpu_ranks_holding_more_cpu_memory_than_the_machine_has_stop_before_starting(caplog):
    # 4 GPU ranks of the tiny pair (141,568 float32 parameters each): each pins its reference and its student.
    cfg = compose("teacher_rlt_mono", ["placement=dp", "model=tiny", "student=tiny", "memory=manual"])
    plan = launch.plan_launch(cfg, 4)
    per_rank = 2 * 141_568 * 4
    line = launch.check_host_memory(cfg, plan, available=4 * per_rank)
    assert line.startswith("CPU memory: 4 ranks x 0.00 GiB (reference 0.00, student 0.00) = 0.00 GiB; 0.00 GiB "
                           "available")
    with pytest.raises(ConfigError, match=r"CPU memory: 4 ranks .* the ranks would run out of CPU memory while "
                                          r"loading; use fewer ranks \(placement.num_processes\)"):
        launch.check_host_memory(cfg, plan, available=4 * per_rank - 1)
    # the teacher set aside in generation is held too (weights, gradients, two float32 Adam states: 4 copies)
    aside = compose("teacher_rlt_mono", ["placement=dp", "model=tiny", "student=tiny", "memory=manual",
                                         "trainer.offload_actor_in_generation=true", "trainer.optim=adamw_torch"])
    with pytest.raises(ConfigError, match="trainer.offload_actor_in_generation=false"):
        launch.check_host_memory(aside, plan, available=4 * per_rank * 3 - 1)
    assert launch.check_host_memory(aside, plan, available=4 * per_rank * 3)
    # memory=auto may set the teacher aside in each rank: the line says so, and a warning when that would not fit
    auto = compose("teacher_rlt_mono", ["placement=dp", "model=tiny", "student=tiny", "memory=auto",
                                        "trainer.optim=adamw_torch"])
    with caplog.at_level("WARNING", logger="rlt_mono.launch"):
        assert "GiB if memory=auto sets the teacher aside" in launch.check_host_memory(auto, plan, 4 * per_rank)
    assert "the ranks run out of CPU memory" in caplog.text
    # SFT and CPU ranks hold nothing on the CPU for the run
    assert launch.check_host_memory(cfg, launch.plan_launch(cfg, 0), available=0) == ""


def test_auto_on_two_gpus_launches_split_as_data_parallel_over_two(monkeypatch):
    from rlt_mono import cli

    launched = {}

    def fake_launch(cfg, config, overrides, gpus):
        launched.update(mode=cfg.placement.mode, processes=cfg.placement.num_processes, overrides=overrides)
        return 0

    monkeypatch.setattr(launch, "launch", fake_launch)
    monkeypatch.setattr(runtime, "gpus_present", lambda: 2)
    # logging=local, no liger-kernel: the GPU config's W&B logging and liger-kernel's layers need packages a CPU
    # machine may lack
    assert cli.main(["teacher_rlt_mono", "placement=auto", "trainer.max_steps=3", "logging=local",
                     "trainer.use_liger_kernel=false"]) == 0
    assert launched == {"mode": "dp", "processes": 2, "overrides": [
        "trainer.max_steps=3", "logging=local", "trainer.use_liger_kernel=false", "placement=split"]}
    # one GPU, the CPU, or a stage other than RL: auto stays in one process (mono)
    for gpus, overrides in ((1, []), (2, ["+trainer.use_cpu=true"])):
        monkeypatch.setattr(runtime, "gpus_present", lambda gpus=gpus: gpus)
        assert not cli.auto_picks_split(compose("teacher_rlt_mono", ["placement=auto", *overrides]))
    monkeypatch.setattr(runtime, "gpus_present", lambda: 2)
    assert not cli.auto_picks_split(compose("distill", ["size=tiny", "placement=auto"]))
