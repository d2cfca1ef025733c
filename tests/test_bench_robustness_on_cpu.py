"""The speed benchmarks' scripts refuse hostile input in one line on stderr and exit code 2, writing nothing:
bench/speed_summary.py (a folder with no run, a cut-off JSON file), offline_host/speed.sh (no or a wrong command),
bench/roofline.py (a --measured that is not phase=seconds)."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
USAGE = ("usage: bash offline_host/speed.sh start 05b [pairs] [steps] [speed arms] [score micro-batch] | start 7b "
         "[steps] [arms] [profiled step] | start '05b ...' '7b ...' | wait <seconds>")


def run(*command: str) -> subprocess.CompletedProcess:
    return subprocess.run(command, capture_output=True, text=True, cwd=ROOT, timeout=120)


def summarise(folder: Path, out: Path, target: str) -> subprocess.CompletedProcess:
    return run(sys.executable, "bench/speed_summary.py", str(folder), "--target", target, "--out", str(out),
               "--commit", "abc", "--device", "nvidia-h200", "--command", "c")


def test_a_7b_summary_of_a_folder_with_no_run_is_refused_and_writes_nothing(tmp_path):
    (tmp_path / "raw").mkdir()
    done = summarise(tmp_path / "raw", tmp_path / "out", "7b")
    assert done.returncode == 2
    assert done.stderr == (f"speed_summary.py: error: {tmp_path / 'raw'} holds no 7B run (step_<arm>.json, arm one of "
                           "manual, noalign, noliger, auto, speed): nothing to summarise\n")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("target, name", [("7b", "step_manual.json"), ("05b", "pairs_raw.json"),
                                          ("05b", "speed_raw.json")])
def test_a_cut_off_json_file_is_named_in_one_line_and_nothing_is_written(target, name, tmp_path):
    raw = tmp_path / "raw"
    raw.mkdir()
    whole = [{"mode": mode, "status": "ok", "median_step_seconds": 5.0, "grpo_config": {}} for mode in ("rlt", "trl")]
    (raw / "pairs_raw.json").write_text(json.dumps(whole))
    (raw / name).write_text('[{"mode": "rlt", "status": "o')  # the run was cut off while writing it
    done = summarise(raw, tmp_path / "out", target)
    assert done.returncode == 2
    assert done.stderr == (f"speed_summary.py: error: {raw / name} is not whole JSON (Unterminated string starting "
                           "at: line 1 column 28 (char 27)): bring it back again from the run, or move it out of the "
                           "folder\n")
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("args", [(), ("start",), ("start", "9b"), ("wait",), ("wait", "soon"), ("stop",)],
                         ids=["nothing", "start-no-spec", "start-unknown-target", "wait-no-seconds",
                              "wait-not-a-number", "unknown-command"])
def test_speed_sh_without_a_known_command_prints_its_usage_and_exits_2(args, tmp_path):
    done = subprocess.run(["bash", "offline_host/speed.sh", *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=60, env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})
    assert (done.returncode, done.stderr, done.stdout) == (2, USAGE + "\n", "")


def test_speed_sh_start_without_the_gpu_stack_says_where_it_looked_and_writes_nothing(tmp_path):
    done = subprocess.run(["bash", "offline_host/speed.sh", "start", "05b"], capture_output=True, text=True,
                          cwd=ROOT, timeout=60, env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path),
                                           "GPU_STACK_PARTS": str(tmp_path / "parts"), "OUT": str(tmp_path / "out")})
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == (f"offline_host/speed.sh: no {tmp_path / 'parts'}/install_gpu_stack.sh: stash the GPU "
                           "stack's parts there first (offline_host/gpu_pipeline.sh stash), or set GPU_STACK_PARTS\n")


def _gpu_pipeline(tmp_path, parts, *args):
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "GPU_STACK_PARTS": str(parts), "OUT": str(tmp_path / "out")}
    return subprocess.run(["bash", "offline_host/gpu_pipeline.sh", *args], capture_output=True, text=True,
                          cwd=ROOT, timeout=60, env=env)


def test_gpu_pipeline_without_the_gpu_stack_says_where_it_looked(tmp_path):
    done = _gpu_pipeline(tmp_path, tmp_path / "parts", "run", "demo_tiny", "10")
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == (f"offline_host/gpu_pipeline.sh: no {tmp_path / 'parts'}/install_gpu_stack.sh: stash the "
                           "GPU stack's parts there first (offline_host/gpu_pipeline.sh stash), or set "
                           "GPU_STACK_PARTS\n")


def test_gpu_pipeline_whose_stack_does_not_install_shows_the_end_of_its_log(tmp_path):
    parts = tmp_path / "parts"
    parts.mkdir()
    (parts / "install_gpu_stack.sh").write_text('echo unpacking; echo "xz: file is corrupt" >&2; exit 1\n')
    done = _gpu_pipeline(tmp_path, parts, "fair", "students", "0")
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == (f"offline_host/gpu_pipeline.sh: the GPU stack did not install; "
                           f"{tmp_path / 'out'}/install.log ends:\nunpacking\nxz: file is corrupt\n")


def _multi_gpu(tmp_path, *args, install='echo unpacked; echo "export STACK=ready"', env=None, popen=False):
    """offline_host/multi_gpu.sh in a copy of offline_host/ (its two scripts), a stand-in GPU stack and a two-GPU
    nvidia-smi; ``env`` adds to its environment, ``popen`` starts it and returns the process."""
    repo, parts, fake = tmp_path / "repo", tmp_path / "parts", tmp_path / "bin"
    for folder in (repo / "offline_host", parts, fake):
        folder.mkdir(parents=True, exist_ok=True)
    for name in ("multi_gpu.sh", "gpu_host.sh"):
        shutil.copy(ROOT / "offline_host" / name, repo / "offline_host" / name)
    (parts / "install_gpu_stack.sh").write_text(install + "\n")
    (fake / "nvidia-smi").write_text("#!/bin/sh\necho 'GPU 0: stand-in'\necho 'GPU 1: stand-in'\n")
    (fake / "nvidia-smi").chmod(0o755)
    env = {"PATH": f"{fake}:/usr/bin:/bin", "HOME": str(tmp_path), "GPU_STACK_PARTS": str(parts),
           "MULTI_GPU_ROOT": str(tmp_path / "root"), "OUT": str(tmp_path / "out"), **(env or {})}
    if popen:
        return subprocess.Popen(["bash", "offline_host/multi_gpu.sh", *args], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, cwd=repo, env=env)
    return subprocess.run(["bash", "offline_host/multi_gpu.sh", *args], capture_output=True, text=True, cwd=repo,
                          timeout=60, env=env)


def test_multi_gpu_runs_its_commands_in_the_background_one_after_another(tmp_path):
    started = _multi_gpu(tmp_path, "start", "none", "none|")
    assert started.returncode == 0 and "2 command(s) started" in started.stdout, started.stderr
    waited = _multi_gpu(tmp_path, "wait", "30")
    assert waited.returncode == 0 and "DONE, exit codes: 0 0" in waited.stdout, waited.stdout + waited.stderr
    log = (tmp_path / "root" / "chain.log").read_text()
    assert log.count("bash offline_host/multi_gpu.sh none") == 2  # one after the other, each logged
    assert (tmp_path / "out" / "install.log").read_text() == "unpacked\nexport STACK=ready\n"  # copied back


def test_multi_gpu_background_records_a_command_that_failed(tmp_path):
    assert _multi_gpu(tmp_path, "start", "none", install="echo corrupt >&2; exit 1").returncode == 0
    waited = _multi_gpu(tmp_path, "wait", "30")
    assert "DONE, exit codes: 2" in waited.stdout, waited.stdout + waited.stderr
    assert "the GPU stack did not install" in (tmp_path / "root" / "chain.log").read_text()


def test_multi_gpu_tests_count_the_gpus_the_command_was_given(tmp_path):
    """Given some of the host's GPUs (CUDA_VISIBLE_DEVICES), the tests' log is named by those, not the host's two."""
    _multi_gpu(tmp_path, "none", "all", env={"CUDA_VISIBLE_DEVICES": "1"})
    _multi_gpu(tmp_path, "none", "all", env={"OUT": str(tmp_path / "all_gpus")})
    assert [p.name for p in (tmp_path / "out").glob("gpu_tests_*.log")] == ["gpu_tests_1.log"]
    assert [p.name for p in (tmp_path / "all_gpus").glob("gpu_tests_*.log")] == ["gpu_tests_2.log"]


def test_multi_gpu_commands_side_by_side_unpack_the_stack_in_turn(tmp_path):
    """Two commands started together on one host (each on its own GPUs) never unpack the stack at the same time."""
    trace = tmp_path / "trace"
    install = f'echo start >> {trace}; sleep 1; echo end >> {trace}; echo "export STACK=ready"'
    runs = [_multi_gpu(tmp_path, "none", install=install, popen=True,
                       env={"CUDA_VISIBLE_DEVICES": gpu, "OUT": str(tmp_path / f"out{gpu}")}) for gpu in "01"]
    assert [run.wait(timeout=60) for run in runs] == [0, 0], [run.stderr.read() for run in runs]
    assert trace.read_text().split() == ["start", "end", "start", "end"]


def test_multi_gpu_wait_with_nothing_started_says_so(tmp_path):
    waited = _multi_gpu(tmp_path, "wait", "30")
    assert waited.returncode == 1
    assert "nothing runs and none has ended here" in waited.stderr
    assert _multi_gpu(tmp_path, "start").returncode == 2  # no command to start


@pytest.mark.parametrize("measured, message", [
    ("train=abc", "'train=abc': the seconds must be a number, as in train=19.8"),
    ("train", "'train': the seconds must be a number, as in train=19.8"),
    ("sample=1", "unknown phase 'sample' in 'sample=1'; the phases are generate, score, train"),
])
def test_roofline_refuses_a_measured_time_that_is_not_phase_equals_seconds(measured, message):
    done = run(sys.executable, "bench/roofline.py", "--measured", measured)
    assert done.returncode == 2
    assert done.stderr == f"roofline.py: error: argument --measured: {message}\n"
