"""The run folder's lock on a disk that refuses its holder's record: one line, nothing held, nothing left open."""

import errno
import os

import pytest

from rlt_mono.runs import lock as run_lock
from rlt_mono.runs.atomic_write import DiskError


def test_a_full_disk_when_the_lock_records_its_holder_is_one_line(tmp_path, monkeypatch):
    """The lock file opens on a full disk (creating an empty file needs no block), but writing its holder's record
    fails: one line saying the disk is full, the descriptor closed, the folder not held."""
    def full(fd, data, offset):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(run_lock.os, "pwrite", full)
    opened = []
    real_open = os.open
    monkeypatch.setattr(run_lock.os, "open", lambda *a, **k: opened.append(real_open(*a, **k)) or opened[-1])
    with pytest.raises(DiskError, match=r"^disk full while writing .*\.lock: free space, then run the same command"):
        run_lock.acquire(tmp_path)
    with pytest.raises(OSError):  # closed
        os.fstat(opened[-1])
    assert tmp_path.resolve() not in run_lock._held
    assert list(tmp_path.iterdir()) == []  # no empty lock file left: the run's folder can go
