"""The speed benchmarks' scripts refuse hostile input in one line on stderr and exit code 2, writing nothing:
bench/speed_summary.py (a folder with no run, a cut-off JSON file) and bench/roofline.py (a --measured that is not
phase=seconds)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def run(*command: str) -> subprocess.CompletedProcess:
    return subprocess.run(command, capture_output=True, text=True, cwd=ROOT, timeout=120)


def summarise(folder: Path, out: Path, target: str) -> subprocess.CompletedProcess:
    return run(sys.executable, "bench/speed_summary.py", str(folder), "--target", target, "--out", str(out),
               "--commit", "abc", "--device", "H200", "--command", "c")


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


@pytest.mark.parametrize("measured, message", [
    ("train=abc", "'train=abc': the seconds must be a number, as in train=19.8"),
    ("train", "'train': the seconds must be a number, as in train=19.8"),
    ("sample=1", "unknown phase 'sample' in 'sample=1'; the phases are generate, score, train"),
])
def test_roofline_refuses_a_measured_time_that_is_not_phase_equals_seconds(measured, message):
    done = run(sys.executable, "bench/roofline.py", "--measured", measured)
    assert done.returncode == 2
    assert done.stderr == f"roofline.py: error: argument --measured: {message}\n"
