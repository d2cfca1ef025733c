"""Rows in, teacher prompts out: sources, validation, the held-out split, prompt rendering, length checks.

A row has ``question`` and ``solution`` strings and optionally ``reasoning_trace`` (the explanation target
of an SFT warm-up stage; validated here, not used by GRPO) and ``answer`` (the final answer alone, for
evaluation). ``data.source`` names where rows come from: ``embedded`` (synthetic arithmetic generated
locally), ``champ`` (CHAMP competition maths, from its PyPI package), ``gsm_symbolic`` (GSM8K-style word problems
from reasoning-gym's templates, ``rlt_mono.data.gsm_symbolic``), a local ``.jsonl``/``.json``/
``.parquet``/``.csv`` file, or a hub dataset id; ``data.row_format=stratos`` reads Bespoke-Stratos rows
(``data=bespoke_stratos``). Reading lives in ``rlt_mono.data.sources``.

Each source is split into training rows and held-out evaluation rows by question (``held_out_questions``):
a function of the seed and the rows only, so a training run never sees an evaluation question. Rows with a
``template`` (``gsm_symbolic``) can also be held out by whole templates (``data.heldout_templates``): no row of
those templates is ever a training row, ``data.heldout_template_rows`` of them join the eval split, and each eval
row then says which held-out set it belongs to (``heldout``: ``instances`` of training templates, or
``templates``; the two alternate in the split). Each row
then becomes a TRL example whose ``prompt`` is the teacher chat rendered with the teacher's chat template
up to the prefilled ``<|begin_of_explanation|>`` (a plain string, so TRL tokenizes it as is and generation
continues the assistant turn), plus the columns the reward reads. The method is described in docs/METHOD.md.
"""

from __future__ import annotations

import hashlib
import itertools
import logging
import math
import random
import unicodedata
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from rlt_mono.config import config_group, default_cache_dir
from rlt_mono.data.embedded import generate_rows
from rlt_mono.data.gsm_symbolic import SOLUTIONS as GSM_SOLUTIONS
from rlt_mono.data.gsm_symbolic import generate_rows as generate_gsm
from rlt_mono.data.prompts import PromptFormat
from rlt_mono.data.sources import FILE_SUFFIXES, DataSourceError, read_champ, read_file, read_hub, stratos_row
from rlt_mono.errors import UserError

if TYPE_CHECKING:
    import datasets
    from transformers import PreTrainedTokenizerBase

logger = logging.getLogger(__name__)

REQUIRED_COLUMNS = ("question", "solution")
OPTIONAL_COLUMNS = ("reasoning_trace", "answer", "heldout")
# A row's group, kept when the source has one (gsm_symbolic: the template number): caps sample by it, eval reports
# and resamples by it.
GROUP_COLUMN = "template"
BUILTIN_SOURCES = ("embedded", "champ", "gsm_symbolic")
ROW_FORMATS = ("columns", "stratos")
SPLITS = ("train", "eval")
# data.gsm_items_per_template above this many items per template is refused: 1,000 already makes 78,000 questions,
# and each item is a generator call (a typo such as 100000 ran for hours without a word).
MAX_GSM_ITEMS_PER_TEMPLATE = 1000
# A question or solution longer than this many characters is a long row (data.on_long_row) in every stage that
# reads rows, before any tokenizer sees it: far above any real maths question, far below a runaway (a 1 MB row kept
# distill and eval busy for minutes with nothing written).
MAX_ROW_CHARS = 65_536
# OmegaConf's value for a mandatory key nobody set (cfgs/data/custom.yaml's source); it reaches the dataclass
# as this string because OmegaConf.to_container does not raise on missing values by default.
MISSING = "???"

__all__ = [
    "BadRowError", "DataConfig", "DataConfigError", "DataSourceError", "NotEnoughRowsError", "PromptBudget",
    "build_prompt_dataset",
    "check_enough_rows", "held_out_questions", "load_rows", "load_split", "prepare_dataset", "render_prompts",
    "check_cap", "coverage", "group_of", "sample_rows", "split_questions", "validate_rows",
]


class DataConfigError(UserError, ValueError):
    """A ``data.*`` value is invalid; the message names the key and what to set."""


class BadRowError(UserError, ValueError):
    """A row lacks a usable column or does not fit the prompt budget; the message names source, row and column."""


class NotEnoughRowsError(UserError, ValueError):
    """Too few usable rows for the split or for one optimizer step."""


@config_group("data")
@dataclass
class DataConfig:
    """The ``data`` config group (see ``cfgs/data/*.yaml`` for each field's meaning)."""

    source: str = "embedded"
    split: str = "train"
    row_format: str = "columns"
    embedded_rows: int = 2000
    max_rows: int | None = None
    on_bad_row: str = "error"
    on_long_row: str = "error"
    eval_rows: int | None = None
    eval_fraction: float = 0.05
    seed: int | None = None
    gsm_items_per_template: int = 60
    gsm_solution: str = "worked"
    heldout_templates: list[int] = field(default_factory=list)
    heldout_template_rows: int | None = None

    def __post_init__(self) -> None:
        if not self.source or self.source == MISSING:
            raise DataConfigError("data=custom needs data.source=<path to .jsonl/.json/.parquet/.csv or a hub id>")
        for key in ("on_bad_row", "on_long_row"):
            if getattr(self, key) not in ("error", "skip"):
                raise DataConfigError(f"data.{key} must be 'error' or 'skip', got {getattr(self, key)!r}")
        if self.row_format not in ROW_FORMATS:
            raise DataConfigError(f"data.row_format must be one of {list(ROW_FORMATS)}, got {self.row_format!r}")
        if self.row_format != "columns" and self.source in BUILTIN_SOURCES:
            raise DataConfigError(
                f"data.row_format={self.row_format} applies to files and hub datasets, not to the built-in "
                f"data.source={self.source}: set data.row_format=columns"
            )
        if self.source == "embedded" and self.embedded_rows < 1:
            raise DataConfigError(
                f"data.embedded_rows must be >= 1 with data.source=embedded, got {self.embedded_rows}"
            )
        for key in ("max_rows", "eval_rows", "heldout_template_rows"):
            value = getattr(self, key)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                raise DataConfigError(f"data.{key} must be a whole number or null, got {value!r}")
        if self.max_rows is not None and self.max_rows < 1:
            raise DataConfigError(f"data.max_rows must be >= 1 or null, got {self.max_rows}")
        if self.eval_rows is not None and self.eval_rows < 0:
            raise DataConfigError(f"data.eval_rows must be >= 0 or null (data.eval_fraction then applies), "
                                  f"got {self.eval_rows}")
        if not 0 <= self.eval_fraction < 1:
            raise DataConfigError(f"data.eval_fraction must be in [0, 1), got {self.eval_fraction}")
        if self.source == "gsm_symbolic" and not 1 <= self.gsm_items_per_template <= MAX_GSM_ITEMS_PER_TEMPLATE:
            raise DataConfigError(f"data.gsm_items_per_template must be in 1..{MAX_GSM_ITEMS_PER_TEMPLATE} (each item "
                                  f"is a generator call), got {self.gsm_items_per_template}")
        if self.gsm_solution not in GSM_SOLUTIONS:
            raise DataConfigError(f"data.gsm_solution must be one of {list(GSM_SOLUTIONS)}, got {self.gsm_solution!r}")
        if isinstance(self.heldout_templates, str) or not isinstance(self.heldout_templates, Sequence) or not all(
                isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in self.heldout_templates):
            raise DataConfigError(f"data.heldout_templates must be a list of template numbers (whole numbers >= 0), "
                                  f"got {self.heldout_templates!r}")
        if self.heldout_template_rows is not None and self.heldout_template_rows < 1:
            raise DataConfigError(f"data.heldout_template_rows must be >= 1 or null (all their rows), got "
                                  f"{self.heldout_template_rows}")
        if self.heldout_templates and self.source != "gsm_symbolic":
            raise DataConfigError(f"data.heldout_templates holds out whole templates of data.source=gsm_symbolic; "
                                  f"data.source={self.source} has none: set data.heldout_templates=[]")


# ---- reading and validation -------------------------------------------------------------------------------


def data_seed(config: DataConfig, seed: int) -> int:
    """The seed of a source's rows, its held-out split and its caps: ``data.seed`` when set, else the run's."""
    return config.seed if config.seed is not None else seed


def load_rows(config: DataConfig, seed: int = 0) -> list[dict]:
    """All rows named by ``config.source``, mapped onto rlt_mono's columns, in source order (no validation yet).
    ``data.seed``, when set, replaces ``seed`` (the rows of every run seed are then the same)."""
    seed = data_seed(config, seed)
    if config.source == "gsm_symbolic":
        return generate_gsm(default_cache_dir(), config.gsm_items_per_template, seed, config.gsm_solution)
    if config.source == "embedded":
        return generate_rows(config.embedded_rows, seed=seed)
    if config.source == "champ":
        return read_champ(default_cache_dir())
    rows = read_file(Path(config.source).expanduser()) if _is_path(config.source) else read_hub(config.source,
                                                                                                 config.split)
    return [stratos_row(row) for row in rows] if config.row_format == "stratos" else rows


def _is_path(source: str) -> bool:
    """A local path rather than a hub id (``name`` or ``owner/name``)."""
    path = Path(source).expanduser()
    return path.exists() or path.suffix in FILE_SUFFIXES or source.startswith(("/", ".", "~")) or source.count("/") > 1


def validate_rows(rows: list[dict], source: str, on_bad_row: str, on_long_row: str) -> tuple[list[dict], int]:
    """Check every row; return ``(valid_rows, skipped)``, each valid row reduced to the known columns.

    Raises:
        BadRowError: with ``on_bad_row="error"``, at the first bad row, naming source, row index and column; with
            ``on_long_row="error"``, at the first row with a column over ``MAX_ROW_CHARS`` characters.
    """
    indexed, skipped = _validate(rows, source, on_bad_row, on_long_row)
    return [row for _, row in indexed], skipped


def _validate(rows: list[dict], source: str, on_bad_row: str, on_long_row: str) -> tuple[list[tuple[int, dict]], int]:
    """``validate_rows`` keeping each valid row's index in the source, for later messages."""
    valid, bad, long = [], 0, 0
    for index, row in enumerate(rows):
        problem = _row_problem(row)
        if problem is None:
            column = next((c for c in (*REQUIRED_COLUMNS, *OPTIONAL_COLUMNS)
                           if isinstance(row.get(c), str) and len(row[c]) > MAX_ROW_CHARS), None)
            if column is None:
                valid.append((index, {k: row[k] for k in (*REQUIRED_COLUMNS, *OPTIONAL_COLUMNS, GROUP_COLUMN)
                                      if row.get(k) is not None}))
            elif on_long_row == "error":
                raise BadRowError(f"{source}: row {index}: column {column!r} has {len(row[column]):,} characters, "
                                  f"over the {MAX_ROW_CHARS:,} any stage reads: shorten the row, or set "
                                  "data.on_long_row=skip to drop such rows")
            else:
                long += 1
            continue
        column, what = problem
        if on_bad_row == "error":
            raise BadRowError(
                f"{source}: row {index}: column {column!r} {what} "
                "(fix the row, or set data.on_bad_row=skip to drop such rows)"
            )
        bad += 1
    if bad:
        logger.warning("%s: skipped %d of %d rows with a missing, empty or non-string column", source, bad, len(rows))
    if long:
        logger.warning("%s: skipped %d of %d rows with a column over %d characters", source, long, len(rows),
                       MAX_ROW_CHARS)
    return valid, bad + long


def _row_problem(row: dict) -> tuple[str, str] | None:
    for column in REQUIRED_COLUMNS:
        if column not in row or row[column] is None:
            return column, "is missing"
        if not isinstance(row[column], str):
            return column, f"is a {type(row[column]).__name__}, not a string"
        if not _visible(row[column]):
            return column, "is empty" if not row[column] else "has no visible character"
    for column in OPTIONAL_COLUMNS:
        if row.get(column) is not None and not isinstance(row[column], str):
            return column, f"is a {type(row[column]).__name__}, not a string"
    return None


def _visible(text: str) -> bool:
    """Whether ``text`` has a character that is neither white space nor an invisible format character (zero-width
    spaces and joiners, byte-order marks: Unicode category Cf)."""
    return any(not ch.isspace() and unicodedata.category(ch) != "Cf" for ch in text)


# ---- caps: seeded samples, stratified by group --------------------------------------------------------------


def sample_rows(rows: list, count: int | None, seed: int, group: Callable[[object], Hashable] | None = None) -> list:
    """``count`` of ``rows`` (all of them when ``count`` is None or not smaller), drawn with ``seed``, in drawing order.

    With ``group`` (a row -> its group, e.g. a GSM-Symbolic template; None for a row without one) the draw is
    stratified: groups are visited in a seeded order, one row of each in turn, each group's rows in a seeded order,
    so every group is represented before any has two rows, and every prefix of the result is itself stratified
    (a later ``[:n]`` of it, e.g. the held-out curve's first questions, covers as many groups as it can). Without
    ``group`` it is a seeded uniform sample. Never the first rows in source order: sources list rows by group.
    """
    rng = random.Random(f"rlt_mono.sample/{seed}")
    groups: dict[Hashable, list] = {}
    for row in rows:
        groups.setdefault(group(row) if group is not None else None, []).append(row)
    queues = [members for _, members in sorted(groups.items(), key=lambda item: repr(item[0]))]
    rng.shuffle(queues)
    for members in queues:
        rng.shuffle(members)
    drawn = [row for layer in itertools.zip_longest(*queues) for row in layer if row is not None]
    return drawn if count is None else drawn[:count]


def group_of(row: dict) -> Hashable:
    """A row's group (``GROUP_COLUMN``), None where its source has none."""
    return row.get(GROUP_COLUMN)


def coverage(rows: Iterable[dict]) -> str:
    """", covering G templates" for rows with groups, else nothing (for the log line of a cap)."""
    covered = {group_of(row) for row in rows} - {None}
    return f", covering {len(covered)} templates" if covered else ""


# ---- the held-out split -----------------------------------------------------------------------------------


def held_out_questions(questions: Iterable[str], seed: int, count: int) -> set[str]:
    """The ``count`` questions held out for evaluation, as whitespace-normalised texts.

    Each distinct question (runs of whitespace read as one space) is ranked by ``sha256(seed, question)``
    and the ``count`` smallest are held out. The result depends on the seed and the set of questions only:
    not on row order, nor on other columns, and two rows with the same question text land on the same side.
    """
    distinct = sorted({_question_key(q) for q in questions}, key=lambda q: hashlib.sha256(f"{seed}\n{q}".encode())
                      .digest())
    return set(distinct[:count])


def _question_key(question: str) -> str:
    return " ".join(question.split())


def _eval_count(config: DataConfig, n_questions: int) -> int:
    """Questions to hold out: ``eval_rows`` when set, else ``eval_fraction`` of them, rounded down."""
    if config.eval_rows is None:
        # The epsilon keeps e.g. 0.29 * 100 = 28.999999999999996 from rounding down to 28.
        return math.floor(config.eval_fraction * n_questions + 1e-9)
    if config.eval_rows > n_questions:
        raise DataConfigError(
            f"data.eval_rows={config.eval_rows} but data.source={config.source} has {n_questions} distinct "
            "questions: lower data.eval_rows"
        )
    return config.eval_rows


def _partition(config: DataConfig, seed: int) -> tuple[dict[str, list[tuple[int, dict]]], int]:
    """Both splits' valid rows with their source indices (before ``max_rows``), from one read of the source; and
    the bad rows skipped."""
    seed = data_seed(config, seed)
    raw = load_rows(config, seed=seed)
    whole = set(config.heldout_templates)
    if whole:
        present = {row.get("template") for row in raw} - {None}
        if not whole <= present:
            raise DataConfigError(f"data.heldout_templates: {sorted(whole - present)} not among the templates of "
                                  f"data.source={config.source} (they are {_ranges(sorted(present))}): hold out "
                                  "templates of that list")
    template_questions = {_question_key(row["question"]) for row in raw if row.get("template") in whole}
    indexed, skipped = _validate(raw, config.source, config.on_bad_row, config.on_long_row)
    pool = [(i, row) for i, row in indexed if _question_key(row["question"]) not in template_questions]
    questions = {_question_key(row["question"]) for _, row in pool}
    held_out = held_out_questions(questions, seed, _eval_count(config, len(questions)))
    parts = {split: [(i, row) for i, row in pool if (_question_key(row["question"]) in held_out) == (split == "eval")]
             for split in SPLITS}
    # The held-out rows in a stratified, seeded order (sample_rows), so that their first N (max_rows,
    # trainer.eval_questions) are a sample covering every template they can; training rows stay in source order.
    parts["eval"] = sample_rows(parts["eval"], None, seed, _group_of)
    if whole:
        count = len(template_questions) if config.heldout_template_rows is None else \
            min(config.heldout_template_rows, len(template_questions))
        by_template = held_out_questions(template_questions, seed, count)
        instances = [(i, {**row, "heldout": "instances"}) for i, row in parts["eval"]]
        templates = sample_rows([(i, {**row, "heldout": "templates"}) for i, row in indexed
                                 if _question_key(row["question"]) in by_template], None, seed, _group_of)
        # Alternated, so that any first N rows (max_rows, trainer.eval_questions) hold both sets.
        parts["eval"] = [pair for both in itertools.zip_longest(instances, templates) for pair in both
                         if pair is not None]
    logger.info("data: %s: %d of %d questions held out for eval; %d more questions of %d held-out templates; %d "
                "bad rows skipped", config.source, len(held_out), len(questions), len(template_questions), len(whole),
                skipped)
    return parts, skipped


def _split_rows(config: DataConfig, seed: int, split: str) -> tuple[list[tuple[int, dict]], int]:
    """The valid rows of one split with their source indices, after ``max_rows``; and the bad rows skipped."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {list(SPLITS)}, got {split!r}")
    parts, skipped = _partition(config, seed)
    rows = parts[split]
    check_cap(config.max_rows, len(rows), split, config.source)
    if split == "eval":  # a stratified, seeded order (_partition): its first rows are a sample
        chosen = rows[: config.max_rows]
    else:  # a stratified, seeded sample, kept in source order
        chosen = sorted(sample_rows(rows, config.max_rows, data_seed(config, seed), _group_of))
    logger.info("data: %d of %d %s rows from %s%s%s", len(chosen), len(rows), split, config.source,
                " (a seeded sample, data.max_rows)" if len(chosen) < len(rows) else "",
                coverage(row for _, row in chosen))
    return chosen, skipped


def check_cap(cap: int | None, available: int, split: str, source: str) -> None:
    """``data.max_rows`` against the rows of a split: a cap over the training rows is a mistake (one line); over the
    held-out rows every one is used, with a warning (their number is set by data.eval_rows)."""
    if cap is None or cap <= available:
        return
    if split == "train":
        raise DataConfigError(f"data.max_rows={cap} but data.source={source} has {available} training rows: lower "
                              "data.max_rows, or set it to null for all of them")
    logger.warning("data.max_rows=%d is more than the %d held-out rows of data.source=%s: all of them are used "
                   "(data.eval_rows sets how many there are)", cap, available, source)


def _group_of(pair: tuple[int, dict]) -> Hashable:
    """An (index, row) pair -> the row's group."""
    return group_of(pair[1])


def _ranges(numbers: list[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``"0-2, 5"``."""
    spans = []
    for number in numbers:
        if spans and number == spans[-1][1] + 1:
            spans[-1][1] = number
        else:
            spans.append([number, number])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)


def split_questions(config: DataConfig, seed: int = 0) -> tuple[set[str], set[str]]:
    """The whitespace-normalised questions of the train and the eval split (``max_rows`` not applied), from one
    read of the source: what a stage that reads the source's rows itself (SFT) splits them by."""
    parts, _ = _partition(config, seed)
    return tuple({_question_key(row["question"]) for _, row in parts[split]} for split in SPLITS)


def load_split(config: DataConfig, seed: int = 0, split: str = "train",
               budgets: Sequence[PromptBudget] = ()) -> list[dict]:
    """The valid rows of ``split`` ("train" or "eval"), ``max_rows`` applied: training rows in source order (a cap
    draws a seeded sample, stratified by template), held-out rows in a stratified, seeded order (a cap keeps the
    first, a sample). With ``budgets`` (what distill and eval will generate from), a row whose prompt is over one
    is refused or dropped by ``data.on_long_row``, as the RL stage's ``prepare_dataset`` does.

    Raises:
        DataSourceError, BadRowError, DataConfigError: the source cannot be read, a row is bad
            (``on_bad_row=error``) or over a budget (``on_long_row=error``), or ``eval_rows`` exceeds the questions
            available.
    """
    indexed, _ = _split_rows(config, seed, split)
    for budget in budgets:
        over = _over_budget(config, indexed, budget.render([row for _, row in indexed]), budget, split)
        indexed = [pair for position, pair in enumerate(indexed) if position not in over]
    return [row for _, row in indexed]


# ---- teacher prompts --------------------------------------------------------------------------------------


def render_prompts(rows: list[dict], tokenizer: PreTrainedTokenizerBase, prompt_format: PromptFormat) -> list[str]:
    """Each row's teacher chat, rendered with the chat template and ending in the prefilled explanation tag."""
    return [
        tokenizer.apply_chat_template(
            prompt_format.teacher_messages(row["question"], row["solution"]),
            tokenize=False,
            continue_final_message=True,
        )
        for row in rows
    ]


def build_prompt_dataset(
    rows: list[dict], tokenizer: PreTrainedTokenizerBase, prompt_format: PromptFormat
) -> datasets.Dataset:
    """TRL examples: ``prompt`` (rendered teacher chat ending in the prefill) + ``question`` + ``solution``
    (+ ``answer`` when any row has one; ``None`` for the others)."""
    return _as_dataset(rows, render_prompts(rows, tokenizer, prompt_format))


def _as_dataset(rows: list[dict], prompts: list[str]) -> datasets.Dataset:
    import datasets  # here: the stages' declarations read this module's config without loading the library

    columns = {"prompt": prompts, **{c: [row[c] for row in rows] for c in REQUIRED_COLUMNS}}
    if any(row.get("answer") is not None for row in rows):
        columns["answer"] = [row.get("answer") for row in rows]
    return datasets.Dataset.from_dict(columns)


def _prompts_over_budget(prompts: list[str], tokenizer: PreTrainedTokenizerBase, limit: int) -> dict[int, str]:
    """Positions of the prompts longer than ``limit`` tokens, each with its size in words.

    Tokens are counted as TRL counts a string prompt (``tokenizer(text)``, special tokens included). Tokenizing
    a 1 MB row takes seconds, so lengths are bounded first: a token spans at least one UTF-8 byte (byte-level
    BPE, byte fallback), so a prompt of at most ``limit`` bytes, less the added special tokens (and one SentencePiece
    prefix space), fits; a token spans at most as many characters as the longest vocabulary
    entry, so a prompt longer than ``limit`` times that does not. Only prompts in between are tokenized.
    """
    added = tokenizer.num_special_tokens_to_add() + 1
    longest = max(len(token) for token in tokenizer.get_vocab())
    over, unsure = {}, []
    for position, prompt in enumerate(prompts):
        if len(prompt.encode("utf-8")) + added <= limit:
            continue
        at_least = math.ceil(len(prompt) / longest)
        if at_least > limit:
            over[position] = f"at least {at_least:,} tokens ({len(prompt):,} characters)"
        else:
            unsure.append(position)
    if unsure:
        # verbose=False: transformers' own line about a sequence over model_max_length would come before ours
        counts = [len(ids) for ids in tokenizer([prompts[p] for p in unsure], verbose=False)["input_ids"]]
        over |= {p: f"{n:,} tokens" for p, n in zip(unsure, counts, strict=True) if n > limit}
    return over


@dataclass(frozen=True)
class PromptBudget:
    """A prompt a stage renders from each row, and the most tokens it may have: the model's context less the tokens
    the stage generates after it. A row over it is refused or dropped by ``data.on_long_row``."""

    name: str  # what the prompt is, in messages: "teacher prompt"
    render: Callable[[list[dict]], list[str]]  # rows -> one prompt each
    tokenizer: PreTrainedTokenizerBase
    max_tokens: int
    reason: str = ""  # where max_tokens comes from, in messages: "the teacher's 2,048-token context less ..."


def _over_budget(config: DataConfig, indexed: list[tuple[int, dict]], prompts: list[str], budget: PromptBudget,
                 split: str) -> set[int]:
    """Positions of the ``prompts`` (one per ``indexed`` row) over ``budget``: with ``on_long_row=error`` the first
    is one ``BadRowError`` line naming its source row and size; with ``skip`` one warning counts them."""
    over = _prompts_over_budget(prompts, budget.tokenizer, budget.max_tokens)
    if over and config.on_long_row == "error":
        position = min(over)
        reason = f" ({budget.reason})" if budget.reason else ""
        raise BadRowError(f"{config.source}: row {indexed[position][0]}: the {budget.name} has {over[position]}, over "
                          f"the {budget.max_tokens:,}-token prompt budget{reason}: shorten the row, or set "
                          "data.on_long_row=skip to drop such rows")
    if over:
        logger.warning("%s: skipped %d %s rows whose %s exceeds %d tokens (source rows %s)", config.source, len(over),
                       split, budget.name, budget.max_tokens, sorted(indexed[p][0] for p in over)[:20])
    return set(over)


def prepare_dataset(
    config: DataConfig,
    tokenizer: PreTrainedTokenizerBase,
    prompt_format: PromptFormat,
    seed: int = 0,
    split: str = "train",
    max_prompt_tokens: int | None = None,
) -> tuple[datasets.Dataset, int]:
    """Load, validate, split, render and (with ``max_prompt_tokens``) length-check one split.

    Returns the dataset and the number of rows skipped (bad rows with ``on_bad_row=skip`` plus prompts over
    ``max_prompt_tokens`` with ``on_long_row=skip``).

    Raises:
        BadRowError: a bad row (``on_bad_row=error``) or a prompt over ``max_prompt_tokens``
            (``on_long_row=error``), naming the row's index in the source and its token count.
        NotEnoughRowsError: no usable row is left in the split.
    """
    indexed, skipped = _split_rows(config, seed, split)
    rows = [row for _, row in indexed]
    prompts = render_prompts(rows, tokenizer, prompt_format)
    if max_prompt_tokens is not None:
        budget = PromptBudget("teacher prompt", partial(render_prompts, tokenizer=tokenizer,
                                                        prompt_format=prompt_format), tokenizer, max_prompt_tokens)
        over = _over_budget(config, indexed, prompts, budget, split)
        rows = [row for p, row in enumerate(rows) if p not in over]
        prompts = [prompt for p, prompt in enumerate(prompts) if p not in over]
        skipped += len(over)
    if not rows:
        hint = ("hold questions out with data.eval_rows=N or data.eval_fraction=F" if split == "eval" else
                "fix the rows, or hold fewer out (data.eval_rows / data.eval_fraction)")
        raise NotEnoughRowsError(f"data.source={config.source}: no usable {split} rows ({skipped} skipped): {hint}")
    return _as_dataset(rows, prompts), skipped


def check_enough_rows(n_rows: int, prompts_per_step: int, source: str, skipped: int = 0) -> None:
    """Raise ``NotEnoughRowsError`` when ``n_rows`` training rows cannot fill one optimizer step.

    TRL's sampler draws ``prompts_per_step`` distinct prompts per step and drops an incomplete draw, so with
    fewer rows it runs zero steps and saves an untrained teacher without a word.
    """
    if n_rows >= prompts_per_step:
        return
    raise NotEnoughRowsError(
        f"data.source={source} has {n_rows} usable training rows ({skipped} skipped) but one optimizer step needs "
        f"{prompts_per_step} distinct prompts (trainer.per_device_train_batch_size x gradient_accumulation_steps "
        "/ num_generations): add rows, lower trainer.per_device_train_batch_size or gradient_accumulation_steps, "
        "raise trainer.num_generations, or hold fewer rows out (data.eval_rows / data.eval_fraction)"
    )
