"""The tracked results/ folder holds the summaries the docs cite, not raw material: at most 5 MB in all, JSON, PNG
and Markdown only, no logs (5 MB: 5,000,000 bytes, not 5 MiB).

Raw logs, raw bench results and per-run rows stay out of the tree (docs/PERFORMANCE.md says which commit has them).
The rows the study reads (the larger model's traces, the teachers' explanations) are its input, not its results:
they live in study_data/, a file of at most 2 MiB; so do the students' answers, question by question, from which
bench/study_fair.py summarize computes the study's results.
"""

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LIMIT_BYTES = 5_000_000
# A teacher's explanations of the study's common questions (bench/study_fair.py keep): 0.55 MB for 3,000 rows
# (measured); a file much larger holds more than the students read (every sample, every question).
KEPT_LIMIT_BYTES = 2 * 2**20


def _tracked(folder: str = "results") -> list[Path]:
    """Every file git lists under ``folder``: tracked, and new files not ignored (a link counts as itself, as git
    stores it)."""
    listing = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard", folder], cwd=ROOT,
                             capture_output=True, check=True).stdout
    return [ROOT / name for name in listing.decode().split("\0") if name]


def test_the_tracked_results_fit_in_five_mb():
    sizes = {path: path.lstat().st_size for path in _tracked() if path.is_symlink() or path.exists()}
    assert sizes, "git tracks no file under results/"
    largest = [f"{path.relative_to(ROOT)}: {sizes[path]:,} bytes" for path in sorted(sizes, key=sizes.get)[-5:]]
    assert sum(sizes.values()) <= LIMIT_BYTES, f"results/ holds {sum(sizes.values()):,} bytes; largest: {largest}"


def test_no_log_is_tracked_under_results():
    logs = [str(path.relative_to(ROOT)) for path in _tracked() if path.name.endswith(".log")]
    assert logs == []


def test_results_are_json_png_or_markdown():
    other = [str(path.relative_to(ROOT)) for path in _tracked() if path.suffix not in (".json", ".png", ".md")]
    assert other == [], "results/ holds summaries (JSON, PNG, Markdown); rows a run reads belong in study_data/"


def test_each_kept_file_of_explanations_fits_in_two_mib():
    large = [f"{path.relative_to(ROOT)}: {path.lstat().st_size:,} bytes" for path in _tracked("study_data")
             if path.exists() and path.lstat().st_size > KEPT_LIMIT_BYTES]
    assert large == []
