"""Inputs a user can fix: each ends in one line saying what to set, before any model loads
where it can; options a stage ignores are refused or warned about."""

import importlib.util
import json
import logging

import pytest

from rlt_mono import cli
from rlt_mono.config import ConfigError, compose
from rlt_mono.data.models import resolve_model_path
from rlt_mono.data.rows import DataConfig
from rlt_mono.errors import UserError
from rlt_mono.rl.lora import lora_rank
from rlt_mono.stages.sft import _usable_rows, build_sft


@pytest.mark.parametrize("override, says", [
    ("sft.learning_rate=-1", "sft: learning_rate must be >= 0, got -1"),
    ("sft.per_device_train_batch_size=-2", "sft: per_device_train_batch_size must be >= 1, got -2"),
    ("sft.gradient_accumulation_steps=0", "sft: gradient_accumulation_steps must be >= 1, got 0"),
    ("sft.max_steps=0", "sft: max_steps must be >= 1 (or -1: train sft.num_train_epochs), got 0"),
    ("model.lora_r=4", "model.lora_r=4: teacher_sft trains every weight (LoRA adapters are teacher_rlt's option): "
                       "set model.lora_r=0"),
])
def test_sft_options_are_refused_in_one_line(tmp_path, override, says):
    with pytest.raises(ConfigError) as err:
        build_sft(compose("teacher_sft", ["size=tiny", f"output_dir={tmp_path / 'run'}", override]))
    assert str(err.value) == says


def test_every_row_longer_than_max_length_says_raise_it_before_the_model_loads(tmp_path, monkeypatch):
    def no_model_load(*args, **kwargs):
        raise AssertionError("the model loaded before the rows were checked")

    monkeypatch.setattr("rlt_mono.stages.sft.load_model", no_model_load)
    cfg = compose("teacher_sft", ["size=tiny", f"output_dir={tmp_path / 'run'}", "sft.max_length=4", "data.max_rows=8"])
    with pytest.raises(UserError, match=r"^every one of the 8 train rows is longer than sft.max_length=4 tokens "
                                          r"before its completion starts: raise sft.max_length$"):
        build_sft(cfg)


def test_a_null_model_or_a_run_folder_for_its_final(tmp_path):
    with pytest.raises(ConfigError) as err:
        resolve_model_path(None, 0, "student.model_name_or_path")
    assert str(err.value) == ("student.model_name_or_path=null: this stage loads that model: set "
                              "student.model_name_or_path=<a model folder or hub id>")
    run = tmp_path / "teacher_sft"
    (run / "final").mkdir(parents=True)
    (run / "final" / "config.json").write_text("{}")
    (run / "config.yaml").write_text("stage: teacher_sft\n")
    with pytest.raises(ConfigError) as err:
        resolve_model_path(str(run), 0)
    assert str(err.value) == (f"model.model_name_or_path={run}: a run folder, not a model; its trained model is in "
                              f"final/: set model.model_name_or_path={run / 'final'}")
    assert resolve_model_path(str(run / "final"), 0) == str(run / "final")


def test_lora_on_lm_head_is_refused():
    with pytest.raises(ConfigError) as err:
        lora_rank({**compose("demo_tiny").model, "lora_r": 4, "lora_target_modules": ["lm_head"]})
    assert str(err.value) == ("model.lora_target_modules=['lm_head']: lm_head cannot carry an adapter (TRL reads its "
                              "weight directly for the log-probs): remove lm_head, e.g. [q_proj,v_proj]")


def test_distilled_rows_trained_on_reasoning_trace_are_warned_about(tmp_path, caplog):
    source = tmp_path / "distill.jsonl"
    rows = [{"question": "1+1?", "solution": "The answer is 2", "reasoning_trace": "r", "explanation": "e"}]
    source.write_text(json.dumps(rows[0]) + "\n")
    with caplog.at_level(logging.WARNING, logger="rlt_mono.stages.sft"):
        kept, _ = _usable_rows(rows, DataConfig(source=str(source)), "student_sft", "reasoning_trace")
    assert len(kept) == 1
    assert [r.getMessage() for r in caplog.records] == [
        f"data.source={source} has an explanation column (rows written by distill) but student_sft trains on "
        "'reasoning_trace': set sft.explanation_column=explanation to train on the teacher's explanations"]


def test_a_row_of_a_megabyte_is_dropped_or_cut_without_tokenizing_it(tokenizer, caplog):
    """A runaway: a 1 MB question in a row used to be tokenized for minutes. Its prompt is certainly over
    max_length tokens (more characters than max_length times the longest vocabulary entry): dropped, counted; a
    1 MB explanation is cut to that bound before tokenizing."""
    from rlt_mono.stages.sft import build_sft_dataset

    normal = {"question": "What is 2 + 3?", "solution": "The answer is 5.", "reasoning_trace": "2 + 3 = 5."}
    huge_question = {**normal, "question": "How many? " * 100_000}
    huge_trace = {**normal, "reasoning_trace": "1 + 1 = 2. " * 100_000}
    with caplog.at_level(logging.WARNING, logger="rlt_mono.stages.sft"):
        dataset = build_sft_dataset([normal, huge_question, huge_trace], tokenizer, "teacher_sft", "reasoning_trace",
                                    max_length=64)
    assert len(dataset) == 2
    longest = max(len(token) for token in tokenizer.get_vocab())
    assert len(dataset[1]["input_ids"]) <= 64 * longest + 200  # the cut explanation, not a megabyte of tokens
    assert any("dropped 1 of 3 rows whose prompt alone is over sft.max_length=64 tokens" in r.getMessage()
               for r in caplog.records)


@pytest.mark.parametrize(("flags", "says"), [
    (["--gpu-gib", "nan"], "error: --gpu-gib nan: give the card's total memory in GiB, a number above 0 (e.g. 80)"),
    (["--gpu-gib", "0"], "error: --gpu-gib 0.0: give the card's total memory in GiB, a number above 0 (e.g. 80)"),
    (["--gpu-gib", "80", "--free-gib", "120"],
     "error: --free-gib 120.0: the memory free for the run must be above 0 and at most the card's --gpu-gib 80.0"),
    (["--gpu-gib", "80", "--free-gib", "inf"],
     "error: --free-gib inf: the memory free for the run must be above 0 and at most the card's --gpu-gib 80.0"),
    (["--gpu-gib", "80", "--prompt-length", "0"], "error: --prompt-length 0: the longest prompt must be at least 1 "
                                                  "token"),
])
def test_the_planner_cli_refuses_impossible_sizes_in_one_line(flags, says, capsys):
    from rlt_mono.memory.planner import main

    assert main(["demo_tiny", *flags]) == 2
    assert capsys.readouterr().err == says + "\n"


@pytest.mark.parametrize("config, override, says", [
    ("distill", "model.lora_r=4", "model.lora_r=4: distill trains nothing (LoRA adapters are teacher_rlt's "
                                  "option): set model.lora_r=0"),
    ("demo_tiny", "logging=wandb", "logging=wandb needs the wandb package, which is not installed: pip install "
                                   "wandb (or choose logging=local)"),
    ("demo_tiny", "trainer.max_steps=1", "RLT_MONO_CACHE={tmp}/afile is a file, not a folder: point it at a folder "
                                         "(or unset it for ~/.cache/rlt_mono)"),
])
def test_run_level_mistakes_end_in_one_line_before_any_model_loads(tmp_path, monkeypatch, config, override, says):
    cfg = compose(config, ["size=tiny", f"output_dir={tmp_path / 'run'}", override])  # the tiny pair on CPU
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb"
                        else real_find_spec(name, *a))  # as on a machine without wandb
    if "RLT_MONO_CACHE" in says:
        (tmp_path / "afile").write_text("x")
        monkeypatch.setenv("RLT_MONO_CACHE", str(tmp_path / "afile"))
    with pytest.raises(UserError) as err:
        cli.check_run_keys(cfg)
    assert str(err.value) == says.replace("{tmp}", str(tmp_path))


@pytest.mark.parametrize(("stage", "overrides", "warning"), [
    ("distill", ["model.lora_target_modules=[q_proj]"],
     "model.lora_target_modules=['q_proj'] is ignored: distill trains nothing"),
    ("eval", ["model.lora_alpha=8"], "model.lora_alpha=8 is ignored: eval trains nothing"),
    ("demo_tiny", ["model.lora_dropout=0.1"],
     "model.lora_dropout=0.1 is ignored: model.lora_r=0 trains every weight, no adapters (set model.lora_r to train "
     "adapters)"),
    ("demo_tiny", ["model.lora_r=4", "model.lora_dropout=0.1"], None),  # adapters trained: the option is read
    ("teacher_sft", ["model.lora_dropout=0.1"],
     "model.lora_dropout=0.1 is ignored: teacher_sft trains every weight of model (LoRA adapters are teacher_rlt's "
     "option)"),
])
def test_an_adapter_option_where_no_adapter_trains_is_a_warning_naming_it(stage, overrides, warning, caplog):
    cfg = compose(stage, ["size=tiny", *overrides] if stage != "demo_tiny" else overrides)
    with caplog.at_level(logging.WARNING, logger="rlt_mono"):
        cli.check_run_keys(cfg, overrides)
    assert [r.getMessage() for r in caplog.records if "lora" in r.getMessage()] == ([warning] if warning else [])
