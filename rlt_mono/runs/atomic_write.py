"""Writes that leave either the old file or the new one, and one line when the disk says no.

- ``write_text`` / ``write_bytes`` / ``write_json``: a whole file (``eval.json``, ``sft_summary.json``,
  ``pipeline.json``, ``config.yaml``, a compressed file) is written to a temporary file in the same folder, then
  ``publish``-ed over the old one. A failure at any point leaves the previous file as it was.
- ``publish``: a finished file or folder, staged beside its final name (a downloaded wheel, a converted model, a
  cache entry), is synced and renamed into place (``os.replace`` is atomic within a filesystem), and the folder
  synced so the rename itself survives a crash: the final name holds the old content or all of the new. This
  module is the only one that renames files into place.
- ``append_text``: an append-only log (``metrics.jsonl``) gets whole lines in one write; when the write fails
  the file is cut back to its size before it, so it still ends at its last complete line.
- ``check_free_space``: before a save whose size is known, stop with the space needed and free.
- ``write_error``: ``ENOSPC`` / ``EDQUOT`` (full), ``EROFS`` (read-only) and ``EACCES`` / ``EPERM`` (not ours)
  become one ``DiskError`` line naming the path, the space needed and free when known, and saying that what was
  written before stays readable. Any other ``OSError`` is left as it is (a bug, or a disk fault to report).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from rlt_mono.errors import UserError

FULL = (errno.ENOSPC, errno.EDQUOT)
READ_ONLY = (errno.EROFS,)
NOT_ALLOWED = (errno.EACCES, errno.EPERM)
KEPT = "what was written before stays complete and readable"
# The process's umask, read once at import (reading it means setting it): a new file gets the mode ``open`` would
# give it, not mkstemp's owner-only 0600.
_UMASK = os.umask(0)
os.umask(_UMASK)


class DiskError(UserError):
    """A write refused by the disk: full, read-only or not writable by this user."""


def write_text(path: str | Path, text: str) -> None:
    """Replace ``path`` with ``text`` (UTF-8) atomically (the old content, or all of the new)."""
    write_bytes(path, text.encode())


def write_bytes(path: str | Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` atomically (the old content, or all of the new). The file keeps the mode of the
    one it replaces; a new one gets the mode ``open`` gives (0666 less the umask)."""
    path = Path(path)
    with writing(path, needed=len(data)):
        try:
            mode = path.stat().st_mode & 0o7777
        except FileNotFoundError:
            mode = 0o666 & ~_UMASK
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        try:
            os.fchmod(fd, mode)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            publish(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise


def write_json(path: str | Path, value, indent: int = 1) -> None:
    """``write_text`` of ``value`` as JSON (with a final newline)."""
    write_text(path, json.dumps(value, indent=indent) + "\n")


def append_text(path: str | Path, text: str, then: str = "run the same command again") -> None:
    """Append whole lines ``text`` to ``path`` in one write, flushed; a failed write is cut back, so the file
    keeps ending at its last complete line."""
    path = Path(path)
    with writing(path, len(text.encode()), then), open(path, "ab") as f:
        append_to(f, text.encode())


def append_to(file, data: bytes, sync: bool = False) -> None:
    """Write ``data`` at the end of the open binary ``file`` and flush it (and fsync with ``sync``); a failed write
    is cut back to the file's size before it."""
    size = file.seek(0, os.SEEK_END)
    try:
        file.write(data)
        file.flush()
        if sync:
            os.fsync(file.fileno())
    except OSError:
        with contextlib.suppress(OSError):
            file.truncate(size)
        raise


def publish(staging: str | Path, final: str | Path) -> None:
    """Move the finished ``staging`` file or folder to ``final`` (on the same filesystem) in one rename, its content
    synced first and the folder of ``final`` after: ``final`` holds its old content or all of the new, never part.
    A file replaces a file; a folder replaces only a missing or empty folder (``os.replace``)."""
    staging, final = Path(staging), Path(final)
    for path in (staging, *sorted(staging.rglob("*"))) if staging.is_dir() else (staging,):
        if not path.is_symlink():
            sync_folder(path)
    os.replace(staging, final)
    sync_folder(final.parent)


def sync_folder(folder: str | Path) -> None:
    """fsync a folder (or a file): a rename or a new file in it is durable once its folder entry is."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def check_free_space(folder: str | Path, needed: int, what: str, then: str = "run the same command again") -> None:
    """Stop before writing ``what`` (``needed`` bytes) into ``folder`` when its disk has less free."""
    free = free_bytes(folder)
    if free is not None and free < needed:
        raise DiskError(f"not enough disk space for {what} in {folder}: needs {human_bytes(needed)}, "
                        f"{human_bytes(free)} free; free space, then {then}; {KEPT}")


def free_bytes(folder: str | Path) -> int | None:
    """Free bytes on the disk of ``folder`` (or of its nearest existing parent); None when it cannot be read."""
    folder = Path(folder)
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    try:
        return shutil.disk_usage(folder).free
    except OSError:
        return None


def write_error(path: str | Path, err: OSError, needed: int | None = None,
                then: str = "run the same command again") -> DiskError | None:
    """The one-line ``DiskError`` for a full, read-only or forbidden write of ``path`` (``then``: what to do once
    there is space, e.g. how to resume); None for other errors."""
    if err.errno in FULL:
        free = free_bytes(Path(path).parent)
        sizes = ", ".join(part for part in (f"{human_bytes(needed)} to write" if needed else "",
                                            f"{human_bytes(free)} free" if free is not None else "") if part)
        return DiskError(f"disk full while writing {path}: free space, then {then}; {KEPT}"
                         + (f" ({sizes})" if sizes else ""))
    if err.errno in READ_ONLY:
        return DiskError(f"cannot write {path}: its filesystem is read-only; set output_dir to a folder on a "
                         f"writable disk ({KEPT})")
    if err.errno in NOT_ALLOWED:
        return DiskError(f"cannot write {path}: permission denied; set output_dir to a folder you can write to, "
                         f"or fix its permissions ({KEPT})")
    return None


@contextlib.contextmanager
def writing(path: str | Path, needed: int | None = None, then: str = "run the same command again") -> Iterator[None]:
    """Turn a full, read-only or forbidden write of ``path`` inside the block into its ``DiskError``
    (``write_error``)."""
    try:
        yield
    except OSError as err:
        error = write_error(path, err, needed, then)
        if error is None:
            raise
        raise error from err


def human_bytes(count: int) -> str:
    """``1536`` -> ``'1.5 KiB'``."""
    units = ("B", "KiB", "MiB", "GiB", "TiB")
    power = 0
    while count >= 1024 ** (power + 1) and power < len(units) - 1:
        power += 1
    return f"{count} B" if power == 0 else f"{count / 1024 ** power:.1f} {units[power]}"
