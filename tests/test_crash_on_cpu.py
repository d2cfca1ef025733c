"""Crash tests: the CPU demo is killed (SIGKILL) at seeded random moments, during steps and during checkpoint
saves, then resumed with ``resume_from_checkpoint=true``. Every step must be recorded once and every step's
reward must equal the uninterrupted seeded run's, bit for bit."""

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
STEPS = 4
RUN = ["demo_tiny", f"trainer.max_steps={STEPS}", "trainer.save_steps=1", "trainer.ref_model_sync_steps=2",
       "trainer.plot_metrics=false", "trainer.max_completion_length=24"]
# Runs the CLI after making the process kill itself in the middle of the checkpoint save of step 2, after the
# model and optimizer files are written and before the RNG state is.
KILL_IN_SAVE = """
import os, signal, sys
from rlt_mono.rl.trainer import RLTTrainer
save_rng_state = RLTTrainer._save_rng_state
def die_at_step_2(self, output_dir):
    if self.state.global_step == 2:
        os.kill(os.getpid(), signal.SIGKILL)
    save_rng_state(self, output_dir)
RLTTrainer._save_rng_state = die_at_step_2
from rlt_mono.cli import main
sys.exit(main(sys.argv[1:]))
"""


def _run(out: Path, *extra: str, code: str | None = None) -> subprocess.Popen:
    command = [sys.executable, "-c", code, *RUN, f"output_dir={out}", *extra] if code else \
        [sys.executable, "-m", "rlt_mono.cli", *RUN, f"output_dir={out}", *extra]
    return subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def _finish(process: subprocess.Popen, timeout: float = 600) -> None:
    _, stderr = process.communicate(timeout=timeout)
    assert process.returncode == 0, stderr[-3000:]


def _rewards(out: Path) -> dict[int, float]:
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    steps = [r for r in rows if "reward" in r]
    assert [r["step"] for r in steps] == list(range(1, STEPS + 1))  # every step once, in order
    return {r["step"]: r["reward"] for r in steps}


def _sample_steps(out: Path) -> list[int]:
    """The step of every samples.jsonl row (4 explanations per step in the demo config)."""
    return [json.loads(line)["step"] for line in (out / "samples.jsonl").read_text().splitlines() if line.strip()]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> dict[int, float]:
    out = tmp_path_factory.mktemp("crash") / "uninterrupted"
    _finish(_run(out))
    return _rewards(out)


def _wait_for(path: Path, process: subprocess.Popen, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert process.poll() is None, process.stderr.read()[-3000:]
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)


@pytest.mark.parametrize("seed", [0, 1])
def test_killed_at_a_random_moment_then_resumed_matches_the_uninterrupted_run(seed, uninterrupted, tmp_path):
    rng = random.Random(seed)
    out = tmp_path / "run"
    process = _run(out)
    _wait_for(out / f"checkpoint-{rng.randint(1, 2)}", process)
    time.sleep(rng.uniform(0.0, 2.0))  # lands in a later step, its save, or the metrics write
    process.send_signal(signal.SIGKILL)
    process.wait()
    _finish(_run(out, "resume_from_checkpoint=true"))
    assert _rewards(out) == uninterrupted
    assert _sample_steps(out) == [step for step in range(1, STEPS + 1) for _ in range(4)]


def test_killed_during_a_checkpoint_save_then_resumed_matches_the_uninterrupted_run(uninterrupted, tmp_path):
    out = tmp_path / "run"
    process = _run(out, code=KILL_IN_SAVE)
    process.communicate(timeout=600)
    assert process.returncode == -signal.SIGKILL
    # the half-written save is a staging folder, never a checkpoint-2 a resume could pick
    assert sorted(p.name for p in out.iterdir() if "checkpoint" in p.name) == [".partial-checkpoint-2",
                                                                              "checkpoint-1"]
    assert not (out / ".partial-checkpoint-2" / "checkpoint-2" / "rng_state.pth").exists()
    _finish(_run(out, "resume_from_checkpoint=true"))
    assert _rewards(out) == uninterrupted
    assert not any(p.name.startswith(".partial-") for p in out.iterdir())
    assert os.path.isdir(out / "final")
