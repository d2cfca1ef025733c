"""Runaways stopped early, in one line: a row over a stage's prompt budget in distill and eval; a model folder whose
weights were cut short. Distill's sampling on CPU, a batch of prompts a generate call, reproducible."""

import json
import logging
import shutil
import time

import pytest
import torch
from transformers import AutoTokenizer, Qwen2ForCausalLM

from rlt_mono import cli
from rlt_mono.config import compose
from rlt_mono.data.rows import _prompts_over_budget
from rlt_mono.errors import UserError
from rlt_mono.rewards import TeacherRewardConfig
from rlt_mono.stages.distill import DISTILL_FILE, run_distill
from rlt_mono.stages.eval import ROWS_FILE
from rlt_mono.stages.sampler import SeededSampling, load_stage_models

SHORT = {"question": "What is 4 + 1?", "solution": "4 + 1 = 5. The answer is 5."}
# Under the 65,536 characters every stage refuses on length alone: only the prompt's token budget catches it.
HUGE = {"question": "What is 2 + 3? " + "Think of apples. " * 3500, "solution": "2 + 3 = 5. The answer is 5."}


@pytest.fixture
def huge_rows(tmp_path, tiny_pair):  # the pair built first: its progress bars are not the stage's
    path = tmp_path / "huge.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in (HUGE, SHORT)))
    return path


def _no_model_loads(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a model loaded before the rows were checked against the prompt budget")

    monkeypatch.setattr("rlt_mono.stages.sampler.load_model", refuse)


def _cli(capsys, *argv):
    """``rlt-mono <argv>`` in this process: its exit code, stderr and seconds."""
    start = time.monotonic()
    code = cli.main(list(argv))
    return code, capsys.readouterr().err, time.monotonic() - start


@pytest.mark.parametrize("stage, data, says", [
    ("distill", ["data.eval_fraction=0"],
     "the teacher prompt has at least 2,503 tokens (60,070 characters), over the 1,984-token prompt budget (the "
     "teacher's 2,048-token context less distill.max_new_tokens=64)"),
    ("eval", ["data.eval_rows=2"],
     "the teacher prompt has at least 2,503 tokens (60,070 characters), over the 1,984-token prompt budget (the "
     "teacher's 2,048-token context less eval.max_new_tokens=64)"),
    ("eval", ["data.eval_rows=2", "model.model_name_or_path=null"],
     "the student prompt has at least 2,538 tokens (60,907 characters), over the 1,952-token prompt budget (the "
     "student's 2,048-token context less eval.student_max_new_tokens=96)"),
])
def test_a_row_over_the_prompt_budget_stops_distill_and_eval_in_one_line(tmp_path, monkeypatch, capsys, huge_rows,
                                                                         stage, data, says):
    _no_model_loads(monkeypatch)
    code, err, seconds = _cli(capsys, stage, "size=tiny", "data=custom", f"data.source={huge_rows}",
                              "data.max_rows=2", *data, f"output_dir={tmp_path / 'run'}")
    assert code == 2
    assert err == (f"error: {huge_rows}: row 0: {says}: shorten the row, or set data.on_long_row=skip to drop such "
                   "rows\n")
    assert seconds < 10


def test_distill_and_eval_skip_a_row_over_the_prompt_budget_with_a_warning(tmp_path, capsys, caplog, huge_rows):
    common = ["size=tiny", "data=custom", f"data.source={huge_rows}", "data.max_rows=2", "data.on_long_row=skip"]
    with caplog.at_level(logging.WARNING, logger="rlt_mono.data.rows"):
        code, err, _ = _cli(capsys, "distill", *common, "data.eval_fraction=0", f"output_dir={tmp_path / 'distill'}")
    assert code == 0 and "error" not in err
    assert f"{huge_rows}: skipped 1 train rows whose teacher prompt exceeds 1984 tokens (source rows [0])" in \
        caplog.messages
    written = [json.loads(line) for line in (tmp_path / "distill" / DISTILL_FILE).read_text().splitlines()]
    assert [(row["question"], row["solution"]) for row in written] == [(SHORT["question"], SHORT["solution"])]

    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="rlt_mono.data.rows"):
        code, err, _ = _cli(capsys, "eval", *common, "data.eval_rows=2", "eval.bootstrap_resamples=10",
                            f"output_dir={tmp_path / 'eval'}")
    assert code == 0 and "error" not in err
    assert f"{huge_rows}: skipped 1 eval rows whose teacher prompt exceeds 1984 tokens (source rows [0])" in \
        caplog.messages
    written = [json.loads(line) for line in (tmp_path / "eval" / ROWS_FILE).read_text().splitlines()]
    assert [row["question"] for row in written] == [SHORT["question"]]


# ---- a model folder whose weights were cut short -----------------------------------------------------------------
def _cut_weights(folder):
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])


def test_a_run_final_cut_short_is_one_line_saying_rerun_its_stage(tmp_path, capsys, tiny_pair):
    run = tmp_path / "teacher_rlt"
    shutil.copytree(tiny_pair.teacher_path, run / "final")
    (run / "config.yaml").write_text("stage: teacher_rlt\n")
    _cut_weights(run / "final")
    code, err, _ = _cli(capsys, "distill", "size=tiny", f"model.model_name_or_path={run / 'final'}",
                        f"output_dir={tmp_path / 'distill'}")
    assert code == 2
    assert err.splitlines()[-1] == (
        f"error: model.model_name_or_path={run / 'final'}: its weights cannot be read (Error while deserializing "
        "header: incomplete metadata, file not fully covered), a file cut short or damaged: re-run the teacher_rlt "
        f"stage that saved it (its run folder is {run})")
    assert "Traceback" not in err


def test_the_tiny_pair_cut_short_in_the_cache_is_one_line_saying_delete_it(tmp_path, monkeypatch, tiny_pair):
    cache = tmp_path / "cache"
    pair = cache / tiny_pair.teacher_path.parent.name
    shutil.copytree(tiny_pair.teacher_path.parent, pair)
    _cut_weights(pair / "student")
    monkeypatch.setenv("RLT_MONO_CACHE", str(cache))
    cfg = compose("eval", ["size=tiny", "model.model_name_or_path=null", f"output_dir={tmp_path / 'eval'}"])
    with pytest.raises(UserError) as err:
        load_stage_models(cfg, TeacherRewardConfig(), 0.7, with_teacher=False, left_align_padding=True)
    assert str(err.value) == (
        f"student.model_name_or_path={pair / 'student'}: its weights cannot be read (Error while deserializing "
        f"header: incomplete metadata, file not fully covered), a file cut short or damaged: delete {pair} (rlt_mono "
        "made it in its cache and makes it again on next use)")


# ---- distill's sampling on the transformers backend, a batch of prompts a call -----------------------------------
def test_seeded_sampling_draws_each_row_by_inverse_cdf_from_its_own_stream():
    """Probabilities 0.5, 0.3, 0.2 and top_p=0.6 keep the first two tokens (0.8 of the mass): a row draws u from
    its own generator and takes token 0 when u * 0.8 < 0.5, else token 1; never token 2."""
    scores = torch.tensor([[0.5, 0.3, 0.2]]).log().repeat(3, 1)  # (3, V)
    seeds = [11, 12, 13]
    expected = []
    for seed in seeds:
        u = torch.rand(1, generator=torch.Generator().manual_seed(seed), dtype=torch.float64).item()
        expected.append(0 if u * 0.8 < 0.5 else 1)
    forced = SeededSampling(seeds, temperature=1.0, top_p=0.6)(None, scores)
    assert forced.argmax(-1).tolist() == expected and set(expected) == {0, 1}  # these seeds draw both tokens
    assert (forced == 0).sum().item() == 3 and torch.isinf(forced).sum().item() == 6
    # The same seed beside other rows draws the same token: a row's stream is its own.
    assert SeededSampling([13], 1.0, 0.6)(None, scores[:1]).argmax(-1).tolist() == expected[2:]


def test_distill_samples_a_batch_of_prompts_a_call_and_a_rerun_writes_the_same_lines(tmp_path, monkeypatch, tiny_pair):
    calls = []
    generate = Qwen2ForCausalLM.generate

    def counting(self, *args, **kwargs):
        calls.append(kwargs["input_ids"].shape[0])
        return generate(self, *args, **kwargs)

    monkeypatch.setattr(Qwen2ForCausalLM, "generate", counting)
    overrides = ["size=tiny", "distill.selection=all", "distill.rows_per_batch=4"]  # 8 rows, 2 samples each
    for name in ("a", "b"):
        run_distill(compose("distill", [*overrides, f"output_dir={tmp_path / name}"]))
    assert calls == [8, 8, 8, 8]  # per run: two calls of 4 prompts x 2 samples, not one call per prompt
    first, again = ((tmp_path / name / DISTILL_FILE).read_text() for name in ("a", "b"))
    assert first == again
    lines = [json.loads(line) for line in first.splitlines()]
    assert len(lines) == 16 and len({line["explanation"] for line in lines}) > 8  # samples of a prompt differ


def test_a_row_counted_in_tokens_over_the_tokenizer_maximum_leaves_no_transformers_line(tiny_pair, caplog):
    """A prompt whose length in characters cannot settle the budget is tokenized; one over the tokenizer's
    ``model_max_length`` made transformers log its own "Token indices sequence length" line before rlt_mono's."""
    tokenizer = AutoTokenizer.from_pretrained(tiny_pair.student_path, model_max_length=8)
    prompt = "What is 2 + 3? Think of apples and pears. " * 2
    with caplog.at_level(logging.WARNING):
        over = _prompts_over_budget([prompt], tokenizer, 12)
    assert list(over) == [0] and over[0].endswith(" tokens") and not over[0].startswith("at least")
    assert not [r for r in caplog.records if "Token indices" in r.getMessage()], caplog.text
