"""One file lock (rlt_mono.runs.lock.exclusive) and one rename into place (rlt_mono.runs.atomic_write.publish) for
the whole package and the benchmark scripts: no other module takes an flock or renames a file into place itself,
and a benchmark writes its result files through atomic_write; a second holder of the lock
waits for the first, a killed holder's lock is free; a published file is the old one or all of the new; a distill
run whose file holds every row loads no model."""

import ast
import fcntl
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from rlt_mono.config import compose
from rlt_mono.data.rows import DataConfig, load_split
from rlt_mono.runs import lock as run_lock
from rlt_mono.runs.atomic_write import publish
from rlt_mono.stages import distill, distill_run

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "rlt_mono"
BENCH = ROOT / "bench"
LOCKS = "rlt_mono/runs/lock.py"
RENAMES = "rlt_mono/runs/atomic_write.py"
# Whole-file writes not through atomic_write, each for a reason of its own, with how many the file makes (a new write
# there is caught too):
OTHER_WRITES = {
    # atomic_write itself: its temporary file
    "rlt_mono/runs/atomic_write.py": 1,
    # a case's input file, written into the case's own temporary folder before the command under test reads it
    "bench/tryout.py": 1,
    # a child run's log, streamed to as the run goes (read by a person, or after the run; never a result)
    "bench/bench_mono.py": 1,
    # the model assembled in a temporary folder beside the cache entry, which is published whole
    "rlt_mono/data/pretrained.py": 2,
    # the tiny pair's COMPLETE marker, written into its staging folder, which is published whole
    "rlt_mono/data/embedded/tiny_models.py": 1,
    # a checkpoint's manifest, staged beside and renamed over (OTHER_RENAMES)
    "rlt_mono/runs/checkpoints.py": 1,
}
# Renames outside atomic_write.py, each for a reason of its own:
OTHER_RENAMES = {
    # a checkpoint's manifest, written beside and renamed over once every file is synced; its disk errors are the
    # checkpoint save's own (write_error), not atomic_write's
    "rlt_mono/runs/checkpoints.py",
    # a whole run folder moved aside (rerun_changed): a move of a finished folder, nothing staged to hide
    "rlt_mono/stages/pipeline.py",
}
HOLD = ("import sys\nfrom rlt_mono.runs.lock import exclusive\nwith exclusive(sys.argv[1]):\n"
        "    print('held', flush=True)\n    sys.stdin.readline()\n")


def _calls(path: Path):
    """Every call in ``path`` with its dotted name (``os.replace``, ``tmp.replace``, ``fcntl.flock``) and node."""
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Call):
            yield ast.unparse(node.func), node


def _modules():
    """The package's modules and the benchmark scripts (with bench/study/), by their path from the repository's root."""
    paths = sorted(PACKAGE.rglob("*.py")) + sorted(BENCH.rglob("*.py"))
    return {str(path.relative_to(ROOT)): path for path in paths}


def test_the_walk_covers_the_benchmark_scripts():
    names = set(_modules())
    assert {"bench/bench_mono.py", "bench/study_fair.py", "bench/study/kept.py",
            "rlt_mono/runs/atomic_write.py"} <= names


# Modules whose open() takes the path first and the mode second, as the builtin's does (a Path's takes the mode first).
OPEN_MODULES = ("io", "gzip", "bz2", "lzma", "codecs", "tarfile", "zipfile")
# Calls that write a whole file from their arguments, by dotted name or by the name a `from x import y` gives them.
WRITING_CALLS = {"json.dump", "pickle.dump", "torch.save", "shutil.copy", "shutil.copy2", "shutil.copyfile",
                 "shutil.copytree", "shutil.move"}


def _mode(node: ast.Call, position: int) -> str | None:
    """The mode an ``open`` call gives (its argument at ``position`` or ``mode=``): "r" when none is written, None
    when it is not a literal (a variable: it may write)."""
    given = [k.value for k in node.keywords if k.arg == "mode"] or node.args[position:position + 1]
    if not given:
        return "r"
    return given[0].value if isinstance(given[0], ast.Constant) and isinstance(given[0].value, str) else None


def _memory_buffers(tree: ast.AST) -> set[str]:
    """Names assigned an in-memory buffer (``io.BytesIO()``, ``io.StringIO()``) anywhere in the module."""
    return {target.id for node in ast.walk(tree) if isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Call) and ast.unparse(node.value.func) in ("io.BytesIO", "io.StringIO")
            for target in node.targets if isinstance(target, ast.Name)}


def _whole_file_writes(path: Path) -> list[str]:
    """Calls that write a whole file in place: ``write_text``/``write_bytes`` on a path, ``open`` of any kind for
    writing (not appending; a mode in a variable counts), ``shutil`` copies and moves, ``json``/``pickle`` dumps and
    ``torch.save`` (also imported by name), ``savefig`` to anything but an in-memory buffer."""
    tree = ast.parse(path.read_text(), filename=str(path))
    imported = {alias.asname or alias.name: f"{node.module}.{alias.name}" for node in ast.walk(tree)
                if isinstance(node, ast.ImportFrom) and node.module for alias in node.names}
    buffers = _memory_buffers(tree)
    found = []
    for func, node in _calls(path):
        receiver, _, method = func.rpartition(".")
        full = imported.get(func, func)
        if method == "open" or func == "open" or full in ("os.fdopen", "io.open"):
            position = 1
            if receiver and receiver not in OPEN_MODULES and func != "os.fdopen":
                # a Path's open takes the mode first; an archive's (ZipFile.open) a member's name, then the mode
                first = node.args[0] if node.args else None
                is_mode = isinstance(first, ast.Constant) and isinstance(first.value, str) \
                    and set(first.value) <= set("rwxabt+")
                position = 0 if is_mode or not node.args else 1
            mode = _mode(node, position)
            writes = mode is None or any(c in mode for c in "wx")
            writes = writes and func != "os.open"
        elif method == "savefig":
            target = node.args[0] if node.args else next((k.value for k in node.keywords if k.arg == "fname"), None)
            writes = not (isinstance(target, ast.Name) and target.id in buffers)
        else:
            writes = ((method in ("write_text", "write_bytes") and receiver and receiver != "atomic_write")
                      or full in WRITING_CALLS)
        if writes:
            found.append((node.lineno, f"{path.relative_to(ROOT)}:{node.lineno}: {func}()"))
    return [line for _, line in sorted(found)]


def test_whole_files_are_written_through_atomic_write():
    found, counts = [], {}
    for name, path in _modules().items():
        lines = _whole_file_writes(path)
        if name in OTHER_WRITES:
            counts[name] = len(lines)
        else:
            found += lines
    assert not found, ("files written in place (use rlt_mono.runs.atomic_write's write_json, write_text or "
                       "write_bytes; a file staged in a folder that is published whole is listed in OTHER_WRITES "
                       "with its reason):\n" + "\n".join(found))
    assert counts == OTHER_WRITES, "writes in the files of OTHER_WRITES, found vs listed (a new one needs a reason)"


def test_the_write_walk_finds_each_kind_of_write(tmp_path, monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    script = tmp_path / "bench" / "x.py"
    script.parent.mkdir()
    script.write_text("import io, json, shutil, gzip\nfrom json import dump\nout.write_text('a')\n"
                      "with open(p, 'w') as f: pass\nwith p.open(mode='wb') as f: pass\nshutil.copy(a, b)\n"
                      "fig.savefig(out)\njson.dump(v, f)\ngzip.open(p, 'wt')\nio.open(p, 'w')\nopen(p, mode)\n"
                      "plt.savefig(fname=p)\ndump(v, f)\nshutil.copytree(a, b)\n"
                      "with open(p, 'ab') as f: pass\nwith open(p) as f: pass\ngzip.open(p)\npng = io.BytesIO()\n"
                      "archive.open(member)\narchive.open('a/b.json')\n"
                      "fig.savefig(png, format='png')\nwrite_text(out, 'a')\natomic_write.write_text(out, 'a')\n")
    assert [line.rpartition(": ")[2] for line in _whole_file_writes(script)] == [
        "out.write_text()", "open()", "p.open()", "shutil.copy()", "fig.savefig()", "json.dump()", "gzip.open()",
        "io.open()", "open()", "plt.savefig()", "dump()", "shutil.copytree()"]


def test_only_the_lock_module_takes_a_file_lock():
    found = []
    for name, path in _modules().items():
        tree = ast.parse(path.read_text(), filename=str(path))
        imports = [alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names]
        imports += [f"{node.module}.{alias.name}" for node in ast.walk(tree)
                    if isinstance(node, ast.ImportFrom) and node.module for alias in node.names]
        found += [f"{name}: imports {target}" for target in imports
                  if target.split(".")[0] == "filelock" or target in ("fcntl.flock", "fcntl.lockf")]
        found += [f"{name}:{node.lineno}: {func}()" for func, node in _calls(path)
                  if func.rpartition(".")[2] in ("flock", "lockf")]
    outside = [line for line in found if not line.startswith(LOCKS)]
    assert not outside, "file locks outside rlt_mono/runs/lock.py (use its exclusive):\n" + "\n".join(outside)
    assert any(line.startswith(LOCKS) for line in found), "the walk found the lock module's flock"


def _renames(path: Path) -> list[str]:
    """Calls that rename a file: os.replace / os.rename / shutil.move, ``x.rename(y)``, and ``x.replace(y)`` with
    one argument (a Path's; a str's takes two, dataclasses.replace is named)."""
    found = []
    for func, node in _calls(path):
        method = func.rpartition(".")[2]
        if (func in ("os.replace", "os.rename", "os.renames", "shutil.move") or method == "rename"
                or (method == "replace" and "." in func and func != "dataclasses.replace"
                    and len(node.args) == 1 and not node.keywords)):
            found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {func}()")
    return found


def test_only_atomic_write_renames_files_into_place():
    found = {name: _renames(path) for name, path in _modules().items()}
    assert found[RENAMES], "the walk found atomic_write's rename"
    outside = [line for name, lines in found.items() if name != RENAMES and name not in OTHER_RENAMES
               for line in lines]
    assert not outside, "renames outside rlt_mono/runs/atomic_write.py (use its publish):\n" + "\n".join(outside)


# ---- exclusive -------------------------------------------------------------------------------------------------
def _holder(path: Path) -> subprocess.Popen:
    process = subprocess.Popen([sys.executable, "-c", HOLD, str(path)], cwd=ROOT, stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, text=True)
    assert process.stdout.readline().strip() == "held"
    return process


def test_a_second_holder_waits_for_the_first_and_a_killed_holders_lock_is_free(tmp_path):
    path = tmp_path / "entry.lock"
    holder = _holder(path)
    order, told = [], []
    try:
        def release_later():
            order.append("released")
            holder.stdin.write("go\n")
            holder.stdin.flush()

        timer = threading.Timer(1.0, release_later)
        timer.start()
        with run_lock.exclusive(path, waiting=told.append):
            order.append("entered")
        timer.join()
    finally:
        holder.kill()
        holder.wait()
    assert order == ["released", "entered"]
    assert told == [None]  # told once; this holder wrote no record

    holder = _holder(path)
    holder.send_signal(signal.SIGKILL)  # killed while holding: the kernel lets go
    holder.wait()
    told.clear()
    started = time.monotonic()
    with run_lock.exclusive(path, waiting=told.append):
        assert not told and time.monotonic() - started < 5


def test_an_open_file_is_locked_for_the_block_and_left_open(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text("a\n")
    other = os.open(path, os.O_RDONLY)  # another open file of the same path: its lock conflicts with ours
    try:
        with open(path, "ab+") as file:
            with run_lock.exclusive(file):
                with pytest.raises(BlockingIOError):
                    fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
            assert not file.closed
            fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)  # free again
            fcntl.flock(other, fcntl.LOCK_UN)
            file.write(b"b\n")
    finally:
        os.close(other)
    assert path.read_text() == "a\nb\n"


# ---- publish ---------------------------------------------------------------------------------------------------
PUBLISH_LOOP = ("import sys\nfrom pathlib import Path\nfrom rlt_mono.runs.atomic_write import publish\n"
                "final = Path(sys.argv[1])\nprint('writing', flush=True)\nfor i in range(100000):\n"
                "    staging = final.with_name(f'.{final.name}.{i}')\n"
                "    staging.write_bytes(b'AB'[i % 2:i % 2 + 1] * (200000 + 100000 * (i % 2)))\n"
                "    publish(staging, final)\n")


def _whole(data: bytes) -> bool:
    return data in (b"A" * 200000, b"B" * 300000)


def test_a_published_file_is_the_old_or_all_of_the_new_even_when_killed(tmp_path):
    final = tmp_path / "model.bin"
    final.write_bytes(b"A" * 200000)
    writer = subprocess.Popen([sys.executable, "-c", PUBLISH_LOOP, str(final)], cwd=ROOT, stdout=subprocess.PIPE,
                              text=True)
    try:
        assert writer.stdout.readline().strip() == "writing"
        seen = set()
        deadline = time.monotonic() + 2
        while time.monotonic() < deadline:  # a reader beside the writer never sees a part of a file
            data = final.read_bytes()
            assert _whole(data), f"a read saw {len(data)} bytes"
            seen.add(data[:1])
        writer.send_signal(signal.SIGKILL)  # killed wherever it is: mid-write, mid-rename
        writer.wait()
    finally:
        writer.kill()
        writer.wait()
    assert seen == {b"A", b"B"}, "the reader saw both versions"
    assert _whole(final.read_bytes())


def test_a_published_folder_appears_whole_and_never_replaces_a_full_one(tmp_path):
    staging, final = tmp_path / ".pair-x", tmp_path / "pair"
    (staging / "teacher").mkdir(parents=True)
    (staging / "teacher" / "config.json").write_text("{}")
    (staging / "COMPLETE").write_text("1")
    publish(staging, final)
    assert not staging.exists()
    assert sorted(str(p.relative_to(final)) for p in final.rglob("*")) == ["COMPLETE", "teacher", "teacher/config.json"]

    staging.mkdir()
    (staging / "COMPLETE").write_text("2")
    with pytest.raises(OSError):  # a complete folder stays as it is: the caller removes it first
        publish(staging, final)
    assert (final / "COMPLETE").read_text() == "1" and (staging / "COMPLETE").read_text() == "2"


# ---- distill with nothing left ---------------------------------------------------------------------------------
def test_distill_with_every_row_written_loads_no_model_and_leaves_the_file(tmp_path, monkeypatch, caplog):
    cfg = compose("distill", ["size=tiny", f"output_dir={tmp_path}", "data.max_rows=3"])
    rows = load_split(DataConfig(**OmegaConf.to_container(cfg.data, resolve=True)), cfg.seed, "train")
    path = tmp_path / distill.DISTILL_FILE
    path.write_text("".join(json.dumps({"question": r["question"], "solution": r["solution"], "explanation": "e"})
                            + "\n" for r in rows))
    OmegaConf.save(cfg, tmp_path / "config.yaml")
    before = {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in tmp_path.iterdir()}

    def no_model(*args, **kwargs):
        raise AssertionError("a model (or its tokenizer) was loaded")

    monkeypatch.setattr(distill_run, "load_stage_models", no_model)
    monkeypatch.setattr(distill_run, "teacher_budget", no_model)
    monkeypatch.setattr(distill_run, "open_generator", no_model)
    with caplog.at_level("INFO", logger="rlt_mono.stages.distill"):
        assert distill.run_distill(cfg) == tmp_path
    assert f"distill: all {len(rows)} rows already written in {path}; nothing to do" in caplog.messages
    assert {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in tmp_path.iterdir()} == before

    # One question missing: the run goes on to the models (here: the refusing stand-in).
    path.write_text("".join(path.read_text().splitlines(keepends=True)[:-1]))
    with pytest.raises(AssertionError, match="was loaded"):
        distill.run_distill(cfg)
