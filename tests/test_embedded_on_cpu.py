"""The embedded dataset and the tiny teacher/student pair: determinism, correctness, caching, warm-up.

The pair is built once per module into a temporary cache (~30 s on 2 CPU cores), never into ~/.cache.
"""

from __future__ import annotations

import logging
import re
import time

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from rlt_mono.config import default_cache_dir
from rlt_mono.data.embedded import TinyPair, build_tiny_pair, generate_rows, tiny_models
from rlt_mono.data.prompts import ALL_TAGS, PromptFormat, begin_tag, end_tag

logger = logging.getLogger(__name__)

EQUATION = re.compile(r"(\d+) ([-+*/]) (\d+) = (\d+)")
OPERATIONS = {"+": int.__add__, "-": int.__sub__, "*": int.__mul__, "/": int.__floordiv__}
HELD_OUT_SEED = 123  # rows the models were not warmed up on


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    """A cache folder private to this module, so the tests never read or write ~/.cache."""
    return tmp_path_factory.mktemp("rlt_mono_cache")


@pytest.fixture(scope="module")
def pair(cache_dir) -> TinyPair:
    """The tiny pair, built once for the module."""
    started = time.perf_counter()
    built = build_tiny_pair(cache_dir)
    logger.info("tiny pair built in %.1fs", time.perf_counter() - started)
    return built


@pytest.fixture(scope="module")
def tokenizer(pair):
    """The tokenizer as a user gets it: reloaded from the teacher folder."""
    return AutoTokenizer.from_pretrained(pair.teacher_path)


# ---------------------------------------------------------------- dataset


def test_generate_rows_is_deterministic_in_seed():
    rows = generate_rows(200, seed=7)
    assert rows == generate_rows(200, seed=7)
    assert rows != generate_rows(200, seed=8)
    for row in rows:
        assert set(row) == {"question", "solution", "reasoning_trace", "answer"}
        assert row["solution"] == f"The answer is {row['answer']}."
        assert all(isinstance(value, str) and value.strip() for value in row.values())


def test_reasoning_traces_are_correct_arithmetic():
    for row in generate_rows(500, seed=0):
        equations = EQUATION.findall(row["reasoning_trace"])
        assert 2 <= len(equations) <= 4, row
        for left, operation, right, result in equations:
            left, right, result = int(left), int(right), int(result)
            if operation == "/":
                assert left % right == 0, row
            assert OPERATIONS[operation](left, right) == result, row
        answer = int(re.fullmatch(r"The answer is (\d+)\.", row["solution"]).group(1))
        assert int(equations[-1][3]) == answer, row
        assert row["reasoning_trace"].endswith(row["solution"])
        assert 3 <= row["reasoning_trace"].count(". ") + 1 <= 5


# ---------------------------------------------------------------- tokenizer


def test_tokenizer_reload_round_trips(tokenizer):
    trained = tiny_models.train_tokenizer(generate_rows(tiny_models.NUM_ROWS, seed=0), PromptFormat())
    texts = [
        "é 😀 ∑ naïve",
        "  two spaces\n\nand\ttabs  ",
        f"{begin_tag('solution')}The answer is 42.{end_tag('solution')}\n\n{begin_tag('explanation')}\n\n5 * 6 = 30.",
        "<|im_start|>user\nhi<|im_end|>\n",
        *generate_rows(3, seed=HELD_OUT_SEED)[0].values(),
    ]
    for text in texts:
        ids = tokenizer.encode(text, add_special_tokens=False)
        assert ids == trained.encode(text, add_special_tokens=False), text
        assert tokenizer.decode(ids) == text


def test_tags_and_chat_tokens_are_single_tokens(tokenizer):
    for token in (*ALL_TAGS, "<|im_start|>", "<|im_end|>", "<|endoftext|>"):
        assert len(tokenizer.encode(token, add_special_tokens=False)) == 1, token
    # The tags are not special: they survive skip_special_tokens.
    text = f"<|im_start|>{begin_tag('thought')}x{end_tag('thought')}<|im_end|>"
    decoded = tokenizer.decode(tokenizer.encode(text), skip_special_tokens=True)
    assert decoded == f"{begin_tag('thought')}x{end_tag('thought')}"
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.pad_token == "<|endoftext|>"


def test_chat_template_continues_the_teacher_prefill(tokenizer):
    prompts = PromptFormat()
    messages = prompts.teacher_messages("What is 2 + 3?", "The answer is 5.")
    rendered = tokenizer.apply_chat_template(messages, tokenize=False, continue_final_message=True)
    assert rendered.endswith("<|im_start|>assistant\n" + prompts.teacher_prefill("The answer is 5."))
    assert rendered.startswith("<|im_start|>system\n" + prompts.teacher_system_prompt + "<|im_end|>\n")
    generation = tokenizer.apply_chat_template(messages[:2], tokenize=False, add_generation_prompt=True)
    assert generation.endswith("<|im_end|>\n<|im_start|>assistant\n")


def test_teacher_and_student_share_the_vocabulary(pair, tokenizer):
    student_tokenizer = AutoTokenizer.from_pretrained(pair.student_path)
    assert student_tokenizer.get_vocab() == tokenizer.get_vocab()
    for path in (pair.teacher_path, pair.student_path):
        model = AutoModelForCausalLM.from_pretrained(path)
        assert model.config.vocab_size == len(tokenizer)
        assert model.generation_config.eos_token_id == tokenizer.convert_tokens_to_ids("<|im_end|>")
        assert model.generation_config.pad_token_id == tokenizer.pad_token_id
    assert pair.data_path.read_text(encoding="utf-8").count("\n") == tiny_models.NUM_ROWS


# ---------------------------------------------------------------- cache


def test_build_is_cached(pair, cache_dir, monkeypatch):
    stamp = pair.teacher_path.parent.stat().st_mtime_ns

    def fail(*args, **kwargs):
        raise AssertionError("the cached pair was rebuilt")

    monkeypatch.setattr(tiny_models, "_build_into", fail)
    started = time.perf_counter()
    assert build_tiny_pair(cache_dir) == pair
    assert time.perf_counter() - started < 1.0
    assert pair.teacher_path.parent.stat().st_mtime_ns == stamp


def test_crashed_build_leaves_nothing_behind(tmp_path, monkeypatch):
    def crash(folder, seed, warmup_steps):
        (folder / "partial.txt").write_text("half")
        raise RuntimeError("simulated crash")

    monkeypatch.setattr(tiny_models, "_build_into", crash)
    with pytest.raises(RuntimeError, match="simulated crash"):
        build_tiny_pair(tmp_path, seed=5)
    assert [path.suffix for path in tmp_path.iterdir()] == [".lock"]


def test_cache_location_and_recipe_hash(monkeypatch, tmp_path):
    monkeypatch.setenv("RLT_MONO_CACHE", str(tmp_path))
    assert default_cache_dir() == tmp_path
    assert tiny_models._recipe_hash(0, 200) != tiny_models._recipe_hash(1, 200)
    assert tiny_models._recipe_hash(0, 200) != tiny_models._recipe_hash(0, 100)


# ---------------------------------------------------------------- warm-up


def _mean_solution_log_prob(model, tokenizer, rows) -> float:
    """Mean log-prob of the tokens after ``<|begin_of_solution|>`` up to ``<|end_of_solution|>`` (inclusive)."""
    prompts = PromptFormat()
    begin_id, end_id = tokenizer.convert_tokens_to_ids([begin_tag("solution"), end_tag("solution")])
    total, count = 0.0, 0
    for row in rows:
        messages = prompts.student_messages(row["question"], row["reasoning_trace"], row["solution"])
        text = tokenizer.apply_chat_template(messages, tokenize=False)
        ids = tokenizer(text, return_tensors="pt")["input_ids"]  # (1, T)
        with torch.no_grad():
            log_probs = model(ids).logits[0, :-1].log_softmax(-1)  # (T-1, V)
        token_log_probs = log_probs.gather(-1, ids[0, 1:, None])[:, 0]  # (T-1,), predicts ids[1:]
        # The last tag pair: the system prompt names the tags too.
        positions = ids[0].tolist()[::-1]
        start, end = len(positions) - positions.index(begin_id), len(positions) - 1 - positions.index(end_id)
        total += token_log_probs[start - 1 : end].sum().item()  # targets ids[start : end + 1]
        count += end + 1 - start
    return total / count


def test_warm_up_teaches_the_student_its_solution_format(pair, tokenizer):
    rows = generate_rows(8, seed=HELD_OUT_SEED)
    student = AutoModelForCausalLM.from_pretrained(pair.student_path).eval()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        untrained = AutoModelForCausalLM.from_config(student.config).eval()
    trained_score = _mean_solution_log_prob(student, tokenizer, rows)
    untrained_score = _mean_solution_log_prob(untrained, tokenizer, rows)
    logger.info("solution mean log-prob: warmed-up %.3f, random init %.3f", trained_score, untrained_score)
    assert trained_score > untrained_score + 2.0


def test_teacher_closes_its_explanation(pair, tokenizer, record_property):
    prompts = PromptFormat()
    rows = generate_rows(16, seed=HELD_OUT_SEED)
    teacher = AutoModelForCausalLM.from_pretrained(pair.teacher_path).eval()
    texts = [
        tokenizer.apply_chat_template(
            prompts.teacher_messages(row["question"], row["solution"]), tokenize=False, continue_final_message=True
        )
        for row in rows
    ]
    batch = tokenizer(texts, return_tensors="pt", padding=True, padding_side="left")  # (B, P)
    with torch.no_grad():
        generated = teacher.generate(**batch, max_new_tokens=120, do_sample=False)  # (B, P + L)
    completions = tokenizer.batch_decode(generated[:, batch["input_ids"].shape[1] :], skip_special_tokens=True)
    share = sum(prompts.explanation_end in completion for completion in completions) / len(completions)
    record_property("explanation_closed_share", share)
    logger.info("teacher closed the explanation in %.0f%% of greedy completions", 100 * share)
    assert share > 0
