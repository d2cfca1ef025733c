"""One writer per run folder (rlt_mono.runs.lock): a live holder stops a second writer in one line naming it, a lock
left by a killed run is taken over, and the dispatcher holds the lock for the whole stage (not in a rank)."""

import dataclasses
import json
import os
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from rlt_mono import cli
from rlt_mono.errors import UserError
from rlt_mono.runs import lock as run_lock
from rlt_mono.stages import STAGES

ROOT = Path(__file__).resolve().parent.parent
HOLD = ("import sys, time\nfrom rlt_mono.runs import lock as run_lock\nrun_lock.acquire(sys.argv[1])\n"
        "print('held', flush=True)\n"
        "time.sleep(120)\n")
TRY = ("import sys\nfrom rlt_mono.runs import lock as run_lock\ntry:\n    run_lock.acquire(sys.argv[1])\n"
       "except run_lock.FolderInUse as err:\n    print(err)\n")


@pytest.fixture(autouse=True)
def _release():
    yield
    run_lock.release_all()


def _holder(folder: Path) -> subprocess.Popen:
    """Another process holding ``folder``'s lock (it says 'held' once it does)."""
    process = subprocess.Popen([sys.executable, "-c", HOLD, str(folder)], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert process.stdout.readline().strip() == "held"
    return process


def test_a_second_writer_stops_naming_the_holder_and_a_dead_holders_lock_is_taken_over(tmp_path, caplog):
    holder = _holder(tmp_path)
    try:
        with pytest.raises(run_lock.FolderInUse, match=rf"^output_dir={tmp_path} is in use by another run \(pid "
                           rf"{holder.pid} on host {socket.gethostname()} since .*: wait for it to end or stop it "
                           rf"\(kill {holder.pid}\), or choose another output_dir$"):
            run_lock.acquire(tmp_path)
    finally:
        holder.send_signal(signal.SIGKILL)  # a killed run leaves its .lock file behind, its flock released
        holder.wait()
    assert json.loads((tmp_path / run_lock.LOCK_FILE).read_text())["pid"] == holder.pid
    run_lock.acquire(tmp_path)
    assert f"taking over the lock of a run that has ended (pid {holder.pid}" in caplog.text
    assert json.loads((tmp_path / run_lock.LOCK_FILE).read_text())["pid"] == os.getpid()
    run_lock.release_all()
    assert not (tmp_path / run_lock.LOCK_FILE).exists()


def test_the_dispatcher_refuses_a_folder_in_use_before_the_stage_starts(tmp_path, capsys, monkeypatch):
    started = []
    monkeypatch.setitem(STAGES, "distill", dataclasses.replace(STAGES["distill"], run=started.append))
    holder = _holder(tmp_path)
    try:
        assert cli.main(["distill", "size=tiny", f"output_dir={tmp_path}"]) == 2
    finally:
        holder.kill()
        holder.wait()
    assert not started
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith(f"error: output_dir={tmp_path} is in use by another run (pid {holder.pid} on host")


def test_the_dispatcher_holds_the_lock_of_the_folder_it_names_for_the_whole_stage(tmp_path, monkeypatch):
    seen = {}

    def stage(cfg):  # what the stage sees: its folder named and locked by this process
        seen["folder"] = Path(cfg.output_dir)
        seen["holder"] = json.loads((seen["folder"] / run_lock.LOCK_FILE).read_text())["pid"]
        second = subprocess.run([sys.executable, "-c", TRY, cfg.output_dir], cwd=ROOT, capture_output=True, text=True)
        seen["second writer"] = second.stdout.strip()
        raise UserError("stopped before writing anything")

    monkeypatch.setitem(STAGES, "distill", dataclasses.replace(STAGES["distill"], run=stage))
    assert cli.main(["distill", "size=tiny", f"run_dir={tmp_path}/new"]) == 2  # output_dir unset: a new folder
    assert seen["folder"] == tmp_path / "new" and seen["holder"] == os.getpid()
    assert seen["second writer"].startswith(f"output_dir={tmp_path}/new is in use by another run (pid {os.getpid()}")
    assert not (tmp_path / "new").exists()  # lock released, so the unused new folder was removed


def test_a_data_parallel_rank_and_another_machine_leave_the_lock_to_the_first_launcher(tmp_path, monkeypatch):
    from rlt_mono.config import compose

    cfg = compose("teacher_sft", ["size=tiny", f"output_dir={tmp_path}"])
    monkeypatch.setenv("RLT_MONO_LAUNCHED", "1")
    cli.hold_run_folder(cfg)
    assert not (tmp_path / run_lock.LOCK_FILE).exists()
    monkeypatch.delenv("RLT_MONO_LAUNCHED")
    cli.hold_run_folder(compose("teacher_sft", ["size=tiny", f"output_dir={tmp_path}", "placement=dp",
                                                       "placement.num_machines=2", "placement.machine_rank=1"]))
    assert not (tmp_path / run_lock.LOCK_FILE).exists()
    cli.hold_run_folder(cfg)
    assert json.loads((tmp_path / run_lock.LOCK_FILE).read_text())["pid"] == os.getpid()


# ---- distill.jsonl: keyed by question ----------------------------------------------------------------------
APPEND = ("import sys, time\nfrom pathlib import Path\nfrom rlt_mono.stages.distill_run import DistillFile\n"
          "out = DistillFile(Path(sys.argv[1]), then='resume')\n"
          "while not Path(sys.argv[2]).exists():\n    time.sleep(0.01)\n"
          "for i in range(100):\n"
          "    out.append([{'question': f'q{i}', 'solution': 's', 'sample_index': k} for k in range(2)])\n")


def _questions(path: Path) -> list[str]:
    return [json.loads(line)["question"] for line in path.read_text().splitlines()]


def test_two_writers_of_one_distill_file_never_write_a_question_twice(tmp_path):
    from rlt_mono.stages.distill_run import DistillFile

    path, go = tmp_path / "distill.jsonl", tmp_path / "go"
    writers = [subprocess.Popen([sys.executable, "-c", APPEND, str(path), str(go)], cwd=ROOT) for _ in range(2)]
    go.touch()  # both start appending the same 100 questions at once
    assert [writer.wait(timeout=120) for writer in writers] == [0, 0]
    questions = _questions(path)
    assert len(questions) == 200 and sorted(set(questions)) == sorted(f"q{i}" for i in range(100))
    assert all(questions[i] == questions[i + 1] for i in range(0, 200, 2))  # a question's rows stay together
    resumed = DistillFile(path, then="resume")  # a resumed run: what is in the file is not written again
    assert resumed.append([{"question": "q7", "solution": "s"}, {"question": "new", "solution": "s"}]) == 1
    resumed.close()
    assert _questions(path)[200:] == ["new"]


ENGINE_HOLD = ("import sys, time\nfrom rlt_mono.runs import lock as run_lock\nwith run_lock.engine_start():\n"
               "    print('starting', flush=True)\n    sys.stdin.readline()\n")


def test_engine_starts_wait_for_each_other_and_name_the_holder(tmp_path, monkeypatch, caplog):
    """Two engine starts on one machine: the second waits until the first's block ends, saying whom it waits for."""
    lock = tmp_path / "engine.lock"
    monkeypatch.setenv(run_lock.ENGINE_LOCK_ENV, str(lock))
    holder = subprocess.Popen([sys.executable, "-c", ENGINE_HOLD], cwd=ROOT, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, env={**os.environ})
    try:
        assert holder.stdout.readline().strip() == "starting"
        order = []
        def release_later():
            order.append("released")
            holder.stdin.write("go\n")
            holder.stdin.flush()

        timer = threading.Timer(1.0, release_later)
        timer.start()
        with caplog.at_level("INFO", logger="rlt_mono.runs.lock"), run_lock.engine_start():
            order.append("entered")
        timer.join()
        assert order == ["released", "entered"]
        assert f"pid {holder.pid} on host {socket.gethostname()}" in caplog.text
        assert "waited" in caplog.text
    finally:
        holder.kill()
        holder.wait()
    # Free again: a start with no other start under way does not wait.
    caplog.clear()
    with caplog.at_level("INFO", logger="rlt_mono.runs.lock"), run_lock.engine_start():
        pass
    assert "waiting" not in caplog.text


def test_cached_memory_is_kept_while_another_process_starts_an_engine(tmp_path, monkeypatch):
    """vLLM's start fails when the card's free memory rises under it: while another process holds the engine-start
    lock, ModelSwapper.empty_cache keeps the allocator's cache; before and after, and in the starting process
    itself, it hands it back."""
    import torch

    from rlt_mono.rl.swapper import ModelSwapper

    monkeypatch.setenv(run_lock.ENGINE_LOCK_ENV, str(tmp_path / "engine.lock"))
    emptied = []
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: emptied.append(run_lock.engine_starting_elsewhere()))
    swapper = ModelSwapper.__new__(ModelSwapper)
    swapper.device = torch.device("cuda", 0)  # no CUDA call is made: empty_cache is the patched one
    assert not run_lock.engine_starting_elsewhere()  # no lock file yet
    swapper.empty_cache()
    holder = subprocess.Popen([sys.executable, "-c", ENGINE_HOLD], cwd=ROOT, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, env={**os.environ})
    try:
        assert holder.stdout.readline().strip() == "starting"
        assert run_lock.engine_starting_elsewhere()
        swapper.empty_cache()  # kept
        holder.stdin.write("go\n")
        holder.stdin.flush()
        holder.wait(timeout=30)
    finally:
        holder.kill()
        holder.wait()
    assert not run_lock.engine_starting_elsewhere()
    swapper.empty_cache()
    with run_lock.engine_start():  # this process's own start holds the lock: not "elsewhere"
        assert not run_lock.engine_starting_elsewhere()
        swapper.empty_cache()
    assert emptied == [False, False, False]  # three calls emptied the cache, the one during the other start did not
