"""Data-parallel launch (``placement=dp``): one process (rank) per GPU, started by ``accelerate launch``.

``launch_mono.sh <run config> placement=dp ...`` composes the config as for any run; ``rlt_mono.cli`` then
sees ``placement.mode: dp`` and, instead of running the stage itself, hands the same command to accelerate:

    accelerate launch --config_file cfgs/accelerate/<strategy>.yaml --num_processes <N x machines>
        --num_machines M --machine_rank R --main_process_ip IP --main_process_port P
        -m rlt_mono.cli <run config> <overrides> output_dir=<the run's folder>

Every rank of the RL stage (``teacher_rlt``) runs a ``mono`` step on its own GPU (``rlt_mono.placement``):
TRL's ``GRPOTrainer`` splits each step's prompts over the ranks, each rank generates with its own colocated
vLLM engine and scores with its own offloaded reference and student, and the teacher's gradients are reduced
across ranks (``ddp``: the teacher replicated, ``cfgs/accelerate/ddp.yaml``; ``fsdp2``: the teacher, its
gradients and optimizer state and TRL's reference sharded over the ranks, ``cfgs/accelerate/fsdp2.yaml``, for a
teacher whose replicated training state does not fit one GPU; GPUs only). Metrics rows,
samples, checkpoints (one copy of the model, optimizer and reference; one RNG file per rank) and ``final/`` are
written once, by rank 0 (``rlt_mono.runs.checkpoints``). The SFT stages (``teacher_sft``, ``student_sft``) run the
same way with transformers' own data parallelism: each rank trains on its share of the rows.

What this module does before any rank starts, from the composed config and the GPUs present: the
``LaunchPlan`` (how many ranks, where they meet, the accelerate command), the per-rank placement table logged
at start, the run's folder (made here once, so every rank writes into the same one), and the models' local
folders (the embedded pair built, a GGUF checkpoint dequantized, once rather than by every rank). Everything a user can
get wrong (too many processes for the GPUs, a machine rank out of range, a multi-node run without an address or
a shared ``output_dir``, a stage that does not train) is a one-line ``ConfigError`` before accelerate
starts. A rank that stops on such an error (or on Ctrl-C) writes its exit code and line to
``$RLT_MONO_RANK_ERRORS/rank-<R>.txt``; the launcher prints the first one and exits with its code (2, or 130 for
an interrupt), as a one-process run would, instead of torchrun's report.

Multi-node: run the same command on every machine with ``placement.num_machines``, ``placement.machine_rank``
(0 on the machine whose address is ``placement.main_process_ip``), the same ``placement.main_process_port`` and
an ``output_dir`` on a filesystem every machine shares.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig

from rlt_mono import runtime
from rlt_mono.config import CONFIG_DIR, ConfigError
from rlt_mono.data.models import load_config, model_path
from rlt_mono.errors import UserError
from rlt_mono.memory import model as memory
from rlt_mono.memory import planner as memory_planner
from rlt_mono.placement import PlacementError, check_main_process_port, check_strategy
from rlt_mono.runs import atomic_write
from rlt_mono.runs.checkpoints import resolve_output_dir
from rlt_mono.stages import STAGES

logger = logging.getLogger(__name__)

# Folder where a rank that stops on a user error writes that error, one line (rank-<global rank>.txt).
ERRORS_ENV = "RLT_MONO_RANK_ERRORS"
ACCELERATE_CONFIGS = CONFIG_DIR / "accelerate"
STRATEGIES = {
    "ddp": "the teacher replicated on every rank (DistributedDataParallel)",
    "fsdp2": "the teacher and its reference sharded over the ranks (FSDP2)",
}
# Stages a data-parallel launch runs (their Stage.data_parallel): the RL stage, and the SFT stages (transformers'
# own DDP: each rank a shard of the rows, gradients all-reduced; no vLLM, reference or student).
DP_STAGES = tuple(name for name, stage in STAGES.items() if stage.data_parallel)


@dataclass(frozen=True)
class LaunchPlan:
    """How a ``placement=dp`` run starts on this machine.

    Attributes:
        processes: ranks on this machine (one per GPU).
        num_machines / machine_rank: machines in the run, and which one this is (0 hosts the main process).
        main_process_ip / main_process_port: where every rank meets (torch.distributed's rendezvous).
        strategy: the accelerate config ``cfgs/accelerate/<strategy>.yaml`` (``STRATEGIES``).
        gpus: GPUs visible on this machine; 0 runs CPU ranks (gloo), as the tests do.
    """

    processes: int
    num_machines: int
    machine_rank: int
    main_process_ip: str
    main_process_port: int
    strategy: str
    gpus: int

    @property
    def world_size(self) -> int:
        return self.processes * self.num_machines

    def global_ranks(self) -> list[int]:
        """The global ranks of this machine's processes, in local-rank order."""
        first = self.machine_rank * self.processes
        return list(range(first, first + self.processes))

    def accelerate_args(self) -> list[str]:
        """``accelerate launch``'s options (everything before the script)."""
        return [
            "--config_file", str(ACCELERATE_CONFIGS / f"{self.strategy}.yaml"),
            "--num_processes", str(self.world_size),
            "--num_machines", str(self.num_machines),
            "--machine_rank", str(self.machine_rank),
            "--main_process_ip", self.main_process_ip,
            "--main_process_port", str(self.main_process_port),
        ]

    def command(self, config: str, overrides: list[str]) -> list[str]:
        """The whole command: accelerate's launcher (through ``main`` below) running ``rlt_mono.cli`` with the
        run's config and overrides."""
        return [sys.executable, "-m", "rlt_mono.launch", *self.accelerate_args(),
                "-m", "rlt_mono.cli", config, *overrides]

    def environment(self, errors_dir: str | Path) -> dict[str, str]:
        """What the ranks' environment adds to this process's."""
        env = {runtime.LAUNCHED_ENV: "1", ERRORS_ENV: str(errors_dir)}
        if self.gpus == 0:
            env["ACCELERATE_USE_CPU"] = "true"  # CPU ranks: accelerate picks gloo
        else:
            env["CUDA_VISIBLE_DEVICES"] = os.environ.get("CUDA_VISIBLE_DEVICES",
                                                         ",".join(str(i) for i in range(self.processes)))
        return env

    def table(self, cfg: DictConfig) -> str:
        """The per-rank placement logged before the ranks start."""
        stage = STAGES[cfg.stage]
        trainer = cfg[stage.trainer_group]
        per_rank = trainer.per_device_train_batch_size * trainer.gradient_accumulation_steps
        rollouts = stage.trains_on_rollouts
        vllm = cfg.placement.rollout == "vllm" or (cfg.placement.rollout == "auto" and self.gpus > 0
                                                     and importlib.util.find_spec("vllm") is not None)
        rollout = (f"vLLM colocated at {trainer.vllm_gpu_memory_utilization:g}" if rollouts and vllm
                   else "transformers generate")
        aside = {True: "CPU (pinned)", False: "resident"}
        unit = "completions" if rollouts else "rows"
        lines = [
            f"placement: dp, {self.world_size} rank{'s' * (self.world_size > 1)} on {self.num_machines} "
            f"machine{'s' * (self.num_machines > 1)} (this is machine {self.machine_rank}, main process "
            f"{self.main_process_ip}:{self.main_process_port}); strategy {self.strategy}: {STRATEGIES[self.strategy]}",
            f"  {'rank':<5} {'local':<6} {'device':<7} "
            + (f"{'actor + rollout':<34} {'reference':<13} student" if rollouts
               else f"the model trained by {cfg.stage}"),
        ]
        sharded = self.strategy == "fsdp2"
        held = f"1/{self.world_size} sharded" if sharded else "resident"
        # FSDP2 shards TRL's reference with the teacher: it stays on the GPU (rlt_mono.rl.trainer).
        reference = held if sharded else aside[bool(cfg.placement.offload_reference) and self.gpus > 0]
        student = aside[bool(cfg.placement.offload_student) and self.gpus > 0]
        roles = f"{held + ', ' + rollout:<34} {reference:<13} {student}" if rollouts else held
        for local, rank in enumerate(self.global_ranks()):
            lines.append(f"  {rank:<5} {local:<6} {f'cuda:{local}' if self.gpus else 'cpu':<7} {roles}")
        lines.append(f"  {unit} per optimizer step: {per_rank} per rank x {self.world_size} "
                     f"rank{'s' * (self.world_size > 1)} = {per_rank * self.world_size}")
        return "\n".join(lines)


def plan_launch(cfg: DictConfig, gpus_present: int) -> LaunchPlan:
    """The ``LaunchPlan`` of a composed ``placement=dp`` config on a machine with ``gpus_present`` GPUs (0 or
    ``trainer.use_cpu``: CPU ranks). Raises ``ConfigError`` for anything the ranks could not start with."""
    p = cfg.placement
    stage = STAGES[cfg.stage]
    if not stage.data_parallel:
        raise ConfigError(f"placement=dp runs the training stages ({', '.join(DP_STAGES)}) on several GPUs; stage "
                          f"{cfg.stage} runs in one process: leave placement=dp out")
    if p.strategy not in STRATEGIES:
        raise ConfigError(f"placement.strategy={p.strategy!r}: choose one of {', '.join(STRATEGIES)} "
                          f"(the accelerate configs in {ACCELERATE_CONFIGS})")
    training = cfg[stage.trainer_group]
    gpus = runtime.usable_gpus(training, gpus_present)
    check_strategy(cfg, gpus, stage.trainer_group, stage.trains if stage.trains_adapters else None)
    processes = _positive_int(p.num_processes if p.num_processes is not None else max(gpus, 1),
                              "placement.num_processes")
    if gpus and processes > gpus:
        split = ("; placement=split is two ranks, so on one GPU run placement=mono (placement=auto picks by the GPUs "
                 "it sees)" if gpus == 1 and processes == 2 else "")
        raise ConfigError(f"placement.num_processes={processes} but this machine has {gpus} GPU"
                          f"{'s' * (gpus > 1)} (one rank per GPU): lower it, or leave it unset for one rank per "
                          f"GPU{split}")
    machines = _positive_int(p.num_machines, "placement.num_machines")
    rounds = training.get("dynamic_sampling_rounds")  # GRPO's option: the SFT stages' group has none
    if rounds and processes * machines > 1:
        raise ConfigError(f"trainer.dynamic_sampling_rounds={rounds} needs one rank (a GRPO group may span ranks): "
                          "set trainer.dynamic_sampling_rounds=0 with placement=dp or split")
    machine_rank = p.machine_rank
    if not isinstance(machine_rank, int) or isinstance(machine_rank, bool) or not 0 <= machine_rank < machines:
        raise ConfigError(f"placement.machine_rank={machine_rank!r}: this machine's rank, from 0 to "
                          f"placement.num_machines - 1 = {machines - 1}")
    ip, port = p.main_process_ip, p.main_process_port
    if machines > 1:
        missing = [key for key, value in (("placement.main_process_ip", ip), ("placement.main_process_port", port),
                                          ("output_dir", cfg.output_dir)) if value is None]
        if missing:
            raise ConfigError(f"placement.num_machines={machines}: set {', '.join(missing)}, the same on every machine "
                              "(the main process's address and a free port on it; a folder every machine shares)")
    try:
        port = check_main_process_port(port)
    except PlacementError as err:
        raise ConfigError(str(err)) from None
    return LaunchPlan(processes=processes, num_machines=machines, machine_rank=machine_rank,
                      main_process_ip=ip or "127.0.0.1", main_process_port=port or free_port(),
                      strategy=p.strategy, gpus=gpus)


def check_host_memory(cfg: DictConfig, plan: LaunchPlan, available: int | None) -> str:
    """What this machine's GPU ranks of the RL stage hold in CPU memory (``memory.host_memory_terms``: each rank its
    own offloaded reference and student, its teacher aside, a sharded teacher's whole copies while loading), as a
    line for the log. ``ConfigError`` when that alone is more than the ``available`` bytes (None: unknown, not
    checked): the ranks would be killed while loading. Under ``memory=auto`` a rank may set its teacher aside: a
    warning when that would not fit."""
    if not STAGES[cfg.stage].plans_memory or plan.gpus == 0:  # SFT pins nothing; CPU ranks keep every model in place
        return ""
    archs = {group: memory.Arch.from_config(load_config(model_path(cfg[group], cfg.seed, group),
                                                        f"{group}.model_name_or_path").to_dict())
             for group in ("model", "student")}
    # The card's size plays no part in what a rank holds on the CPU.
    settings = memory_planner.settings_from_config(cfg, total_gib=0.0, teacher=archs["model"], student=archs["student"])
    terms = memory.host_memory_terms(settings)
    ranks = plan.processes
    need = ranks * sum(nbytes for _, nbytes in terms)
    parts = ", ".join(f"{what} {nbytes / memory.GIB:.2f}" for what, nbytes in terms) or "nothing"
    line = (f"CPU memory: {ranks} rank{'s' * (ranks > 1)} x {need / ranks / memory.GIB:.2f} GiB ({parts}) = "
            f"{need / memory.GIB:.2f} GiB")
    aside = ranks * sum(nbytes for _, nbytes in memory.host_memory_terms(
        dataclasses.replace(settings, offload_actor_in_generation=True)))
    may_aside = cfg.get("memory") in memory_planner.PLANNING_MODES and aside > need
    if may_aside:
        line += f", {aside / memory.GIB:.2f} GiB if memory={cfg.get('memory')} sets the teacher aside"
    if available is None:
        return line
    line += f"; {available / memory.GIB:.2f} GiB available"
    if need > available:
        advice = ", trainer.offload_actor_in_generation=false" if settings.offload_actor_in_generation else ""
        raise ConfigError(f"{line}: the ranks would run out of CPU memory while loading; use fewer ranks "
                          f"(placement.num_processes) or keep the student on the GPU (placement.offload_student="
                          f"false{advice})")
    if may_aside and aside > available:
        logger.warning("%s: if memory=auto sets the teacher aside on this card, the ranks run out of CPU memory; "
                       "memory=manual keeps the configured settings", line)
    return line


def available_host_memory() -> int | None:
    """This machine's available memory in bytes (``MemAvailable`` of /proc/meminfo), None where unknown."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


# placement=dp's own keys and their unset values (cfgs/placement/_base.yaml): another placement ignores them.
DP_KEYS = {"strategy": "ddp", "num_processes": None, "num_machines": 1, "machine_rank": 0, "main_process_ip": None,
           "main_process_port": None}


def check_dp_keys_unused(cfg: DictConfig) -> None:
    """A ``placement=dp`` key set for another placement would be ignored without a word: a one-line
    ``ConfigError`` instead."""
    found = [f"placement.{key}={cfg.placement.get(key)}" for key, unset in DP_KEYS.items()
             if cfg.placement.get(key, unset) != unset]
    if found:
        them = "them" if len(found) > 1 else "it"
        raise ConfigError(f"{', '.join(found)}: placement=dp's (one rank per GPU), ignored by "
                          f"placement={cfg.placement.mode}; add placement=dp, or leave {them} out")


def launch(cfg: DictConfig, config: str, overrides: list[str], gpus_present: int) -> int:
    """Start the ranks of a ``placement=dp`` run and wait for them; returns the exit code (2: a rank stopped on
    an error the user can fix, printed here in one line; 1: a bug, its traceback is in the rank's log above)."""
    plan = plan_launch(cfg, gpus_present)
    for group in ("model", "student"):  # built or dequantized once, here, instead of by every rank at once
        if cfg.get(group) is not None:
            model_path(cfg[group], cfg.seed, group)
    host = check_host_memory(cfg, plan, available_host_memory())
    resuming = cfg.resume_from_checkpoint not in (None, False)
    if plan.machine_rank == 0:
        output_dir = resolve_output_dir(cfg.output_dir, cfg.run_dir, resuming=resuming,
                                        resume_from_checkpoint=cfg.resume_from_checkpoint)
    else:  # machine 0 checks the shared folder; the others only need its name
        output_dir = Path(cfg.output_dir)
    overrides = [o for o in overrides if not o.startswith("output_dir=")] + [f"output_dir={output_dir}"]
    logger.info("\n%s", plan.table(cfg) + (f"\n  {host}" if host else ""))
    command = plan.command(config, overrides)
    logger.info("starting the ranks: accelerate launch %s", " ".join(command[3:]))
    with tempfile.TemporaryDirectory(prefix="rlt_mono_ranks_") as errors_dir:
        ranks = subprocess.Popen(command, env={**os.environ, **plan.environment(errors_dir)})
        # Ctrl-C reaches the ranks' launcher and every rank too: they stop, say where to resume, and the launcher
        # exits with the ranks' code; this process only waits for it.
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            code = ranks.wait()
        finally:
            signal.signal(signal.SIGINT, previous)
        if code == 0:
            logger.info("all %d ranks finished; the run is in %s", plan.world_size, output_dir)
            return 0
        errors = sorted(Path(errors_dir).glob("rank-*.txt"), key=lambda path: int(path.stem.split("-")[1]))
        if errors:
            exit_code, _, message = errors[0].read_text().strip().partition(" ")
            sys.stderr.write(f"error: {message} ({errors[0].stem.replace('-', ' ')})\n")
            return int(exit_code)
    sys.stderr.write(f"rlt_mono stopped: a rank of the placement=dp run failed (exit code {code}); its traceback "
                     "is in the log above\n")
    return 1


def record_rank_error(err: UserError) -> bool:
    """In a launched rank, write ``err`` (its exit code and one-line message) for the launcher (True: written,
    the launcher prints it and exits with its code; False: not in a rank)."""
    folder = os.environ.get(ERRORS_ENV)
    if not runtime.in_rank() or not folder or not Path(folder).is_dir():
        return False
    atomic_write.write_text(Path(folder) / f"rank-{runtime.rank()}.txt", f"{err.exit_code} {err}\n")
    return True


def main(argv: list[str] | None = None) -> int:
    """``accelerate launch`` with the same arguments, run in this process so that a rank's failure ends in its
    exit code instead of torchrun's report and traceback (the ranks' own logs say what happened)."""
    # here: python -m rlt_mono.cli imports this module, and loads no torch before a run needs it
    import torch.distributed.run  # noqa: F401  (creates torchrun's loggers, each with its own level)
    from accelerate.commands.launch import launch_command, launch_command_parser
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    for name in [name for name in logging.root.manager.loggerDict if name.startswith("torch.distributed.elastic")]:
        logging.getLogger(name).setLevel(logging.CRITICAL)  # the ranks' own logs say what happened
    args = launch_command_parser().parse_args(argv)
    try:
        launch_command(args)
    except ChildFailedError as err:
        _, failure = err.get_first_failure()
        return failure.exitcode if failure.exitcode > 0 else 1
    except SignalException as err:  # Ctrl-C or a kill: torchrun has stopped the ranks, which said where to resume
        return 128 + int(err.sigval)
    return 0


def _positive_int(value, key: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConfigError(f"{key}={value!r}: must be a whole number >= 1")
    return value


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


if __name__ == "__main__":
    sys.exit(main())
