"""Rows in, teacher prompts out.

A row has ``question`` and ``solution`` strings and optionally ``reasoning_trace`` (the explanation target
of an SFT warm-up stage; validated here, not used by GRPO). Rows come from the embedded synthetic set, a
local ``.jsonl``/``.json``/``.parquet``/``.csv`` file, or a hub dataset id. Each becomes a TRL example whose
``prompt`` is the teacher chat rendered with the teacher's chat template up to the prefilled
``<|begin_of_explanation|>`` (a plain string, so TRL tokenizes it as is and generation continues the
assistant turn), plus the columns the reward reads.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import datasets
from transformers import PreTrainedTokenizerBase

from rlt_mono.prompts import PromptFormat

logger = logging.getLogger(__name__)

REQUIRED_COLUMNS = ("question", "solution")
OPTIONAL_COLUMNS = ("reasoning_trace",)
_FILE_FORMATS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}


class BadRowError(ValueError):
    """A row lacks a usable column; the message names the source, the row index and the column."""


@dataclass
class DataConfig:
    """The ``data`` config group (see ``cfgs/data/*.yaml`` for each field's meaning)."""

    source: str = "embedded"
    split: str = "train"
    embedded_rows: int = 2000
    max_rows: int | None = None
    on_bad_row: str = "error"

    def __post_init__(self) -> None:
        if self.on_bad_row not in ("error", "skip"):
            raise ValueError(f"data.on_bad_row must be 'error' or 'skip', got {self.on_bad_row!r}")
        if self.max_rows is not None and self.max_rows < 1:
            raise ValueError(f"data.max_rows must be >= 1 or null, got {self.max_rows}")


def load_rows(config: DataConfig, seed: int = 0) -> list[dict]:
    """Read the raw rows named by ``config.source`` (no validation yet)."""
    if config.source == "embedded":
        from rlt_mono.embedded import generate_rows

        return generate_rows(config.embedded_rows, seed=seed)
    path = Path(config.source).expanduser()
    if path.suffix in _FILE_FORMATS:
        if not path.is_file():
            raise FileNotFoundError(f"data.source={config.source}: no such file")
        return _read_file(path)
    if path.exists():
        raise ValueError(f"data.source={config.source}: unsupported file type; use one of {sorted(_FILE_FORMATS)}")
    return list(datasets.load_dataset(config.source, split=config.split))


def _read_file(path: Path) -> list[dict]:
    table = datasets.load_dataset(_FILE_FORMATS[path.suffix], data_files=str(path), split="train")
    return list(table)


def validate_rows(rows: list[dict], source: str, on_bad_row: str = "error") -> tuple[list[dict], int]:
    """Check every row; return ``(valid_rows, skipped)``.

    Raises:
        BadRowError: with ``on_bad_row="error"``, at the first bad row, naming source, row index and column.
    """
    valid, skipped = [], 0
    for index, row in enumerate(rows):
        problem = _row_problem(row)
        if problem is None:
            valid.append({k: row[k] for k in (*REQUIRED_COLUMNS, *OPTIONAL_COLUMNS) if row.get(k) is not None})
            continue
        column, what = problem
        if on_bad_row == "error":
            raise BadRowError(
                f"{source}: row {index}: column {column!r} {what} "
                "(fix the row, or set data.on_bad_row=skip to drop such rows)"
            )
        skipped += 1
    if skipped:
        logger.warning("%s: skipped %d of %d rows with a missing, empty or non-string column", source, skipped,
                       len(rows))
    return valid, skipped


def _row_problem(row: dict) -> tuple[str, str] | None:
    for column in REQUIRED_COLUMNS:
        if column not in row or row[column] is None:
            return column, "is missing"
        if not isinstance(row[column], str):
            return column, f"is a {type(row[column]).__name__}, not a string"
        if not row[column].strip():
            return column, "is empty"
    for column in OPTIONAL_COLUMNS:
        if row.get(column) is not None and not isinstance(row[column], str):
            return column, f"is a {type(row[column]).__name__}, not a string"
    return None


def build_prompt_dataset(
    rows: list[dict], tokenizer: PreTrainedTokenizerBase, prompt_format: PromptFormat
) -> datasets.Dataset:
    """TRL examples: ``prompt`` (rendered teacher chat ending in the prefill) + ``question`` + ``solution``."""
    prompts = [
        tokenizer.apply_chat_template(
            prompt_format.teacher_messages(row["question"], row["solution"]),
            tokenize=False,
            continue_final_message=True,
        )
        for row in rows
    ]
    return datasets.Dataset.from_dict(
        {
            "prompt": prompts,
            "question": [row["question"] for row in rows],
            "solution": [row["solution"] for row in rows],
        }
    )


def prepare_dataset(
    config: DataConfig, tokenizer: PreTrainedTokenizerBase, prompt_format: PromptFormat, seed: int = 0
) -> tuple[datasets.Dataset, int]:
    """Load, validate and render; returns the dataset and the number of skipped rows."""
    rows, skipped = validate_rows(load_rows(config, seed=seed), config.source, config.on_bad_row)
    if config.max_rows is not None:
        rows = rows[: config.max_rows]
    if not rows:
        raise ValueError(f"data.source={config.source}: no valid rows")
    logger.info("data: %d rows from %s (%d skipped)", len(rows), config.source, skipped)
    return build_prompt_dataset(rows, tokenizer, prompt_format), skipped
