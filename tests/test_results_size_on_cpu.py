"""The tracked results/ folder holds the summaries the docs cite, not raw material: at most 5 MiB in all, no logs.

Raw logs, raw bench results and per-run rows stay out of the tree (docs/PERFORMANCE.md says which commit has them).
"""

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LIMIT_BYTES = 5 * 2**20


def _tracked_results() -> list[Path]:
    """Every file git tracks under results/ (a link counts as itself, as git stores it)."""
    listing = subprocess.run(["git", "ls-files", "-z", "results"], cwd=ROOT, capture_output=True, check=True).stdout
    return [ROOT / name for name in listing.decode().split("\0") if name]


def test_the_tracked_results_fit_in_five_mib():
    sizes = {path: path.lstat().st_size for path in _tracked_results() if path.is_symlink() or path.exists()}
    assert sizes, "git tracks no file under results/"
    largest = [f"{path.relative_to(ROOT)}: {sizes[path]:,} bytes" for path in sorted(sizes, key=sizes.get)[-5:]]
    assert sum(sizes.values()) <= LIMIT_BYTES, f"results/ holds {sum(sizes.values()):,} bytes; largest: {largest}"


def test_no_log_is_tracked_under_results():
    logs = [str(path.relative_to(ROOT)) for path in _tracked_results() if path.name.endswith(".log")]
    assert logs == []
