"""Rows: sources and their errors, validation, the held-out split, presets, prompt rendering and length checks."""

import json
import socket
import time

import datasets
import httpx
import pytest
from huggingface_hub import constants as hub_constants
from omegaconf import OmegaConf

from rlt_mono.config import compose
from rlt_mono.data import sources as data_sources
from rlt_mono.data.prompts import PromptFormat, begin_tag
from rlt_mono.data.rows import (
    BadRowError,
    DataConfig,
    DataConfigError,
    DataSourceError,
    NotEnoughRowsError,
    build_prompt_dataset,
    check_enough_rows,
    held_out_questions,
    load_split,
    prepare_dataset,
    render_prompts,
    validate_rows,
)
from rlt_mono.errors import UserError

GOOD = {"question": "What is 2 + 3?", "solution": "The answer is 5.", "reasoning_trace": "2 + 3 = 5."}


def _write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _rows(n, prefix="q"):
    return [{"question": f"{prefix}{i}?", "solution": f"s{i}"} for i in range(n)]


# ---- validation -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "bad, column, what",
    [
        ({"question": "q"}, "solution", "is missing"),
        ({"question": "", "solution": "s"}, "question", "is empty"),
        ({"question": "q", "solution": 5}, "solution", "is a int, not a string"),
        ({"question": "q", "solution": "s", "reasoning_trace": ["x"]}, "reasoning_trace", "is a list"),
        ({"question": "q", "solution": "s", "answer": 5}, "answer", "is a int, not a string"),
    ],
)
def test_bad_row_error_names_source_row_and_column(bad, column, what):
    with pytest.raises(BadRowError) as err:
        validate_rows([GOOD, GOOD, bad], "rows.jsonl", "error", "error")
    assert f"rows.jsonl: row 2: column '{column}' {what}" in str(err.value)
    assert isinstance(err.value, UserError) and isinstance(err.value, ValueError)


def test_skip_mode_drops_and_counts():
    rows, skipped = validate_rows([GOOD, {"question": "q", "solution": "  "}, {**GOOD, "extra": 1}], "x", "skip",
                                  "error")
    assert skipped == 1 and rows == [GOOD, GOOD]


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


def test_prompt_rendering_uses_the_chat_template(tokenizer):
    dataset = build_prompt_dataset([GOOD], tokenizer, PromptFormat())
    expected = tokenizer.apply_chat_template(PromptFormat().teacher_messages(GOOD["question"], GOOD["solution"]),
                                             tokenize=False, continue_final_message=True)
    assert dataset[0]["prompt"] == expected


# ---- sources and their errors -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name, content, message",
    [
        ("missing.jsonl", None, r"missing.jsonl: no such file$"),
        ("folder", "DIR", r"folder is a directory: point it at a local .jsonl/.json/.parquet/.csv file or a hub id"),
        ("empty.jsonl", "", r"empty.jsonl: file has no rows$"),
        ("blank.jsonl", "\n  \n", r"blank.jsonl: file has no rows$"),
        ("header.csv", "question,solution\n", r"header.csv: file has no rows$"),
        ("bad.jsonl", '{"question": "a", "solution": "b"}\n\n{"question": oops}\n',
         r"bad.jsonl: line 3: bad JSON \(Expecting value at column 14\); each line must be one JSON object"),
        ("list.jsonl", '{"question": "a", "solution": "b"}\n[1, 2]\n', r"list.jsonl: line 2 is a JSON list, not an"),
        ("array.json", '[{"question": "a",\n "solution": }]', r"array.json: line 2: bad JSON \(Expecting value\)"),
        ("latin1.jsonl", b'{"question": "a"}\n{"question": "caf\xe9"}\n', r"latin1.jsonl: line 2 is not UTF-8 text"),
        ("bad.parquet", "not parquet", r"bad.parquet: not a readable Parquet file"),
        ("rows.txt", "question: a", r"rows.txt: unsupported file type '.txt'"),
    ],
)
def test_unreadable_sources_fail_with_one_line_naming_the_file(tmp_path, name, content, message):
    path = tmp_path / name
    if content == "DIR":
        path.mkdir()
    elif isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        path.write_text(content)
    with pytest.raises(DataSourceError, match=message) as err:
        load_split(DataConfig(source=str(path)))
    assert f"data.source={path}" in str(err.value) and "\n" not in str(err.value)


def test_json_array_and_jsonl_read_the_same_rows(tmp_path):
    rows = [GOOD, {**GOOD, "question": "What is 1 + 1?", "answer": "2"}]
    array = tmp_path / "rows.json"
    array.write_text(json.dumps(rows, indent=2))
    lines = _write_jsonl(tmp_path / "rows.jsonl", rows)
    for path in (array, lines):
        assert load_split(DataConfig(source=str(path), eval_fraction=0)) == rows


def test_custom_data_without_a_source_says_what_to_set():
    expected = "data=custom needs data.source=<path to .jsonl/.json/.parquet/.csv or a hub id>"
    values = OmegaConf.to_container(compose("demo_tiny", ["data=custom"]).data, resolve=True)
    assert values["source"] == "???"
    for source in ("???", ""):
        with pytest.raises(DataConfigError) as err:
            DataConfig(**{**values, "source": source})
        assert str(err.value) == expected


def test_config_errors_name_the_key():
    for kwargs, message in [
        ({"on_bad_row": "ignore"}, "data.on_bad_row must be 'error' or 'skip', got 'ignore'"),
        ({"on_long_row": "cut"}, "data.on_long_row must be 'error' or 'skip', got 'cut'"),
        ({"row_format": "sharegpt"}, "data.row_format must be one of ['columns', 'stratos'], got 'sharegpt'"),
        ({"row_format": "stratos"}, "data.row_format=stratos applies to files and hub datasets, not to the built-in"),
        ({"eval_fraction": 1.0}, "data.eval_fraction must be in [0, 1), got 1.0"),
        ({"eval_rows": -1}, "data.eval_rows must be >= 0 or null"),
        ({"max_rows": 0}, "data.max_rows must be >= 1 or null, got 0"),
        ({"embedded_rows": 0}, "data.embedded_rows must be >= 1 with data.source=embedded, got 0"),
    ]:
        with pytest.raises(DataConfigError) as err:
            DataConfig(**kwargs)
        assert str(err.value).startswith(message)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_unreachable_hub_fails_fast_with_one_line(monkeypatch):
    # An endpoint whose port refuses connections: the same answer as no network, without touching the network.
    monkeypatch.setattr(hub_constants, "ENDPOINT", f"http://127.0.0.1:{_closed_port()}")
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)
    for proxy in ("https_proxy", "HTTPS_PROXY"):
        monkeypatch.delenv(proxy, raising=False)
    start = time.monotonic()
    with pytest.raises(DataSourceError) as err:
        load_split(DataConfig(source="made-up-owner/made-up-dataset"))
    assert time.monotonic() - start < data_sources.HUB_CONNECT_TIMEOUT_S + 1
    message = str(err.value)
    assert message.startswith("data.source=made-up-owner/made-up-dataset: could not load the dataset from the hub "
                              "(cannot reach 127.0.0.1:")
    assert "a local .jsonl/.json/.parquet/.csv file works offline" in message and "\n" not in message


def test_connection_lost_after_the_reachability_check_is_one_line(monkeypatch):
    def lose_connection(*args, **kwargs):
        raise httpx.ConnectError("[Errno 104] Connection reset by peer")

    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(data_sources, "hub_unreachable_reason", lambda: None)
    monkeypatch.setattr(datasets, "load_dataset", lose_connection)
    with pytest.raises(DataSourceError) as err:
        load_split(DataConfig(source="owner/name", split="test"))
    assert str(err.value) == (
        "data.source=owner/name: could not load the dataset from the hub ([Errno 104] Connection reset by peer): "
        "check the id and data.split=test, or use a local .jsonl/.json/.parquet/.csv file, which works offline"
    )


def test_hub_dataset_missing_from_the_offline_cache_fails_with_one_line(monkeypatch):
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    with pytest.raises(DataSourceError) as err:
        load_split(DataConfig(source="made-up-owner/made-up-dataset"))
    assert str(err.value).startswith("data.source=made-up-owner/made-up-dataset: could not load the dataset from "
                                     "the hub in offline mode (HF_HUB_OFFLINE=1)")
    assert "which works offline" in str(err.value) and "\n" not in str(err.value)


# ---- prompt budget and rows per step ----------------------------------------------------------------------


def test_rows_over_the_prompt_budget_error_or_skip(tmp_path, tokenizer):
    long_question = "How many apples are there? " * 100  # 2,700 characters: counted by tokenizing
    rows = [GOOD, {**GOOD, "question": long_question}, {**GOOD, "question": "x" * 60_000}, GOOD]
    path = _write_jsonl(tmp_path / "rows.jsonl", rows)
    [prompt] = render_prompts([rows[1]], tokenizer, PromptFormat())
    tokens = len(tokenizer(prompt)["input_ids"])
    config = DataConfig(source=str(path), eval_fraction=0)
    with pytest.raises(BadRowError) as err:
        prepare_dataset(config, tokenizer, PromptFormat(), max_prompt_tokens=tokens - 1)
    assert str(err.value) == (f"{path}: row 1: the teacher prompt has {tokens:,} tokens, over the {tokens - 1:,}-token "
                              "prompt budget: shorten the row, or set data.on_long_row=skip to drop such rows")
    # At the exact budget row 1 fits; the 60,000-character row is judged on its length alone (no tokenizing).
    start = time.monotonic()
    with pytest.raises(BadRowError, match=r"row 2: the teacher prompt has at least [\d,]+ tokens \(6\d,\d{3} "
                                          r"characters\), over the"):
        prepare_dataset(config, tokenizer, PromptFormat(), max_prompt_tokens=tokens)
    assert time.monotonic() - start < 2
    config.on_long_row = "skip"
    dataset, skipped = prepare_dataset(config, tokenizer, PromptFormat(), max_prompt_tokens=tokens - 1)
    assert skipped == 2 and dataset["question"] == [GOOD["question"], GOOD["question"]]
    dataset, skipped = prepare_dataset(config, tokenizer, PromptFormat(), max_prompt_tokens=10_000_000)
    assert skipped == 0 and len(dataset) == 4


def test_check_enough_rows():
    check_enough_rows(4, 4, "x.jsonl")
    with pytest.raises(NotEnoughRowsError) as err:
        check_enough_rows(3, 4, "x.jsonl", skipped=2)
    assert str(err.value).startswith("data.source=x.jsonl has 3 usable training rows (2 skipped) but one optimizer "
                                     "step needs 4 distinct prompts (trainer.per_device_train_batch_size x ")
    assert isinstance(err.value, UserError)


def test_a_split_without_rows_is_an_error(tmp_path, tokenizer):
    path = _write_jsonl(tmp_path / "rows.jsonl", _rows(5))
    with pytest.raises(NotEnoughRowsError, match=r"no usable eval rows \(0 skipped\): hold questions out with"):
        prepare_dataset(DataConfig(source=str(path), eval_fraction=0), tokenizer, PromptFormat(), split="eval")


# ---- the held-out split -----------------------------------------------------------------------------------


def test_embedded_eval_questions_are_never_trained_on():
    config = DataConfig(source="embedded", embedded_rows=2000)
    train, evaluation = load_split(config, seed=0, split="train"), load_split(config, seed=0, split="eval")
    train_questions = {row["question"] for row in train}
    eval_questions = {row["question"] for row in evaluation}
    # 2,000 rows hold 1,994 distinct questions; 5% of them, rounded down, are held out.
    assert (len(train_questions), len(eval_questions)) == (1994 - 99, 99)
    assert not train_questions & eval_questions and len(train) + len(evaluation) == 2000
    # The answer column is the final number of the solution sentence.
    assert all(row["solution"] == f"The answer is {row['answer']}." for row in train + evaluation)
    assert load_split(config, seed=0, split="eval") == evaluation
    assert {row["question"] for row in load_split(config, seed=1, split="eval")} != eval_questions


def test_split_is_by_question_and_ignores_row_order(tmp_path):
    # 30 questions, each twice with different solutions: a question's rows never straddle the split.
    rows = [{"question": f"q{i}?", "solution": f"s{i}-{k}"} for k in range(2) for i in range(30)]
    path = _write_jsonl(tmp_path / "rows.jsonl", rows)
    shuffled = _write_jsonl(tmp_path / "shuffled.jsonl", rows[::-1])
    config = DataConfig(source=str(path), eval_rows=7)
    evaluation = load_split(config, seed=3, split="eval")
    train = load_split(config, seed=3, split="train")
    assert len(evaluation) == 14 and len(train) == 46
    assert not {r["question"] for r in evaluation} & {r["question"] for r in train}
    held_out = held_out_questions([r["question"] for r in rows], seed=3, count=7)
    assert {r["question"] for r in evaluation} == held_out
    reordered = load_split(DataConfig(source=str(shuffled), eval_rows=7), seed=3, split="eval")
    assert {r["question"] for r in reordered} == held_out
    # Whitespace does not make a new question.
    assert held_out_questions(["a  b", "a b", " a b\n"], seed=0, count=1) == {"a b"}
    # max_rows trims the split after it is taken, so the held-out questions do not move.
    assert load_split(DataConfig(source=str(path), eval_rows=7, max_rows=3), seed=3, split="eval") == evaluation[:3]
    with pytest.raises(DataConfigError, match=r"data.eval_rows=31 but data.source=.*has 30 distinct questions"):
        load_split(DataConfig(source=str(path), eval_rows=31), seed=3)


def test_eval_fraction_rounds_down_and_zero_holds_nothing_out(tmp_path):
    path = _write_jsonl(tmp_path / "rows.jsonl", _rows(100))
    assert len(load_split(DataConfig(source=str(path), eval_fraction=0.29), split="eval")) == 29
    assert len(load_split(DataConfig(source=str(path), eval_fraction=0.019), split="eval")) == 1
    assert len(load_split(DataConfig(source=str(path), eval_fraction=0), split="train")) == 100


def test_max_rows_and_embedded_source(tokenizer):
    dataset, _ = prepare_dataset(DataConfig(source="embedded", embedded_rows=50, max_rows=7), tokenizer,
                                 PromptFormat())
    assert len(dataset) == 7
    assert set(dataset.column_names) == {"prompt", "question", "solution", "answer"}


# ---- presets ----------------------------------------------------------------------------------------------


def _stratos(question, thought, solution):
    answer = (f"<|begin_of_thought|>\n\n{thought}\n\n<|end_of_thought|>\n\n"
              f"<|begin_of_solution|>\n\n{solution}\n\n<|end_of_solution|>")
    return {"system": "Your role as an assistant ...", "conversations": [
        {"from": "user", "value": question}, {"from": "assistant", "value": answer}]}


def test_bespoke_stratos_rows_map_onto_the_columns(tmp_path):
    thought = "First, 2 + 2.\n\nThat is 4."
    rows = [_stratos("What is 2 + 2?", thought, "**Answer:** \\boxed{4}"), _stratos("What is 3 + 3?", "6", "6")]
    broken = _stratos("What is 5 + 5?", "10", "10")
    broken["conversations"][1]["value"] = broken["conversations"][1]["value"].replace("<|end_of_solution|>", "")
    path = _write_jsonl(tmp_path / "stratos.jsonl", [*rows, broken])
    values = OmegaConf.to_container(compose("demo_tiny", ["data=bespoke_stratos"]).data, resolve=True)
    assert values["source"] == "bespokelabs/Bespoke-Stratos-17k"
    config = DataConfig(**{**values, "source": str(path), "on_bad_row": "skip"})
    # As the RLT teacher data: only the thought's leading "\n\n" goes (the teacher prompt ends with it); the
    # student chat rebuilt from the columns is the dataset's assistant turn, character for character.
    assert load_split(config) == [
        {"question": "What is 2 + 2?", "solution": "\n\n**Answer:** \\boxed{4}\n\n",
         "reasoning_trace": thought + "\n\n"},
        {"question": "What is 3 + 3?", "solution": "\n\n6\n\n", "reasoning_trace": "6\n\n"},
    ]
    row = load_split(config)[0]
    assert PromptFormat().student_completion(row["reasoning_trace"], row["solution"]) == \
        rows[0]["conversations"][1]["value"]
    with pytest.raises(BadRowError, match=r"stratos.jsonl: row 2: column 'solution' is missing"):
        load_split(DataConfig(**{**values, "source": str(path)}))


@pytest.fixture(scope="module")
def champ_config():
    values = OmegaConf.to_container(compose("demo_tiny", ["data=champ"]).data, resolve=True)
    return DataConfig(**values)


def test_champ_from_its_pypi_package(champ_config):
    train, evaluation = load_split(champ_config, split="train"), load_split(champ_config, split="eval")
    assert (len(train), len(evaluation)) == (270 - 13, 13)  # 5% of 270 questions, rounded down
    assert not {r["question"] for r in train} & {r["question"] for r in evaluation}
    first = next(row for row in train + evaluation if row["question"].startswith("Let a string consist of digit"))
    assert first == {
        "question": "Let a string consist of digit 1, 2, 3. How many such strings of length 6 have adjacent digit "
                    "differing by less than or equal to 1?",
        "solution": "Final answer: 239",
        "reasoning_trace": first["reasoning_trace"],
        "answer": "239",
    }
    steps = first["reasoning_trace"].split("\n\n")
    assert len(steps) == 6 and steps[0].startswith("Let x_n, y_n, z_n be the number of length-n strings")
    assert steps[-1] == "Thus, in total, there are x_6+y_6+z_6=70+99+70=239 such strings."
    assert all("@@" not in row["question"] + row["reasoning_trace"] + row["answer"] for row in train)


def test_champ_wheel_is_checked_and_download_failures_are_one_line(tmp_path, monkeypatch):
    (tmp_path / "champ-dataset").mkdir()
    (tmp_path / "champ-dataset" / data_sources.CHAMP_WHEEL).write_bytes(b"not the wheel")
    with pytest.raises(DataSourceError, match=r"has sha256 .*, not the pinned aa59df5ae28e...: delete it and run"):
        data_sources.champ_wheel(tmp_path)
    monkeypatch.setattr(data_sources, "CHAMP_REQUIREMENT", "champ-dataset==0.0.0")
    monkeypatch.setattr(data_sources, "CHAMP_WHEEL", "champ_dataset-0.0.0-py3-none-any.whl")
    with pytest.raises(DataSourceError) as err:
        data_sources.champ_wheel(tmp_path)
    assert str(err.value).startswith("data.source=champ: could not download champ-dataset==0.0.0 from PyPI (")
    assert "pip download --no-deps champ-dataset==0.0.0 -d" in str(err.value) and "\n" not in str(err.value)
