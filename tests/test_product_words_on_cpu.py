"""The code, configs, tests, docs, benchmarks and committed measurements speak to a user of rlt_mono: a measurement
names its date, device, commit and command, never how the machines that ran it were lent or how the work on rlt_mono
was organised. In results/ the text files (JSON, Markdown, text, CSV, YAML) are read, and the name of every file and
folder there is checked too; its images and compressed files are not read."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = ("rlt_mono", "cfgs", "tests", "docs", "bench")
PAGES = ("README_MONO_GPU.md", "README.md")
RESULTS = ROOT / "results"
RESULT_TEXTS = (".json", ".md", ".txt", ".csv", ".yaml")
# Each word is spelled so that this file's own pattern does not match it: "[ ]" is one space, "[ -]?" one of those
# or none (a number joined to the word, as in a file name).
WORDS = re.compile(r"\blease|\bsession[ -]?\d|\bissue[ -]?#?\d|(?<![\w-])GPU[ ]machine|\bdevice[ ]tools?\b"
                   r"|\bstash[ ]calls?\b|\bdevice[ ]calls?\b", re.IGNORECASE)


def organised(text: str) -> bool:
    """Whether ``text`` holds one of the words; an underscore separates words as a space does (a file name)."""
    return WORDS.search(text.replace("_", " ")) is not None


def _files() -> list[Path]:
    files = [ROOT / page for page in PAGES]
    for folder in FOLDERS:
        files += sorted(path for path in (ROOT / folder).rglob("*")
                        if path.is_file() and "__pycache__" not in path.parts)
    return files + sorted(path for path in RESULTS.rglob("*") if path.is_file() and path.suffix in RESULT_TEXTS)


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
                  for number, line in enumerate(text.splitlines(), 1) if organised(line)]
    return found


def named(folder: Path, root: Path = ROOT) -> list[str]:
    """The path, relative to root, of every file and folder under ``folder`` whose own name holds one of the words."""
    return [path.relative_to(root).as_posix() for path in sorted(folder.rglob("*")) if organised(path.name)]


def test_no_word_of_how_the_work_was_organised():
    found = hits(_files())
    assert not found, "\n".join(found)


def test_no_result_file_or_folder_is_named_after_how_the_work_was_organised():
    found = named(RESULTS)
    assert not found, "\n".join(found)


def test_the_words_are_found_with_their_file_and_line(tmp_path):
    page = tmp_path / "page.md"
    ran, numbered = "In L" "ease 7 it ran.", "see Iss" "ue #12"  # split, or the test above would find them
    named_file = "results/h100_iss" "ue9.json"
    page.write_text(f"Measured on nvidia-h200.\n{ran}\nA four-GPU machine.\n{numbered}\nthe release\n"
                    f"{named_file}\nrelease_notes, session_id\n")
    assert hits([page], tmp_path) == [f"page.md:2: {ran}", f"page.md:4: {numbered}", f"page.md:6: {named_file}"]


def test_the_words_are_found_in_file_and_folder_names(tmp_path):
    folder, file = "run_l" "ease4", "h100_iss" "ue9.json"  # split, or the test above would find them
    (tmp_path / "study" / folder).mkdir(parents=True)
    (tmp_path / "study" / folder / "seed0.json").write_text("{}")
    (tmp_path / file).write_text("{}")
    for innocent in ("release_notes.md", "h100_0.5b_1024_adapter.json", "session_log.md"):
        (tmp_path / innocent).write_text("")
    assert named(tmp_path, tmp_path) == [file, f"study/{folder}"]
