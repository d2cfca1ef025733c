"""Rows: loading from files, validation errors that name file/row/column, skipping, prompt rendering."""

import json

import pytest

from rlt_mono.data import BadRowError, DataConfig, build_prompt_dataset, prepare_dataset, validate_rows
from rlt_mono.prompts import PromptFormat, begin_tag

GOOD = {"question": "What is 2 + 3?", "solution": "The answer is 5.", "reasoning_trace": "2 + 3 = 5."}


def _write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.mark.parametrize(
    "bad, column, what",
    [
        ({"question": "q"}, "solution", "is missing"),
        ({"question": "", "solution": "s"}, "question", "is empty"),
        ({"question": "q", "solution": 5}, "solution", "is a int, not a string"),
        ({"question": "q", "solution": "s", "reasoning_trace": ["x"]}, "reasoning_trace", "is a list"),
    ],
)
def test_bad_row_error_names_source_row_and_column(bad, column, what):
    with pytest.raises(BadRowError) as err:
        validate_rows([GOOD, GOOD, bad], "rows.jsonl")
    assert f"rows.jsonl: row 2: column '{column}' {what}" in str(err.value)


def test_skip_mode_drops_and_counts(tmp_path):
    path = _write_jsonl(tmp_path / "rows.jsonl", [GOOD, {"question": "q", "solution": "  "}, GOOD])
    rows, skipped = validate_rows([GOOD, {"question": "q", "solution": "  "}, GOOD], str(path), "skip")
    assert skipped == 1 and len(rows) == 2


def test_jsonl_and_csv_files_become_teacher_prompts(tmp_path, tokenizer):
    jsonl = _write_jsonl(tmp_path / "rows.jsonl", [GOOD, {**GOOD, "question": "What is 4 + 4?"}])
    csv = tmp_path / "rows.csv"
    csv.write_text('question,solution\n"What is 1 + 1?","The answer is 2."\n')
    for path, n in ((jsonl, 2), (csv, 1)):
        dataset, skipped = prepare_dataset(DataConfig(source=str(path)), tokenizer, PromptFormat())
        assert len(dataset) == n and skipped == 0
        assert set(dataset.column_names) == {"prompt", "question", "solution"}
    prompt = dataset[0]["prompt"]
    # The prompt ends with the prefilled solution and the opened explanation: generation continues it.
    assert prompt.endswith(f"{begin_tag('solution')}The answer is 2.<|end_of_solution|>\n\n"
                           f"{begin_tag('explanation')}\n\n")
    assert "What is 1 + 1?" in prompt


def test_file_errors_are_clear(tmp_path, tokenizer):
    with pytest.raises(FileNotFoundError, match="no such file"):
        prepare_dataset(DataConfig(source=str(tmp_path / "missing.jsonl")), tokenizer, PromptFormat())
    bad = _write_jsonl(tmp_path / "bad.jsonl", [GOOD, {"question": "q"}])
    with pytest.raises(BadRowError, match=r"bad.jsonl: row 1: column 'solution' is missing"):
        prepare_dataset(DataConfig(source=str(bad)), tokenizer, PromptFormat())
    with pytest.raises(ValueError, match="on_bad_row must be 'error' or 'skip'"):
        DataConfig(on_bad_row="ignore")


def test_max_rows_and_embedded_source(tokenizer):
    dataset, _ = prepare_dataset(DataConfig(source="embedded", embedded_rows=50, max_rows=7), tokenizer,
                                 PromptFormat())
    assert len(dataset) == 7


def test_prompt_rendering_uses_the_chat_template(tokenizer):
    dataset = build_prompt_dataset([GOOD], tokenizer, PromptFormat())
    expected = tokenizer.apply_chat_template(PromptFormat().teacher_messages(GOOD["question"], GOOD["solution"]),
                                             tokenize=False, continue_final_message=True)
    assert dataset[0]["prompt"] == expected
