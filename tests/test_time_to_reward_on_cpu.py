"""bench/time_to_reward.py: wall-clock time to the default's held-out reward, on hand-made run folders."""

import json
import shutil
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


def test_curves_give_each_steps_median_and_spread_and_where_an_arm_leaves_the_baselines_band(tmp_path):
    auto = [_run(tmp_path / f"auto{i}", [(0, -3.3, 0.0), (25, a25, 100), (50, a50, 200)])
            for i, (a25, a50) in enumerate([(-3.0, -2.6), (-3.2, -2.8), (-3.1, -2.4)])]
    # async: step 25's median -3.15 lies in auto's [-3.2, -3.0]; step 50's median -2.9 lies below auto's [-2.8, -2.4];
    # its third run evaluated step 75 too, which the others did not: left out
    late = [_run(tmp_path / "async0", [(0, -3.4, 0.0), (25, -3.1, 60), (50, -2.9, 120)]),
            _run(tmp_path / "async1", [(0, -3.2, 0.0), (25, -3.2, 60), (50, -3.0, 120)]),
            _run(tmp_path / "async2", [(0, -3.3, 0.0), (25, -3.15, 60), (50, -2.7, 120), (75, -2.5, 180)])]
    out = tmp_path / "ttr.json"
    done = _cli(f"auto={','.join(map(str, auto))}", f"async={','.join(map(str, late))}", "--baseline", "auto",
                "--target-step", "50", "--out", str(out), "--device", "d", "--commit", "c", "--command", "x")
    assert done.returncode == 0, done.stderr
    curves = json.loads(out.read_text())["curves"]
    assert curves["auto"]["50"] == {"median": -2.6, "lowest": -2.8, "highest": -2.4}
    assert "within_baseline_spread" not in curves["auto"]
    assert curves["async"]["0"] == {"median": -3.3, "lowest": -3.4, "highest": -3.2}
    assert curves["async"]["25"]["median"] == -3.15 and "75" not in curves["async"]
    # step 0: -3.3 within auto's [-3.3, -3.3]; 25 within; 50 outside
    assert curves["async"]["within_baseline_spread"] == {"steps": 3, "within": 2, "outside": [50]}
    assert "median within auto's spread at 2 of 3 evaluated steps" in done.stdout


def _time_to_reward_sh(tmp_path, arms, seeds="0,1"):
    """bench/time_to_reward.sh in a copy whose launch_mono.sh records what each run got, on a host of 3 GPUs."""
    repo, fake = tmp_path / "repo", tmp_path / "bin"
    (repo / "bench").mkdir(parents=True)
    fake.mkdir()
    shutil.copy(ROOT / "bench" / "time_to_reward.sh", repo / "bench")
    (repo / "launch_mono.sh").write_text('#!/bin/sh\necho "$CUDA_VISIBLE_DEVICES ${RLT_MONO_ENGINE_LOCK##*-} $*"\n')
    (fake / "nvidia-smi").write_text("#!/bin/sh\nfor i in 0 1 2; do echo \"GPU $i: stand-in (UUID: x)\"; done\n")
    for script in (repo / "launch_mono.sh", fake / "nvidia-smi"):
        script.chmod(0o755)
    env = {"PATH": f"{fake}:/usr/bin:/bin", "HOME": str(tmp_path), "TMPDIR": str(tmp_path)}
    done = subprocess.run(["bash", "bench/time_to_reward.sh", str(tmp_path / "root"), seeds, arms], cwd=repo,
                          capture_output=True, text=True, timeout=60, env=env)
    return done, tmp_path / "root"


def test_time_to_reward_runs_async_on_two_gpus_a_run_and_the_others_on_one(tmp_path):
    done, root = _time_to_reward_sh(tmp_path, "auto,async")
    assert done.returncode == 0, done.stderr
    seen = {name: (root / "logs" / f"{name}.log").read_text().split() for name in ("auto_s0", "auto_s1", "async_s0",
                                                                                  "async_s1")}
    # GPUs dealt in turn: auto on 0 and 1; async on 2,0 then 1,2, its engine lock the server's GPU (the last)
    assert [seen[n][:2] for n in seen] == [["0", "gpu0.lock"], ["1", "gpu1.lock"], ["2,0", "gpu0.lock"],
                                           ["1,2", "gpu2.lock"]]
    assert "memory=auto" in seen["auto_s0"] and "placement=async" not in seen["auto_s0"]
    assert {"memory=auto", "placement=async", "seed=1", f"output_dir={root}/async_s1"} <= set(seen["async_s1"])
    assert (root / "DONE").read_text().startswith("auto_s0=0 auto_s1=0 async_s0=0 async_s1=0 seconds=")


def test_time_to_reward_refuses_an_unknown_arm_before_starting_any(tmp_path):
    done, root = _time_to_reward_sh(tmp_path, "auto,fast")
    assert (done.returncode, done.stderr) == (2, "bench/time_to_reward.sh: unknown arm 'fast' (auto, speed, async)\n")
    assert not (root / "logs").exists()
