"""A full, read-only or forbidden disk (rlt_mono.runs.atomic_write): one line naming the path and the space, and the
last complete file still readable; the same for metrics rows, final/ and a torch checkpoint writer's error."""

import errno
import json
import os
from types import SimpleNamespace

import pytest
import torch

from rlt_mono.runs import atomic_write, checkpoints
from rlt_mono.runs.atomic_write import DiskError
from rlt_mono.runs.files import RunFilesCallback
from rlt_mono.runs.outputs import METRICS_FILE, read_metrics
from rlt_mono.stages.final_model import save_final


def test_a_full_disk_keeps_the_previous_file_whole_and_says_the_space(tmp_path, monkeypatch):
    path = tmp_path / "eval.json"
    atomic_write.write_json(path, {"questions": 3})
    monkeypatch.setattr(os, "fsync", lambda fd: (_ for _ in ()).throw(OSError(errno.ENOSPC, "No space left")))
    monkeypatch.setattr(atomic_write, "free_bytes", lambda folder: 1024)
    with pytest.raises(DiskError, match=rf"^disk full while writing {path}: free space, then run the same command "
                                        r"again; what was written before stays complete and readable "
                                        r"\(1\.0 KiB to write, 1\.0 KiB free\)$"):
        atomic_write.write_json(path, {"questions": 4, "pad": "x" * 1000})
    assert json.loads(path.read_text()) == {"questions": 3}
    assert [p.name for p in tmp_path.iterdir()] == ["eval.json"]  # no temporary file left beside it


@pytest.mark.parametrize(("code", "message"), [
    (errno.EROFS, "its filesystem is read-only; set output_dir to a folder on a writable disk"),
    (errno.EACCES, "permission denied; set output_dir to a folder you can write to, or fix its permissions"),
])
def test_a_read_only_or_forbidden_folder_is_one_line(tmp_path, monkeypatch, code, message):
    path = tmp_path / "sft_summary.json"
    path.write_text("{}")
    monkeypatch.setattr(atomic_write.tempfile, "mkstemp", lambda **kw: (_ for _ in ()).throw(OSError(code, "x")))
    with pytest.raises(DiskError, match=rf"^cannot write {path}: {message} \(what was written before stays"):
        atomic_write.write_text(path, "{}")
    with pytest.raises(OSError, match="disk fault"):  # any other OSError is not the user's: it keeps its traceback
        with atomic_write.writing(path):
            raise OSError(errno.EIO, "disk fault")


class _HalfThenFull:
    """A file whose writes get half their bytes onto the disk, then fail as a full disk does."""

    def __init__(self, file):
        self.file = file

    def write(self, data):
        self.file.write(data[: len(data) // 2])
        self.file.flush()
        raise OSError(errno.ENOSPC, "No space left on device")

    def __getattr__(self, name):
        return getattr(self.file, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.file.close()


def _half_then_full(path, mode):
    return _HalfThenFull(open(path, mode))


def test_a_metrics_row_cut_by_a_full_disk_leaves_the_file_at_its_last_complete_row(tmp_path, monkeypatch):
    callback = RunFilesCallback(tmp_path, plot=False)
    state = SimpleNamespace(is_world_process_zero=True, global_step=1)
    callback.on_log(None, state, None, logs={"loss": 1.0})
    before = (tmp_path / METRICS_FILE).read_text()
    monkeypatch.setattr(atomic_write, "open", _half_then_full, raising=False)
    state.global_step = 2
    with pytest.raises(DiskError, match=rf"^disk full while writing {tmp_path / METRICS_FILE}: free space, then start "
                                        r"the run again in a new output_dir \(or with output_dir unset\): it saved no "
                                        r"checkpoint yet"):
        callback.on_log(None, state, None, logs={"loss": 0.5, "note": "y" * 200})
    monkeypatch.undo()
    assert (tmp_path / METRICS_FILE).read_text() == before
    assert [row["step"] for row in read_metrics(tmp_path / METRICS_FILE)] == [1]


def test_final_is_refused_before_writing_when_the_weights_do_not_fit(tmp_path, monkeypatch):
    model = torch.nn.Linear(256, 256)  # 257 * 256 float32 values: 257 KiB
    trainer = SimpleNamespace(model=model, args=SimpleNamespace(should_save=True))
    monkeypatch.setattr(atomic_write, "free_bytes", lambda folder: 100 * 1024)
    with pytest.raises(DiskError, match=rf"^not enough disk space for final/ \(the model's weights\) in {tmp_path}: "
                                        r"needs 257\.0 KiB, 100\.0 KiB free; free space, then start the run again "
                                        r"in a new output_dir \(or with output_dir unset\): it saved no checkpoint"):
        save_final(trainer, tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_torch_zip_writer_running_out_of_disk_mid_checkpoint_is_one_line(tmp_path):
    trainer = SimpleNamespace(state=SimpleNamespace(global_step=2))
    error = RuntimeError("[enforce fail at inline_container.cc:778] . PytorchStreamWriter failed writing file "
                         "data/3: file write failed")
    with pytest.raises(DiskError, match=rf"^disk full while writing {tmp_path}: free space, then start the run again "
                                         r"in a new output_dir"):
        with checkpoints.training_failures(trainer, tmp_path, "x"):
            raise error
    with pytest.raises(DiskError, match=r"^cannot write /ro/x: its filesystem is read-only"):
        with checkpoints.training_failures(trainer, tmp_path, "x"):
            raise OSError(errno.EROFS, "Read-only file system", "/ro/x")



def test_a_new_file_gets_the_umask_mode_and_a_replaced_file_keeps_its_own(tmp_path, monkeypatch):
    monkeypatch.setattr(atomic_write, "_UMASK", 0o027)
    new = tmp_path / "study.json"
    atomic_write.write_json(new, {"arms": 2})
    assert new.stat().st_mode & 0o777 == 0o640  # 0666 less the umask, not mkstemp's 0600
    shared = tmp_path / "table.md"
    shared.write_text("old\n")
    shared.chmod(0o664)
    atomic_write.write_text(shared, "new\n")
    assert shared.read_text() == "new\n" and shared.stat().st_mode & 0o777 == 0o664
