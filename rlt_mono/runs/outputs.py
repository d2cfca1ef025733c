"""What a run leaves in its output folder besides TRL's checkpoints, and how it is read back.

- ``metrics.jsonl``: one JSON row per logged step, ``{"event": "step", "step": N, ...every metric}``, and one per
  finished ``train()`` call, ``{"event": "summary", "step": N, "train_runtime": ...}``. ``read_metrics`` returns
  the step rows (or the summaries).
- ``samples.jsonl``: a few teacher explanations per step: step, question, solution, explanation, reward parts
  first, then the rest of the reward's breakdown (``rlt_mono.runs.files.sample_row``).
- ``reward_components.png``: reward components, unmatched explanations and phase seconds over steps
  (``rlt_mono.runs.plots``).
- ``README.md``: what the run was, what each file is and how to resume (``rlt_mono.runs.readme``).

``rlt_mono.runs.files.RunFilesCallback`` writes them all during training; this module names them and reads them
back, for the callback, the plots, the README, the console and the study. A resumed run first drops the rows of the
steps it is about to run again, and a last line cut short by a killed process (``drop_rows_after``); any other
unreadable line stops it with a ``UserError`` naming the file and line. Rows are appended whole
(``rlt_mono.runs.atomic_write.append_text``): on a full or read-only disk the file is cut back to its last complete row
and the run stops with one line.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Mapping
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from rlt_mono.errors import UserError
from rlt_mono.runs.atomic_write import write_text

logger = logging.getLogger(__name__)

METRICS_FILE = "metrics.jsonl"
SAMPLES_FILE = "samples.jsonl"
PLOT_FILE = "reward_components.png"
README_FILE = "README.md"
CONFIG_FILE = "config.yaml"
STEP_EVENT = "step"
SUMMARY_EVENT = "summary"
# TRL's evaluation on held-out questions (trainer.eval_strategy: steps): its keys start with "eval_".
EVAL_EVENT = "eval"
# Phases in the order a step runs them; any other phase follows, by name.
PHASE_ORDER = ("generate", "score", "train")


def is_summary_log(logs: Mapping) -> bool:
    """Whether a log is transformers' end-of-``train()`` summary (runtime, throughput), not a step's."""
    return "train_runtime" in logs


def _parse_lines(path: Path, lines: list[str]) -> list[dict | None]:
    """Each line's row (``None`` for a blank line). An unparseable last line, left by a process killed while
    writing it, is ``None`` with a warning; an unparseable line elsewhere raises ``UserError``."""
    last = max((i for i, line in enumerate(lines) if line.strip()), default=-1)
    rows: list[dict | None] = []
    for i, line in enumerate(lines):
        if not line.strip():
            rows.append(None)
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as err:
            if i != last:
                raise UserError(f"{path}, line {i + 1}: not a JSON row ({err.msg}); fix or delete that line, "
                                "then run again") from err
            logger.warning("%s: dropped its last line (line %d), cut short when the run stopped: %r", path, i + 1,
                           line.strip()[:80])
            rows.append(None)
    return rows


def drop_rows_after(path: str | Path, step: int) -> None:
    """Resume: keep only the rows of ``path`` up to ``step`` (and no unfinished last line), rewritten atomically."""
    path = Path(path)
    if not path.exists():
        return
    original = path.read_text()
    lines = original.splitlines()
    rows = _parse_lines(path, lines)
    kept = [line for line, row in zip(lines, rows, strict=True) if row is not None and row.get("step", 0) <= step]
    dropped = sum(row is not None for row in rows) - len(kept)
    text = "".join(line + "\n" for line in kept)
    if text == original:
        return
    write_text(path, text)
    if dropped:
        logger.info("resuming at step %d: dropped %d rows of later steps from %s", step, dropped, path)


def row_event(row: Mapping) -> str:
    """A ``metrics.jsonl`` row's event: ``STEP_EVENT``, ``EVAL_EVENT`` or ``SUMMARY_EVENT``."""
    # Rows written before rows carried "event": transformers' summary is the one with train_runtime.
    return row.get("event") or (SUMMARY_EVENT if is_summary_log(row) else STEP_EVENT)


def read_metrics(path: str | Path, event: str = STEP_EVENT) -> list[dict]:
    """The rows of a ``metrics.jsonl``: one per logged step (``event="step"``), the held-out evaluations
    (``event="eval"``), or the end-of-training summaries (``event="summary"``). A last line cut short by a
    killed run is skipped with a warning."""
    path = Path(path)
    lines = path.read_text().splitlines()
    return [row for row in _parse_lines(path, lines) if row is not None and row_event(row) == event]


def in_phase_order(names) -> list[str]:
    """Phase names in ``PHASE_ORDER``, any other after them by name."""
    return sorted(names, key=lambda name: (PHASE_ORDER.index(name) if name in PHASE_ORDER else len(PHASE_ORDER),
                                           name))


def is_number(value) -> bool:
    """Whether a logged value is a finite number (a bool is not): one worth showing."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def write_run_config(output_dir: str | Path, cfg: DictConfig, set_by_build: dict[str, dict] | None = None) -> None:
    """Write ``CONFIG_FILE``: the run's resolved config, every key, with ``resume_from_checkpoint`` recorded as null.
    Resuming changes how a run starts, not what it runs: a run resumed after a kill records what the uninterrupted
    run does. ``set_by_build`` (``{group: {key: value}}``): settings the build chose for this run beyond the config
    (e.g. the RL trainer's under ``placement=dp``), recorded in their groups as used."""
    config = OmegaConf.to_container(cfg, resolve=True)
    if "resume_from_checkpoint" in config:
        config["resume_from_checkpoint"] = None
    for group, values in (set_by_build or {}).items():
        config.setdefault(group, {}).update(values)
    write_text(Path(output_dir) / CONFIG_FILE, OmegaConf.to_yaml(config))
