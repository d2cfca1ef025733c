"""The run folder's README without a model: the reward trend, the resume command, what the run was, and the
launch command it records."""

from pathlib import Path

from rlt_mono.runs.outputs import METRICS_FILE
from rlt_mono.runs.readme import Block, launch_command, resume_command, reward_trend, write_run_readme

ROOT = Path(__file__).resolve().parent.parent


def _step_row(step, reward, **extra):
    return {"event": "step", "step": step, "reward": reward, "teacher_reward/total": reward, **extra}


def test_reward_trend_uses_the_smoothing_window():
    assert reward_trend([1, 2, 3], [1.0, 2.0, 4.0]) == (Block(1, 1, 1.0), Block(3, 3, 4.0))
    steps = list(range(1, 11))
    assert reward_trend(steps, [float(s) for s in steps]) == (Block(1, 3, 2.0), Block(8, 10, 9.0))
    assert reward_trend([], []) is None


def test_resume_command_replaces_output_dir_and_resume(tmp_path):
    command = f"./launch_mono.sh demo_tiny trainer.max_steps=3 output_dir={tmp_path}/old resume_from_checkpoint=x"
    assert resume_command(command, tmp_path) == (
        f"./launch_mono.sh demo_tiny trainer.max_steps=3 output_dir={tmp_path} resume_from_checkpoint=true")


def test_run_readme_says_what_the_run_was(tmp_path):
    (tmp_path / "config.yaml").write_text("x: 1\n")
    (tmp_path / METRICS_FILE).write_text("")
    (tmp_path / "checkpoint-10").mkdir()
    (tmp_path / "checkpoint-5").mkdir()
    (tmp_path / ".partial-checkpoint-15").mkdir()
    (tmp_path / "final").mkdir()
    cfg = {"run_name": "demo_tiny", "seed": 0, "model": {"model_name_or_path": "embedded:teacher"},
           "student": {"model_name_or_path": "embedded:student"}, "data": {"source": "embedded", "max_rows": None},
           "trainer": {"max_steps": 10}}
    rows = [_step_row(s, float(s)) for s in range(1, 11)] + [{"event": "summary", "step": 10, "train_runtime": 1}]
    command = "./launch_mono.sh cfgs/run_cfg/demo_tiny.yaml trainer.max_steps=10"
    text = write_run_readme(tmp_path, cfg, rows, command=command).read_text()
    lines = text.splitlines()
    assert lines[0] == f"# rlt_mono run `demo_tiny`: {tmp_path.name}"
    assert f"| command | `{command}` |" in lines
    assert "| teacher (trained) | `embedded:teacher` |" in lines
    assert "| student (frozen, scores the explanations) | `embedded:student` |" in lines
    assert "| data | `embedded` |" in lines
    assert "| steps done | 10 of 10: finished; the trained teacher is in `final/` |" in lines
    assert "| mean reward | 2.000 (steps 1-3) -> 9.000 (steps 8-10) |" in lines
    files = [line.split("`")[1] for line in lines if line.startswith("- `")]
    assert files == ["config.yaml", "metrics.jsonl", "final/", "README.md", "checkpoint-5/", "checkpoint-10/"]
    assert f"{command} output_dir={tmp_path} resume_from_checkpoint=true" in lines
    assert "None" not in text


def test_run_readme_of_a_notebook_run_that_stopped(tmp_path):
    text = write_run_readme(tmp_path, {"run_name": "r", "trainer": {"max_steps": 40}}, [_step_row(1, -3.0)]
                            ).read_text()
    assert "| steps done | 1 of 40: stopped, or still running |" in text
    assert "| command | not recorded (built in Python" in text
    assert f"./launch_mono.sh <the run config and overrides of this run> output_dir={tmp_path} " \
           "resume_from_checkpoint=true" in text


def test_launch_command_is_known_only_for_the_command_line_entry(monkeypatch, tmp_path):
    monkeypatch.setattr("sys.argv", [str(ROOT / "rlt_mono" / "cli.py"), "demo_tiny", "data.source=my rows.jsonl"])
    monkeypatch.chdir(ROOT)
    assert launch_command() == "./launch_mono.sh demo_tiny 'data.source=my rows.jsonl'"
    monkeypatch.chdir(ROOT / "cfgs" / "run_cfg")  # a folder inside the repository (a pipeline's, where a stage runs)
    assert launch_command() == "../../launch_mono.sh demo_tiny 'data.source=my rows.jsonl'"
    monkeypatch.chdir(tmp_path)  # outside it: the console command, which runs from any folder
    assert launch_command() == "rlt-mono demo_tiny 'data.source=my rows.jsonl'"
    monkeypatch.setattr("sys.argv", ["/usr/bin/ipykernel_launcher.py", "-f", "kernel.json"])
    assert launch_command() is None
    # the console command of an installed package (no checkout), from any folder
    monkeypatch.setattr("sys.argv", ["/opt/venv/bin/rlt-mono", "demo_tiny", "trainer.max_steps=2"])
    assert launch_command() == "rlt-mono demo_tiny trainer.max_steps=2"
    monkeypatch.chdir(ROOT)
    assert launch_command() == "rlt-mono demo_tiny trainer.max_steps=2"
    monkeypatch.chdir(tmp_path)
    # python -m rlt_mono (what launch_mono.sh runs); a resumed run records the command of the uninterrupted one
    monkeypatch.setattr("sys.argv", [str(ROOT / "rlt_mono" / "__main__.py"), "demo_tiny", "resume_from_checkpoint=true",
                                     "trainer.max_steps=4"])
    monkeypatch.chdir(ROOT)
    assert launch_command() == "./launch_mono.sh demo_tiny trainer.max_steps=4"
