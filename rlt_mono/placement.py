"""Placement as data: which device each role of an RLT step lives on and which engine rolls out, validated
before any model loads. The one source of where a role runs: build, the trainer and the distill/eval stages
read it from here (``resolve_placement_for``: a run's ``placement`` group on the GPUs its process sees), and of
what ``placement.strategy`` cannot run with (``check_strategy``: the launcher and the RL build).

Roles (verl's split placement, brought to one host): ACTOR (the teacher being trained), ROLLOUT (the engine
that samples the teacher's completions: vLLM colocated with the actor, or ``transformers`` ``generate`` on the
actor's model), REFERENCE (the GRPO reference) and STUDENT (the frozen student that scores explanations: the
critic, in verl's terms; an extra reward model would join it). Modes:

- ``mono``: every role on GPU 0; reference and student kept in CPU memory between uses (``offload_*``).
- ``student_gpu``: actor, rollout and reference on GPU 0; the student resident on GPU 1, scoring while GPU 0
  computes the reference and teacher log-probs.
- ``auto``: ``mono`` on one GPU; for the RL stage on two or more, ``placement=split`` (``dp`` over two GPUs,
  started by ``rlt_mono.cli``).
- ``dp``: data parallel, one process (rank) per GPU launched through ``accelerate launch``
  (``rlt_mono.launch``); each rank is a ``mono`` step on its own GPU ``cuda:<local rank>``: the actor (teacher,
  replicated on every rank: DDP, ``cfgs/accelerate/ddp.yaml``; or with ``placement.strategy=fsdp2`` sharded over
  the ranks with TRL's reference, which then stays on the GPU), its own colocated vLLM engine, and its own
  reference and student in CPU memory between uses. Each rank generates and scores its share of the step's
  completions; gradients are reduced across ranks. ``placement=split`` (``cfgs/placement/split.yaml``) is ``dp``
  over two GPUs: the fastest two-GPU placement measured, against ``mono`` and ``student_gpu``
  (docs/PERFORMANCE.md, "Two GPUs").
- ``async``: one-step-off rollout on two GPUs: actor, reference and student on GPU 0 (reference and student in
  CPU memory between uses, as ``mono``); the rollout a vLLM server on GPU 1 (``rlt_mono.rl.vllm_server``) that
  generates step n+1's completions with the weights of step n while GPU 0 scores and trains step n; the weights go
  to it over NCCL after each optimizer step (TRL's server mode), and TRL's importance-sampling correction weighs
  each token by how the trained weights' probability differs from the sampling one (``rlt_mono.rl.one_step_off``).

With no GPU every role is on the CPU (the embedded demo; ``dp`` then runs CPU ranks) and rollouts use
``transformers``.
"""

from __future__ import annotations

import enum
import logging
import os
from dataclasses import dataclass

from omegaconf import DictConfig

from rlt_mono import runtime
from rlt_mono.config import ConfigError
from rlt_mono.memory.planner import PLANNING_MODES

logger = logging.getLogger(__name__)


class Role(enum.Enum):
    ACTOR = "actor"
    ROLLOUT = "rollout"
    REFERENCE = "reference"
    STUDENT = "student"


MODES = ("mono", "student_gpu", "auto", "dp", "async")
ROLLOUTS = ("auto", "vllm", "transformers")
# The TCP ports a data-parallel run's ranks can meet on (placement.main_process_port; 0, "any free port", cannot be
# shared between machines, so null asks rlt_mono.launch to pick one).
PORTS = range(1, 65536)


class PlacementError(ValueError):
    """The placement asked for cannot be had on this machine; the message says what is missing."""


@dataclass(frozen=True)
class Placement:
    """A resolved placement: ``devices[role]`` is where the role computes (``cuda:N`` or ``cpu``); roles in
    ``offloaded`` live in pinned CPU memory between their uses; ``rollout`` is the engine of the ROLLOUT role
    (``vllm``, colocated on the rollout device, or ``transformers``)."""

    mode: str
    devices: dict[Role, str]
    offloaded: frozenset[Role]
    rollout: str

    def device(self, role: Role) -> str:
        return self.devices[role]

    def offloads(self, role: Role) -> bool:
        """Whether ``role`` lives in CPU memory between its uses."""
        return role in self.offloaded

    def beside_actor(self, role: Role) -> bool:
        """Whether ``role`` computes on a device of its own, next to the actor's (it can run alongside it)."""
        return self.devices[role] != self.devices[Role.ACTOR]

    @property
    def use_vllm(self) -> bool:
        return self.rollout == "vllm"

    @property
    def one_step_off(self) -> bool:
        """Whether the rollout runs one optimizer step ahead of training on a vLLM server of its own
        (``placement=async``)."""
        return self.mode == "async"

    @property
    def engine_label(self) -> str:
        if self.one_step_off:
            return "vLLM server, one step ahead"
        return "vLLM colocated" if self.use_vllm else "transformers generate"

    def table(self) -> str:
        """The table logged at start-up."""
        lines = [f"placement: {self.mode}", f"  {'role':<10} {'device':<8} between uses"]
        for role in Role:
            where = "CPU (pinned)" if role in self.offloaded else "resident"
            engine = f" ({self.engine_label})" if role is Role.ROLLOUT else ""
            lines.append(f"  {role.value:<10} {self.devices[role]:<8} {where}{engine}")
        return "\n".join(lines)


def resolve_placement(
    mode: str, gpu_count: int, *, offload_reference: bool, offload_student: bool, rollout: str, local_rank: int,
) -> Placement:
    """Resolve ``mode`` and the ``rollout`` choice for ``gpu_count`` visible GPUs (``rollout``: ``auto``
    picks vLLM when it is installed and a GPU is in use). ``local_rank``: this process's rank on its machine
    (``dp``: its roles live on ``cuda:<local_rank>``). No argument has a default here: the placement group's
    (``cfgs/placement/_base.yaml``) are the only ones.

    Raises:
        PlacementError: unknown mode or rollout, ``student_gpu`` with fewer than two GPUs, or ``vllm`` without a GPU
            or without the vllm package.
    """
    if mode not in MODES:
        raise PlacementError(f"placement.mode must be one of {MODES}, got {mode!r}")
    if mode == "student_gpu" and gpu_count < 2:
        raise PlacementError(
            f"placement=student_gpu needs 2 visible GPUs (student on the second), found {gpu_count}; "
            "use placement=mono or placement=auto, or make a second GPU visible (CUDA_VISIBLE_DEVICES=0,1)"
        )
    if mode == "async" and gpu_count < 2:
        raise PlacementError(
            f"placement=async generates on a second GPU while the first trains, and found {gpu_count} visible GPUs; "
            "use placement=mono, or make a second GPU visible (CUDA_VISIBLE_DEVICES=0,1)")
    if mode == "dp" and gpu_count and not 0 <= local_rank < gpu_count:
        raise PlacementError(f"placement=dp: local rank {local_rank} has no GPU of its own ({gpu_count} visible); "
                             "lower placement.num_processes to the GPUs of a machine")
    engine = _rollout_engine(rollout, gpu_count)
    if mode == "async" and engine != "vllm":
        raise PlacementError(f"placement=async runs vLLM as a server on GPU 1, and the rollout here is {engine} "
                             f"(placement.rollout={rollout}, vllm installed: {_vllm_installed()}): install vllm, or "
                             "use placement=mono")
    if gpu_count == 0:
        return Placement("dp" if mode == "dp" else "mono", {role: "cpu" for role in Role}, frozenset(), engine)
    # auto on two GPUs is launched as dp (cli.py)
    resolved = mode if mode in ("student_gpu", "dp", "async") else "mono"
    gpu = f"cuda:{local_rank}" if resolved == "dp" else "cuda:0"
    devices = {role: gpu for role in Role}
    offloaded = {Role.REFERENCE} if offload_reference else set()
    if resolved == "student_gpu":
        devices[Role.STUDENT] = "cuda:1"
    elif offload_student:
        offloaded.add(Role.STUDENT)
    if resolved == "async":  # the server's process sees only that GPU; this process computes nothing there
        devices[Role.ROLLOUT] = "cuda:1"
    return Placement(resolved, devices, frozenset(offloaded), engine)


def resolve_placement_for(placement_cfg: DictConfig, use_cpu: bool = False) -> Placement:
    """The ``placement`` group resolved for the GPUs this process sees (none when ``use_cpu`` or without CUDA),
    logged as a table; an impossible one is a ``ConfigError``. What the RL build and the distill and eval stages
    place their roles by."""
    import torch  # here: rlt_mono.cli imports this module, and its --help needs no torch

    gpu_count = 0 if use_cpu or not torch.cuda.is_available() else torch.cuda.device_count()
    try:
        placement = resolve_placement(placement_cfg.mode, gpu_count, offload_reference=placement_cfg.offload_reference,
                                      offload_student=placement_cfg.offload_student, rollout=placement_cfg.rollout,
                                      local_rank=runtime.local_rank())
    except PlacementError as err:
        raise ConfigError(str(err)) from err
    logger.info("\n%s", placement.table())
    return placement


def physical_gpu(device: str) -> str:
    """The GPU a ``cuda:N`` device of this process is, as another process must be told it (``CUDA_VISIBLE_DEVICES``:
    the N-th entry of this process's list, else N)."""
    index = int(device.split(":")[1])
    visible = [gpu.strip() for gpu in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if gpu.strip()]
    return visible[index] if index < len(visible) else str(index)


def _rollout_engine(choice: str, gpu_count: int) -> str:
    if choice not in ROLLOUTS:
        raise PlacementError(f"placement.rollout must be auto, vllm or transformers, got {choice!r}")
    if choice == "transformers":
        return "transformers"
    has_vllm = gpu_count > 0 and _vllm_installed()
    if choice == "vllm" and not has_vllm:
        raise PlacementError(
            "placement.rollout=vllm needs a CUDA GPU and the vllm package "
            f"(GPU in use: {gpu_count > 0}, vllm installed: {_vllm_installed()}); "
            "use placement.rollout=auto or transformers"
        )
    return "vllm" if has_vllm else "transformers"


def _vllm_installed() -> bool:
    try:
        import vllm  # noqa: F401
    except ImportError:
        return False
    return True


def check_main_process_port(port) -> int | None:
    """``placement.main_process_port`` as given: None (the launcher picks a free port) or a whole number in
    ``PORTS``; anything else is a ``PlacementError`` (accelerate's launcher would stop on it with a traceback)."""
    if port is not None and (not isinstance(port, int) or isinstance(port, bool) or port not in PORTS):
        raise PlacementError(f"placement.main_process_port={port!r}: a TCP port, a whole number from {PORTS[0]} to "
                             f"{PORTS[-1]} (or null for a free one)")
    return port


def gpus_to_expose(mode: str, gpus_present: int, processes: int | None = None) -> int:
    """How many GPUs a placement mode uses (0 on a machine without GPUs): mono and auto 1, student_gpu and async 2,
    dp one per process on this machine (``processes``; None: every GPU present)."""
    if mode not in MODES:
        raise PlacementError(f"placement.mode must be one of {MODES}, got {mode!r}")
    if mode == "dp":
        return min(gpus_present, processes or gpus_present)
    return min(gpus_present, 2 if mode in ("student_gpu", "async") else 1)


# trainer.optim values (transformers' OptimizerNames) served by bitsandbytes: its kernels update plain tensors, not
# FSDP2's sharded DTensor weights (seen on an H100 run: "bitsandbytes.optimizer_update_32bit ... does not have
# a sharding strategy registered").
BITSANDBYTES_OPTIMIZERS = frozenset({
    "adamw_bnb_8bit", "adamw_8bit", "ademamix", "ademamix_8bit", "lion_8bit", "lion_32bit", "paged_adamw_32bit",
    "paged_adamw_8bit", "paged_ademamix_32bit", "paged_ademamix_8bit", "paged_lion_32bit", "paged_lion_8bit",
    "rmsprop_bnb", "rmsprop_bnb_8bit", "rmsprop_bnb_32bit", "galore_adamw_8bit", "galore_adamw_8bit_layerwise"})


def check_strategy(cfg: DictConfig, gpus: int, group: str, adapters: str | None) -> None:
    """What ``placement.strategy`` cannot run with, as a one-line ``ConfigError`` (checked by the launcher and,
    for a rank started without it such as a benchmark's, when the trainer is built). ``group``: the config group of
    the stage's training arguments (``trainer`` or ``sft``); ``adapters``: the model group whose LoRA adapters it
    trains when its ``lora_r`` > 0, None for a stage that trains none (the stage's facts, ``rlt_mono.stages``)."""
    if cfg.placement.strategy != "fsdp2":
        return
    if gpus == 0:
        raise ConfigError("placement.strategy=fsdp2 shards the teacher with FSDP2, which accelerate runs on GPUs only "
                          "(this run has none, or trainer.use_cpu=true): use placement.strategy=ddp")
    if adapters is not None and cfg[adapters].get("lora_r"):
        raise ConfigError(f"{adapters}.lora_r={cfg[adapters].lora_r} with placement.strategy=fsdp2: a LoRA teacher "
                          "trains only its adapters, small enough to replicate; use placement.strategy=ddp")
    optim = str(cfg[group].get("optim", ""))
    if optim in BITSANDBYTES_OPTIMIZERS:
        raise ConfigError(f"{group}.optim={optim} with placement.strategy=fsdp2: bitsandbytes' optimizers cannot "
                          f"update FSDP2's sharded weights; set {group}.optim=adamw_torch (its state is sharded with "
                          "them) or use placement.strategy=ddp")

def warn_unused_options(cfg: DictConfig, placement: Placement | None, *, plans_memory: bool,
                        sampling_group: str | None) -> None:
    """One warning for each option the config of an SFT, distill or eval run sets that its stage does not read.
    ``placement``: the run's resolved placement (None: the stage resolves none, as the SFT stages, which train one
    model per process); ``plans_memory`` and ``sampling_group``: the stage's facts (``rlt_mono.stages.base.Stage``).

    - ``memory=auto|speed`` for a stage whose memory it does not plan (it plans teacher_rlt's GPU memory);
    - ``placement=student_gpu|auto|async`` where no placement is resolved: only ``placement=dp`` changes an SFT run;
    - ``<sampling_group>.vllm_kv_cache_gib`` (distill, eval) where the placement samples with transformers: no vLLM
      engine.
    """
    if not plans_memory and cfg.get("memory") in PLANNING_MODES:
        logger.warning("memory=%s is ignored: it plans the GPU memory of an RL run, and this run is %s", cfg.memory,
                       cfg.stage)
    if placement is None and cfg.get("placement") is not None and cfg.placement.mode in ("student_gpu", "auto",
                                                                                         "async"):
        logger.warning("placement=%s is ignored: %s trains one model in one process (placement=dp spreads it over "
                       "GPUs)", cfg.placement.mode, cfg.stage)
    kv_cache = cfg[sampling_group].get("vllm_kv_cache_gib") if sampling_group is not None else None
    if placement is not None and not placement.use_vllm and kv_cache is not None:
        logger.warning("%s.vllm_kv_cache_gib=%s is ignored: this run samples with transformers, not vLLM (no CUDA GPU, "
                       "no vllm package, or placement.rollout=transformers)", sampling_group, kv_cache)


def check_gpu_kernels(cfg: DictConfig, on_gpu: bool, group: str = "trainer") -> None:
    """``runtime.gpu_kernels_problem`` of the stage's training group (``group``: ``trainer`` for the RL stage,
    ``sft`` for the SFT stages; ``on_gpu``: where the run computes) as a one-line ``ConfigError``."""
    problem = runtime.gpu_kernels_problem(group, cfg[group].get("use_liger_kernel"), on_gpu)
    if problem:
        raise ConfigError(problem)
