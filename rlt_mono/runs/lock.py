"""One writer per run folder: an OS file lock on ``<run folder>/.lock``, held for the whole run.

``rlt_mono.cli`` takes it once it knows the run's folder, before the stage starts, and gives it back when the
stage ends. A second process asking for the same folder stops at once with one line naming the holder (its pid,
host, start time and command, written into the lock file). The lock is ``fcntl.flock``: the kernel releases it
when its process ends, however it ends (``kill -9`` included), so a ``.lock`` left by a dead run is taken over
(the lock succeeds; its old content is logged). Each folder has its own lock, not inherited by subfolders: a
pipeline holds its root, each stage it launches its own stage folder; a data-parallel run's launcher holds it for
all its ranks. The lock file is removed when the run ends.

``engine_start`` is the other lock here: one vLLM engine start at a time per machine. A start measures the GPU's
memory to size its KV cache; another process starting (or loading) meanwhile changes what it measures, and
several runs sharing one GPU failed that way. The lock serialises only the starts, not the runs.

``exclusive`` is the lock every other part of rlt_mono takes: a cache entry built once by concurrent callers
(``rlt_mono.data.pretrained``, ``rlt_mono.data.embedded.tiny_models``), appends keyed by question
(``rlt_mono.stages.distill``). This module is the only one that calls ``fcntl.flock`` (``_flock``).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import socket
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

from rlt_mono.errors import UserError
from rlt_mono.runs.atomic_write import write_error

logger = logging.getLogger(__name__)

LOCK_FILE = ".lock"
# The machine-wide lock of engine_start; RLT_MONO_ENGINE_LOCK names another file (tests, or a shared /tmp).
ENGINE_LOCK_ENV = "RLT_MONO_ENGINE_LOCK"

# Folders this process holds (resolved path -> the open lock file's descriptor), until release_all.
_held: dict[Path, int] = {}
# True while this process holds the engine-start lock (engine_start).
_starting_here = False


class FolderInUse(UserError):
    """Another live process writes into the folder."""


def acquire(folder: str | Path) -> None:
    """Hold ``folder``'s lock for this process (again: nothing to do). Raises ``FolderInUse`` naming the holder
    when another live process holds it, ``DiskError`` when the folder cannot be written."""
    folder = Path(folder).resolve()
    if folder in _held:
        return
    path = folder / LOCK_FILE
    while True:
        fd = _open_lock_file(path)
        if not _flock(fd, wait=False):
            holder = _read(fd)
            os.close(fd)
            raise FolderInUse(f"output_dir={folder} is in use by another run ({describe(holder)}): wait for it to "
                              f"end{_stop_hint(holder)}, or choose another output_dir") from None
        # The previous holder removes the file as it ends: if it did so between our open and our lock, we hold a
        # file no one else will open; lock the one now at the path instead.
        if _same_file(fd, path):
            break
        os.close(fd)
    previous = _read(fd)
    if previous:
        logger.warning("%s: taking over the lock of a run that has ended (%s)", folder, describe(previous))
    try:
        _record_holder(fd, path)
    except BaseException:
        with contextlib.suppress(OSError):  # ours (we hold it): no empty lock file keeps the folder from going
            path.unlink()
        os.close(fd)
        raise
    _held[folder] = fd


@contextmanager
def exclusive(target: str | Path | BinaryIO,
              waiting: Callable[[dict | None], None] | None = None) -> Iterator[int]:
    """Hold an exclusive lock of ``target`` while the block runs (which gets the locked descriptor), waiting for
    another holder to let go.

    ``target`` is a lock file's path (created if missing, its folder not; closed at the end, which releases the
    lock) or an open file (locked and unlocked, left open). When another process holds it, ``waiting`` is called
    once with the holder's record, if the holder wrote one (``acquire``, ``engine_start``), before waiting. The
    kernel releases the lock when its process ends, however it ends."""
    fd = _open_lock_file(Path(target)) if isinstance(target, (str, Path)) else target.fileno()
    try:
        if not _flock(fd, wait=False):
            if waiting is not None:
                waiting(_read(fd))
            _flock(fd)
        yield fd
    finally:
        if isinstance(target, (str, Path)):
            os.close(fd)  # closing the descriptor releases the lock
        else:
            fcntl.flock(fd, fcntl.LOCK_UN)


def engine_lock_path() -> Path:
    """The machine-wide file ``engine_start`` locks: ``$RLT_MONO_ENGINE_LOCK``, else one per user in the temp
    folder."""
    return Path(os.environ.get(ENGINE_LOCK_ENV) or Path(tempfile.gettempdir()) / f"rlt_mono-engine-{os.getuid()}.lock")


@contextmanager
def engine_start(what: str = "vLLM engine") -> Iterator[None]:
    """Hold the machine-wide engine-start lock while the block runs (a vLLM engine's start and first sleep): a
    second process waits, saying once whom it waits for."""
    global _starting_here
    waited_since = []

    def waiting(holder: dict | None) -> None:
        waited_since.append(time.monotonic())
        logger.info("%s start: waiting for another process's engine start to end (%s)", what, describe(holder))

    with exclusive(engine_lock_path(), waiting) as fd:
        if waited_since:
            logger.info("%s start: waited %.1f s for the other engine start", what, time.monotonic() - waited_since[0])
        _record_holder(fd, engine_lock_path())
        _starting_here = True
        try:
            yield
        finally:
            _starting_here = False


def engine_starting_elsewhere() -> bool:
    """Whether another process holds the engine-start lock now. vLLM's start reads the card's free memory before
    and after profiling: memory freed in between stops it ("Error in memory profiling"), memory taken in between
    leaves no room for its KV cache ("No available memory for the cache blocks"). A process that empties its
    allocator's cache after each phase does both (it frees, then takes the memory back from the card), so it keeps
    the cache while this is true (``rlt_mono.rl.swapper``): in the study's run 7 (2026-11-26, docs/STUDY.md), one
    seed's RL start failed once each way beside the other seeds' steps."""
    if _starting_here:
        return False
    try:
        fd = os.open(engine_lock_path(), os.O_RDONLY | os.O_CLOEXEC)
    except OSError:  # no lock file: nobody has started an engine on this machine
        return False
    try:
        return not _flock(fd, wait=False, shared=True)
    finally:
        os.close(fd)  # releases the shared lock taken just now, if it was


def release_all() -> None:
    """Give back every lock this process holds, removing the lock files (removed while still held, so no other
    process can lock a file that is about to disappear)."""
    for folder, fd in list(_held.items()):
        try:
            os.unlink(folder / LOCK_FILE)
        except OSError:  # gone with its folder (a test's temporary folder, an aside move): nothing to remove
            pass
        os.close(fd)
        del _held[folder]


def describe(record: dict | None) -> str:
    """``pid 123 on host gpu1 since 2026-01-02 03:04:05: python -m rlt_mono.cli ...``."""
    if not record:
        return "it has not written its details yet"
    return (f"pid {record.get('pid')} on host {record.get('host')} since {record.get('since')}: "
            f"{record.get('command', '?')}")


def _stop_hint(record: dict | None) -> str:
    if record and record.get("host") == socket.gethostname():
        return f" or stop it (kill {record.get('pid')})"
    return " or stop it"


def _open_lock_file(path: Path) -> int:
    """A descriptor of the lock file ``path``, created if missing; a folder in its place, or a disk that refuses
    the write, is one line (``UserError``)."""
    try:
        return os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except IsADirectoryError as err:
        raise UserError(f"{path} is a folder, where rlt_mono keeps a lock file: remove that folder (it is not "
                        "rlt_mono's), then run again") from err
    except OSError as err:
        raise (write_error(path, err) or err) from err


def _flock(fd: int, wait: bool = True, shared: bool = False) -> bool:
    """Lock ``fd`` exclusively (or ``shared``), waiting for it; without ``wait``, False at once when another process
    holds it."""
    try:
        fcntl.flock(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | (0 if wait else fcntl.LOCK_NB))
    except BlockingIOError:
        return False
    return True


def _record_holder(fd: int, path: Path) -> None:
    """Write this process's record (pid, host, start time, command) into the locked file ``fd`` at ``path``, for
    ``describe``; a disk that refuses the write (full, read-only) is one line (``DiskError``)."""
    record = {"pid": os.getpid(), "host": socket.gethostname(), "since": time.strftime("%Y-%m-%d %H:%M:%S"),
              "command": " ".join(sys.argv)}
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(record) + "\n").encode(), 0)
    except OSError as err:
        raise (write_error(path, err) or err) from err


def _read(fd: int) -> dict | None:
    try:
        return json.loads(os.pread(fd, 65536, 0).decode())
    except (ValueError, UnicodeDecodeError):  # empty (its holder is writing it) or not ours
        return None


def _same_file(fd: int, path: Path) -> bool:
    try:
        return os.stat(path).st_ino == os.fstat(fd).st_ino
    except FileNotFoundError:
        return False
