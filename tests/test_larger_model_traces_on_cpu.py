"""The larger-model traces of the fair study: the eval stage on the training split (eval.split=train), the traces
file bench/study_fair.py makes of its right, uncut answers, and student SFT reading that file."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from rlt_mono.config import ConfigError, compose
from rlt_mono.data.rows import DataConfig, load_split
from rlt_mono.stages.eval import ROWS_FILE, run_eval
from rlt_mono.stages.sft import build_sft_dataset, load_sft_rows

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "study_fair.py"
TINY = ["size=tiny", "model.model_name_or_path=null", "eval.student_max_new_tokens=4", "data.embedded_rows=40",
        "data.eval_rows=6"]


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _questions(cfg, split: str) -> set[str]:
    return {row["question"] for row in load_split(DataConfig(**OmegaConf.to_container(cfg.data)), 0, split)}


def test_the_train_split_asks_training_questions_only(tmp_path):
    cfg = compose("eval", [*TINY, f"output_dir={tmp_path}", "eval.split=train", "data.max_rows=5",
                           "eval.student_prompt=plain"])
    run_eval(cfg)
    asked = {row["question"] for row in _lines(tmp_path / ROWS_FILE)}
    held_out = _questions(compose("eval", TINY), "eval")
    assert len(asked) == 5 and asked <= _questions(cfg, "train") and not asked & held_out
    assert len(held_out) == 6
    assert json.loads((tmp_path / "eval.json").read_text())["rows"] == "embedded, train split, 5 rows"


def test_the_train_split_with_a_teacher_is_one_line(tmp_path):
    with pytest.raises(ConfigError) as refused:
        run_eval(compose("eval", ["size=tiny", f"output_dir={tmp_path}", "eval.split=train"]))
    assert str(refused.value) == ("eval.split=train asks the student the training questions; the teacher half is for "
                                  "held-out questions: set model.model_name_or_path=null, or eval.split=eval")
    assert not (tmp_path / "eval.json").exists()


def _traces_folder(tmp_path: Path, rows: list[dict], split: str = "train", prompt: str = "plain") -> Path:
    folder = tmp_path / "eval"
    folder.mkdir()
    (folder / "config.yaml").write_text(f"stage: eval\neval:\n  split: {split}\n  student_prompt: {prompt}\n")
    (folder / ROWS_FILE).write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder


def _traces(*args):
    return subprocess.run([sys.executable, str(SCRIPT), "traces", *map(str, args)], capture_output=True, text=True)


ROWS = [  # question, solution, answer, template; then what the model said
    {"question": "q1", "solution": "2 + 3 = 5\nThe answer is 5.", "answer": "5", "template": 7,
     "student_output": "**Step 1:** 2 + 3 = 5.\n\n**The answer is 5.**", "correct": True, "capped": False},
    {"question": "q2", "solution": "s2", "answer": "6", "template": 8,
     "student_output": "The answer is 4 here, not 6.\nThe answer is 6.", "correct": True, "capped": False},
    {"question": "q3", "solution": "s3", "answer": "7", "template": 7,
     "student_output": "Wrong steps.\nThe answer is 9.", "correct": False, "capped": False},
    {"question": "q4", "solution": "s4", "answer": "8", "template": 7,
     "student_output": "Long steps, cut 8", "correct": True, "capped": True},
    {"question": "q5", "solution": "s5", "answer": "9", "template": 9,
     "student_output": "  ### The answer is 9.", "correct": True, "capped": False},  # nothing before it
    {"question": "q6", "solution": "s6", "answer": "1", "template": 9,
     "student_output": "So $\\boxed{1}$", "correct": True, "capped": False},  # no such sentence: kept whole
]


def test_traces_keep_the_right_uncut_answers_less_their_answer_sentence(tmp_path):
    out = tmp_path / "traces" / "traces.jsonl"
    result = _traces(_traces_folder(tmp_path, ROWS), "--out", out)
    assert result.returncode == 0, result.stderr
    assert result.stdout == (f"{out}: 3 of 6 training questions answered right within the cap, kept as traces\n")
    assert _lines(out) == [
        {"question": "q1", "solution": "2 + 3 = 5\nThe answer is 5.", "answer": "5", "template": 7,
         "trace": "**Step 1:** 2 + 3 = 5."},
        {"question": "q2", "solution": "s2", "answer": "6", "template": 8, "trace": "The answer is 4 here, not 6."},
        {"question": "q6", "solution": "s6", "answer": "1", "template": 9, "trace": "So $\\boxed{1}$"},
    ]


@pytest.mark.parametrize(("split", "prompt", "wrong"), [("eval", "plain", "eval.split=eval"),
                                                        ("train", "student", "eval.student_prompt=student")])
def test_traces_of_another_eval_are_one_line(tmp_path, split, prompt, wrong):
    result = _traces(_traces_folder(tmp_path, ROWS, split, prompt), "--out", tmp_path / "t.jsonl")
    assert result.returncode == 2 and result.stderr.count("\n") == 1
    assert f"was run with {wrong}: traces come from an eval with eval.split=train, eval.student_prompt=plain" in \
        result.stderr
    assert not (tmp_path / "t.jsonl").exists()


def test_student_sft_reads_the_trace_column(tmp_path, tokenizer):
    rows = [{"question": f"What is {i} + 1?", "solution": f"{i} + 1 = {i + 1}\nThe answer is {i + 1}.",
             "answer": str(i + 1), "template": i % 3, "trace": f"Add one to {i}."} for i in range(12)]
    rows[3]["trace"] = ""  # an empty trace is a bad row, skipped
    path = tmp_path / "traces.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = compose("student_sft", ["size=tiny", "data=custom", f"data.source={path}", "data.eval_rows=2",
                                  "sft.explanation_column=trace", "data.on_bad_row=skip"])
    train, held_out, skipped = load_sft_rows(DataConfig(**OmegaConf.to_container(cfg.data)), 0, "student_sft",
                                             cfg.sft.explanation_column)
    assert skipped == 1 and len(train) + len(held_out) == 11 and "What is 3 + 1?" not in {
        row["question"] for row in train + held_out}
    assert all(row["trace"] == f"Add one to {row['question'].split()[2]}." for row in train + held_out)
    # the student learns question -> trace + worked solution
    example = build_sft_dataset(train[:1], tokenizer, "student_sft", "trace")[0]
    completion = tokenizer.decode([t for t, m in zip(example["input_ids"], example["completion_mask"]) if m])
    assert train[0]["trace"] in completion and train[0]["solution"] in completion
    assert completion.index(train[0]["trace"]) < completion.index(train[0]["solution"])
