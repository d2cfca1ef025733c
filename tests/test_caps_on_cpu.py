"""Caps sample, never truncate (rlt_mono.data.rows.sample_rows): every subset of rows is a seeded sample, stratified by
template where rows have one; GSM-Symbolic's worked-solution mapping; the untrained student's plain prompt."""

import json
from collections import Counter
from dataclasses import replace

import pytest
from omegaconf import OmegaConf

from rlt_mono.data.prompts import PromptFormat
from rlt_mono.data.rows import (
    MAX_ROW_CHARS,
    BadRowError,
    DataConfig,
    DataConfigError,
    load_split,
    sample_rows,
    validate_rows,
)
from rlt_mono.stages.eval import PLAIN_REQUEST, EvalConfig, answer_record, student_question
from rlt_mono.stages.sft import build_sft_dataset, load_sft_rows

GOOD = {"question": "What is 2 + 3?", "solution": "The answer is 5."}


def _committed_gsm_config(**changes) -> DataConfig:
    """cfgs/data/gsm_symbolic.yaml as committed, with ``changes``."""
    values = OmegaConf.to_container(OmegaConf.load("cfgs/data/gsm_symbolic.yaml"))
    values.pop("defaults")
    return DataConfig(**{**values, **changes})


def _rows_file(tmp_path, rows):
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


# ---- sample_rows ------------------------------------------------------------------------------------------------
def test_a_stratified_sample_takes_every_group_once_before_any_group_twice():
    rows = [{"id": i, "template": i // 10} for i in range(50)]  # 5 groups of 10, in group order as sources list them
    drawn = sample_rows(rows, None, seed=3, group=lambda r: r["template"])
    assert sorted(r["id"] for r in drawn) == list(range(50))
    for n in range(1, 51):  # every prefix is itself stratified: group counts differ by at most one
        counts = Counter(r["template"] for r in drawn[:n])
        assert max(counts.values()) - min(counts.values()) <= 1 and len(counts) == min(n, 5)
    assert sample_rows(rows, 7, seed=3, group=lambda r: r["template"]) == drawn[:7]
    assert sample_rows(rows, 7, seed=4, group=lambda r: r["template"]) != drawn[:7]  # the seed decides
    # not the first rows in source order
    assert [r["id"] for r in sample_rows(rows, 10, seed=3)] != list(range(10))


def test_a_cap_on_the_training_rows_is_a_seeded_sample_kept_in_source_order(tmp_path):
    rows = [{"question": f"Q{i}?", "solution": f"The answer is {i}."} for i in range(40)]
    config = DataConfig(source=str(_rows_file(tmp_path, rows)), eval_fraction=0, max_rows=10)
    capped = load_split(config, seed=0)
    indices = [int(r["question"][1:-1]) for r in capped]
    assert len(capped) == 10 and indices == sorted(indices) and indices != list(range(10))
    assert load_split(config, seed=0) == capped and load_split(config, seed=1) != capped


def test_a_cap_of_256_gsm_symbolic_rows_covers_the_training_templates(caplog):
    caplog.set_level("INFO", logger="rlt_mono.data.rows")
    config = _committed_gsm_config(gsm_items_per_template=20, eval_rows=200, heldout_template_rows=200, max_rows=256)
    rows = load_split(config, seed=0)
    assert len(rows) == 256 and len({r["template"] for r in rows}) == 63  # 78 templates, 15 held out whole
    assert "256 of " in caplog.text and "covering 63 templates" in caplog.text
    # with the ten held-out templates of the first study: 256 rows covered 5 of 68 when the cap kept the first rows
    ten = replace(config, heldout_templates=[0, 11, 19, 29, 40, 48, 56, 67, 80, 91], heldout_template_rows=200,
                  eval_rows=200)
    assert len({r["template"] for r in load_split(ten, seed=0)}) >= 60


def test_the_first_held_out_rows_cover_both_sets_and_many_templates():
    rows = load_split(_committed_gsm_config(gsm_items_per_template=20, eval_rows=300, heldout_template_rows=300),
                      seed=0, split="eval")
    first = rows[:64]  # what the RL stage's held-out curve reads (trainer.eval_questions=64)
    assert Counter(r["heldout"] for r in first) == {"instances": 32, "templates": 32}
    assert len({r["template"] for r in first if r["heldout"] == "templates"}) == 15
    assert len({r["template"] for r in first if r["heldout"] == "instances"}) == 32


@pytest.mark.parametrize("cap, says", [
    (0, "data.max_rows must be >= 1 or null, got 0"),
    (-3, "data.max_rows must be >= 1 or null, got -3"),
    ("abc", "data.max_rows must be a whole number or null, got 'abc'"),
    (2.5, "data.max_rows must be a whole number or null, got 2.5"),
])
def test_a_cap_that_is_not_a_positive_whole_number_is_one_line(cap, says):
    with pytest.raises(DataConfigError) as err:
        DataConfig(max_rows=cap)
    assert str(err.value) == says


def test_a_cap_over_the_training_rows_is_one_line_and_over_the_held_out_rows_a_warning(tmp_path, caplog):
    rows = [{"question": f"Q{i}?", "solution": f"The answer is {i}."} for i in range(20)]
    config = DataConfig(source=str(_rows_file(tmp_path, rows)), eval_rows=4, max_rows=17)
    with pytest.raises(DataConfigError) as err:
        load_split(config)
    assert str(err.value) == (f"data.max_rows=17 but data.source={config.source} has 16 training rows: lower "
                              "data.max_rows, or set it to null for all of them")
    assert len(load_split(config, split="eval")) == 4
    assert "data.max_rows=17 is more than the 4 held-out rows" in caplog.text
    with pytest.raises(DataConfigError, match="data.max_rows=17 but"):  # the SFT stages check it too
        load_sft_rows(config, 0, "student_sft", "none")


@pytest.mark.parametrize("held_out, says", [
    ([999], r"data.heldout_templates: \[999\] not among the templates of data.source=gsm_symbolic \(they are 0-1, "),
    ([32], r"data.heldout_templates: \[32\] not among the templates"),  # a template reasoning-gym marks as broken
])
def test_held_out_templates_the_source_lacks_are_one_line(held_out, says):
    with pytest.raises(DataConfigError, match=says):
        load_split(_committed_gsm_config(gsm_items_per_template=1, heldout_templates=held_out,
                                         heldout_template_rows=None, eval_rows=5))


@pytest.mark.parametrize("held_out", ["abc", [-1], [1.5], [True]])
def test_held_out_templates_that_are_not_template_numbers_are_one_line(held_out):
    with pytest.raises(DataConfigError, match=r"data.heldout_templates must be a list of template numbers"):
        _committed_gsm_config(heldout_templates=held_out)


# ---- one length guard, visible text -----------------------------------------------------------------------------
def test_a_megabyte_row_is_refused_or_skipped_before_any_stage_reads_it(tmp_path, caplog):
    huge = {**GOOD, "question": "How many? " * 100_000}
    path = _rows_file(tmp_path, [GOOD, huge, GOOD])
    with pytest.raises(BadRowError) as err:  # what distill and eval read (load_split), and SFT
        load_split(DataConfig(source=str(path), eval_fraction=0))
    assert str(err.value) == (f"{path}: row 1: column 'question' has 1,000,000 characters, over the "
                              f"{MAX_ROW_CHARS:,} any stage reads: shorten the row, or set data.on_long_row=skip to "
                              "drop such rows")
    rows = load_split(DataConfig(source=str(path), eval_fraction=0, on_long_row="skip"))
    assert rows == [GOOD, GOOD] and "skipped 1 of 3 rows with a column over 65536 characters" in caplog.text
    with pytest.raises(BadRowError, match="row 1: column 'question' has 1,000,000 characters"):
        load_sft_rows(DataConfig(source=str(path), eval_fraction=0), 0, "student_sft", "none")


def test_a_question_of_zero_width_spaces_is_a_bad_row():
    rows = [GOOD, {**GOOD, "question": "\u200b\u200b \u2060\ufeff"}]
    with pytest.raises(BadRowError) as err:
        validate_rows(rows, "rows.jsonl", "error", "error")
    assert str(err.value) == ("rows.jsonl: row 1: column 'question' has no visible character (fix the row, or set "
                              "data.on_bad_row=skip to drop such rows)")
    assert validate_rows(rows, "rows.jsonl", on_bad_row="skip", on_long_row="error") == ([GOOD], 1)


# ---- the RLT mapping on GSM-Symbolic ----------------------------------------------------------------------------
def test_the_teacher_is_shown_the_worked_solution_and_the_ablation_the_answer_alone():
    small = {"gsm_items_per_template": 2, "eval_rows": 10, "heldout_template_rows": 10}
    worked = load_split(_committed_gsm_config(**small), seed=0)
    answer_only = load_split(_committed_gsm_config(**small, gsm_solution="answer"), seed=0)
    assert [r["question"] for r in worked] == [r["question"] for r in answer_only]
    for w, a in zip(worked, answer_only, strict=True):
        assert w["solution"] == f"{w['reasoning_trace']}\nThe answer is {w['answer']}."
        assert a["solution"] == f"The answer is {a['answer']}." and a["reasoning_trace"] == w["reasoning_trace"]
    with pytest.raises(DataConfigError, match=r"data.gsm_solution must be one of \['worked', 'answer'\], got 'x'"):
        _committed_gsm_config(gsm_solution="x")


def test_the_worked_solution_student_learns_question_to_solution_with_an_empty_thought(tokenizer):
    row = {"question": "What is 2 + 3?", "solution": "2 + 3 = 5\nThe answer is 5."}
    [ids] = build_sft_dataset([row], tokenizer, "student_sft", "none")["input_ids"]
    text = tokenizer.decode(ids)
    assert PromptFormat().student_completion("", row["solution"]) in text
    assert text.index("What is 2 + 3?") < text.rindex("<|begin_of_thought|>")


def test_no_explanation_is_for_students_only(tmp_path):
    config = DataConfig(source=str(_rows_file(tmp_path, [GOOD] * 3)), eval_fraction=0)
    with pytest.raises(Exception, match="sft.explanation_column=none trains a student on solutions alone; "
                                        "teacher_sft learns to write explanations"):
        load_sft_rows(config, 0, "teacher_sft", "none")


# ---- the untrained student's own prompt ------------------------------------------------------------------------
def test_the_plain_prompt_asks_for_steps_and_the_student_prompt_is_the_student_chat():
    plain = student_question(PromptFormat(), EvalConfig(student_prompt="plain"), "What is 2 + 3?")
    assert plain == [{"role": "user", "content": "What is 2 + 3?" + PLAIN_REQUEST}]
    chat = student_question(PromptFormat(), EvalConfig(), "What is 2 + 3?")
    assert [m["role"] for m in chat] == ["system", "user"] and chat[1]["content"] == "What is 2 + 3?"
    with pytest.raises(ValueError, match="student_prompt must be one of"):
        EvalConfig(student_prompt="chatty")


def test_an_answer_cut_at_the_token_cap_is_counted():
    row = {"question": "q", "solution": "The answer is 5.", "answer": "5"}
    assert answer_record(row, "2 + 3 = 5. The answer is 5.", capped=False)["capped"] is False
    record = answer_record(row, "We add the two numbers and", capped=True)
    assert record["capped"] is True and record["correct"] is False
