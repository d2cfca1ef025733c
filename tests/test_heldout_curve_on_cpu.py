"""The held-out learning curve of the RL stage: TRL's evaluation on held-out questions every eval_steps."""

import gc
import json
import weakref

import yaml

from rlt_mono import build_trainer, compose, release_trainer
from rlt_mono.data.rows import DataConfig, load_split
from rlt_mono.runs.outputs import EVAL_EVENT, read_metrics
from rlt_mono.runs.plots import EVAL_SERIES, metric_series


def test_eval_rows_score_the_first_held_out_questions_every_eval_steps(tmp_path):
    out = tmp_path / "run"
    cfg = compose("demo_tiny", ["trainer.max_steps=4", "trainer.eval_strategy=steps", "trainer.eval_steps=2",
                                "trainer.eval_on_start=true", "trainer.eval_questions=8",
                                "trainer.per_device_eval_batch_size=4", f"output_dir={out}"])
    trainer = build_trainer(cfg)
    held_out = {" ".join(r["question"].split()) for r in load_split(DataConfig(**cfg.data), cfg.seed, "eval")}
    questions = [" ".join(q.split()) for q in trainer.eval_dataset["question"]]
    assert len(questions) == 8 and set(questions) <= held_out  # held-out questions only, the first 8
    assert not set(questions) & {" ".join(q.split()) for q in trainer.train_dataset["question"]}
    trainer.train()
    teacher = weakref.ref(trainer.model)
    release_trainer(trainer)
    gc.collect()
    assert teacher() is None, "the released trainer still holds the teacher"  # a notebook's next build fits

    evals = read_metrics(out / "metrics.jsonl", EVAL_EVENT)
    assert [row["step"] for row in evals] == [0, 2, 4]  # eval_on_start, then every 2 steps
    assert all(row["eval_reward"] < 0 and "eval_teacher_reward/r_ss" in row for row in evals)
    steps = read_metrics(out / "metrics.jsonl")
    assert [row["step"] for row in steps] == [1, 2, 3, 4]  # the eval rows are not counted as steps
    assert not any(k.startswith("eval_") for row in steps for k in row)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    held_out_series = [s for s in metric_series(rows)["reward"] if s.label == EVAL_SERIES[1]]
    assert held_out_series[0].steps == [0, 2, 4]
    assert held_out_series[0].values == [row["eval_reward"] for row in evals]


def test_a_resumed_run_does_not_evaluate_again_at_its_start(tmp_path):
    out = tmp_path / "run"
    overrides = ["trainer.eval_strategy=steps", "trainer.eval_steps=2", "trainer.eval_on_start=true",
                 "trainer.eval_questions=4", "trainer.per_device_eval_batch_size=4", "trainer.save_steps=2",
                 f"output_dir={out}"]
    trainer = build_trainer(compose("demo_tiny", ["trainer.max_steps=2", *overrides]))
    trainer.train()
    release_trainer(trainer)
    trainer = build_trainer(compose("demo_tiny", ["trainer.max_steps=4", "resume_from_checkpoint=true", *overrides]))
    # the arguments stay as configured (the checkpoints' training_args.bin are the uninterrupted run's); the start
    # evaluation of a resumed run is skipped by the trainer
    assert trainer.resume_checkpoint is not None and trainer.args.eval_on_start
    trainer.train(resume_from_checkpoint=str(trainer.resume_checkpoint))
    release_trainer(trainer)
    assert [row["step"] for row in read_metrics(out / "metrics.jsonl", EVAL_EVENT)] == [0, 2, 4]
    assert yaml.safe_load((out / "config.yaml").read_text())["resume_from_checkpoint"] is None
