"""The distill stage's code (``rlt_mono.stages.distill`` declares the stage and checks its options): the teacher
explains each row, the reward scores every sample, the kept ones are appended to ``distill.jsonl`` by question
(``DistillFile``), in batches, so that a run stopped anywhere resumes where it stopped."""

from __future__ import annotations

import json
import logging
from collections import Counter
from pathlib import Path

import torch
from omegaconf import DictConfig
from tqdm.auto import tqdm

from rlt_mono.data.rows import group_of, sample_rows
from rlt_mono.errors import RunInterrupted, UserError
from rlt_mono.rewards import TeacherRewardConfig
from rlt_mono.runs.atomic_write import append_to, write_text, writing
from rlt_mono.runs.console import terminal_shows_bars
from rlt_mono.runs.lock import exclusive
from rlt_mono.runs.outputs import write_run_config
from rlt_mono.stages import distill as stage
from rlt_mono.stages.distill import DISTILL_FILE, RESUME_KEYS, DistillConfig
from rlt_mono.stages.sampler import (
    check_resume_matches,
    explain,
    load_stage_models,
    open_generator,
    row_key,
    stage_output_dir,
    stage_rows,
    teacher_budget,
    teacher_prompts,
)
from rlt_mono.study.arithmetic import check

# Its lines are the distill stage's: logged under rlt_mono.stages.distill.
logger = logging.getLogger(stage.__name__)


# ---- resume -----------------------------------------------------------------------------------------------
def completed_keys(path: Path, per_question: int) -> set[tuple[str, str]]:
    """Keys of the questions whose ``per_question`` lines are all in ``path``.

    A line cut short by a crash (no newline, or not JSON) and the lines of a question written only in part are
    dropped from the file, so the question is written again in full.
    """
    if not path.exists():
        return set()
    lines = path.read_text().splitlines(keepends=True)
    parsed = []
    for line in lines:
        try:
            parsed.append((line, json.loads(line)) if line.endswith("\n") else None)
        except json.JSONDecodeError:
            parsed.append(None)
    complete_lines = [p for p in parsed if p is not None]
    counts = Counter(row_key(row) for _, row in complete_lines)
    done = {key for key, count in counts.items() if count >= per_question}
    kept = [line for line, row in complete_lines if row_key(row) in done]
    if len(kept) < len(lines):
        logger.warning("%s: dropping %d incomplete lines (a run stopped while writing); their questions run again",
                       path, len(lines) - len(kept))
        write_text(path, "".join(kept))
    return done


class DistillFile:
    """``distill.jsonl`` open for appending, keyed by question (``row_key``). Each ``append`` holds an exclusive
    lock of the file while it reads the lines written since its last look (by this run or any other) and writes
    only the rows of questions not in the file yet, so neither a resumed run nor a second writer repeats a question.
    A write that fails is cut back to the last complete line; a full or read-only disk is one ``DiskError`` line
    saying ``then`` (how to resume)."""

    def __init__(self, path: Path, then: str):
        self.path = path
        self.then = then
        self.keys: set[tuple[str, str]] = set()
        self.read_to = 0  # bytes of the file already read into keys
        with writing(path, then=then):
            self.file = open(path, "ab+")  # closed by close()

    def append(self, rows: list[dict]) -> int:
        """Append ``rows`` (every row of a question at once) but those of questions already in the file; returns
        how many questions were written."""
        with exclusive(self.file):
            self._read_new_lines()
            new = [row for row in rows if row_key(row) not in self.keys]
            data = "".join(json.dumps(row) + "\n" for row in new).encode()
            with writing(self.path, len(data), self.then):
                append_to(self.file, data, sync=True)
            self.read_to = self.file.tell()
            keys = {row_key(row) for row in new}
            self.keys |= keys
            return len(keys)

    def close(self) -> None:
        self.file.close()

    def _read_new_lines(self) -> None:
        self.file.seek(self.read_to)
        data = self.file.read()
        complete = data[: data.rfind(b"\n") + 1]  # a line still being written is read next time
        for line in complete.splitlines():
            try:
                self.keys.add(row_key(json.loads(line)))
            except (ValueError, KeyError, TypeError):  # not a row: completed_keys dropped such lines at start
                continue
        self.read_to += len(complete)


# ---- the stage --------------------------------------------------------------------------------------------
def distill(cfg: DictConfig, options: DistillConfig, reward_config: TeacherRewardConfig) -> Path:
    """Write the teacher's explanations of every row to ``<output_dir>/distill.jsonl`` with the checked ``options``
    and ``reward_config`` (``rlt_mono.stages.distill.check_options``); returns ``output_dir``."""
    output_dir = stage_output_dir(cfg)
    out_path = output_dir / DISTILL_FILE
    # Settings that change the rows must match the rows already written (none yet: any settings do).
    check_resume_matches(output_dir, cfg, RESUME_KEYS if out_path.exists() else ())
    per_question = options.samples_per_question if options.selection == "all" else 1
    done = completed_keys(out_path, per_question)
    if done:  # a file written to the end says so before the teacher's tokenizer (or a GGUF conversion) loads
        every_row, _ = stage_rows(cfg, "train")
        if all(row_key(row) in done for row in every_row):
            logger.info("distill: all %d rows already written in %s; nothing to do", len(every_row), out_path)
            return output_dir
    # The teacher prompts must leave room for distill.max_new_tokens in the teacher's context, as in the RL stage.
    rows, source = stage_rows(cfg, "train", [teacher_budget(cfg, "distill.max_new_tokens")])
    # In a stratified order (every template before any has two rows): a distill stopped part-way has explained a
    # sample covering every template it could, not the first templates of the source; a resumed one goes on in the
    # same order.
    todo = [row for row in sample_rows(rows, None, cfg.seed, group_of) if row_key(row) not in done]
    write_run_config(output_dir, cfg)
    logger.info("distill: %s; %d already written, %d to explain (%d samples each, keep %s) -> %s",
                source, len(rows) - len(todo), len(todo), options.samples_per_question, options.selection, out_path)
    if not todo:
        return output_dir
    # ---- models ---------------------------------------------------------------------------------------
    models = load_stage_models(cfg, reward_config, options.temperature,
                               left_align_padding=options.left_align_padding)
    _, prompt_ids = teacher_prompts(models, todo)
    generator = open_generator(models, "teacher", options, cfg, max_new_tokens=options.max_new_tokens,
                               max_prompt_tokens=max(len(ids) for ids in prompt_ids),
                               stop_strings=(models.prompt_format.explanation_end,))
    # ---- explain, score, append -----------------------------------------------------------------------
    written = no_correct_sample = 0
    out = DistillFile(out_path, then=f"resume with output_dir={output_dir}")
    try:
        with tqdm(total=len(rows), initial=len(rows) - len(todo), desc="distill", unit="question",
                  disable=not terminal_shows_bars()) as bar:
            for first in range(0, len(todo), options.rows_per_batch):
                batch = todo[first : first + options.rows_per_batch]
                samples = explain(models, generator, batch, options.samples_per_question, options.temperature)
                kept = [_distill_row(row, s, cfg.model.model_name_or_path)
                        for row, per_row in zip(batch, samples) for s in _select(per_row, options.selection)]
                if options.selection == "best_correct":
                    no_correct_sample += sum(line["wrong_equations"] > 0 for line in kept)
                appended = out.append(kept)
                if appended < len(batch):
                    logger.warning("distill: %d questions of this batch were in %s already (written by another "
                                   "run), not written again", len(batch) - appended, out_path)
                written += appended
                bar.update(len(batch))
                if bar.disable:  # a log file or a pipe: one line per batch instead of the bar
                    logger.info("distill: %d/%d questions", len(rows) - len(todo) + first + len(batch), len(rows))
    except KeyboardInterrupt as err:
        raise RunInterrupted(f"distill interrupted after {written} of {len(todo)} questions; resume with "
                             f"output_dir={output_dir}") from err
    except torch.OutOfMemoryError as err:
        raise UserError(f"out of GPU memory after {written} of {len(todo)} questions: lower reward.micro_batch_size, "
                        "distill.rows_per_batch or distill.vllm_gpu_memory_utilization; resume with "
                        f"output_dir={output_dir}") from err
    finally:
        out.close()
        generator.close()
    if options.selection == "best_correct" and no_correct_sample:
        logger.warning("distill: %d of %d questions had no sample with every equation right; each keeps its best "
                       "by reward (wrong_equations > 0 in %s)", no_correct_sample, len(todo), out_path)
    logger.info("distill: wrote %d questions to %s (%s)", written, out_path,
                ", ".join(f"{k} {v:.1f}" for k, v in models.phases.pop_metrics().items() if k.endswith("seconds")))
    return output_dir


def _select(samples: list[dict], selection: str) -> list[dict]:
    """``best``: the highest total (the first such sample on a tie); ``all``: every sample; ``best_correct``: the
    highest total among the samples with no wrong equation, the highest of all when every sample has one."""
    if selection == "all":
        return samples
    if selection == "best_correct":
        samples = [s for s in samples if check(s["explanation"])[1] == 0] or samples
    return [max(samples, key=lambda s: s["total"])]


def _distill_row(row: dict, sample: dict, teacher: str) -> dict:
    return {
        "question": row["question"],
        "solution": row["solution"],
        "explanation": sample["explanation"],
        # the row's own trace and answer travel along: the raw-trace student baseline trains on the same rows
        **{name: row[name] for name in ("reasoning_trace", "answer", "template") if row.get(name) is not None},
        **{name: sample[name] for name in ("r_ss", "r_kl", "match_penalty", "total")},
        "matched": not sample["unmatched"],
        "wrong_equations": check(sample["explanation"])[1],
        "teacher": teacher,
        "sample_index": sample["sample_index"],
    }
