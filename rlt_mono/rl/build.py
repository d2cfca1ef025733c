"""Wiring: a composed config in, a ready ``RLTTrainer`` out (used by the CLI and by notebooks).

Reads top to bottom: run folder -> placement -> typed configs -> resume check -> models -> data -> reward
-> trainer -> outputs. Everything a user can get wrong without a model loaded is checked before the first
model loads; each mistake raises a one-line ``rlt_mono.errors.UserError``. Models are found and loaded
by ``rlt_mono.data.models`` and placed by ``rlt_mono.placement.resolve_placement_for``; the checks every training
stage shares live below it (``rlt_mono.placement.check_gpu_kernels``, ``warn_unused_options``;
``rlt_mono.runtime.set_wandb_env``); the trainer releases what it holds itself (``RLTTrainer.release``).
Under ``placement=async`` it also prepares the rollout server (``rollout_server``), which the trainer starts.
"""

from __future__ import annotations

import logging
import os
import socket
from pathlib import Path

import torch
from accelerate.utils import gather_object
from omegaconf import DictConfig, OmegaConf
from peft.utils.error import NoMatchingPeftModuleError

from rlt_mono import runtime
from rlt_mono.config import ConfigError, instantiate
from rlt_mono.data.models import (
    dtype_name,
    load_config,
    load_model,
    load_tokenizer,
    model_kwargs,
    model_path,
    stop_token_ids,
)
from rlt_mono.data.prompts import PromptFormat
from rlt_mono.data.rows import DataConfig, check_enough_rows, prepare_dataset
from rlt_mono.memory import device as device_memory
from rlt_mono.memory import planner as memory_planner
from rlt_mono.memory.model import GIB, Arch
from rlt_mono.placement import Placement, Role, check_gpu_kernels, check_strategy, physical_gpu, resolve_placement_for
from rlt_mono.rewards import TeacherKLReward, TeacherRewardConfig
from rlt_mono.rl import lora
from rlt_mono.rl.grpo_config import RLTConfig
from rlt_mono.rl.phases import PhaseTimer
from rlt_mono.rl.swapper import ModelSwapper
from rlt_mono.rl.trainer import RLTTrainer
from rlt_mono.rl.vllm_server import VLLMServer, free_port, serve_command
from rlt_mono.runs import checkpoints
from rlt_mono.runs.console import NoLearningSignalWarning, bars_only_in_terminal, replace_progress_callback
from rlt_mono.runs.diverged import StopOnNonFinite, divergence_hint
from rlt_mono.runs.files import RunFilesCallback
from rlt_mono.runs.outputs import write_run_config
from rlt_mono.runs.precision import warn_if_steps_round_away
from rlt_mono.runtime import set_wandb_env

logger = logging.getLogger(__name__)


def build_trainer(cfg: DictConfig) -> RLTTrainer:
    """Build the trainer a run config describes. Errors the user can fix raise ``UserError``.

    The verified checkpoint to resume from (``resume_from_checkpoint``) is ``trainer.resume_checkpoint``:
    pass it to ``trainer.train(resume_from_checkpoint=...)``.
    """
    resuming = cfg.resume_from_checkpoint not in (None, False)
    output_dir = checkpoints.resolve_output_dir(cfg.output_dir, cfg.run_dir, resuming=resuming,
                                                resume_from_checkpoint=cfg.resume_from_checkpoint)
    main_process = runtime.rank() == 0
    # ---- placement ------------------------------------------------------------------------------------
    placement = resolve_placement_for(cfg.placement, use_cpu=bool(cfg.trainer.get("use_cpu", False)))
    on_gpu = placement.device(Role.ACTOR).startswith("cuda")
    check_gpu_kernels(cfg, on_gpu)
    if placement.mode == "dp":
        check_strategy(cfg, gpus=int(on_gpu), group="trainer", adapters="model")
    if on_gpu:
        # Before the trainer's config picks its device: without these variables transformers counts every visible
        # GPU as nn.DataParallel's (student_gpu sees two), which TRL refuses; a dp rank keeps its launcher's values.
        ensure_single_process_distributed_env()
    # ---- typed configs: every value checked before a model loads ---------------------------------------
    args, reward_config = trainer_and_reward_configs(cfg, output_dir, placement.use_vllm)
    data_config = instantiate(DataConfig, cfg.data, "data")
    resume_checkpoint = checkpoints.resolve_resume(output_dir, cfg.resume_from_checkpoint, args.max_steps,
                                                   world_size=runtime.world_size(), stage=cfg.stage,
                                                   trains="model")
    if main_process:
        checkpoints.remove_stale_staging(output_dir)
    set_wandb_env(cfg.logging, args.report_to)
    timer = PhaseTimer(placement.device(Role.ACTOR))
    swapper = ModelSwapper(placement.device(Role.ACTOR), timer, pin_memory=cfg.placement.pin_memory)
    # ---- models ---------------------------------------------------------------------------------------
    bars_only_in_terminal()  # the weight-writing and -loading bars too (the embedded pair's first build)
    teacher_path = model_path(cfg.model, cfg.seed, "model")
    student_path = model_path(cfg.student, cfg.seed, "student")
    tokenizer = load_tokenizer(teacher_path, "model.model_name_or_path")
    student_tokenizer = load_tokenizer(student_path, "student.model_name_or_path")
    teacher_config = load_config(teacher_path, "model.model_name_or_path")
    lora.check_rank_fits(cfg.model, teacher_config.hidden_size)
    # ---- data -----------------------------------------------------------------------------------------
    prompt_format = PromptFormat()
    max_prompt_tokens = prompt_room(teacher_config.max_position_embeddings, args)
    dataset, skipped = prepare_dataset(data_config, tokenizer, prompt_format, seed=cfg.seed,
                                       max_prompt_tokens=max_prompt_tokens)
    eval_dataset = None  # the held-out learning curve: TRL's evaluation on the first eval_questions held-out rows
    if args.eval_strategy != "no":
        eval_dataset, _ = prepare_dataset(data_config, tokenizer, prompt_format, seed=cfg.seed,
                                          max_prompt_tokens=max_prompt_tokens, split="eval")
        if args.eval_questions:
            eval_dataset = eval_dataset.select(range(min(args.eval_questions, len(eval_dataset))))
    # TRL's sampler draws generation_batch_size / num_generations distinct prompts per generation; with fewer
    # rows it yields no batch and the run ends after 0 steps.
    check_enough_rows(len(dataset), args.generation_batch_size // args.num_generations, data_config.source, skipped)
    # ---- memory: fit the run to the card before a model loads (cfg.memory: auto, speed or manual) --------
    if fit_memory(cfg, placement, teacher_config, load_config(student_path, "student.model_name_or_path"),
                  longest_prompt(dataset, tokenizer)):  # memory=auto|speed changed cfg: read it again
        args, reward_config = trainer_and_reward_configs(cfg, output_dir, placement.use_vllm)
        # memory=speed may raise the generation batch: the rows must fill it too.
        check_enough_rows(len(dataset), args.generation_batch_size // args.num_generations, data_config.source,
                          skipped)
    # placement=async: the rollout server TRL's server mode will talk to (the trainer starts it)
    server = rollout_server(cfg, args, placement, teacher_path, output_dir) if placement.one_step_off else None
    # ---- models ---------------------------------------------------------------------------------------
    teacher = load_model(teacher_path, "model.model_name_or_path", **model_kwargs(cfg.model),
                         **lora.quantization_kwargs(cfg.model, placement.device(Role.ACTOR)))
    lora.check_target_modules(cfg.model, teacher)
    student = load_model(student_path, "student.model_name_or_path", dtype=dtype_name(cfg.student.dtype)).eval()
    student.requires_grad_(False)
    swapper.place(student, "student", offload=placement.offloads(Role.STUDENT), device=placement.device(Role.STUDENT))
    # ---- reward ---------------------------------------------------------------------------------------
    try:
        reward = TeacherKLReward(
            student,
            tokenizer,
            reward_config,
            teacher_model=teacher,
            teacher_temperature=args.temperature,
            prompt_format=prompt_format,
            student_tokenizer=student_tokenizer,
            model_context=swapper.resident,
            stop_token_ids=stop_token_ids(teacher, tokenizer),
            names=(str(teacher_path), str(student_path)),
        )
    except ValueError as err:
        raise ConfigError(str(err)) from err
    # ---- trainer --------------------------------------------------------------------------------------
    try:
        trainer = RLTTrainer(
            model=teacher,
            teacher_reward=reward,
            args=args,
            train_dataset=dataset,
            eval_dataset=eval_dataset,
            processing_class=tokenizer,
            peft_config=lora.peft_config(cfg.model),
            placement=placement,
            timer=timer,
            swapper=swapper,
            reuse_policy_log_probs=reward_config.unbias_teacher_log_probs,
            rollout_server=server,
            callbacks=[RunFilesCallback(output_dir, reward, args.explanation_samples_per_step, args.plot_metrics,
                                        run_config=OmegaConf.to_container(cfg, resolve=True)),
                       NoLearningSignalWarning(),
                       StopOnNonFinite(output_dir, divergence_hint("trainer", args, teacher.dtype, "model"))],
        )
    except NoMatchingPeftModuleError as err:  # none of model.lora_target_modules is in the teacher
        raise lora.no_target_error(cfg.model, err) from err
    replace_progress_callback(trainer)  # one compact line per step under the bar, not the whole metrics dict
    trainer.checkpoint_stage = cfg.stage
    trainer.resume_checkpoint = resume_checkpoint
    if trainer.accelerator.num_processes > 1:
        check_ranks_agree(trainer)
    if main_process:
        output_dir.mkdir(parents=True, exist_ok=True)
        write_run_config(output_dir, cfg, {"trainer": set_by_build(cfg, args)})
        warn_if_steps_round_away(trainer, "model", "trainer")
    logger.info("output dir: %s", output_dir)
    return trainer


def rollout_server(cfg: DictConfig, args: RLTConfig, placement: Placement, teacher_path,
                   output_dir: Path) -> VLLMServer:
    """placement=async's rollout engine: a vLLM server (not started yet: the trainer starts it) on the placement's
    rollout GPU, serving the teacher's starting weights; ``args`` is pointed at it (TRL's server mode, a free port
    for the NCCL weight transfer). What a one-step-off rollout cannot run with is a one-line ``ConfigError``."""
    one_generation_a_step = args.steps_per_generation in (None, args.gradient_accumulation_steps)
    refused = [(not one_generation_a_step or args.num_iterations != 1,
                "it generates once per optimizer step: set trainer.steps_per_generation to "
                "trainer.gradient_accumulation_steps and trainer.num_iterations=1"),
               (args.dynamic_sampling_rounds, "trainer.dynamic_sampling_rounds > 0 generates again inside a step: "
                                              "set it to 0"),
               (cfg.model.get("load_in_4bit"), "a 4-bit (QLoRA) teacher reaches vLLM through the colocated engine "
                                              "only: use placement=mono"),
               (args.offload_actor_in_generation, "trainer.offload_actor_in_generation frees the actor's GPU for a "
                                                  "colocated engine: set it to false"),
               (int(os.environ.get("WORLD_SIZE", "1")) > 1,
                f"it trains in one process (its generation thread asks the server without TRL's gather), found "
                f"WORLD_SIZE={os.environ.get('WORLD_SIZE')}: start it with launch_mono.sh, not torchrun")]
    for value, why in refused:
        if value:
            raise ConfigError(f"placement=async: {why}")
    gpu = physical_gpu(placement.device(Role.ROLLOUT))
    port = free_port()
    # served in the teacher's dtype, the one its weights reach the server in after each step
    command = serve_command(str(teacher_path), port, dtype=dtype_name(cfg.model.dtype),
                            gpu_memory_utilization=args.vllm_gpu_memory_utilization,
                            max_model_len=getattr(args, "vllm_max_model_length", None))
    args.vllm_mode, args.vllm_server_base_url, args.vllm_group_port = "server", f"http://127.0.0.1:{port}", free_port()
    return VLLMServer(command, port, gpu, Path(output_dir) / "rollout_server.log")


def release_trainer(trainer: RLTTrainer) -> None:
    """Free what a trainer holds so the next build in the same process fits (an alias of ``RLTTrainer.release``
    for notebooks)."""
    trainer.release()


# What every rank of a data-parallel run must share: each rank plans its own GPU (memory=auto), and ranks that
# disagree on batch sizes would wait for each other's gradients forever.
RANK_SETTINGS = ("per_device_train_batch_size", "gradient_accumulation_steps", "steps_per_generation",
                 "num_generations", "max_completion_length", "vllm_gpu_memory_utilization")


def check_ranks_agree(trainer: RLTTrainer) -> None:
    """Every rank of a data-parallel run has the same ``RANK_SETTINGS`` (``ConfigError`` naming the first
    difference otherwise: set the key on the command line, or free the GPU that planned differently)."""
    mine = {key: getattr(trainer.args, key) for key in RANK_SETTINGS}
    everyone = gather_object([mine])
    for rank, theirs in enumerate(everyone):
        differ = [key for key in RANK_SETTINGS if theirs[key] != everyone[0][key]]
        if differ:
            key = differ[0]
            raise ConfigError(f"the ranks of placement=dp planned different settings: trainer.{key} is "
                              f"{everyone[0][key]} on rank 0 and {theirs[key]} on rank {rank} (memory=auto plans each "
                              f"GPU from its free memory): set trainer.{key} on the command line")


def fit_memory(cfg: DictConfig, placement: Placement, teacher_config, student_config, prompt_length: int) -> bool:
    """``rlt_mono.memory.planner`` on the actor's GPU (placement mono): log the plan; under ``memory=auto`` or
    ``memory=speed`` apply its config changes to ``cfg``, here and nowhere else, each logged as ``key: before ->
    after`` (True: something changed, the typed configs must be built again). On a CPU, with the student on
    another GPU or with the rollout on a server of its own (placement=async) nothing is planned."""
    device = torch.device(placement.device(Role.ACTOR))
    if device.type != "cuda" or placement.beside_actor(Role.STUDENT) or placement.one_step_off:
        if cfg.get("memory") in memory_planner.PLANNING_MODES:
            logger.info("memory=%s plans a run with every role on one GPU; this one (%s, %s) keeps its settings",
                        cfg.get("memory"), device, placement.mode)
        return False
    card = device_memory.read_capacity(device)  # the card less what other live processes hold
    settings = memory_planner.settings_from_config(cfg, total_gib=card.total / GIB, free_gib=card.usable / GIB,
                                                   teacher=Arch.from_config(teacher_config.to_dict()),
                                                   student=Arch.from_config(student_config.to_dict()),
                                                   prompt_length=prompt_length)
    _, changes = memory_planner.fit_plan(cfg.memory, settings)
    if changes:
        logger.info("memory=%s set %s", cfg.memory, ", ".join(f"{key}: {OmegaConf.select(cfg, key)} -> {value}"
                                                              for key, value in changes.items()))
    for key, value in changes.items():
        OmegaConf.update(cfg, key, value)
    return bool(changes)


def longest_prompt(dataset, tokenizer) -> int:
    """Tokens in the longest training prompt (the prompts are already rendered chats)."""
    return max(len(ids) for ids in tokenizer(list(dataset["prompt"]), add_special_tokens=False).input_ids)


def trainer_and_reward_configs(cfg: DictConfig, output_dir: str | Path,
                               use_vllm: bool) -> tuple[RLTConfig, TeacherRewardConfig]:
    """The typed ``trainer`` and ``reward`` groups of a run: ``RLTConfig`` of ``trainer_kwargs`` and
    ``TeacherRewardConfig``, each value checked (``ConfigError``)."""
    return (instantiate(RLTConfig, trainer_kwargs(cfg, output_dir, use_vllm), "trainer"),
            instantiate(TeacherRewardConfig, cfg.reward, "reward"))


# The trainer settings trainer_kwargs may choose for a run beyond its config (each logged where it is chosen).
BUILD_SETTINGS = ("ddp_find_unused_parameters", "model_init_kwargs", "sync_ref_model")


def set_by_build(cfg: DictConfig, args) -> dict:
    """The ``BUILD_SETTINGS`` whose value in the built ``args`` differs from the run's ``trainer`` group: what
    config.yaml records beside the config's own, so that it says what the run used."""
    return {key: getattr(args, key) for key in BUILD_SETTINGS
            if getattr(args, key, None) != cfg.trainer.get(key, None)}


def trainer_kwargs(cfg: DictConfig, output_dir: str | Path, use_vllm: bool) -> dict:
    """The ``RLTConfig`` keyword arguments of a run: the ``trainer`` group plus the run-level settings (also
    used by ``bench/bench_mono.py``, whose plain-TRL arm takes the same values)."""
    kwargs = OmegaConf.to_container(cfg.trainer, resolve=True)
    kwargs.update(output_dir=str(output_dir), run_name=cfg.run_name, seed=cfg.seed,
                  report_to=list(cfg.logging.report_to), use_vllm=use_vllm)
    if "placement" in cfg and cfg.placement.mode == "dp" and kwargs.get("ddp_find_unused_parameters") is None:
        # transformers' default (every parameter searched each step unless gradient checkpointing is on) finds
        # nothing to skip in a causal LM and costs a graph traversal per step.
        kwargs["ddp_find_unused_parameters"] = False
        logger.info("placement=dp: trainer.ddp_find_unused_parameters=false (every parameter of the teacher gets a "
                    "gradient; set it to true if yours does not)")
    if "placement" in cfg and cfg.placement.mode == "dp" and cfg.placement.get("strategy") == "fsdp2":
        # TRL loads the reference from its path with device_map="auto" unless the run is DDP or DeepSpeed; under
        # FSDP each rank sees every GPU, so "auto" would spread (or stack) the reference over cards not its own
        # before fully_shard places it. Loaded whole on the CPU instead, each rank shards it onto its own GPU.
        kwargs["model_init_kwargs"] = {**(kwargs.get("model_init_kwargs") or {}), "device_map": None}
        logger.info("placement.strategy=fsdp2: TRL loads the reference without a device map (where TRL says "
                    "model_init_kwargs are ignored, it means for the teacher, which rlt_mono loads)")
    if lora.lora_rank(cfg.model) and kwargs.get("sync_ref_model"):
        # The reference of a LoRA teacher is the teacher with its adapters disabled, which TRL does not mix.
        logger.info("model.lora_r=%s: the reference is the base model (adapters disabled); trainer.sync_ref_model "
                    "is off", cfg.model.lora_r)
        kwargs["sync_ref_model"] = False
    return kwargs


def prompt_room(max_position_embeddings: int, args) -> int:
    """The longest prompt a run takes: a prompt must leave room for a whole completion
    (``args.max_completion_length``) in the teacher's context (TRL 1.16 does not truncate), and in vLLM's where the
    engine is given a shorter one (``args.vllm_max_model_length``); a ``ConfigError`` where no prompt fits."""
    context, context_name = max_position_embeddings, "the teacher's max_position_embeddings"
    engine_context = getattr(args, "vllm_max_model_length", None) if args.use_vllm else None
    if engine_context and engine_context < context:
        context, context_name = engine_context, "trainer.vllm_max_model_length"
    room = context - args.max_completion_length
    if room <= 0:
        raise ConfigError(f"trainer.max_completion_length={args.max_completion_length} leaves no room for a prompt "
                          f"in a {context}-token context ({context_name}): lower it, or raise it")
    return room


def ensure_single_process_distributed_env() -> None:
    """A lone GPU process as a one-rank distributed run: TRL's colocated vLLM engine joins a torch.distributed
    group, and transformers then gives the trainer one GPU, not every visible one."""
    defaults = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1"}
    for key, value in defaults.items():
        os.environ.setdefault(key, value)
    if "MASTER_PORT" not in os.environ:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            os.environ["MASTER_PORT"] = str(s.getsockname()[1])
