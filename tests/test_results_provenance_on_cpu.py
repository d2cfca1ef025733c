"""Every result kept under results/ says the commit, the device and the command that produced it: in the JSON itself,
or in results/provenance.json (an entry for the file, or for a folder holding it)."""

import json
from pathlib import Path

import pytest

RESULTS = Path(__file__).resolve().parents[1] / "results"
INDEX = RESULTS / "provenance.json"
FIELDS = ("commit", "device", "command")
NOT_RECORDED = "not recorded"
# The facts no record holds, today: this may fall, never rise.
MOST_NOT_RECORDED = 14


def inline(path: Path) -> set[str]:
    """The fields ``path`` carries itself (``commands`` counts as ``command``)."""
    value = json.loads(path.read_text())
    if not isinstance(value, dict):
        return set()
    return {f for f in FIELDS if value.get(f) or (f == "command" and value.get("commands"))}


def covering(entries: dict, relative: str) -> str | None:
    """The entry that speaks for ``relative``: its own, else the deepest folder entry above it."""
    if relative in entries:
        return relative
    folders = [k for k in entries if k.endswith("/") and relative.startswith(k)]
    return max(folders, key=len, default=None)


def result_files() -> list[Path]:
    return sorted(p for p in RESULTS.rglob("*.json") if p != INDEX)


@pytest.fixture(scope="module")
def entries() -> dict:
    return json.loads(INDEX.read_text())["entries"]


def test_every_result_names_its_commit_device_and_command(entries):
    missing = []
    for path in result_files():
        relative = path.relative_to(RESULTS).as_posix()
        if len(inline(path)) == len(FIELDS):
            continue
        entry = covering(entries, relative)
        if entry is None:
            missing.append(f"{relative}: lacks {sorted(set(FIELDS) - inline(path))} and no entry covers it")
    assert not missing, "\n".join(missing)


def test_each_entry_is_whole_sorted_and_speaks_for_a_result_that_needs_it(entries):
    assert list(entries) == sorted(entries), "results/provenance.json: entries out of order"
    problems = []
    for key, entry in entries.items():
        blank = [f for f in FIELDS if not isinstance(entry.get(f), str) or not entry[f].strip()]
        if blank or not entry.get("source"):
            problems.append(f"{key}: empty {blank or ['source']}")
        target = RESULTS / key
        if key.endswith("/"):
            needy = [p for p in target.rglob("*.json") if len(inline(p)) < len(FIELDS)
                     and covering(entries, p.relative_to(RESULTS).as_posix()) == key]
            if not target.is_dir() or not needy:
                problems.append(f"{key}: a folder entry that speaks for no result lacking a field (stale)")
        elif not target.is_file():
            problems.append(f"{key}: no such result (stale)")
        elif len(inline(target)) == len(FIELDS):
            problems.append(f"{key}: carries all three fields itself (stale)")
    assert not problems, "\n".join(problems)


def test_facts_not_recorded_do_not_grow(entries):
    count = sum(entry[f] == NOT_RECORDED for entry in entries.values() for f in FIELDS)
    assert count <= MOST_NOT_RECORDED, f"{count} facts 'not recorded' in results/provenance.json, at most " \
                                       f"{MOST_NOT_RECORDED}: record what produced a new result"


def test_covering_prefers_the_file_then_the_deepest_folder():
    entries = {"a/": {}, "a/b/": {}, "a/b/c.json": {}}
    assert covering(entries, "a/b/c.json") == "a/b/c.json"
    assert covering(entries, "a/b/d.json") == "a/b/"
    assert covering(entries, "a/x.json") == "a/"
    assert covering(entries, "ab/x.json") is None
