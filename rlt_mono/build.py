"""Wiring: a composed config in, a ready ``RLTTrainer`` out (used by the CLI and by notebooks).

Reads top to bottom: placement -> models -> data -> reward -> trainer -> outputs.
"""

from __future__ import annotations

import dataclasses
import gc
import logging
import os
import socket
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf
from transformers import AutoModelForCausalLM, AutoTokenizer

from rlt_mono.config import ConfigError, RLTConfig
from rlt_mono.data import DataConfig, prepare_dataset
from rlt_mono.outputs import RunFilesCallback
from rlt_mono.phases import PhaseController
from rlt_mono.placement import PlacementError, Role, resolve_placement
from rlt_mono.prompts import PromptFormat
from rlt_mono.rewards import TeacherKLReward, TeacherRewardConfig
from rlt_mono.trainer import RLTTrainer

logger = logging.getLogger(__name__)
EMBEDDED_PREFIX = "embedded:"


def build_trainer(cfg: DictConfig) -> RLTTrainer:
    """Build the trainer a run config describes. Errors the user can fix raise ``ConfigError``."""
    if cfg.resume_from_checkpoint is True and not cfg.output_dir:
        raise ConfigError(
            "resume_from_checkpoint=true resumes from the newest checkpoint in output_dir, but output_dir is null "
            "(a new folder each run): set output_dir=<the run's folder>, or resume_from_checkpoint=<checkpoint path>"
        )
    output_dir = Path(cfg.output_dir or f"outputs/{cfg.run_name}/{_timestamp()}")
    # ---- placement ------------------------------------------------------------------------------------
    use_cpu = bool(cfg.trainer.get("use_cpu", False)) or not torch.cuda.is_available()
    try:
        placement = resolve_placement(
            cfg.placement.mode,
            0 if use_cpu else torch.cuda.device_count(),
            offload_reference=cfg.placement.offload_reference,
            offload_critic=cfg.placement.offload_student,
        )
    except PlacementError as err:
        raise ConfigError(str(err)) from err
    logger.info("\n%s", placement.table())
    use_vllm = resolve_rollout(cfg.placement.rollout, use_cpu)
    if use_vllm:
        ensure_single_process_distributed_env()
    phases = PhaseController(placement.device(Role.ACTOR), offload=True, pin_memory=cfg.placement.pin_memory)
    # ---- models ---------------------------------------------------------------------------------------
    teacher_path = resolve_model_path(cfg.model.model_name_or_path, cfg.seed)
    student_path = resolve_model_path(cfg.student.model_name_or_path, cfg.seed)
    tokenizer = AutoTokenizer.from_pretrained(teacher_path)
    if tokenizer.pad_token is None:
        logger.info("tokenizer has no pad token: using eos %r", tokenizer.eos_token)
        tokenizer.pad_token = tokenizer.eos_token
    student_tokenizer = AutoTokenizer.from_pretrained(student_path)
    teacher = AutoModelForCausalLM.from_pretrained(teacher_path, **_model_kwargs(cfg.model))
    student = AutoModelForCausalLM.from_pretrained(student_path, dtype=_dtype(cfg.student.dtype)).eval()
    student.requires_grad_(False)
    phases.place(student, "student (critic)", offload=Role.CRITIC in placement.offloaded,
                 device=placement.device(Role.CRITIC))
    # ---- data -----------------------------------------------------------------------------------------
    prompt_format = PromptFormat()
    data_config = _instantiate(DataConfig, cfg.data, "data")
    dataset, _ = prepare_dataset(data_config, tokenizer, prompt_format, seed=cfg.seed)
    # ---- trainer arguments ----------------------------------------------------------------------------
    trainer_kwargs = OmegaConf.to_container(cfg.trainer, resolve=True)
    trainer_kwargs.update(
        output_dir=str(output_dir),
        run_name=cfg.run_name,
        seed=cfg.seed,
        report_to=list(cfg.logging.report_to),
        use_vllm=use_vllm,
    )
    if "wandb" in trainer_kwargs["report_to"]:
        os.environ.setdefault("WANDB_PROJECT", cfg.logging.wandb_project)
        os.environ.setdefault("WANDB_MODE", cfg.logging.wandb_mode)
    args = _instantiate(RLTConfig, trainer_kwargs, "trainer")
    # ---- reward ---------------------------------------------------------------------------------------
    reward_config = _instantiate(TeacherRewardConfig, cfg.reward, "reward")
    try:
        reward = TeacherKLReward(
            student,
            tokenizer,
            reward_config,
            teacher_model=teacher,
            teacher_temperature=args.temperature,
            prompt_format=prompt_format,
            student_tokenizer=student_tokenizer,
            model_context=phases.resident,
            stop_token_ids=_stop_token_ids(teacher, tokenizer),
            names=(str(teacher_path), str(student_path)),
        )
    except ValueError as err:
        raise ConfigError(str(err)) from err
    # ---- trainer --------------------------------------------------------------------------------------
    trainer = RLTTrainer(
        model=teacher,
        reward_funcs=[reward],
        args=args,
        train_dataset=dataset,
        processing_class=tokenizer,
        phases=phases,
        offload_reference=Role.REFERENCE in placement.offloaded,
        critic_reward=reward if placement.mode == "split" else None,
        reuse_policy_log_probs=reward_config.unbias_teacher_log_probs,
        callbacks=[RunFilesCallback(output_dir, reward, args.explanation_samples_per_step, args.plot_metrics)],
    )
    trainer.teacher_reward = reward
    output_dir.mkdir(parents=True, exist_ok=True)
    OmegaConf.save(cfg, output_dir / "config.yaml", resolve=True)
    logger.info("output dir: %s", output_dir)
    return trainer


def release_trainer(trainer: RLTTrainer) -> None:
    """Free what a trainer holds (vLLM engine, models, optimizer, pinned copies, CUDA cache) so the next
    build in the same process fits."""
    trainer.close()
    trainer.accelerator.free_memory()
    for name in ("model", "model_wrapped", "ref_model", "optimizer", "lr_scheduler", "teacher_reward",
                 "vllm_generation", "critic_reward"):
        if hasattr(trainer, name):
            setattr(trainer, name, None)
    trainer.reward_funcs = []
    for callback in trainer.callback_handler.callbacks:
        if isinstance(callback, RunFilesCallback):
            callback.reward = None
    trainer.phases.forget()
    gc.collect()
    trainer.phases.empty_cache()


def _stop_token_ids(model, tokenizer) -> set[int]:
    """Ids that end a completion: the generation config's eos id(s), the tokenizer's eos and pad."""
    eos = model.generation_config.eos_token_id
    ids = set(eos if isinstance(eos, list) else [eos]) | {tokenizer.eos_token_id, tokenizer.pad_token_id}
    return {i for i in ids if i is not None}


def resolve_model_path(name_or_path: str, seed: int) -> str:
    """``embedded:teacher`` / ``embedded:student`` -> the locally built tiny pair; anything else unchanged."""
    if not name_or_path.startswith(EMBEDDED_PREFIX):
        return name_or_path
    from rlt_mono.embedded import build_tiny_pair

    role = name_or_path.removeprefix(EMBEDDED_PREFIX)
    if role not in ("teacher", "student"):
        raise ConfigError(f"unknown embedded model {name_or_path!r}; use embedded:teacher or embedded:student")
    pair = build_tiny_pair()
    return str(pair.teacher_path if role == "teacher" else pair.student_path)


def resolve_rollout(choice: str, use_cpu: bool) -> bool:
    """Whether rollouts use vLLM (colocated): ``auto`` picks it when vLLM is installed and a GPU is in use."""
    if choice not in ("auto", "vllm", "transformers"):
        raise ConfigError(f"placement.rollout must be auto, vllm or transformers, got {choice!r}")
    try:
        import vllm  # noqa: F401

        has_vllm = True
    except ImportError:
        has_vllm = False
    if choice == "vllm" and (use_cpu or not has_vllm):
        raise ConfigError(
            "placement.rollout=vllm needs a CUDA GPU and the vllm package "
            f"(GPU in use: {not use_cpu}, vllm installed: {has_vllm}); use placement.rollout=auto or transformers"
        )
    use_vllm = choice == "vllm" or (choice == "auto" and has_vllm and not use_cpu)
    logger.info("rollouts: %s", "vLLM colocated" if use_vllm else "transformers generate")
    return use_vllm


def ensure_single_process_distributed_env() -> None:
    """TRL's colocated vLLM engine joins a torch.distributed group: give a lone process its variables."""
    defaults = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1"}
    for key, value in defaults.items():
        os.environ.setdefault(key, value)
    if "MASTER_PORT" not in os.environ:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            os.environ["MASTER_PORT"] = str(s.getsockname()[1])


def _instantiate(cls, values, group: str):
    values = OmegaConf.to_container(values, resolve=True) if isinstance(values, DictConfig) else dict(values)
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise ConfigError(f"{group}: unknown keys {unknown}")
    try:
        return cls(**values)
    except (TypeError, ValueError) as err:
        raise ConfigError(f"{group}: {err}") from err


def _dtype(name: str) -> str:
    if name not in ("float32", "bfloat16", "float16"):
        raise ConfigError(f"dtype must be float32, bfloat16 or float16, got {name!r}")
    return name


def _model_kwargs(model_cfg: DictConfig) -> dict:
    kwargs = {"dtype": _dtype(model_cfg.dtype)}
    if model_cfg.get("attn_implementation"):
        kwargs["attn_implementation"] = model_cfg.attn_implementation
    return kwargs


def _timestamp() -> str:
    import datetime

    return datetime.datetime.now().strftime("%Y-%m-%d_%H-%M-%S")
