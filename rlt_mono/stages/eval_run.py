"""The eval stage's code (``rlt_mono.stages.eval`` declares the stage, checks its options and reads answers): the
teacher half (one explanation per question, scored by the reward, and the student's solution log-prob given it),
the student half (the student's greedy answers), and the run that writes ``eval.json`` and ``eval_rows.jsonl``."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import torch
from omegaconf import DictConfig

from rlt_mono.data.prompts import PromptFormat
from rlt_mono.errors import UserError
from rlt_mono.rewards import TeacherRewardConfig
from rlt_mono.rewards.log_probs import range_log_probs
from rlt_mono.runs.atomic_write import write_json, write_text
from rlt_mono.runs.outputs import write_run_config
from rlt_mono.stages import eval as stage
from rlt_mono.stages.eval import (
    THE_ANSWER_IS,
    EvalConfig,
    answer_record,
    student_question,
    summarize_records,
    warn_capped,
    warn_too_few,
)
from rlt_mono.stages.eval_compare import compare_table, questions_fingerprint
from rlt_mono.stages.sampler import (
    StageModels,
    check_resume_matches,
    explain,
    load_stage_models,
    open_generator,
    prompt_budget,
    stage_output_dir,
    stage_rows,
    teacher_budget,
    teacher_prompts,
)
from rlt_mono.study.eval_stats import EVAL_FILE, ROWS_FILE

# Its lines are the eval stage's: logged under rlt_mono.stages.eval.
logger = logging.getLogger(stage.__name__)


# ---- the two halves ---------------------------------------------------------------------------------------
def teacher_half(models: StageModels, options: EvalConfig, cfg: DictConfig, rows: list[dict]) -> list[dict]:
    """Per row: one teacher explanation with its reward components and the student's solution log-prob."""
    _, prompt_ids = teacher_prompts(models, rows)
    generator = open_generator(models, "teacher", options, cfg, max_new_tokens=options.max_new_tokens,
                               max_prompt_tokens=max(len(ids) for ids in prompt_ids),
                               stop_strings=(models.prompt_format.explanation_end,))
    records = []
    try:
        for first in range(0, len(rows), options.rows_per_batch):
            batch = rows[first : first + options.rows_per_batch]
            scored = [per_row[0] for per_row in explain(models, generator, batch, 1, options.temperature)]
            log_probs = solution_log_probs(models, batch, [s["completion_ids"] for s in scored])
            records += [
                {"explanation": s["explanation"], **{k: s[k] for k in ("r_ss", "r_kl", "match_penalty", "total")},
                 "unmatched": s["unmatched"], "solution_log_prob": lp}
                for s, lp in zip(scored, log_probs)
            ]
            logger.info("eval: teacher explained %d of %d questions", len(records), len(rows))
    finally:
        generator.close()
    return records


def solution_log_probs(models: StageModels, rows: list[dict], completion_ids: list[list[int]]) -> list[float]:
    """Mean over solution tokens of log p_student(token | question, explanation, earlier tokens), temperature 1,
    the explanation being the reward's (same alignment: the teacher's ids up to the closing tag)."""
    samples = models.reward.align([r["question"] for r in rows], [r["solution"] for r in rows], completion_ids)
    with models.swapper.resident(models.student):
        per_token = range_log_probs(models.student, [s.student_ids for s in samples],
                                    [s.solution_span for s in samples], temperature=1.0,
                                    micro_batch_size=models.reward.config.micro_batch_size,
                                    pad_token_id=models.reward.pad_token_id)  # B tensors (S_i,)
    return [float(lp.mean()) for lp in per_token]


def student_half(models: StageModels, options: EvalConfig, cfg: DictConfig, rows: list[dict]) -> list[dict]:
    """Per row: the student's greedy answer from the question alone and whether it is right (None: not checkable)."""
    tokenizer = models.student_tokenizer
    prompt_ids = [tokenizer(p)["input_ids"] for p in student_prompts(tokenizer, models.prompt_format, options, rows)]
    generator = open_generator(models, "student", options, cfg, max_new_tokens=options.student_max_new_tokens,
                               max_prompt_tokens=max(len(ids) for ids in prompt_ids))
    try:
        outputs = [per_prompt[0] for per_prompt in generator.generate(prompt_ids, 1, 0.0)]
    finally:
        generator.close()
    texts = tokenizer.batch_decode(outputs, skip_special_tokens=True)
    return [answer_record(row, text, len(ids) >= options.student_max_new_tokens)
            for row, text, ids in zip(rows, texts, outputs, strict=True)]


def student_prompts(tokenizer, prompt_format: PromptFormat, options: EvalConfig, rows: list[dict]) -> list[str]:
    """Each row's student prompt (``student_question``), rendered with the student's chat template up to its
    answer."""
    return [tokenizer.apply_chat_template(student_question(prompt_format, options, row["question"]), tokenize=False,
                                          add_generation_prompt=True) for row in rows]


# ---- the stage --------------------------------------------------------------------------------------------
def evaluate(cfg: DictConfig, options: EvalConfig, reward_config: TeacherRewardConfig) -> Path:
    """Evaluate the configured teacher and student on the rows of ``eval.split`` with the checked ``options`` and
    ``reward_config`` (``rlt_mono.stages.eval.check_options``); returns ``output_dir`` (``eval.json``)."""
    with_teacher = cfg.model.model_name_or_path is not None
    # Each prompt must leave room for what is generated after it in its model's context, as in the RL stage.
    budgets = [teacher_budget(cfg, "eval.max_new_tokens")] if with_teacher else []
    if options.student_accuracy:
        prompt_format = PromptFormat()
        budgets.append(prompt_budget(cfg, "student", "student prompt", "eval.student_max_new_tokens",
                                     lambda tokenizer, rows: student_prompts(tokenizer, prompt_format, options, rows)))
    rows, source = stage_rows(cfg, options.split, budgets)
    output_dir = stage_output_dir(cfg)
    check_resume_matches(output_dir, cfg, ())  # an eval folder is rewritten, another stage's is not touched
    write_run_config(output_dir, cfg)
    logger.info("eval: %d questions (%s) -> %s", len(rows), source, output_dir)
    torch.manual_seed(cfg.seed)
    models = load_stage_models(cfg, reward_config, options.temperature, with_teacher=with_teacher,
                               left_align_padding=options.left_align_padding)
    records = [{k: row[k] for k in ("question", "solution", "answer", "heldout", "template") if k in row}
               for row in rows]
    try:
        if with_teacher:
            for record, teacher_record in zip(records, teacher_half(models, options, cfg, rows)):
                record.update(teacher_record)
        if options.student_accuracy:
            for record, student_record in zip(records, student_half(models, options, cfg, rows)):
                record.update(student_record)
    except torch.OutOfMemoryError as err:
        raise UserError("out of GPU memory: lower reward.micro_batch_size, eval.rows_per_batch or "
                        "eval.vllm_gpu_memory_utilization") from err
    if options.student_accuracy and not any(record["correct"] is not None for record in records):
        logger.warning("eval: student/accuracy is not measured (n=0): no held-out row of data.source=%s has an answer "
                       "to check the student's against (an answer column, or a solution stating '%s ...'); add an "
                       "answer column, or set eval.student_accuracy=false", cfg.data.source, THE_ANSWER_IS)
    result = {
        "teacher": cfg.model.model_name_or_path,
        "student": cfg.student.model_name_or_path,
        "rows": source,
        "questions": len(rows),
        "questions_sha256": questions_fingerprint([row["question"] for row in rows]),
        "confidence": options.confidence,
        "bootstrap_resamples": options.bootstrap_resamples,
        "seed": cfg.seed,
        **summarize_records(records, options.confidence, options.bootstrap_resamples, cfg.seed),
    }
    warn_too_few(result)
    warn_capped(result, options.student_max_new_tokens)
    write_text(output_dir / ROWS_FILE, "".join(json.dumps(record) + "\n" for record in records))
    eval_path = output_dir / EVAL_FILE
    write_json(eval_path, result, indent=2)
    logger.info("eval: wrote %s\n%s", eval_path, compare_table([eval_path]))
    return output_dir
