"""RLT_MONO_TEST_FAILURES (tests/conftest.py): each failed test's report is written to that file as the test ends,
so a GPU test run cut by its time limit (offline_host/multi_gpu.sh) still says why the finished tests failed."""

import os
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def test_a_failed_test_is_written_down_when_it_ends_and_a_passed_one_is_not(tmp_path):
    (tmp_path / "test_three.py").write_text(
        "def test_passes():\n    assert 1 + 1 == 2\n\n\n"
        "def test_fails():\n    assert 2 + 2 == 5, 'arithmetic'\n\n\n"
        "def test_hangs_after_a_failure():\n"
        "    # the run stops here, as a time limit would stop it: the failure above is already written down\n"
        "    import os\n    assert 'test_fails' in open(os.environ['RLT_MONO_TEST_FAILURES']).read()\n")
    failures = tmp_path / "failures.txt"
    env = {**os.environ, "RLT_MONO_TEST_FAILURES": str(failures),
           "PYTHONPATH": f"{TESTS}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "conftest", "-p", "no:cacheprovider",
                          str(tmp_path / "test_three.py")], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 1 and "1 failed, 2 passed" in run.stdout, run.stdout + run.stderr
    written = failures.read_text()
    assert written.startswith("==== test_three.py::test_fails (call)\n")
    assert "AssertionError: arithmetic" in written and "test_passes" not in written
    assert written.count("==== ") == 1
