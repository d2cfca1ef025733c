"""Where raw rows come from: local files, the Hugging Face hub, the CHAMP package; the Bespoke-Stratos format.

``rlt_mono.data.rows`` calls ``read_file``, ``read_hub`` and ``read_champ`` to get plain ``dict`` rows, and
``stratos_row`` to map a Bespoke-Stratos row onto the ``question`` / ``solution`` / ``reasoning_trace``
columns. Every failure here is a ``DataSourceError`` whose one-line message names the source (and the line
of a malformed file) and says what to do; nothing here validates columns (``rlt_mono.data.rows`` does).

Files are read without ``datasets``: JSON with the standard library (so a bad line is reported with its
number), CSV with ``csv``, Parquet with ``pyarrow``. CHAMP (Mao et al., MIT licence) is the PyPI package
``champ-dataset==1.0.0``: its wheel is fetched once with ``pip download --no-deps`` into the rlt_mono cache,
checked against a pinned sha256 and read as a zip archive, never installed nor imported.
"""

from __future__ import annotations

import csv
import hashlib
import json
import logging
import socket
import subprocess
import sys
import tempfile
import urllib.parse
import urllib.request
import zipfile
from pathlib import Path

from rlt_mono.data.prompts import PromptFormat
from rlt_mono.errors import UserError
from rlt_mono.runs.atomic_write import publish

logger = logging.getLogger(__name__)

FILE_SUFFIXES = (".jsonl", ".json", ".parquet", ".csv")
FILE_HINT = "a local .jsonl/.json/.parquet/.csv file"

CHAMP_REQUIREMENT = "champ-dataset==1.0.0"
CHAMP_WHEEL = "champ_dataset-1.0.0-py3-none-any.whl"
CHAMP_SHA256 = "aa59df5ae28e2ec76a401a46faf3d6395920be8009a01ce451f7d5c131d82201"
CHAMP_MEMBER = "champ_dataset/dataset_files/v0.json"
# How long to wait for a TCP connection to the hub before calling it unreachable.
HUB_CONNECT_TIMEOUT_S = 3.0


class DataSourceError(UserError, ValueError):
    """The rows cannot be read (missing or malformed file, unreachable hub, failed download)."""


# ---- local files ------------------------------------------------------------------------------------------


def read_file(path: Path) -> list[dict]:
    """Rows of a ``.jsonl``/``.json``/``.parquet``/``.csv`` file; at least one row.

    Raises:
        DataSourceError: missing, a directory, unsupported type, unreadable, malformed (with the line), empty.
    """
    if path.is_dir():
        raise DataSourceError(f"data.source={path} is a directory: point it at {FILE_HINT} or a hub id")
    if not path.exists():
        raise DataSourceError(f"data.source={path}: no such file")
    if path.suffix not in FILE_SUFFIXES:
        raise DataSourceError(f"data.source={path}: unsupported file type {path.suffix!r}; use {FILE_HINT} or a hub id")
    try:
        if path.suffix == ".parquet":
            rows = _read_parquet(path)
        elif path.suffix == ".csv":
            with path.open(encoding="utf-8", newline="") as handle:
                rows = list(csv.DictReader(handle))
        else:
            rows = _read_json(path)
    except UnicodeDecodeError:
        raise DataSourceError(f"data.source={path}: line {_first_non_utf8_line(path)} is not UTF-8 text: save the "
                              "file as UTF-8") from None
    except OSError as err:
        raise DataSourceError(f"data.source={path}: cannot read it ({err.strerror or err})") from None
    if not rows:
        raise DataSourceError(f"data.source={path}: file has no rows")
    return rows


def _first_non_utf8_line(path: Path) -> int:
    """The first line holding a byte that is not UTF-8 (a decoding error's offset counts from its chunk only).

    A line is valid exactly when decoding it with replacement changes nothing; UTF-8 never puts a newline byte
    inside a character, so splitting the bytes on newlines is safe.
    """
    lines = path.read_bytes().split(b"\n")
    return next(n for n, line in enumerate(lines, start=1) if line.decode("utf-8", "replace").encode("utf-8") != line)


def _read_json(path: Path) -> list[dict]:
    """A JSON array of objects, or JSON lines (one object per line, blank lines ignored)."""
    with path.open(encoding="utf-8") as handle:
        head = handle.read(4096).lstrip()
        handle.seek(0)
        if head.startswith("["):
            try:
                rows = json.load(handle)
            except json.JSONDecodeError as err:
                raise DataSourceError(f"data.source={path}: line {err.lineno}: bad JSON ({err.msg})") from None
            numbered = list(enumerate(rows, start=1))
            where = "item"
        else:
            numbered = []
            for lineno, line in enumerate(handle, start=1):
                if not line.strip():
                    continue
                try:
                    numbered.append((lineno, json.loads(line)))
                except json.JSONDecodeError as err:
                    raise DataSourceError(
                        f"data.source={path}: line {lineno}: bad JSON ({err.msg} at column {err.colno}); "
                        "each line must be one JSON object"
                    ) from None
            where = "line"
    for number, row in numbered:
        if not isinstance(row, dict):
            raise DataSourceError(
                f"data.source={path}: {where} {number} is a JSON {type(row).__name__}, not an object with "
                "'question' and 'solution'"
            )
    return [row for _, row in numbered]


def _read_parquet(path: Path) -> list[dict]:
    import pyarrow
    import pyarrow.parquet

    try:
        return pyarrow.parquet.read_table(path).to_pylist()
    except pyarrow.ArrowException as err:
        raise DataSourceError(f"data.source={path}: not a readable Parquet file ({err})") from None


# ---- the hub ----------------------------------------------------------------------------------------------


def read_hub(dataset_id: str, split: str) -> list[dict]:
    """Rows of a hub dataset split (from the hub cache in offline mode, ``HF_HUB_OFFLINE=1``).

    Raises:
        DataSourceError: the hub cannot be reached, the dataset or split does not exist, or (offline) it is
            not in the hub cache; the message says that a local file works offline.
    """
    import datasets
    import httpx

    offline = datasets.config.HF_HUB_OFFLINE
    if not offline:
        unreachable = hub_unreachable_reason()
        if unreachable:
            raise DataSourceError(
                f"data.source={dataset_id}: could not load the dataset from the hub ({unreachable}): "
                f"{FILE_HINT} works offline, or set HF_HUB_OFFLINE=1 to read a copy "
                "already in the hub cache"
            )
    try:
        return list(datasets.load_dataset(dataset_id, split=split))
    # huggingface_hub raises OSError subclasses, but a connection lost mid-download surfaces as httpx's own.
    except (OSError, ValueError, datasets.exceptions.DatasetsError, httpx.HTTPError) as err:
        reason = (str(err).strip().splitlines() or [type(err).__name__])[0]
        mode = " in offline mode (HF_HUB_OFFLINE=1)" if offline else ""
        raise DataSourceError(
            f"data.source={dataset_id}: could not load the dataset from the hub{mode} ({reason}): check the id "
            f"and data.split={split}, or use {FILE_HINT}, which works offline"
        ) from None


def hub_unreachable_reason() -> str | None:
    """Why the hub cannot be reached, or ``None`` when a TCP connection to it (or its HTTPS proxy) opens.

    Without network ``datasets`` retries five times with backoff (tens of seconds) and then raises with a long
    traceback; this check answers within ``HUB_CONNECT_TIMEOUT_S``.
    """
    from huggingface_hub import constants

    proxy = urllib.request.getproxies().get("https")
    url = urllib.parse.urlsplit(proxy or constants.ENDPOINT)
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        socket.create_connection((url.hostname, port), timeout=HUB_CONNECT_TIMEOUT_S).close()
    except OSError as err:
        return f"cannot reach {'proxy ' if proxy else ''}{url.hostname}:{port}: {err.strerror or err}"
    return None


# ---- Bespoke-Stratos rows ---------------------------------------------------------------------------------


def stratos_row(row: dict) -> dict:
    """Map a Bespoke-Stratos row onto rlt_mono's columns.

    The row has ``conversations = [{"from": "user", "value": question}, {"from": "assistant", "value":
    "<|begin_of_thought|>\\n\\n{thought}\\n\\n<|end_of_thought|>\\n\\n<|begin_of_solution|>\\n\\n{solution}
    \\n\\n<|end_of_solution|>"}]``. ``PromptFormat.split_student_completion`` splits the assistant turn the way
    the RLT teacher data does: ``reasoning_trace`` is the thought without its leading ``"\\n\\n"`` (which the
    teacher prompt already ends with, after ``<|begin_of_explanation|>``), ``solution`` everything inside the
    solution tags, padding kept; so the student chat rebuilt from the columns is the dataset's turn, character
    for character (docs/METHOD.md). A part whose tags are missing is left out of the row, which validation then
    reports as a missing column.
    """
    turns = row.get("conversations")
    turns = turns if isinstance(turns, list) else []
    mapped = {}
    question = _first_turn(turns, "user")
    if question is not None:
        mapped["question"] = question
    explanation, solution = PromptFormat().split_student_completion(_first_turn(turns, "assistant") or "")
    if explanation is not None:
        mapped["reasoning_trace"] = explanation
    if solution is not None:
        mapped["solution"] = solution
    return mapped


def _first_turn(turns: list, speaker: str) -> str | None:
    for turn in turns:
        if isinstance(turn, dict) and turn.get("from") == speaker:
            return turn.get("value")
    return None


def read_champ(cache_dir: Path) -> list[dict]:
    """CHAMP's 270 problems as rows, in the package's order.

    ``question`` is the problem text, ``reasoning_trace`` its step-by-step solution (one step per paragraph,
    ``"\\n\\n"`` between steps, as in Stratos thoughts), ``answer`` the final answer and ``solution`` the
    sentence ``"Final answer: {answer}"``: the teacher is shown the answer and explains how to reach it. The
    package's ``@@`` math markers are already removed in the ``_text`` / ``_answer`` fields read here.
    """
    wheel = champ_wheel(cache_dir)
    with zipfile.ZipFile(wheel) as archive, archive.open(CHAMP_MEMBER) as handle:
        problems = json.load(handle)["problems"]
    return [
        {
            "question": problem["_text"],
            "solution": f"Final answer: {problem['_answer']}",
            "reasoning_trace": "\n\n".join(step["_text"] for step in problem["solution"]["steps"]),
            "answer": problem["_answer"],
        }
        for problem in problems.values()
    ]


def champ_wheel(cache_dir: Path) -> Path:
    """The pinned CHAMP wheel in ``cache_dir/champ-dataset``, downloaded from PyPI on first use."""
    return pypi_wheel(cache_dir, CHAMP_REQUIREMENT, CHAMP_WHEEL, CHAMP_SHA256, "champ")


def pypi_wheel(cache_dir: Path, requirement: str, wheel_name: str, sha256: str, source: str) -> Path:
    """The pinned wheel ``wheel_name`` of ``requirement`` in ``cache_dir/<distribution>``, downloaded from PyPI with
    ``pip download --no-deps`` on first use (never installed), checked against ``sha256``.

    Raises:
        DataSourceError: pip could not download it, or the file there does not match the pinned sha256; the message
            names ``data.source=<source>``.
    """
    folder = cache_dir / requirement.split("==")[0]
    wheel = folder / wheel_name
    if not wheel.is_file():
        folder.mkdir(parents=True, exist_ok=True)
        logger.info("data: downloading %s from PyPI into %s", requirement, folder)
        # A private folder, then a rename: a concurrent run never sees a half-written wheel.
        with tempfile.TemporaryDirectory(dir=folder) as download_dir:
            command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                       "--disable-pip-version-check", "--quiet", requirement, "--dest", download_dir]
            result = subprocess.run(command, capture_output=True, text=True, timeout=600, check=False)
            downloaded = Path(download_dir) / wheel_name
            if result.returncode != 0 or not downloaded.is_file():
                lines = (result.stderr or result.stdout).strip().splitlines()
                raise DataSourceError(
                    f"data.source={source}: could not download {requirement} from PyPI "
                    f"({lines[-1].strip() if lines else f'pip exited with {result.returncode}'}): run "
                    f"`pip download --no-deps {requirement} -d {folder}` where PyPI is reachable"
                )
            publish(downloaded, wheel)
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    if digest != sha256:
        raise DataSourceError(
            f"data.source={source}: {wheel} has sha256 {digest[:12]}..., not the pinned {sha256[:12]}...: "
            "delete it and run again to download it afresh"
        )
    return wheel
