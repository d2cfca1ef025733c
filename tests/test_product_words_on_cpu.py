"""The code, configs, tests, docs and benchmarks speak to a user of rlt_mono: a measurement names its date, device,
commit and command, never how the machines that ran it were lent or how the work on rlt_mono was organised. Only
results/ (data files, which keep the names they were written with) is left out."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = ("rlt_mono", "cfgs", "tests", "docs", "bench")
PAGES = ("README_MONO_GPU.md", "README.md")
# Each word is spelled so that this file's own pattern does not match it: "[ ]" is one space.
WORDS = re.compile(r"\blease|\bsession[ ]\d|\bissue[ ]#?\d|(?<![\w-])GPU[ ]machine|\bdevice[ ]tools?\b"
                   r"|\bstash[ ]calls?\b|\bdevice[ ]calls?\b", re.IGNORECASE)


def _files() -> list[Path]:
    files = [ROOT / page for page in PAGES]
    for folder in FOLDERS:
        files += sorted(path for path in (ROOT / folder).rglob("*")
                        if path.is_file() and "__pycache__" not in path.parts)
    return files


def _text(path: Path) -> str | None:
    """The file's text, or None for a binary file (an image, a compiled file)."""
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        return None


def hits(files: list[Path], root: Path = ROOT) -> list[str]:
    """``<path relative to root>:<line>: <line text>`` of every line in ``files`` that holds one of the words."""
    found = []
    for path in files:
        text = _text(path)
        if text is None:
            continue
        found += [f"{path.relative_to(root)}:{number}: {line.strip()}"
                  for number, line in enumerate(text.splitlines(), 1) if WORDS.search(line)]
    return found


def test_no_word_of_how_the_work_was_organised():
    found = hits(_files())
    assert not found, "\n".join(found)


def test_the_words_are_found_with_their_file_and_line(tmp_path):
    page = tmp_path / "page.md"
    organised, numbered = "In L" "ease 7 it ran.", "see Iss" "ue #12"  # split, or the test above would find them
    page.write_text(f"Measured on nvidia-h200.\n{organised}\nA four-GPU machine.\n{numbered}\nthe release\n")
    assert hits([page], tmp_path) == [f"page.md:2: {organised}", f"page.md:4: {numbered}"]
