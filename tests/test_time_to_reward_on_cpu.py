"""bench/time_to_reward.py: wall-clock time to the default's held-out reward, on hand-made run folders."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _run(folder: Path, evals: list[tuple[int, float, float]]) -> Path:
    """A run folder whose metrics.jsonl has a step row and the held-out evaluations (step, reward, seconds)."""
    folder.mkdir(parents=True)
    rows = [{"event": "step", "step": 1, "reward": -3.0, "wall_time_seconds": 1.0}]
    rows += [{"event": "eval", "step": s, "eval_reward": r, "wall_time_seconds": t} for s, r, t in evals]
    (folder / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    return folder


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "bench/time_to_reward.py", *args], capture_output=True, text=True,
                          cwd=ROOT, timeout=120)


def test_the_target_is_the_baselines_median_and_sooner_is_the_ratio_of_medians(tmp_path):
    auto = [_run(tmp_path / f"auto{i}", [(0, -3.3, 0.0), (100, r100, t100), (200, r200, t200)])
            for i, (r100, t100, r200, t200) in enumerate([(-3.1, 500, -2.9, 1000), (-3.0, 520, -2.8, 1040),
                                                          (-3.2, 480, -3.0, 960)])]
    # target: median(-2.9, -2.8, -3.0) = -2.9; auto reaches it at 1000 (run 0), 520 (run 1: -3.0 < -2.9 at 100,
    # -2.8 at 200 -> 1040), and never (run 2, best -3.0)
    speed = [_run(tmp_path / "speed0", [(0, -3.3, 0.0), (50, -2.85, 300)]),
             _run(tmp_path / "speed1", [(0, -3.3, 0.0), (50, -3.1, 250), (100, -2.9, 450)])]
    out = tmp_path / "ttr.json"
    done = _cli(f"auto={','.join(map(str, auto))}", f"speed={','.join(map(str, speed))}", "--baseline", "auto",
                "--target-step", "200", "--out", str(out), "--device", "d", "--commit", "c", "--command", "x")
    assert done.returncode == 0, done.stderr
    result = json.loads(out.read_text())
    assert result["target"]["eval_reward"] == -2.9
    a, s = result["arms"]["auto"], result["arms"]["speed"]
    assert [r.get("seconds") for r in a["runs"]] == [1000.0, 1040.0, None]
    assert a["runs"][2] == {"run": str(auto[2]), "reached": False, "best_eval_reward": -3.0, "last_step": 200,
                            "last_seconds": 960.0}
    assert (a["reached"], a["median_seconds"], a["sooner"]) == ("2 of 3", 1020.0, 1.0)
    assert [r["step"] for r in s["runs"]] == [50, 100]
    assert (s["median_seconds"], s["sooner"]) == (375.0, round(1020 / 375, 3))
    assert result["commit"] == "c" and "speed: reached 2 of 2, median 375.0 s, sooner 2.72" in done.stdout


def test_a_baseline_without_an_evaluation_at_the_target_step_is_one_line(tmp_path):
    run = _run(tmp_path / "a", [(0, -3.3, 0.0), (150, -3.0, 700)])
    done = _cli(f"auto={run}", "--baseline", "auto", "--target-step", "200", "--out", str(tmp_path / "o.json"),
                "--device", "d", "--commit", "c", "--command", "x")
    assert done.returncode == 2
    assert done.stderr == f"error: {run}: no held-out evaluation at step 200 (its steps: [0, 150]); pass a " \
                          "--target-step it evaluated\n"
    done = _cli(f"auto={run}", "--baseline", "speed", "--target-step", "150", "--out", str(tmp_path / "o.json"),
                "--device", "d", "--commit", "c", "--command", "x")
    assert done.returncode == 2 and "--baseline speed: not among the arms (auto)" in done.stderr
