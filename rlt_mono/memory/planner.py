"""Fit an RL run to the card before any model loads: ``memory=auto`` and ``memory=speed`` pick the settings,
``memory=manual`` checks them.

``rlt_mono.memory.model`` predicts each phase's device-level peak from the model configs and the settings; this module
turns that into decisions:

- ``plan(settings)``: the prediction, and when it does not fit, the cheapest single change that would
  (``advise``: lower ``reward.micro_batch_size``, a smaller micro-batch with more accumulation, gradient
  checkpointing, 8-bit Adam, a LoRA then a QLoRA teacher, shorter completions; failing each alone, all of them).
- ``choose(settings)``: what ``memory=auto`` runs with. The completions per optimizer step and per generation
  stay as configured; it sizes vLLM's pool to the teacher's weights, the KV cache of one generation batch and
  vLLM's own working memory (``vllm_gpu_memory_utilization``), then takes the largest micro-batch (with the
  gradient accumulation that keeps completions per step) and the largest ``reward.micro_batch_size`` that fit,
  each at most ``MAX_MICRO_BATCH``. A generation batch whose KV cache does not fit beside the trainer first gets
  the trainer out of the way while vLLM generates (``offload_actor_in_generation``), then a smaller pool (vLLM
  queues sequences: slower, never out of memory).
  Gradient checkpointing is the planner's, not the config's: off at the largest micro-batch that fits without it,
  on (at the largest micro-batch that fits with it) only when no micro-batch fits without it. Recomputing costs
  every micro-batch one more forward pass, while a smaller micro-batch costs only less work per kernel, so no
  recomputation comes before the micro-batch's size. The plan log says which and why (``speed_plan.decisions``).
- ``choose(settings, speed=True)``: what ``memory=speed`` runs with (``rlt_mono.memory.speed_plan``): the same, with the
  largest generation batch whose KV cache fits (a multiple of the completions per step, capped), so that one
  generation feeds several optimizer steps; the plan log says what that changes.
- ``settings_from_config(cfg, ...)``: the ``Settings`` of a run config, each run setting read through its config
  key (``memory.CONFIG_KEYS``, declared once on the field); the YAML holds every default (``memory.Settings``).
- ``fit_plan(mode, settings)``: the build step's plan. It logs the plan as a table and returns it with the config
  changes that carry ``choose``'s settings, ``{dotted key: value}`` at the keys they were read from (``memory=auto``
  or ``speed``, ``config_changes``; the builder ``rlt_mono.rl.build.fit_memory`` applies them to the run's config),
  or warns when the configured ones will not fit (``memory=manual``, no change); it raises a one-line ``UserError``
  with the numbers and the advice when nothing fits.

Command line (no GPU needed): ``python -m rlt_mono.memory.planner teacher_rlt_mono --gpu-gib 24 [--free-gib F]
[--arch 1.5b] [--auto | --speed] [overrides]``: prints the plan, exit 0 if it fits, 2 with the advice if not.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf
from omegaconf.errors import MissingMandatoryValue

from rlt_mono import runtime
from rlt_mono.config import compose
from rlt_mono.errors import UserError
from rlt_mono.memory.model import (
    CONFIG_KEYS,
    DTYPE_BYTES,
    GIB,
    QWEN25_ARCHS,
    Arch,
    Phase,
    Settings,
    pool_bytes,
    predict,
    start_bytes,
    weight_bytes,
)
from rlt_mono.memory.speed_plan import (
    completions_per_step,
    decisions,
    generation_batch,
    generation_batches,
    least_trainer,
)

logger = logging.getLogger(__name__)

# The largest micro-batch and reward micro-batch memory=auto picks: beyond it a forward gains little speed.
MAX_MICRO_BATCH = 16
# vLLM's memory besides weights and KV cache (its profiling forward of up to 4096 batched tokens, the sampler's
# logits, CUDA graphs): this much plus a tenth of the weights. An estimate, on the safe side of what vLLM asks.
VLLM_WORKING_GIB = 1.5
VLLM_WORKING_SHARE = 0.10
# The adapter rank the advice suggests when only a LoRA or QLoRA teacher fits.
ADVICE_LORA_RANK = 16
# The memory modes that choose the run's settings (choose), and every mode.
PLANNING_MODES = ("auto", "speed")
MODES = (*PLANNING_MODES, "manual")


# ---- the plan and its advice ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Plan:
    """The prediction for ``settings``: per-phase peaks, the largest, whether it fits, and if not the advice."""

    settings: Settings
    phases: dict[str, Phase]
    # Full-length sequences whose KV cache fits beside vLLM's weights in its pool (< 1: vLLM cannot start).
    kv_sequences: int
    advice: str | None = field(default=None)

    @property
    def peak(self) -> Phase:
        """The largest phase; of SCORE and TRAIN at the same level, the one whose own allocations set it."""
        return max(self.phases.values(), key=lambda phase: (phase.bytes, -phase.term("allocator cache")))

    @property
    def fits(self) -> bool:
        return self.peak.gib <= self.settings.free and self.kv_sequences >= 1 and self.starts

    @property
    def starts(self) -> bool:
        """Whether vLLM's engine can start beside the teacher (``memory.start_bytes``)."""
        return start_bytes(self.settings) / GIB <= self.settings.free

    @property
    def start_beside(self) -> str:
        """What shares the GPU with vLLM's pool when its engine starts."""
        if self.settings.sharded:
            return "(the teacher still on the CPU, sharded later)"
        return "beside the teacher's weights"

    def refusal(self) -> str:
        """One line: what does not fit and the advice (empty when the plan fits)."""
        if self.fits:
            return ""
        if self.peak.gib > self.settings.free:
            problem = f"{self.peak.name} needs {self.peak.gib:.1f} GiB, {room(self.settings)}"
        elif not self.starts:
            problem = (f"vLLM's start needs {start_bytes(self.settings) / GIB:.1f} GiB free (its pool "
                       f"{gib_text(pool_bytes(self.settings))} GiB {self.start_beside}), {room(self.settings)}")
        else:
            problem = (f"vLLM's pool ({gib_text(pool_bytes(self.settings))} GiB) holds no full-length sequence's KV "
                       "cache beside its weights")
        return f"{problem}: {self.advice}" if self.advice else problem

    def table(self) -> str:
        """A text table: each phase's total and its terms, then the peak and the verdict."""
        s = self.settings
        lines = [f"memory plan (predicted device-level peaks): card {s.total_gib:.1f} GiB, held by other processes "
                 f"{s.held_by_others_gib:.1f}, usable {s.free:.1f}; "
                 f"vLLM pool {gib_text(pool_bytes(s))} GiB ({s.vllm_gpu_memory_utilization:g}), "
                 f"{self.kv_sequences} full-length sequences of KV cache",
                 f"  {'phase':<9} {'GiB':>7}  terms (GiB)"]
        for phase in self.phases.values():
            terms = ", ".join(f"{what} {gib_text(nbytes)}" for what, nbytes in phase.terms)
            lines.append(f"  {phase.name:<9} {phase.gib:>7.2f}  {terms}")
        lines.append(f"  {'start':<9} {start_bytes(s) / GIB:>7.2f}  vLLM's engine start: its pool {self.start_beside}")
        verdict = "fits" if self.fits else f"does not fit: {self.refusal()}"
        lines.append(f"  peak: {self.peak.name} {self.peak.gib:.2f} GiB; {verdict}")
        return "\n".join(lines)


def gib_text(nbytes: float) -> str:
    return f"{nbytes / GIB:.2f}"


def room(s: Settings) -> str:
    """What the run may use, in words for a refusal: the card's memory, or what other processes leave of it."""
    if s.held_by_others_gib < 0.05:
        return f"the card has {s.free:.1f}"
    return f"the card has {s.free:.1f} beside other processes' {s.held_by_others_gib:.1f}"


def fits(s: Settings) -> bool:
    """``Plan.fits`` of ``s``'s prediction (without the advice)."""
    return Plan(s, *predict(s)).fits


def _candidates(s: Settings) -> list[dict]:
    """Single changes, cheapest first within each kind, in the fixed order: reward.micro_batch_size lower, the
    micro-batch lower with gradient accumulation (and steps per generation) raised to keep completions per step,
    gradient checkpointing on, 8-bit Adam, a LoRA teacher (rank ``ADVICE_LORA_RANK``), a QLoRA teacher, shorter
    completions (halved down to 128). Activation offloading is not
    suggested: measured, it saved no device memory (``rlt_mono.memory.model.train_activation_bytes``)."""
    changes: list[dict] = []
    size = s.reward_micro_batch_size // 2
    while size >= 1:
        changes.append({"reward_micro_batch_size": size})
        size //= 2
    b = s.per_device_train_batch_size
    for smaller in sorted((d for d in range(1, b) if b % d == 0), reverse=True):
        factor = b // smaller
        changes.append({"per_device_train_batch_size": smaller,
                        "gradient_accumulation_steps": s.gradient_accumulation_steps * factor,
                        "steps_per_generation": s.steps_per_generation * factor})
    if not s.gradient_checkpointing:
        changes.append({"gradient_checkpointing": True})
    if s.optim not in ("adamw_bnb_8bit", "paged_adamw_8bit"):
        changes.append({"optim": "adamw_bnb_8bit"})
    if not s.lora_r:
        changes.append({"lora_r": ADVICE_LORA_RANK})
    if not s.load_in_4bit:
        changes.append({"lora_r": s.lora_r or ADVICE_LORA_RANK, "load_in_4bit": True})
    length = s.max_completion_length // 2
    while length >= 128:
        changes.append({"max_completion_length": length})
        length //= 2
    return changes


def wording(change: dict) -> str:
    """``key=value`` overrides of ``{Settings field: value}``, as a user types them on the command line."""
    return " ".join(f"{CONFIG_KEYS[name]}={str(v).lower() if isinstance(v, bool) else v}"
                    for name, v in change.items())


def advise(s: Settings) -> str:
    """The first single change of ``_candidates`` that fits; failing that, the changes of every kind taken
    together in the same order until they fit; failing that, what is left to try."""
    candidates = _candidates(s)
    for change in candidates:
        if fits(dataclasses.replace(s, **change)):
            return wording(change)
    combined: dict = {}
    for change in candidates:  # later values of a kind are more drastic: each replaces the one before
        combined.update(change)
        if fits(dataclasses.replace(s, **combined)):
            return wording(combined)
    if predict(s)[1] < 1:
        return "raise vllm_gpu_memory_utilization until vLLM's pool holds its weights and one sequence's KV cache"
    return "no change of these settings fits: a smaller model pair or a larger card"


def plan(settings: Settings) -> Plan:
    """Predict every phase for ``settings``; when the peak exceeds the free memory, attach ``advise``'s change."""
    phases, kv_sequences = predict(settings)
    result = Plan(settings, phases, kv_sequences)
    return result if result.fits else dataclasses.replace(result, advice=advise(settings))


# ---- memory=auto ------------------------------------------------------------------------------------------
def vllm_pool_gib(s: Settings, sequences: int) -> float:
    """vLLM's pool for ``sequences`` full-length sequences at once: the teacher's weights, their KV cache and
    vLLM's working memory (``VLLM_WORKING_GIB`` + ``VLLM_WORKING_SHARE`` of the weights)."""
    weights = weight_bytes(s.teacher, s.teacher_dtype)
    kv = sequences * s.sequence_length * s.teacher.kv_bytes_per_token(DTYPE_BYTES[s.teacher_dtype])
    return (weights * (1 + VLLM_WORKING_SHARE) + kv) / GIB + VLLM_WORKING_GIB


def _utilization(s: Settings, sequences: int) -> float:
    """The pool for ``sequences`` as a share of the card, rounded up to a hundredth."""
    return min(1.0, math.ceil(vllm_pool_gib(s, sequences) / s.total_gib * 100) / 100)


def _largest_fitting(s: Settings, options: list[dict]) -> Settings:
    """The first of ``options`` (largest first, the last one known to fit) applied to ``s`` that fits."""
    for change in options:
        candidate = dataclasses.replace(s, **change)
        if fits(candidate):
            return candidate
    return s


def choose(s: Settings, speed: bool = False) -> Settings:
    """The settings ``memory=auto`` runs with, or with ``speed`` ``memory=speed`` (see the module docstring). When
    nothing fits, the least this run needs (micro-batches of 1, gradient checkpointing, a pool for one sequence):
    ``plan`` of it then says by how much it misses and what else to change."""
    completions, configured = completions_per_step(s), generation_batch(s)
    # Each generation batch with its whole KV cache in the pool, the trainer beside it (as configured), then aside
    # while vLLM generates; failing every one, the configured batch with a smaller share of it at once.
    aside = not s.load_in_4bit  # a 4-bit teacher moved aside frees nothing (rlt_mono.memory.model.predict)
    tries = [(away, batch, batch) for batch in (generation_batches(s) if speed else [configured])
             for away in (s.offload_actor_in_generation and aside, aside)]
    sequences = configured // 2
    while sequences >= 1:
        tries.append((aside, configured, sequences))
        sequences //= 2
    for away, batch, sequences in tries:
        # The pool gets what the card can give beside the least the trainer needs.
        sized = dataclasses.replace(least_trainer(s, batch, checkpointing=True), offload_actor_in_generation=away,
                                    vllm_gpu_memory_utilization=_utilization(s, sequences))
        if fits(sized):
            break
    else:
        return sized
    if sequences < batch:
        logger.warning("memory=%s: vLLM's pool holds the KV cache of %d of the %d sequences a generation makes "
                       "(vLLM queues the rest: slower generation)", "speed" if speed else "auto", sequences, batch)
    # No recomputation at the largest micro-batch that fits without it; failing that, the largest with it.
    micro_batches = [b for b in range(min(MAX_MICRO_BATCH, completions), 0, -1)
                     if completions % b == 0 and batch % b == 0]
    sized = _largest_fitting(sized, [{"per_device_train_batch_size": b, "gradient_accumulation_steps": completions // b,
                                      "steps_per_generation": batch // b, "gradient_checkpointing": checkpointing}
                                     for checkpointing in (False, True) for b in micro_batches])
    rewards = [r for r in (16, 8, 4, 2, 1) if r <= MAX_MICRO_BATCH]
    return _largest_fitting(sized, [{"reward_micro_batch_size": r} for r in rewards])


def auto_refusal(result: Plan) -> str:
    """Why ``choose`` found nothing: vLLM alone does not fit beside the trainer, or a phase is over (with advice)."""
    s = result.settings
    if result.kv_sequences < 1:
        return (f"vLLM needs {vllm_pool_gib(s, 1):.1f} GiB for the teacher's weights and one sequence's KV cache, "
                f"{room(s)}: a smaller teacher or a larger card")
    return result.refusal()


def changes(before: Settings, after: Settings) -> dict:
    """The run settings whose values differ, ``{Settings field: (before, after)}``, in ``Settings``' order."""
    return {name: (getattr(before, name), getattr(after, name)) for name in CONFIG_KEYS
            if getattr(before, name) != getattr(after, name)}


def config_changes(before: Settings, after: Settings) -> dict[str, Any]:
    """The run settings ``after`` changes from ``before`` as config changes, ``{dotted key: new value}``, each at
    its config key (``memory.CONFIG_KEYS``, where ``settings_from_config`` read it), in ``Settings``' order."""
    return {CONFIG_KEYS[name]: value for name, (_, value) in changes(before, after).items()}


# ---- from a run config ------------------------------------------------------------------------------------
def arch_for(group, name: str, arch: str | None) -> Arch:
    """The architecture of config group ``name`` (``model`` or ``student``): its folder's config.json when
    ``model_name_or_path`` is a local folder, else the Qwen2.5 architecture ``arch``."""
    folder = Path(str(group.model_name_or_path)).expanduser()
    if (folder / "config.json").is_file():
        return Arch.from_config(json.loads((folder / "config.json").read_text()))
    if arch is None:
        raise UserError(f"{name}.model_name_or_path={group.model_name_or_path} is no local folder with "
                        f"config.json: pass --arch {'|'.join(QWEN25_ARCHS)} (the Qwen2.5 architecture to assume)")
    return Arch.from_config(QWEN25_ARCHS[arch])


def settings_from_config(cfg, *, total_gib: float, free_gib: float | None = None, arch: str | None = None,
                         teacher: Arch | None = None, student: Arch | None = None,
                         prompt_length: int = 512) -> Settings:
    """``Settings`` of a composed ``teacher_rlt`` run config (placement mono only), the one whose GRPO ``trainer``
    group it plans; ``teacher``/``student`` default to ``arch_for`` the model and student groups."""
    if cfg.get("trainer") is None:
        raise UserError(f"the memory planner covers the teacher_rlt stage; this config's stage is {cfg.get('stage')}")
    if cfg.placement.mode == "student_gpu":  # placement=auto in one process is mono: planned as such
        raise UserError("placement=student_gpu: the memory planner covers every role on one GPU (placement=mono)")
    teacher = teacher or arch_for(cfg.model, "model", arch)
    student = student or arch_for(cfg.student, "student", arch)
    return Settings(teacher=teacher, student=student, **run_settings(cfg), prompt_length=prompt_length,
                    data_parallel_ranks=data_parallel_ranks(cfg),
                    sharded=cfg.placement.mode == "dp" and cfg.placement.strategy == "fsdp2",
                    total_gib=total_gib, free_gib=free_gib)


def run_settings(cfg) -> dict:
    """``{Settings field: value}`` of every run setting, read at its config key (``memory.CONFIG_KEYS``). The
    composed YAML declares each one; a key a config lacks, leaves unset (``???``) or sets to null is a
    ``UserError`` naming it."""
    values = {}
    for name, key in CONFIG_KEYS.items():
        try:
            value = OmegaConf.select(cfg, key, throw_on_missing=True)
        except MissingMandatoryValue:
            value = None
        if value is None:
            raise UserError(f"{key} is not set: the memory planner reads it (set {key}=...)")
        values[name] = value
    return values


def data_parallel_ranks(cfg) -> int:
    """Ranks of a ``placement=dp`` run: the launched run's world size in a rank, else what the launcher would start
    (``num_processes``, unset: one per GPU this machine shows, at least 1, and 1 with ``use_cpu``; times
    ``num_machines``); 1 for every other placement."""
    if cfg.placement.mode != "dp":
        return 1
    if runtime.in_rank():
        return runtime.world_size()
    processes = cfg.placement.num_processes or max(runtime.usable_gpus(cfg.trainer, runtime.gpus_present()), 1)
    return processes * cfg.placement.num_machines


def fit_plan(mode: str, settings: Settings) -> tuple[Plan, dict[str, Any]]:
    """The build step's plan for ``memory=<mode>``, logged, and the config changes it makes (``config_changes``:
    ``{dotted key: new value}``, for the caller to apply): ``memory=auto`` and ``memory=speed`` plan ``choose``'s
    settings (with ``decisions`` logged); ``memory=manual`` plans the configured ones, changes nothing and warns if
    they will not fit. Raises ``UserError`` (one line: the phase, its need, the free memory, the advice) when
    ``memory=auto`` or ``speed`` finds nothing that fits."""
    if mode not in MODES:
        raise UserError(f"memory={mode!r}: choose one of {', '.join(MODES)}")
    if mode == "manual":
        result = plan(settings)
        logger.info("memory=manual, the configured settings:\n%s", result.table())
        if not result.fits:
            logger.warning("memory=manual: these settings will likely run out of GPU memory (%s); memory=auto picks "
                           "settings that fit", result.refusal())
        return result, {}
    chosen = choose(settings, speed=mode == "speed")
    result = plan(chosen)
    logger.info("memory=%s:\n%s", mode, result.table())
    if not result.fits:
        raise UserError(f"memory={mode}: nothing fits this card: {auto_refusal(result)}")
    for line in decisions(settings, chosen, speed=mode == "speed"):
        logger.info("%s", line)
    return result, config_changes(settings, chosen)


def argument_problem(gpu_gib: float, free_gib: float | None, prompt_length: int) -> str | None:
    """What is wrong with the command line's sizes, in one line, or None: a card of a finite positive size, free
    memory no more than the card, a prompt of at least one token."""
    if not math.isfinite(gpu_gib) or gpu_gib <= 0:
        return f"--gpu-gib {gpu_gib}: give the card's total memory in GiB, a number above 0 (e.g. 80)"
    if free_gib is not None and (not math.isfinite(free_gib) or not 0 < free_gib <= gpu_gib):
        return (f"--free-gib {free_gib}: the memory free for the run must be above 0 and at most the card's "
                f"--gpu-gib {gpu_gib}")
    if prompt_length < 1:
        return f"--prompt-length {prompt_length}: the longest prompt must be at least 1 token"
    return None


def main(argv: list[str] | None = None) -> int:
    """``python -m rlt_mono.memory.planner <run config> [overrides] --gpu-gib N [--auto | --speed]``: print the plan;
    exit 0 if it fits, 2 with the one-line advice if not (or on a mistake in the arguments)."""
    parser = argparse.ArgumentParser(prog="python -m rlt_mono.memory.planner", description=__doc__.splitlines()[0])
    parser.add_argument("run_config", help="a run config (e.g. teacher_rlt_mono)")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. trainer.max_completion_length=2048")
    parser.add_argument("--gpu-gib", type=float, required=True, help="the card's total memory in GiB")
    parser.add_argument("--free-gib", type=float, help="memory the run may use in GiB: the card less what other "
                        "processes hold (default: --gpu-gib; on a GPU, memory=auto reads it from NVML)")
    parser.add_argument("--arch", choices=list(QWEN25_ARCHS), help="Qwen2.5 architecture of a model without a "
                        "local folder (embedded:, hub ids, GGUF options)")
    parser.add_argument("--prompt-length", type=int, default=512, help="the longest prompt in tokens")
    picks = parser.add_mutually_exclusive_group()
    picks.add_argument("--auto", action="store_true", help="show what memory=auto would pick")
    picks.add_argument("--speed", action="store_true", help="show what memory=speed would pick")
    args = parser.parse_intermixed_args(argv)
    mode = "speed" if args.speed else "auto" if args.auto else None
    if problem := argument_problem(args.gpu_gib, args.free_gib, args.prompt_length):
        sys.stderr.write(f"error: {problem}\n")
        return 2
    try:
        cfg = compose(args.run_config, args.overrides)
        settings = settings_from_config(cfg, total_gib=args.gpu_gib, free_gib=args.free_gib, arch=args.arch,
                                        prompt_length=args.prompt_length)
        chosen = choose(settings, speed=args.speed) if mode else settings
        result = plan(chosen)
    except UserError as err:
        sys.stderr.write(f"error: {err}\n")
        return 2
    sys.stdout.write(result.table() + "\n")
    if mode and result.fits:
        chosen_values = {name: after for name, (_, after) in changes(settings, chosen).items()}
        sys.stdout.write("".join(f"{line}\n" for line in decisions(settings, chosen, speed=args.speed)))
        sys.stdout.write(f"memory={mode}: {wording(chosen_values) or 'no change'}\n")
    if not result.fits:
        sys.stderr.write(f"error: {auto_refusal(result) if mode else result.refusal()}\n")
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
