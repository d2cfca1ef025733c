"""The code, configs, tests, docs, benchmarks and committed measurements speak to a user of rlt_mono: a measurement
names its date, device, commit and command, never how the machines that ran it were lent or how the work on rlt_mono
was organised. Every text file of the tree git lists (tracked, and new files not ignored) is read, and the name of
every file and folder in it is checked too; images and compressed files are not read."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Each word is spelled so that this file's own pattern does not match it: "[ ]" is one space, "[ -]?" one of those
# or none (a number joined to the word, as in a file name). "iss[u]es?" is a word alone or a number's label (with
# "#12" or "9" after it), never part of a longer word (issued, issuer).
WORDS = re.compile(r"\blease|\bsession[ -]?\d|\biss[u]es?(?![a-z])|\bround[ -]?\d|\bsprints?\b"
                   r"|(?<![\w-])GPU[ ]machine|\bdevice[ ]tools?\b|\bstash[ ]calls?\b|\bdevice[ ]calls?\b"
                   r"|\bdevice[ ]machine\b|\bcall-\d|\bmachine's[ ]time\b|\bdevice[ ]time\b|\bgiven[ ](?:back|out)\b"
                   r"|/wor[k]/|\bnvidia-h[0-9]00\b|\bcall[ ]?\d|\bwas[ ]reclaimed\b|\btime[ ]ran[ ]out\b"
                   r"|\bminutes[ ]on[ ]the[ ]machine\b|\bmachines'[ ]worth\b|\bhosts?[ ](?:was|were|stopped|went)\b"
                   r"|\bwith[ ]the[ ]machine\b|\blost[ ]machine\b|\bpart's[ ](?:\d+[ ]minutes|GPU[ ]time)"
                   r"|\bmachine[ ](?:was|were)[ ](?:lost|released|reclaimed)\b|\bparts?[ ]of[ ]\d+[ ]minutes\b",
                   re.IGNORECASE)
# A link to an upstream project's bug tracker (vLLM's, TRL's) is about the world, not about rlt_mono's work: the URL
# alone is left out of the line before it is searched.
UPSTREAM_BUG = re.compile(r"https://github\.com/[\w.-]+/(?!rlt[_-]mono\b)[\w.-]+/iss[u]es/\d+", re.IGNORECASE)


def organised(text: str) -> bool:
    """Whether ``text`` holds one of the words; an underscore separates words as a space does (a file name)."""
    return WORDS.search(UPSTREAM_BUG.sub("", text).replace("_", " ")) is not None


def _listed(root: Path = ROOT) -> list[str]:
    """Every path git lists under ``root``, relative to it: tracked, and new files that are not ignored."""
    out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=root,
                         capture_output=True, check=True).stdout.decode()
    return sorted({name for name in out.split("\0") if name})


def _files() -> list[Path]:
    return [ROOT / name for name in _listed() if (ROOT / name).is_file()]  # a file deleted but not yet staged: gone


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


def named(paths: list[str]) -> list[str]:
    """Every file and folder of ``paths`` (relative paths, "/"-separated) whose own name holds one of the words."""
    found = set()
    for path in paths:
        parts = path.split("/")
        found |= {"/".join(parts[:end]) for end in range(1, len(parts) + 1) if organised(parts[end - 1])}
    return sorted(found)


def test_no_word_of_how_the_work_was_organised():
    found = hits(_files())
    assert not found, "\n".join(found)


def test_no_file_or_folder_is_named_after_how_the_work_was_organised():
    found = named(_listed())
    assert not found, "\n".join(found)


def test_the_words_are_found_with_their_file_and_line(tmp_path):
    page = tmp_path / "page.md"
    # split, or the test above would find them
    ran, numbered, worded = "In L" "ease 7 it ran.", "see Iss" "ue #12", "as the iss" "ue asks"
    plural, reviewed = "open Iss" "ues", "fixed in Ro" "und 3"
    named_file, logger = "results/h100_iss" "ue9.json", 'getLogger("ro' 'und3.file")'
    upstream = "vLLM's bug https://github.com/vllm-project/vllm/iss" "ues/12345 is worked around here"
    own = "https://github.com/someone/rlt_mono/iss" "ues/4"
    page.write_text(f"Measured on an H200.\n{ran}\nA four-GPU machine.\n{numbered}\nthe release\n"
                    f"{named_file}\nrelease_notes, session_id\n{worded}\n{plural}\n{reviewed}\n{logger}\n"
                    f"issued, the issuer, round(x, 2), a background task\n{upstream}\n{own}\n")
    assert hits([page], tmp_path) == [f"page.md:2: {ran}", f"page.md:4: {numbered}", f"page.md:6: {named_file}",
                                      f"page.md:8: {worded}", f"page.md:9: {plural}", f"page.md:10: {reviewed}",
                                      f"page.md:11: {logger}", f"page.md:14: {own}"]
    # said another way: where the work ran, not what the product does
    said, folder = "run on the dev" "ice machine", ".gpu-stack/ca" "ll-3/install.sh"
    budget, numbered_call = "when the mach" "ine's ti" "me ran out", "run 1 ca" "ll 3: python3 bench/x.py"
    lost, fits = "then both ho" "sts stopped", "does not fit a pa" "rt of 25 minutes"
    page.write_text(f"{said}\n{folder}\na call to the engine, the machine's memory\n{budget}\n{numbered_call}\n"
                    f"{lost}\n{fits}\nthe host's disk filled\n")
    assert hits([page], tmp_path) == [f"page.md:1: {said}", f"page.md:2: {folder}", f"page.md:4: {budget}",
                                      f"page.md:5: {numbered_call}", f"page.md:6: {lost}", f"page.md:7: {fits}"]


def test_the_words_are_found_in_file_and_folder_names_git_lists(tmp_path):
    # split, or the test above would find them
    folder, file, test = "run_l" "ease4", "h100_iss" "ue9.json", "test_ro" "und4_x_on_cpu.py"
    (tmp_path / "study" / folder).mkdir(parents=True)
    (tmp_path / "study" / folder / "seed0.json").write_text("{}")
    (tmp_path / file).write_text("{}")
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / test).write_text("")
    for innocent in ("release_notes.md", "h100_0.5b_1024_adapter.json", "session_log.md", "test_rounding_on_cpu.py"):
        (tmp_path / innocent).write_text("")
    (tmp_path / "ignored_iss" "ue1").mkdir()
    (tmp_path / "ignored_iss" "ue1" / "x.txt").write_text("")
    (tmp_path / ".gitignore").write_text("ignored_*/\n")
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    subprocess.run(["git", "add", file], cwd=tmp_path, check=True)  # one tracked, the others new: both are listed
    assert named(_listed(tmp_path)) == [file, f"study/{folder}", f"tests/{test}"]
