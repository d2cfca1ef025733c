"""The SFT stages' code: supervised fine-tuning of the teacher (RLT's warm-up) or of a student, with TRL's SFTTrainer.

One code path for two stages (declared in ``rlt_mono.stages.teacher_sft`` and ``rlt_mono.stages.student_sft``, whose
run functions import this module), chosen by the run config's ``stage``:

- ``teacher_sft`` trains ``model`` on the teacher chat. Prompt: the chat rendered with the teacher's chat template
  up to and including the prefilled ``<|begin_of_explanation|>`` + ``\\n\\n`` (exactly what the RL stage continues).
  Completion: the explanation (column ``sft.explanation_column``, default ``reasoning_trace``) +
  ``<|end_of_explanation|>``.
- ``student_sft`` trains ``student`` on the student chat. Prompt: student system prompt + question, with the
  generation prompt. Completion: ``PromptFormat.student_completion(explanation, solution)``, the explanation being
  a distilled one (``explanation``, written by the distill stage) or the raw trace (``reasoning_trace``, baseline).

Both are tokenized here, prompt and completion apart (``build_sft_dataset``), with a ``completion_mask`` that TRL
turns into labels (``completion_only_loss``): the loss covers only what the model writes. Each completion ends with
``eos_token``: unless ``sft.eos_token`` names one, the token the chat template closes an assistant turn with
(``<|im_end|>`` in ChatML), so the model learns to end its turn right after the closing tag, where the RL stage
and vLLM stop generating. Method and warm-up settings: docs/METHOD.md.

Rows are split as data.py splits them (by question; ``data.eval_rows`` / ``data.eval_fraction``): the model never
trains on a held-out question, and its loss on them is measured before and after training (TRL's ``eval_loss``:
the token-mean NLL of the completions, averaged over eval batches; none when nothing is held out).

A run leaves in ``<output_dir>``: ``config.yaml``, ``metrics.jsonl`` (train and held-out losses by step),
``checkpoint-*`` (resumable with ``resume_from_checkpoint``), ``final/`` (model + tokenizer; the RL stage loads it
as ``model.model_name_or_path=<output_dir>/final``) and ``sft_summary.json`` (rows, steps, train loss first/last,
held-out loss before/after).

Run::

    ./launch_mono.sh cfgs/run_cfg/teacher_sft.yaml size=tiny                # CPU, embedded tiny teacher
    ./launch_mono.sh cfgs/run_cfg/teacher_sft.yaml data=custom data.source=rows.jsonl
    ./launch_mono.sh cfgs/run_cfg/student_sft.yaml data.source=outputs/distill/.../rows.jsonl
"""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass, field
from pathlib import Path

import datasets
import torch
import trl
from omegaconf import DictConfig, OmegaConf
from transformers import EarlyStoppingCallback, PreTrainedTokenizerBase

from rlt_mono import runtime
from rlt_mono.config import ConfigError, config_group, instantiate
from rlt_mono.data.models import load_model, load_tokenizer, model_kwargs
from rlt_mono.data.models import model_path as resolve_model
from rlt_mono.data.prompts import PromptFormat
from rlt_mono.data.rows import (
    DataConfig,
    check_cap,
    coverage,
    group_of,
    load_rows,
    sample_rows,
    split_questions,
    validate_rows,
)
from rlt_mono.errors import UserError
from rlt_mono.placement import check_gpu_kernels, warn_unused_options
from rlt_mono.rl import lora
from rlt_mono.runs import checkpoints, console
from rlt_mono.runs.atomic_write import write_json
from rlt_mono.runs.diverged import StopOnNonFinite, divergence_hint
from rlt_mono.runs.files import RunFilesCallback
from rlt_mono.runs.outputs import EVAL_EVENT, METRICS_FILE, read_metrics, write_run_config
from rlt_mono.runs.precision import warn_if_steps_round_away
from rlt_mono.runtime import set_wandb_env
from rlt_mono.stages import adapter_stages, student_sft, teacher_sft
from rlt_mono.stages.final_model import save_final
from rlt_mono.study import diversity

logger = logging.getLogger(__name__)

# The stages this module runs, by name (each one's module declares it: the config group of the model it trains).
SFT_STAGES = {stage.name: stage for stage in (teacher_sft.STAGE, student_sft.STAGE)}
SUMMARY_FILE = "sft_summary.json"
# data.py's column for an SFT target: the stage's explanation column is validated under this name.
TARGET_COLUMN = "reasoning_trace"
# sft.explanation_column for a student that learns question -> solution with an empty thought (the dataset's own
# worked solutions: the study's positive control).
NO_EXPLANATION = "none"


@config_group("sft")
@dataclass
class SFTStageConfig(trl.SFTConfig):
    """``trl.SFTConfig`` plus the stage's own option (the ``sft`` config group); TRL's fields keep their meaning."""

    explanation_column: str = field(
        default="reasoning_trace",
        metadata={
            "help": "Data column holding the explanation trained on: reasoning_trace (the data's traces: the "
            "teacher warm-up, the raw-trace student baseline), explanation (rows written by the distill stage), or "
            "none (student_sft only: the student learns question -> solution with an empty thought)."
        },
    )
    early_stopping_patience: int = field(
        default=0,
        metadata={
            "help": "Stop when the held-out loss has not improved for this many evaluations (eval_strategy=steps, "
            "every eval_steps) and keep the best checkpoint as final/ (transformers' EarlyStoppingCallback with "
            "load_best_model_at_end). 0: off, train for max_steps / num_train_epochs."
        },
    )
    diversity_prompts: int = field(
        default=16,
        metadata={
            "help": "teacher_sft: held-out prompts on which the trained teacher samples explanations, to measure "
            "how varied it still is (rlt_mono.study.diversity; sft_summary.json's diversity). 0: not measured."
        },
    )
    diversity_samples: int = field(
        default=4, metadata={"help": "Explanations sampled per held-out prompt for the diversity measurement."}
    )
    diversity_temperature: float = field(
        default=0.7,
        metadata={"help": "Sampling temperature of the diversity measurement: the RL stage's trainer.temperature."},
    )
    diversity_max_new_tokens: int = field(
        default=256,
        metadata={"help": "Longest explanation sampled for the diversity measurement, in tokens."},
    )

    def __post_init__(self) -> None:
        # TRL and torch take these as they are and fail deep inside training (torch's "Invalid learning rate",
        # a ZeroDivisionError); max_steps=0 silently means "train by epochs" to transformers.
        if self.learning_rate < 0:
            raise ValueError(f"learning_rate must be >= 0, got {self.learning_rate}")
        for name in ("per_device_train_batch_size", "per_device_eval_batch_size", "gradient_accumulation_steps"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.max_steps == 0 or self.max_steps < -1:
            raise ValueError(f"max_steps must be >= 1 (or -1: train sft.num_train_epochs), got {self.max_steps}")
        super().__post_init__()


# ---- examples ---------------------------------------------------------------------------------------------------
def build_sft_dataset(
    rows: list[dict], tokenizer: PreTrainedTokenizerBase, stage: str, explanation_column: str,
    eos_token: str | None = None, prompt_format: PromptFormat | None = None, max_length: int | None = None,
) -> datasets.Dataset:
    """Tokenized examples of ``stage``'s chat, one per row: ``input_ids`` and ``completion_mask``.

    The prompt (the chat rendered with ``tokenizer``'s template up to where the model starts writing) and the
    completion (what it writes, then ``eos_token``) are encoded apart and joined: the prompt ids are exactly the
    ones the RL stage and vLLM continue from. Encoding the joined text instead lets BPE merge across the boundary
    (SmolLM2 merges the prompt's final ``\n\n`` with the completion's first token), and TRL then trains on a
    context the model never sees at generation time.

    With ``max_length`` no row is tokenized for longer than it needs (a 1 MB row takes seconds): a token spans at
    most as many characters as the longest vocabulary entry, so a prompt longer than ``max_length`` times that has
    more than ``max_length`` tokens and leaves its completion nothing (the row is dropped, as TRL would drop it,
    and counted in the log); a completion is cut to that many characters before tokenizing (TRL cuts its tokens at
    ``max_length`` anyway).
    """
    prompt_format = prompt_format or PromptFormat()
    most_chars = None if max_length is None else max_length * max(len(token) for token in tokenizer.get_vocab())
    too_long = 0
    eos_ids = [tokenizer.convert_tokens_to_ids(eos_token or tokenizer.eos_token)]
    examples = {"input_ids": [], "completion_mask": []}
    for row in rows:
        explanation = "" if explanation_column == NO_EXPLANATION else row[explanation_column]
        if stage == "teacher_sft":
            messages = prompt_format.teacher_messages(row["question"], row["solution"])
            prompt = tokenizer.apply_chat_template(messages, tokenize=False, continue_final_message=True)
            completion = explanation + prompt_format.explanation_end
        elif stage == "student_sft":
            messages = prompt_format.student_messages(row["question"], explanation, row["solution"])[:-1]
            prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
            completion = prompt_format.student_completion(explanation, row["solution"])
        else:
            raise UserError(f"stage={stage!r} is not an SFT stage; use one of {sorted(SFT_STAGES)}")
        if most_chars is not None and len(prompt) > most_chars:
            too_long += 1
            continue
        completion = completion if most_chars is None else completion[:most_chars]
        prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        completion_ids = tokenizer(completion, add_special_tokens=False)["input_ids"] + eos_ids
        examples["input_ids"].append(prompt_ids + completion_ids)
        examples["completion_mask"].append([0] * len(prompt_ids) + [1] * len(completion_ids))
    if too_long:
        logger.warning("%s: dropped %d of %d rows whose prompt alone is over sft.max_length=%d tokens (at least %d "
                       "characters) without tokenizing them", stage, too_long, len(rows), max_length, most_chars)
    return datasets.Dataset.from_dict(examples)


def end_of_turn_token(tokenizer: PreTrainedTokenizerBase, key: str) -> str | None:
    """The token ``tokenizer``'s chat template closes an assistant turn with (``<|im_end|>`` in ChatML), or None
    when the template writes nothing after the assistant's text (TRL then appends the tokenizer's eos)."""
    marker = "\u2063ASSISTANT-TEXT\u2063"  # a string no template writes itself
    chat = [{"role": "user", "content": "?"}, {"role": "assistant", "content": marker}]
    closing = tokenizer.apply_chat_template(chat, tokenize=False).split(marker, 1)[1].strip()
    if not closing:
        return None
    if closing not in tokenizer.get_vocab():
        raise UserError(f"{key}: its chat template closes an assistant turn with {closing!r}, which is not one "
                        "token: set sft.eos_token=<the token that ends a turn>")
    return closing


# ---- rows -------------------------------------------------------------------------------------------------------
def load_sft_rows(data_config: DataConfig, seed: int, stage: str, explanation_column: str
                  ) -> tuple[list[dict], list[dict], int]:
    """Train rows, held-out rows and the number of bad rows skipped; every row kept has ``question``,
    ``solution`` and a non-empty ``explanation_column``. ``data.max_rows`` caps each split.

    The split is data.py's (``split_questions``): by question, the same held-out questions as the distill and eval
    stages. It is applied here to the source's rows with every column kept, because ``load_split`` keeps only
    data.py's own columns and a distill row's ``explanation`` is not one of them.

    Raises:
        UserError: unreadable source, no row with ``explanation_column``, a bad row (with ``on_bad_row=error``),
            no train row.
    """
    train_questions, heldout_questions = split_questions(data_config, seed)
    if explanation_column != NO_EXPLANATION:
        rows, skipped = _usable_rows(load_rows(data_config, seed=seed), data_config, stage, explanation_column)
    elif stage == "student_sft":
        rows, skipped = validate_rows(load_rows(data_config, seed=seed), data_config.source, data_config.on_bad_row,
                                      data_config.on_long_row)
    else:
        raise UserError(f"sft.explanation_column={NO_EXPLANATION} trains a student on solutions alone; {stage} learns "
                        "to write explanations: set sft.explanation_column to the column that holds them")
    # A row of a held-out template that the eval split did not sample is in neither: no stage trains on it.
    train = [row for row in rows if _question_key(row["question"]) in train_questions]
    heldout = [row for row in rows if _question_key(row["question"]) in heldout_questions]
    if data_config.max_rows is not None:
        check_cap(data_config.max_rows, len(train), "train", data_config.source)
        train = sample_rows(train, data_config.max_rows, seed, group_of)
        heldout = sample_rows(heldout, data_config.max_rows, seed, group_of)
        logger.info("%s: a seeded sample of %d training rows (data.max_rows)%s", stage, len(train), coverage(train))
    if not train:
        raise UserError(f"data.source={data_config.source}: no usable train rows for {stage} ({skipped} skipped, "
                        f"{len(heldout)} held out): add rows, or hold fewer out (data.eval_rows / data.eval_fraction)")
    return train, heldout, skipped


def _question_key(question: str) -> str:
    """A question's identity in data.py's split: runs of whitespace read as one space."""
    return " ".join(question.split())


def _usable_rows(rows: list[dict], data_config: DataConfig, stage: str, column: str) -> tuple[list[dict], int]:
    """``validate_rows`` plus the explanation column: a bad row raises or is dropped, as ``data.on_bad_row`` says.

    The explanation column goes through ``validate_rows`` as data.py's SFT target column (``reasoning_trace``),
    which it checks and keeps.
    """
    source = data_config.source
    if rows and not any(column in row for row in rows):
        raise UserError(f"{stage} trains on column {column!r}, which data.source={source} does not have (columns: "
                        f"{sorted(rows[0])}): set sft.explanation_column to the column with the explanations")
    if stage == "student_sft" and column != "explanation" and any("explanation" in row for row in rows):
        logger.warning("data.source=%s has an explanation column (rows written by distill) but student_sft trains on "
                       "%r: set sft.explanation_column=explanation to train on the teacher's explanations", source,
                       column)
    with_target = []
    for index, row in enumerate(rows):
        value = row.get(column)
        if isinstance(value, str) and value.strip():
            with_target.append({**row, TARGET_COLUMN: value})
        elif data_config.on_bad_row == "error":
            what = ("is missing" if value is None else "is empty" if isinstance(value, str)
                    else f"is a {type(value).__name__}, not a string")
            raise UserError(f"{source}: row {index}: column {column!r} {what} (fix the row, or set "
                            "data.on_bad_row=skip to drop such rows)")
    if len(with_target) < len(rows):
        logger.warning("%s: skipped %d of %d rows without a usable %r", source, len(rows) - len(with_target),
                       len(rows), column)
    valid, skipped = validate_rows(with_target, source, data_config.on_bad_row, data_config.on_long_row)
    return [{**row, column: row[TARGET_COLUMN]} for row in valid], skipped + len(rows) - len(with_target)


# ---- the stage --------------------------------------------------------------------------------------------------
@dataclass
class SFTRun:
    """An SFT stage built from its config, ready to train (``build_sft``); ``run_sft`` trains it."""

    stage: str
    trainer: trl.SFTTrainer
    output_dir: Path
    # Verified checkpoint to resume from (None: a fresh run).
    resume_checkpoint: str | None
    # Folder or hub id of the model trained.
    model_path: str
    # Rows: "train", "heldout", "skipped" (bad rows dropped), "truncated" (train rows cut at max_length).
    rows: dict[str, int]
    # teacher_sft: held-out teacher prompts the diversity measurement samples from (empty: not measured).
    diversity_prompts: list[str] = field(default_factory=list)


MEMORY_HINT = "sft.max_length or sft.per_device_train_batch_size (raise gradient_accumulation_steps to keep the batch)"


class StageSFTTrainer(checkpoints.VerifiedCheckpoints, trl.SFTTrainer):
    """TRL's SFT trainer with verified, atomic checkpoints (``checkpoints.VerifiedCheckpoints``)."""


def build_sft(cfg: DictConfig) -> SFTRun:
    """Build the SFT stage a run config describes. Reads top to bottom: run folder -> typed configs -> resume
    check -> rows -> model -> trainer. Errors a user can fix raise ``UserError``, before any model loads if they can.
    """
    stage = cfg.get("stage")
    if stage not in SFT_STAGES:
        raise UserError(f"stage={stage!r}: rlt_mono.stages.sft runs {' or '.join(sorted(SFT_STAGES))}")
    resuming = cfg.resume_from_checkpoint not in (None, False)
    output_dir = checkpoints.resolve_output_dir(cfg.output_dir, cfg.run_dir, resuming=resuming,
                                                resume_from_checkpoint=cfg.resume_from_checkpoint)
    # ---- typed configs: every value checked before a model loads -------------------------------------------------
    sft_kwargs = OmegaConf.to_container(cfg.sft, resolve=True)
    sft_kwargs.update(output_dir=str(output_dir), run_name=cfg.run_name, seed=cfg.seed,
                      report_to=list(cfg.logging.report_to))
    # Off a terminal (a log file, a pipe) no bars: transformers prints one line per logged step (rlt_mono.runs.console).
    bars = console.bars_only_in_terminal()
    if sft_kwargs.get("disable_tqdm") is None:  # +sft.disable_tqdm=... decides for itself
        sft_kwargs["disable_tqdm"] = not bars
    data_config = instantiate(DataConfig, cfg.data, "data")
    if sft_kwargs.get("early_stopping_patience"):
        check_early_stopping(sft_kwargs)
        # The best checkpoint by held-out loss becomes final/ (transformers keeps it from save_total_limit).
        sft_kwargs.update(load_best_model_at_end=True, metric_for_best_model="eval_loss", greater_is_better=False)
    args = instantiate(SFTStageConfig, sft_kwargs, "sft")
    declared = SFT_STAGES[stage]
    check_gpu_kernels(cfg, on_gpu=torch.cuda.is_available() and not args.use_cpu, group=declared.trainer_group)
    warn_unused_options(cfg, None, plans_memory=declared.plans_memory, sampling_group=declared.sampling_group)
    # An epoch-based run (max_steps=-1) has no step limit to check a checkpoint against; transformers ends it.
    resume_checkpoint = checkpoints.resolve_resume(output_dir, cfg.resume_from_checkpoint,
                                                   args.max_steps if args.max_steps > 0 else sys.maxsize,
                                                   world_size=runtime.world_size(), stage=stage,
                                                   trains=declared.trains)
    set_wandb_env(cfg.logging, args.report_to)
    # ---- rows (before the model: a data mistake costs no model load) ----------------------------------------------
    train_rows, heldout_rows, skipped = load_sft_rows(data_config, cfg.seed, stage, args.explanation_column)
    logger.info("%s: %d train rows, %d held-out rows from %s (%d skipped)", stage, len(train_rows),
                len(heldout_rows), data_config.source, skipped)
    # The held-out loss before training is TRL's evaluation at step 0 inside train(), once per run (a resume reads
    # it back): under FSDP2 accelerate prepares the model only together with its optimizer, which train() does.
    args.eval_on_start = bool(heldout_rows)
    if args.early_stopping_patience and not heldout_rows:
        raise UserError(f"sft.early_stopping_patience={args.early_stopping_patience} stops on the held-out loss, but "
                        f"data.source={data_config.source} holds no question out: set data.eval_rows=N or "
                        "data.eval_fraction=F, or sft.early_stopping_patience=0")
    # ---- model ----------------------------------------------------------------------------------------------------
    group = declared.trains
    if lora.lora_rank(cfg[group]):  # a silent full fine-tune would not be what was asked for
        raise ConfigError(f"{group}.lora_r={cfg[group].lora_r}: {stage} trains every weight (LoRA adapters are "
                          f"{adapter_stages()}'s option): set {group}.lora_r=0")
    key = f"{group}.model_name_or_path"
    model_path = resolve_model(cfg[group], cfg.seed, group)
    tokenizer = load_tokenizer(model_path, key)
    if args.eos_token is None:
        args.eos_token = end_of_turn_token(tokenizer, key)
    elif args.eos_token not in tokenizer.get_vocab():  # TRL's trainer would stop on it, with a traceback
        raise ConfigError(f"sft.eos_token={args.eos_token!r} is not a token of {key}={model_path}'s vocabulary: set "
                          "one of its tokens, or sft.eos_token=null for the token its chat template ends a turn with")
    # the rows in tokens need only the tokenizer: rows that all leave no completion cost no model load
    train_dataset = build_sft_dataset(train_rows, tokenizer, stage, args.explanation_column, args.eos_token,
                                      max_length=args.max_length)
    if len(train_dataset) == 0:
        raise rows_too_long(len(train_rows), args.max_length)
    model = load_model(model_path, key, **model_kwargs(cfg[group]))
    # ---- trainer --------------------------------------------------------------------------------------------------
    output_dir.mkdir(parents=True, exist_ok=True)
    # the run's files first: a diverged step's row is in metrics.jsonl when StopOnNonFinite stops the run
    callbacks = [RunFilesCallback(output_dir, samples_per_step=0, plot=False),
                 StopOnNonFinite(output_dir, divergence_hint("sft", args, model.dtype, group))]
    if args.early_stopping_patience:
        callbacks.append(EarlyStoppingCallback(early_stopping_patience=args.early_stopping_patience))
    trainer = StageSFTTrainer(
        model=model,
        args=args,
        train_dataset=train_dataset,
        eval_dataset=build_sft_dataset(heldout_rows, tokenizer, stage, args.explanation_column, args.eos_token,
                                       max_length=args.max_length)
        if heldout_rows
        else None,
        processing_class=tokenizer,
        callbacks=callbacks,
    )
    console.replace_progress_callback(trainer)  # one line per logged step (and one bar in a terminal), no dicts
    trainer.checkpoint_stage = stage
    if trainer.args.should_save:  # data parallel: rank 0 writes the run's files
        write_run_config(output_dir, cfg)
        warn_if_steps_round_away(trainer, group, "sft")
    if len(trainer.train_dataset) == 0:  # TRL drops a row cut before its completion starts
        raise rows_too_long(len(train_rows), args.max_length)
    truncated = count_truncated(trainer.train_dataset, len(train_rows), tokenizer.eos_token_id)
    if truncated:
        logger.warning("%d of %d train rows are longer than sft.max_length=%s tokens: their ends are cut, so the "
                       "model does not learn to close them; raise sft.max_length", truncated, len(train_rows),
                       args.max_length)
    rows = {"train": len(train_rows), "heldout": len(heldout_rows), "skipped": skipped, "truncated": truncated}
    diversity_prompts = [] if stage != "teacher_sft" else [
        tokenizer.apply_chat_template(PromptFormat().teacher_messages(row["question"], row["solution"]), tokenize=False,
                                      continue_final_message=True)
        for row in heldout_rows[: args.diversity_prompts]]
    return SFTRun(stage, trainer, output_dir, resume_checkpoint, model_path, rows, diversity_prompts)


def rows_too_long(rows: int, max_length: int) -> UserError:
    """The one line for SFT rows that all leave no completion within ``sft.max_length``."""
    return UserError(f"every one of the {rows} train rows is longer than sft.max_length={max_length} tokens before "
                     "its completion starts: raise sft.max_length")


def check_early_stopping(sft: dict) -> None:
    """What early stopping needs from the other ``sft`` keys, as a one-line ``ConfigError``: a held-out loss every
    ``eval_steps`` and a checkpoint at each of those evaluations (the best one becomes final/)."""
    patience = sft["early_stopping_patience"]
    if not isinstance(patience, int) or isinstance(patience, bool) or patience < 0:
        raise ConfigError(f"sft.early_stopping_patience must be a whole number >= 0, got {patience!r}")
    if sft.get("eval_strategy") != "steps":
        raise ConfigError(f"sft.early_stopping_patience={patience} stops on the held-out loss measured every "
                          f"sft.eval_steps: set sft.eval_strategy=steps (it is {sft.get('eval_strategy')!r})")
    eval_steps, save_steps = sft.get("eval_steps") or sft.get("logging_steps"), sft.get("save_steps")  # as TRL
    if not eval_steps or not save_steps or save_steps % eval_steps:
        raise ConfigError(f"sft.early_stopping_patience keeps the best evaluated checkpoint: sft.save_steps "
                          f"({save_steps}) must be a multiple of sft.eval_steps ({eval_steps})")


def run_sft(cfg: DictConfig) -> Path:
    """Run the SFT stage ``cfg.stage`` describes; returns the run folder (the trained model is in ``final/``).

    Held-out loss before -> train (or resume) -> held-out loss after -> ``final/`` -> ``sft_summary.json``.
    """
    run = build_sft(cfg)
    trainer, output_dir = run.trainer, run.output_dir
    measured = trainer.eval_dataset is not None
    with checkpoints.training_failures(trainer, output_dir, MEMORY_HINT):
        trainer.train(resume_from_checkpoint=run.resume_checkpoint)
        after = _heldout_loss_after(trainer) if measured else None
        final = save_final(trainer, output_dir)
        teacher_diversity = _diversity(run) if run.diversity_prompts else None
    before = _heldout_loss_before(trainer, output_dir) if measured else None
    curve = [{"step": row["step"], "eval_loss": row["eval_loss"]} for row in trainer.state.log_history
             if "eval_loss" in row]
    train_losses = [row["loss"] for row in trainer.state.log_history if "loss" in row]
    summary = {
        "stage": run.stage,
        "model": run.model_path,
        "explanation_column": trainer.args.explanation_column,
        "rows": run.rows,
        "steps": trainer.state.global_step,
        "train_loss_first": train_losses[0] if train_losses else None,
        "train_loss_last": train_losses[-1] if train_losses else None,
        # null when the data has no held-out rows
        "heldout_loss_before": before,
        "heldout_loss_after": after,
        # every held-out loss measured, by step (the curve early stopping reads)
        "heldout_curve": curve,
        "early_stopping": _early_stopping_summary(trainer) if trainer.args.early_stopping_patience else None,
        # teacher_sft: how varied the trained teacher's explanations are (rlt_mono.study.diversity); null: not measured
        "diversity": teacher_diversity.as_dict() if teacher_diversity else None,
        "final": str(final),
    }
    if trainer.args.should_save:
        write_json(output_dir / SUMMARY_FILE, summary)
    logger.info("%s done: %d steps, %s; model in %s", run.stage, summary["steps"], heldout_loss_text(before, after),
                final)
    return output_dir


def heldout_loss_text(before: float | None, after: float | None) -> str:
    """``held-out loss 1.032 -> 0.9776`` for the end-of-run line, or what was not measured and why."""
    if before is None and after is None:
        return "held-out loss: not measured (no held-out rows)"
    before_text, after_text = ("not measured" if loss is None else f"{loss:.4g}" for loss in (before, after))
    return f"held-out loss {before_text} -> {after_text}"


def _diversity(run: SFTRun) -> diversity.Diversity | None:
    """The trained teacher's explanation diversity on held-out prompts; a collapsed teacher is warned about loudly.
    One process only: under data parallel the ranks would sample apart; and not on a sharded teacher
    (placement.strategy=fsdp2), whose ``generate`` meets FSDP2's sharded parameters (found on an H200: "aten.
    embedding.default got mixed torch.Tensor and DTensor"). Both are logged, not measured."""
    args = run.trainer.args
    if runtime.world_size() > 1:
        logger.info("teacher_sft: explanation diversity is measured in one-process runs only (this run has %d "
                    "ranks)", runtime.world_size())
        return None
    if getattr(run.trainer, "is_fsdp_enabled", False):
        logger.info("teacher_sft: explanation diversity is not measured on a sharded teacher (placement.strategy="
                    "fsdp2); the same run with placement.strategy=ddp, or a one-process run, measures it")
        return None
    model = run.trainer.accelerator.unwrap_model(run.trainer.model)
    found = diversity.measure(model, run.trainer.processing_class, run.diversity_prompts, args.diversity_samples,
                              args.diversity_temperature, args.diversity_max_new_tokens,
                              PromptFormat().explanation_end, seed=args.seed)
    logger.info("teacher_sft: explanation diversity on %d held-out prompts x %d samples at temperature %s: "
                "%.2f distinct per prompt, %.0f%% of prompts with identical samples, mean token entropy %.3f nats",
                found.prompts, found.samples, found.temperature, found.distinct_per_prompt,
                100 * found.all_same_frac, found.mean_token_entropy)
    if problem := diversity.collapse_problem(found):
        logger.warning("!" * 100)
        logger.warning(problem)
        logger.warning("!" * 100)
    return found


def _early_stopping_summary(trainer: trl.SFTTrainer) -> dict:
    """Whether early stopping ended the run before its step budget, and the best held-out loss it kept."""
    best = trainer.state.best_model_checkpoint
    return {"patience": trainer.args.early_stopping_patience,
            "stopped_early": trainer.state.global_step < trainer.state.max_steps,
            "best_step": int(Path(best).name.rsplit("-", 1)[-1]) if best else None,
            "best_heldout_loss": trainer.state.best_metric}


def count_truncated(dataset: datasets.Dataset, num_rows: int, eos_token_id: int) -> int:
    """Rows TRL cut at ``max_length``: those whose tokens no longer end with the eos it appended, plus those it
    dropped (cut before their completion started)."""
    kept_whole = sum(1 for ids in dataset["input_ids"] if ids[-1] == eos_token_id)
    return num_rows - kept_whole


def _heldout_loss_before(trainer: trl.SFTTrainer, output_dir: Path) -> float | None:
    """Held-out loss of the model before training: the step-0 evaluation ``eval_on_start`` ran inside ``train()``
    (``build_sft``), kept in the trainer's history, which a resumed run reloads from its checkpoint. A checkpoint
    of an earlier rlt_mono, which measured it before ``train()``, has it only in the run's metrics.jsonl."""
    def at_step_0(rows: list[dict]) -> float | None:
        return next((row["eval_loss"] for row in rows if row.get("step") == 0 and "eval_loss" in row), None)

    loss = at_step_0(trainer.state.log_history)
    if loss is None and (output_dir / METRICS_FILE).exists():
        loss = at_step_0(read_metrics(output_dir / METRICS_FILE, EVAL_EVENT))
    return loss


def _heldout_loss_after(trainer: trl.SFTTrainer) -> float:
    """Held-out loss after training: of the best checkpoint, which early stopping loaded; else the evaluation
    ``sft.eval_strategy`` ran at the last step, else a new one."""
    if trainer.args.load_best_model_at_end and trainer.state.best_metric is not None:
        return trainer.state.best_metric
    for row in reversed(trainer.state.log_history):
        if "eval_loss" in row and row.get("step") == trainer.state.global_step:
            return row["eval_loss"]
    return trainer.evaluate()["eval_loss"]
