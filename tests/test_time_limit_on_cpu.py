"""trainer.max_minutes: the RL stage stops at the end of the first optimizer step past the limit and saves final/
as at max_steps (a GPU held for a fixed time)."""

import json
import logging
from types import SimpleNamespace

import pytest
from transformers import TrainerControl

from rlt_mono.config import ConfigError, compose, instantiate
from rlt_mono.rl.grpo_config import RLTConfig
from rlt_mono.rl.trainer import TimeLimit
from rlt_mono.runs.readme import write_run_readme


def _steps(limit: TimeLimit, times: list[float], max_steps: int, evaluates: bool = True) -> int | None:
    """Run steps 1..max_steps with the clock reading the next of ``times`` whenever it is read (the first step's
    begin, then each step's end); the step at which the trainer would stop (None: it ran to max_steps)."""
    clock = iter(times)
    limit.clock = lambda: next(clock)
    args = SimpleNamespace(eval_strategy="steps" if evaluates else "no")
    for step in range(1, max_steps + 1):
        state, control = SimpleNamespace(global_step=step - 1, max_steps=max_steps), TrainerControl()
        limit.on_step_begin(args, state, control)
        state.global_step = step
        limit.on_step_end(args, state, control)
        if control.should_training_stop:
            assert control.should_evaluate == evaluates  # the curve's last point is the saved teacher
            return step
    return None


def test_stops_after_the_first_step_that_ends_past_the_limit():
    limit = TimeLimit(1.0)  # 60 s from the first step's begin
    # step 1 begins at 0 and ends at 25 s, step 2 ends at 50 s, step 3 at 75 s: over
    assert _steps(limit, [0.0, 25.0, 50.0, 75.0, 100.0], max_steps=10) == 3
    assert limit.stopped_at == 3


def test_no_stop_when_the_limit_is_not_reached_or_rank_zero_says_no():
    limit = TimeLimit(1.0)
    assert _steps(limit, [0.0, 10.0, 20.0, 30.0], max_steps=3) is None
    assert limit.stopped_at is None
    outvoted = TimeLimit(0.5, agree=lambda over: False)  # data parallel: rank 0 is not over yet
    assert _steps(outvoted, [0.0, 100.0, 200.0], max_steps=2) is None


def test_the_last_step_is_not_called_a_stop():
    limit = TimeLimit(0.01)
    assert _steps(limit, [0.0, 5.0, 9.0], max_steps=2) == 1  # over after step 1 of 2
    assert _steps(TimeLimit(0.01), [0.0, 5.0, 9.0], max_steps=2, evaluates=False) == 1
    last = TimeLimit(0.01)
    assert _steps(last, [0.0, 5.0], max_steps=1) is None and last.stopped_at is None


@pytest.mark.parametrize(("value", "message"), [(-1, "max_minutes must be >= 0, got -1"),
                                                ("soon", "max_minutes must be a number, got 'soon'")])
def test_a_negative_or_non_numeric_limit_is_refused(value, message, tmp_path):
    cfg = compose("demo_tiny", [f"trainer.max_minutes={value}"])
    with pytest.raises(ConfigError, match=f"^trainer: {message}"):
        instantiate(RLTConfig, {**cfg.trainer, "output_dir": str(tmp_path)}, "trainer")


def test_a_run_stopped_by_the_limit_saves_final_and_says_so(tmp_path, caplog):
    from rlt_mono.cli import main

    run = tmp_path / "run"
    with caplog.at_level(logging.INFO):
        main(["demo_tiny", "trainer.max_steps=6", "trainer.save_steps=100", "trainer.max_minutes=1e-6",
              "trainer.eval_strategy=steps", "trainer.eval_steps=100", "trainer.eval_questions=2",
              f"output_dir={run}"])
    steps = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()
             if json.loads(line).get("event", "step") == "step"]
    assert max(steps) == 1
    evals = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()
             if json.loads(line).get("event") == "eval"]
    assert [row["step"] for row in evals] == [1]  # evaluated where it stopped, not only every eval_steps
    # every row has its wall-clock time since training began (a learning curve's time axis)
    times = [json.loads(line)["wall_time_seconds"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert times == sorted(times) and times[0] >= 0 and len(times) >= 2
    assert (run / "final" / "config.json").is_file()
    assert "trainer.max_minutes=1e-06: stopping after step 1 of 6" in caplog.text
    assert "| steps done | 1 of 6: stopped by trainer.max_minutes=1e-06; the trained teacher is in `final/` |" in \
        (run / "README.md").read_text().splitlines()


def test_readme_names_a_sampled_row_cap(tmp_path):
    cfg = {"data": {"source": "gsm_symbolic", "max_rows": 256}, "trainer": {"max_steps": 2}}
    text = write_run_readme(tmp_path, cfg, [], command=None).read_text()
    assert "| data | `gsm_symbolic (a seeded sample of 256 rows)` |" in text
