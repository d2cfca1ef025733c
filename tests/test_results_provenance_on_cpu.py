"""Every result kept under results/ says the commit, the device and the command that produced it: in the JSON itself
(``commit``, ``device``, and ``command`` or ``commands``, none empty), or in an entry of results/provenance.json
named by its path under results/. Where no record says, the index writes "not recorded", and how many facts it
writes so may fall, never rise."""

import json
import re
from pathlib import Path

import pytest

RESULTS = Path(__file__).resolve().parents[1] / "results"
INDEX = RESULTS / "provenance.json"
FIELDS = ("commit", "device", "command")
NOT_RECORDED = "not recorded"
# The facts of the index that no record holds, today (a fact wholly "not recorded" or in part, as "runs 1-2 not
# recorded"): this may fall, never rise.
MOST_NOT_RECORDED = 39
# Words that stand for "not recorded" without saying it; the index says it one way.
PLACEHOLDERS = {"unknown", "n/a", "n.a.", "na", "none", "null", "?", "???", "tbd", "todo", "-", "—", "not known",
                "not recorded.", "not available", "unrecorded"}


def _said(value) -> bool:
    """Whether a field's value says something: not empty, not a placeholder, not "not recorded" (a list: each item)."""
    if isinstance(value, list):
        return bool(value) and all(_said(item) for item in value)
    if isinstance(value, dict):  # named commands, e.g. one a GPU
        return bool(value) and all(_said(item) for item in value.values())
    if not isinstance(value, str):  # a number, a flag: no commit, device or command is written so
        return False
    text = value.strip().lower()
    return bool(text) and text not in PLACEHOLDERS and NOT_RECORDED not in text and not text.startswith("unknown")


def _names_a_commit(value) -> bool:
    """A commit field starts with a git hash (7 to 40 hex digits), e.g. "abc1234" or "abc1234 (the bench's code)";
    a list (a study over several commits) of such, each."""
    if isinstance(value, list):
        return bool(value) and all(_names_a_commit(item) for item in value)
    return isinstance(value, str) and re.match(r"[0-9a-f]{7,40}\b", value.strip()) is not None


def inline(path: Path) -> set[str]:
    """The fields ``path`` carries itself, each with a value that says something (``commands`` counts as
    ``command``): a file that writes "unknown" or "not recorded" for a field is indexed like one that lacks it."""
    value = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(value, dict):
        return set()
    said = {f for f in FIELDS if _said(value.get(f)) or (f == "command" and _said(value.get("commands")))}
    return said if _names_a_commit(value.get("commit")) else said - {"commit"}


def result_files() -> list[Path]:
    return sorted(p for p in RESULTS.rglob("*.json") if p != INDEX)


def relative(path: Path) -> str:
    return path.relative_to(RESULTS).as_posix()


@pytest.fixture(scope="module")
def index() -> dict:
    return json.loads(INDEX.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def entries(index) -> dict:
    return index["entries"]


def test_the_index_is_a_json_object_of_entries_sorted_by_path(index):
    assert isinstance(index, dict) and isinstance(index.get("entries"), dict), \
        "results/provenance.json: not an object with an 'entries' object"
    keys = list(index["entries"])
    out_of_order = [f"{later} after {earlier}" for earlier, later in zip(keys, keys[1:]) if later < earlier]
    assert not out_of_order, "results/provenance.json: entries out of order by path: " + "; ".join(out_of_order)


def test_every_result_names_its_commit_device_and_command(entries):
    missing = []
    for path in result_files():
        name = relative(path)
        lacks = sorted(set(FIELDS) - inline(path))
        if lacks and name not in entries:
            missing.append(f"results/{name}: lacks {lacks} and has no entry in results/provenance.json")
    assert not missing, "\n".join(missing)


def test_each_entry_is_whole(entries):
    problems = []
    for name, entry in entries.items():
        if not isinstance(entry, dict):
            problems.append(f"results/{name}: its entry is not an object")
            continue
        for field in (*FIELDS, "source"):
            value = entry.get(field)
            if not isinstance(value, str) or not value.strip():
                problems.append(f"results/{name}: entry's {field!r} is empty or not text")
            elif value.strip().lower() in PLACEHOLDERS or (value.strip().lower() == NOT_RECORDED
                                                           and value != NOT_RECORDED):
                problems.append(f"results/{name}: entry's {field!r} is {value!r}; where no record says, write "
                                f"exactly {NOT_RECORDED!r}")
    assert not problems, "\n".join(problems)


def test_no_entry_is_stale(entries):
    stale = []
    for name in entries:
        path = RESULTS / name
        if name.endswith("/") or not name.endswith(".json"):
            stale.append(f"results/{name}: an entry names one JSON file by its path under results/")
        elif not path.is_file():
            stale.append(f"results/{name}: no such result (stale entry)")
        elif path == INDEX:
            stale.append(f"results/{name}: the index has no entry of its own")
        elif inline(path) == set(FIELDS):
            stale.append(f"results/{name}: carries commit, device and command itself (stale entry)")
    assert not stale, "\n".join(stale)


def not_recorded(entries: dict) -> list[str]:
    return [f"results/{name}: {field}" for name, entry in entries.items() for field in FIELDS
            if isinstance(entry.get(field), str) and NOT_RECORDED in entry[field]]


def test_facts_not_recorded_do_not_grow(entries):
    found = not_recorded(entries)
    assert len(found) <= MOST_NOT_RECORDED, (
        f"{len(found)} facts 'not recorded' in results/provenance.json, at most {MOST_NOT_RECORDED}: record the "
        "commit, device and command of a new result in the file itself (or lower MOST_NOT_RECORDED when a fact is "
        "found):\n" + "\n".join(found))


def test_the_helpers_read_a_result_as_the_index_does(tmp_path):
    result = tmp_path / "r.json"
    result.write_text(json.dumps({"commit": "abc1234", "device": "H200", "commands": ["a", "b"]}))
    assert inline(result) == set(FIELDS)
    result.write_text(json.dumps({"commit": "abc1234", "device": None, "commands": []}))
    assert inline(result) == {"commit"}
    result.write_text(json.dumps([{"commit": "abc1234", "device": "H200", "command": "a"}]))
    assert inline(result) == set()
    result.write_text(json.dumps({"commit": "unknown", "device": "?", "command": "not recorded"}))
    assert inline(result) == set()  # placeholders in the file itself say nothing either
    result.write_text(json.dumps({"commit": "abc1234", "device": "H200", "commands": ["a", "n/a"]}))
    assert inline(result) == {"commit", "device"}
    result.write_text(json.dumps({"commit": "abc1234", "device": "unknown device", "command": 1}))
    assert inline(result) == {"commit"}
    result.write_text(json.dumps({"commit": "abc1234", "device": "—", "commands": {}}))
    assert inline(result) == {"commit"}
    result.write_text(json.dumps({"commit": "abc1234", "device": "H200", "commands": {"gpu0": "a", "gpu1": "b"}}))
    assert inline(result) == set(FIELDS)
    for commit in ("unknown commit", "n.a.", "???", "HEAD", "abc12"):  # no hash: indexed as lacking it
        result.write_text(json.dumps({"commit": commit, "device": "H200", "command": "a"}))
        assert inline(result) == {"device", "command"}, commit
    entries = {"a.json": {"commit": NOT_RECORDED, "device": "H100", "command": "runs 1-2 not recorded"}}
    assert not_recorded(entries) == ["results/a.json: commit", "results/a.json: command"]
