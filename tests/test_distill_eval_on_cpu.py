"""The distill and eval stages on the embedded tiny pair: numbers against direct computations, resume, compare."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from rlt_mono.config import ConfigError, compose
from rlt_mono.data.prompts import PromptFormat, end_tag
from rlt_mono.data.rows import DataConfig, group_of, load_split, sample_rows
from rlt_mono.errors import UserError
from rlt_mono.rewards import TeacherKLReward, TeacherRewardConfig
from rlt_mono.stages.distill import DISTILL_FILE, run_distill
from rlt_mono.stages.eval import EVAL_FILE, ROWS_FILE, main, run_eval
from rlt_mono.stages.eval_compare import compare_table
from rlt_mono.stages.sampler import TransformersGenerator
from rlt_mono.study.eval_stats import bootstrap_interval

FMT = PromptFormat()
ROOT = Path(__file__).resolve().parent.parent
# Runs one stage as `python -m rlt_mono.cli <args>` does, appending every VLLMGenerator.generate call to the file
# named by $RLT_MONO_VLLM_CALLS, one JSON line [prompt_ids, n, temperature, completions] per call. Passed with
# `python -c`, it needs no `__main__` guard: vLLM's spawned engine process re-runs only a main module with a file.
RECORD_VLLM_CALLS = """
import json, os, sys
from rlt_mono.stages.sampler import VLLMGenerator
from rlt_mono.cli import main

generate = VLLMGenerator.generate

def recording(self, prompt_ids, n, temperature):
    completions = generate(self, prompt_ids, n, temperature)
    with open(os.environ["RLT_MONO_VLLM_CALLS"], "a") as f:
        f.write(json.dumps([prompt_ids, n, temperature, completions]) + "\\n")
    return completions

VLLMGenerator.generate = recording
sys.exit(main(sys.argv[1:]))
"""


@pytest.fixture
def generations(monkeypatch):
    """Record every generate call: ``(prompt_ids, n, temperature, completions)``."""
    calls = []
    original = TransformersGenerator.generate

    def recording(self, prompt_ids, n, temperature):
        completions = original(self, prompt_ids, n, temperature)
        calls.append((prompt_ids, n, temperature, completions))
        return completions

    monkeypatch.setattr(TransformersGenerator, "generate", recording)
    return calls


def _lines(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def _teacher_prompt(tokenizer, row):
    return tokenizer.apply_chat_template(FMT.teacher_messages(row["question"], row["solution"]), tokenize=False,
                                         continue_final_message=True)


def _direct_reward(cfg, tokenizer, student, teacher):
    config = TeacherRewardConfig(**OmegaConf.to_container(cfg.reward))
    return TeacherKLReward(student, tokenizer, config, teacher_model=teacher, teacher_temperature=0.7)


def _score(reward, tokenizer, row, completion_ids):
    n = len(completion_ids)
    reward(prompts=[_teacher_prompt(tokenizer, row)] * n, completions=tokenizer.batch_decode(completion_ids),
           completion_ids=completion_ids, question=[row["question"]] * n, solution=[row["solution"]] * n)
    return reward.last_scores


def test_distill_keeps_the_best_of_k_scored_as_a_direct_reward_call(tmp_path, generations, tokenizer, student,
                                                                    teacher):
    cfg = compose("distill", ["size=tiny", f"output_dir={tmp_path}", "data.max_rows=3",
                              "distill.samples_per_question=3", "distill.max_new_tokens=40"])
    run_distill(cfg)
    source_order = load_split(DataConfig(**OmegaConf.to_container(cfg.data)), 0, "train")
    # explained in the stratified order of sample_rows (a distill stopped part-way covers every template it can)
    rows = sample_rows(source_order, None, cfg.seed, group_of)
    assert rows != source_order
    written = _lines(tmp_path / DISTILL_FILE)
    assert [(r["question"], r["solution"]) for r in written] == [(r["question"], r["solution"]) for r in rows]

    [(prompt_ids, n, temperature, completions)] = generations
    assert (n, temperature) == (3, 0.7)
    reward = _direct_reward(cfg, tokenizer, student, teacher)
    end = end_tag("explanation")
    for row, ids, per_row, line in zip(rows, prompt_ids, completions, written):
        assert ids == tokenizer(_teacher_prompt(tokenizer, row))["input_ids"]  # the RL stage's prompt
        for completion in per_row:  # generation stops at the closing tag (or EOS / the token limit)
            text = tokenizer.decode(completion).removesuffix(tokenizer.eos_token)
            assert end not in text or text.index(end) == len(text) - len(end)
        scores = _score(reward, tokenizer, row, per_row)
        best = max(range(3), key=lambda j: scores[j]["total"])
        assert line["sample_index"] == best
        assert line["explanation"] == scores[best]["explanation"]
        assert line["matched"] == (not scores[best]["unmatched"])
        assert line["teacher"] == "embedded:teacher"
        for key in ("r_ss", "r_kl", "match_penalty", "total"):
            assert line[key] == pytest.approx(scores[best][key], abs=1e-4)


def test_distill_resumes_with_only_the_missing_questions(tmp_path, generations):
    overrides = [f"output_dir={tmp_path}", "distill.selection=all", "distill.samples_per_question=2",
                 "distill.max_new_tokens=24"]
    path = tmp_path / DISTILL_FILE
    run_distill(compose("distill", ["size=tiny", *overrides, "data.max_rows=2"]))
    first = path.read_text()
    assert len(_lines(path)) == 4  # 2 questions x 2 samples
    run_distill(compose("distill", ["size=tiny", *overrides, "data.max_rows=3"]))  # one more question
    assert path.read_text().startswith(first)
    assert [len(call[0]) for call in generations] == [2, 1]
    questions = [line["question"] for line in _lines(path)]
    assert len(questions) == 6 and len(set(questions)) == 3
    assert [line["sample_index"] for line in _lines(path)] == [0, 1] * 3

    # A crash while writing: the last question has one complete line and one cut short.
    text = path.read_text()
    path.write_text(text[:-15])
    run_distill(compose("distill", ["size=tiny", *overrides, "data.max_rows=3"]))
    assert path.read_text().startswith(first) and len(_lines(path)) == 6
    assert len(generations[-1][0]) == 1 and [line["question"] for line in _lines(path)] == questions
    run_distill(compose("distill", ["size=tiny", *overrides, "data.max_rows=3"]))  # nothing left: nothing generated
    assert len(generations) == 3

    with pytest.raises(UserError, match=r"was written with distill.selection=\"all\", not \"best\""):
        run_distill(compose("distill", ["size=tiny", f"output_dir={tmp_path}", "distill.samples_per_question=2"]))


def test_eval_numbers_match_a_direct_computation(tmp_path, generations, tokenizer, student, teacher):
    cfg = compose("eval", ["size=tiny", f"output_dir={tmp_path}", "data.max_rows=3", "eval.max_new_tokens=40",
                           "eval.student_max_new_tokens=64", "eval.bootstrap_resamples=500"])
    run_eval(cfg)
    result = json.loads((tmp_path / EVAL_FILE).read_text())
    records = _lines(tmp_path / ROWS_FILE)
    rows = load_split(DataConfig(**OmegaConf.to_container(cfg.data)), 0, "eval")
    assert [r["question"] for r in records] == [r["question"] for r in rows] and result["questions"] == 3

    (_, n, _, explanations), (student_prompts, _, temperature, answers) = generations
    assert n == 1 and temperature == 0.0  # the student answers greedily
    reward = _direct_reward(cfg, tokenizer, student, teacher)
    expected = {"teacher/reward": [], "teacher/r_ss": [], "teacher/r_kl": [], "teacher/match_penalty": [],
                "teacher/unmatched_frac": [], "student/solution_log_prob": [], "student/accuracy": []}
    for row, completion, prompt_ids, answer in zip(rows, explanations, student_prompts, answers):
        [score] = _score(reward, tokenizer, row, completion)
        for key in ("r_ss", "r_kl", "match_penalty"):
            expected[f"teacher/{key}"].append(score[key])
        expected["teacher/reward"].append(score["total"])
        expected["teacher/unmatched_frac"].append(float(score["unmatched"]))
        # log p(solution | question, explanation) at temperature 1: one unpadded forward with full logits
        [sample] = reward.align([row["question"]], [row["solution"]], completion)
        with torch.no_grad():
            logits = student(torch.tensor([sample.student_ids])).logits[0]
        start, stop = sample.solution_span
        targets = torch.tensor(sample.student_ids[start:stop])
        log_probs = logits[start - 1 : stop - 1].log_softmax(-1).gather(-1, targets[:, None])
        expected["student/solution_log_prob"].append(float(log_probs.mean()))
        # the student saw its chat without the assistant turn, and is right when its last number is the answer
        chat = FMT.student_messages(row["question"], "", "")[:2]
        assert prompt_ids == tokenizer(tokenizer.apply_chat_template(chat, tokenize=False,
                                                                     add_generation_prompt=True))["input_ids"]
        said = re.findall(r"The answer is (-?\d+)", tokenizer.decode(answer[0]))
        expected["student/accuracy"].append(float(bool(said) and said[-1] == row["answer"]))
    for name, values in expected.items():
        metric = result["metrics"][name]
        assert metric["mean"] == pytest.approx(sum(values) / len(values), abs=1e-4), name
        assert metric["n"] == 3 and metric["low"] <= metric["mean"] <= metric["high"]


def test_eval_student_accuracy_alone_with_controlled_answers(tmp_path, monkeypatch, tokenizer):
    rows = [
        {"question": "What is 3 + 4?", "solution": "The answer is 7."},
        {"question": "What is 2 * 6?", "solution": "The answer is 12."},
        {"question": "Half of one?", "solution": "Final answer: \\frac{1}{2}", "answer": "\\frac{1}{2}"},
        {"question": "Root of 8?", "solution": "Final answer: 2\\sqrt{2}", "answer": "2\\sqrt{2}"},
        {"question": "Is it nice?", "solution": "It depends."},  # nothing to check
    ]
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    replies = {"What is 3 + 4?": "The answer is 7.", "What is 2 * 6?": "The answer is 13.",
               "Half of one?": "So $x = 0.5$", "Root of 8?": "So $x = 3$", "Is it nice?": "Yes."}

    def answer(self, prompt_ids, n, temperature):
        texts = [tokenizer.decode(ids) for ids in prompt_ids]
        reply = [next(v for q, v in replies.items() if f"{q}<|im_end|>" in text) for text in texts]
        return [[tokenizer(f"<|begin_of_thought|>t<|end_of_thought|>\n\n<|begin_of_solution|>{r}"
                           "<|end_of_solution|>")["input_ids"]] for r in reply]

    monkeypatch.setattr(TransformersGenerator, "generate", answer)
    run_eval(compose("eval", ["size=tiny", f"output_dir={tmp_path / 'out'}", "model.model_name_or_path=null",
                              "data=custom", f"data.source={data}", "data.eval_rows=5"]))
    result = json.loads((tmp_path / "out" / EVAL_FILE).read_text())
    assert result["teacher"] is None and set(result["metrics"]) == {"student/accuracy", "student/unparsed_frac",
                                                                    "student/capped_frac"}
    assert result["metrics"]["student/accuracy"]["mean"] == 0.5 and result["metrics"]["student/accuracy"]["n"] == 4
    assert result["metrics"]["student/unparsed_frac"]["mean"] == 0.0  # every checkable answer had a number
    correct = {r["question"]: r["correct"] for r in _lines(tmp_path / "out" / ROWS_FILE)}
    assert correct == {"What is 3 + 4?": True, "What is 2 * 6?": False, "Half of one?": True, "Root of 8?": False,
                       "Is it nice?": None}


def test_bootstrap_interval_of_hand_made_values():
    assert bootstrap_interval([2.0] * 10) == (2.0, 2.0)
    assert bootstrap_interval([5.0]) == (5.0, 5.0)
    # 50 zeros and 50 ones: the mean's standard error is 0.05, so a 95% interval is about 0.5 -+ 1.96 * 0.05
    low, high = bootstrap_interval([0.0] * 50 + [1.0] * 50, confidence=0.95, resamples=4000, seed=0)
    assert low == pytest.approx(0.402, abs=0.015) and high == pytest.approx(0.598, abs=0.015)
    assert bootstrap_interval([0.0] * 50 + [1.0] * 50, seed=3) == bootstrap_interval([0.0] * 50 + [1.0] * 50, seed=3)
    narrow = bootstrap_interval([0.0] * 50 + [1.0] * 50, confidence=0.5, resamples=4000)
    assert low < narrow[0] < narrow[1] < high  # 50% interval: about 0.5 -+ 0.674 * 0.05
    assert narrow[0] == pytest.approx(0.466, abs=0.012)


def test_compare_renders_one_table(tmp_path, capsys):
    def eval_json(folder, teacher, reward, accuracy):
        (tmp_path / folder).mkdir()
        metrics = {"student/accuracy": {"mean": accuracy, "low": accuracy - 0.1, "high": accuracy + 0.1, "n": 20}}
        if reward is not None:
            metrics["teacher/reward"] = {"mean": reward, "low": reward - 0.25, "high": reward + 0.5, "n": 20}
        path = tmp_path / folder / EVAL_FILE
        path.write_text(json.dumps({"teacher": teacher, "student": "s", "questions": 20, "metrics": metrics}))
        return path

    a, b = eval_json("a", "t1", -1.5, 0.25), eval_json("b", None, None, 0.5)
    table = compare_table([a, b])
    assert table.splitlines() == [
        f"| | {tmp_path / 'a'} | {tmp_path / 'b'} |",
        "| --- | --- | --- |",
        "| teacher | t1 | None |",
        "| student | s | s |",
        "| questions | 20 | 20 |",
        "| teacher/reward | -1.500 [-1.750, -1.000] (n=20) | — |",
        "| student/accuracy | 0.250 [0.150, 0.350] (n=20) | 0.500 [0.400, 0.600] (n=20) |",
    ]
    assert main(["compare", str(tmp_path / "a"), str(b)]) == 0  # a run folder or its eval.json
    assert capsys.readouterr().out == table + "\n"
    assert main(["compare", str(tmp_path / "missing.json")]) == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_stage_options_are_checked_before_a_model_loads(tmp_path):
    with pytest.raises(ConfigError,
                       match=r"^distill: selection must be one of \('best', 'all', 'best_correct'\), got 'top'$"):
        run_distill(compose("distill", ["size=tiny", f"output_dir={tmp_path}", "distill.selection=top"]))
    with pytest.raises(ConfigError, match="leave nothing to evaluate"):
        run_eval(compose("eval", ["size=tiny", f"output_dir={tmp_path}", "model.model_name_or_path=null",
                                  "eval.student_accuracy=false"]))
    with pytest.raises(ConfigError, match="distill needs a teacher"):
        run_distill(compose("distill", ["size=tiny", f"output_dir={tmp_path}", "model.model_name_or_path=null"]))
    OmegaConf.save(compose("eval", ["size=tiny"]), tmp_path / "config.yaml")  # another stage's folder is left alone
    with pytest.raises(UserError, match=r"^output_dir=.* was written with stage=\"eval\", not \"distill\""):
        run_distill(compose("distill", ["size=tiny", f"output_dir={tmp_path}"]))


def _run_stage_recording_vllm(calls_path, *args, timeout=600):
    """Run a stage in a new Python process; returns its VLLMGenerator.generate calls, as ``RECORD_VLLM_CALLS``
    writes them."""
    env = {**os.environ, "RLT_MONO_VLLM_CALLS": str(calls_path)}
    result = subprocess.run([sys.executable, "-c", RECORD_VLLM_CALLS, *args], cwd=ROOT, env=env, capture_output=True,
                            text=True, timeout=timeout)
    assert result.returncode == 0, result.stderr[-3000:]
    return _lines(calls_path)


@pytest.mark.gpu
def test_distill_and_eval_with_vllm_on_gpu(tiny_pair, tmp_path):
    """vLLM generates (asleep while the reward scores), two engines start one after the other in eval, and the
    kept explanation is the best of the generated ids by a direct reward call on the same GPU.

    Each stage runs in its own process, as it does from the command line: vLLM's CuMem allocator serves one
    sleep-mode engine per process, and an earlier GPU test in this pytest process may have made one.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    for role, path in (("teacher", tiny_pair.teacher_path), ("student", tiny_pair.student_path)):
        AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).save_pretrained(tmp_path / role)
        AutoTokenizer.from_pretrained(path).save_pretrained(tmp_path / role)
    models = [f"model.model_name_or_path={tmp_path / 'teacher'}", f"student.model_name_or_path={tmp_path / 'student'}",
              "model.dtype=bfloat16", "student.dtype=bfloat16", "placement.rollout=vllm"]
    distill_overrides = [*models, f"output_dir={tmp_path / 'distill'}", "data.max_rows=4",
                         "distill.samples_per_question=4", "distill.vllm_gpu_memory_utilization=0.3"]
    distill_calls = _run_stage_recording_vllm(tmp_path / "distill_calls.jsonl", "distill", "size=tiny",
                                               *distill_overrides)
    eval_calls = _run_stage_recording_vllm(tmp_path / "eval_calls.jsonl", "eval", "size=tiny", *models,
                                           f"output_dir={tmp_path / 'eval'}", "data.max_rows=4",
                                           "eval.vllm_gpu_memory_utilization=0.3")

    cfg = compose("distill", ["size=tiny", *distill_overrides])
    written = _lines(tmp_path / "distill" / DISTILL_FILE)
    rows = load_split(DataConfig(**OmegaConf.to_container(cfg.data)), 0, "train")
    assert [r["question"] for r in written] == [r["question"] for r in rows]
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "teacher")
    teacher = AutoModelForCausalLM.from_pretrained(tmp_path / "teacher", dtype=torch.bfloat16).cuda().eval()
    student = AutoModelForCausalLM.from_pretrained(tmp_path / "student", dtype=torch.bfloat16).cuda().eval()
    reward = _direct_reward(cfg, tokenizer, student, teacher)
    [(_, n, _, completions)] = distill_calls
    assert n == 4
    end = end_tag("explanation")
    for row, per_row, line in zip(rows, completions, written):
        for completion in per_row:  # vLLM stops at the closing tag and hands back no token after it
            text = tokenizer.decode(completion).removesuffix(tokenizer.eos_token)
            assert end not in text or text.index(end) == len(text) - len(end)
        scores = _score(reward, tokenizer, row, per_row)
        assert line["explanation"] == scores[line["sample_index"]]["explanation"]
        assert line["total"] == pytest.approx(max(s["total"] for s in scores), abs=0.05)  # bf16, other batches

    result = json.loads((tmp_path / "eval" / EVAL_FILE).read_text())
    assert set(result["metrics"]) == {"teacher/reward", "teacher/r_ss", "teacher/r_kl", "teacher/match_penalty",
                                      "teacher/unmatched_frac", "student/solution_log_prob", "student/accuracy"}
    assert [c[2] for c in eval_calls] == [0.7, 0.0]  # the teacher samples, then the student answers greedily


def test_distill_under_placement_async_says_it_samples_on_one_gpu(tmp_path, caplog):
    """placement=async is the RL stage's one-step-off rollout: a pipeline that sets it for every step gets distill
    (and eval) on one device, with one warning, not a refusal."""
    cfg = compose("distill", ["size=tiny", f"output_dir={tmp_path}", "data.max_rows=1", "placement=async",
                              "distill.samples_per_question=1", "distill.max_new_tokens=4"])
    run_distill(cfg)
    assert len(_lines(tmp_path / DISTILL_FILE)) == 1
    assert "placement=async is ignored: it runs the RL stage's rollout one step ahead on a second GPU; distill " \
           "samples and scores on one GPU (placement=mono)" in caplog.text
