"""The SFT stage (rlt_mono.stages.sft) on CPU with the embedded tiny pair: the loss covers exactly what the model
writes, SFT lowers the held-out explanation loss, the final model loads and differs from the start, a run resumes, and
bad inputs stop with one-line errors."""

import dataclasses
import itertools
import json
from dataclasses import replace

import pytest
import torch
import trl
from transformers import AutoModelForCausalLM, AutoTokenizer

from rlt_mono.config import ConfigError, compose, instantiate
from rlt_mono.data.prompts import PromptFormat
from rlt_mono.data.rows import DataConfig, load_split
from rlt_mono.errors import UserError
from rlt_mono.runs import checkpoints
from rlt_mono.runs.outputs import EVAL_EVENT, METRICS_FILE, read_metrics
from rlt_mono.stages.sft import (
    SUMMARY_FILE,
    SFTStageConfig,
    build_sft,
    build_sft_dataset,
    end_of_turn_token,
    load_sft_rows,
    run_sft,
)

QUESTION, SOLUTION = "What is 2 + 5?", "The answer is 7."
TRACE = "2 + 5 = 7. The answer is 7."
# TRACE in the tiny tokenizer, checked by hand ("Ġ" is a space, "ĊĊ" is "\n\n"; tags are single tokens). Tokens,
# not ids: the tokenizer is trained on the rendered chats, so a change of the prompts renumbers its vocabulary.
TRACE_TOKENS = ["2", "Ġ+", "Ġ", "5", "Ġ=", "Ġ", "7", ".", "ĠThe", "Ġanswer", "Ġis", "Ġ", "7", "."]
# Few, small steps: the whole file stays fast on a shared 2-core machine.
FAST = ["sft.per_device_train_batch_size=8", "sft.gradient_accumulation_steps=1", "+sft.disable_tqdm=true"]


pytestmark = pytest.mark.usefixtures("one_thread")


def _rows_file(tmp_path, rows):
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def _labelled(example):
    """(prompt ids, ids with a loss) of a prepared example; the loss span must be one block at the end."""
    ids, labels = example["input_ids"], example["labels"]
    start = next(i for i, label in enumerate(labels) if label != -100)
    assert labels[start:] == ids[start:]  # one block, up to the end
    return ids[:start], ids[start:]


def test_teacher_example_has_a_loss_on_exactly_the_explanation_and_end_tags(tmp_path, tiny_pair):
    rows = _rows_file(tmp_path, [{"question": QUESTION, "solution": SOLUTION, "reasoning_trace": TRACE}])
    run = build_sft(compose("teacher_sft", ["size=tiny", f"output_dir={tmp_path / 'run'}", "data=custom",
                                            f"data.source={rows}"]))
    tokenizer = run.trainer.processing_class
    prompt_ids, loss_ids = _labelled(run.trainer.train_dataset[0])
    assert tokenizer.convert_ids_to_tokens(loss_ids) == [*TRACE_TOKENS, "<|end_of_explanation|>", "<|im_end|>"]
    assert tokenizer.convert_ids_to_tokens(prompt_ids[-2:]) == ["<|begin_of_explanation|>", "ĊĊ"]
    # the prompt is exactly the RL stage's: the teacher chat up to the prefilled explanation opening
    rl_prompt = tokenizer.apply_chat_template(PromptFormat().teacher_messages(QUESTION, SOLUTION), tokenize=False,
                                              continue_final_message=True)
    assert prompt_ids == tokenizer(rl_prompt, add_special_tokens=False)["input_ids"]
    assert run.rows == {"train": 1, "heldout": 0, "skipped": 0, "truncated": 0}
    # a max_length that cuts the explanation: the loss keeps its start, and the row is counted as truncated
    cut = build_sft(compose("teacher_sft", ["size=tiny", f"output_dir={tmp_path / 'cut'}", "data=custom",
                                            f"data.source={rows}", f"sft.max_length={len(prompt_ids) + 5}"]))
    cut_prompt_ids, cut_loss_ids = _labelled(cut.trainer.train_dataset[0])
    assert (cut_prompt_ids, tokenizer.convert_ids_to_tokens(cut_loss_ids)) == (prompt_ids, TRACE_TOKENS[:5])
    assert cut.rows["truncated"] == 1


def test_student_example_has_a_loss_on_exactly_the_assistant_turn(tmp_path, tiny_pair):
    distilled = "Add two and five: 7."
    rows = _rows_file(tmp_path, [{"question": QUESTION, "solution": SOLUTION, "reasoning_trace": TRACE,
                                  "explanation": distilled}])
    run = build_sft(compose("student_sft", ["size=tiny", f"output_dir={tmp_path / 'run'}", "data=custom",
                                            f"data.source={rows}", "sft.explanation_column=explanation"]))
    tokenizer = run.trainer.processing_class
    prompt_ids, loss_ids = _labelled(run.trainer.train_dataset[0])
    prompt_format = PromptFormat()
    turn = prompt_format.student_completion(distilled, SOLUTION) + "<|im_end|>"
    assert loss_ids == tokenizer(turn, add_special_tokens=False)["input_ids"]
    tokens = tokenizer.convert_ids_to_tokens(loss_ids)
    assert (tokens[0], tokens[-2:]) == ("<|begin_of_thought|>", ["<|end_of_solution|>", "<|im_end|>"])
    assert tokenizer.decode(prompt_ids) == tokenizer.apply_chat_template(
        prompt_format.student_messages(QUESTION, distilled, SOLUTION)[:-1], tokenize=False, add_generation_prompt=True)
    assert tokenizer.decode(prompt_ids).endswith("<|im_start|>assistant\n")


def test_teacher_sft_lowers_the_heldout_loss_writes_a_loadable_model_and_resumes(tmp_path, tiny_pair):
    out = tmp_path / "run"
    # The tiny teacher is already warmed up on this very format (tiny_models.py), so a few steps barely move it;
    # the tiny student has never seen the teacher chat: it starts where a real warm-up does.
    overrides = [f"output_dir={out}", "model.model_name_or_path=embedded:student", "data.embedded_rows=96",
                 "data.eval_rows=32", "sft.learning_rate=3e-3", "sft.save_steps=4", *FAST]
    run_sft(compose("teacher_sft", ["size=tiny", *overrides, "sft.max_steps=4"]))

    summary = json.loads((out / SUMMARY_FILE).read_text())
    assert summary["steps"] == 4 and summary["rows"] == {"train": 64, "heldout": 32, "skipped": 0, "truncated": 0}
    assert summary["heldout_loss_after"] < summary["heldout_loss_before"] - 0.1
    evals = read_metrics(out / METRICS_FILE, EVAL_EVENT)  # held-out losses are "eval" rows
    assert [(row["step"], row["eval_loss"]) for row in evals] == [
        (0, summary["heldout_loss_before"]), (4, summary["heldout_loss_after"])]
    assert [row["step"] for row in read_metrics(out / METRICS_FILE) if "loss" in row] == [1, 2, 3, 4]

    start = AutoModelForCausalLM.from_pretrained(tiny_pair.student_path)
    final = AutoModelForCausalLM.from_pretrained(out / "final")
    assert AutoTokenizer.from_pretrained(out / "final").eos_token == "<|im_end|>"
    start_weights = dict(start.named_parameters())
    assert all(not torch.equal(p, start_weights[n]) for n, p in final.named_parameters())

    # resume from the step-4 checkpoint up to step 6: each step is logged once, the "before" loss is the first start's
    # (the checkpoint's history stripped of it, as an earlier rlt_mono's was: read back from metrics.jsonl)
    state_file = out / "checkpoint-4" / "trainer_state.json"
    state = json.loads(state_file.read_text())
    state["log_history"] = [row for row in state["log_history"] if row.get("step") != 0]
    state_file.write_text(json.dumps(state))
    (state_file.parent / checkpoints.MANIFEST).unlink()
    checkpoints.write_manifest(state_file.parent, 4)  # the checkpoint stays verified
    run_sft(compose("teacher_sft", ["size=tiny", *overrides, "sft.max_steps=6", "resume_from_checkpoint=true"]))
    resumed = json.loads((out / SUMMARY_FILE).read_text())
    assert resumed["steps"] == 6 and resumed["heldout_loss_before"] == summary["heldout_loss_before"]
    assert [row["step"] for row in read_metrics(out / METRICS_FILE) if "loss" in row] == [1, 2, 3, 4, 5, 6]
    assert [row["step"] for row in read_metrics(out / METRICS_FILE, EVAL_EVENT)] == [0, 4, 6]


def test_rows_are_split_by_question_like_data_py_and_keep_the_explanation_column(tmp_path):
    # distill rows with selection "all": two explanations per question
    rows = [{"question": f"Q{q}?", "solution": f"S{q}", "explanation": f"E{q}.{k}", "total": 0.5}
            for q in range(5) for k in range(2)]
    data_config = DataConfig(source=str(_rows_file(tmp_path, rows)), eval_rows=2)
    train, heldout, skipped = load_sft_rows(data_config, 0, "student_sft", "explanation")
    eval_questions = {row["question"] for row in load_split(data_config, 0, "eval")}
    assert {row["question"] for row in heldout} == eval_questions and len(eval_questions) == 2
    assert not eval_questions & {row["question"] for row in train}
    assert sorted(row["explanation"] for row in train + heldout) == sorted(row["explanation"] for row in rows)
    assert all(row["explanation"][1] == row["question"][1] for row in train + heldout) and skipped == 0
    # data.max_rows caps each split with a seeded sample, never moves a question across
    capped, capped_heldout, _ = load_sft_rows(replace(data_config, max_rows=1), 0, "student_sft", "explanation")
    assert len(capped) == len(capped_heldout) == 1 and capped[0] in train and capped_heldout[0] in heldout
    assert load_sft_rows(replace(data_config, max_rows=1), 0, "student_sft", "explanation")[0] == capped


def test_bad_inputs_stop_with_one_line_errors(tmp_path, tiny_pair):
    no_trace = _rows_file(tmp_path, [{"question": QUESTION, "solution": SOLUTION}])
    cases = [
        (compose("teacher_sft", ["size=tiny", "data=custom", f"data.source={no_trace}"]),
         r"teacher_sft trains on column 'reasoning_trace', which data.source=.* does not have .*"
         r"set sft.explanation_column"),
        (compose("student_sft", ["size=tiny", "data=custom", f"data.source={no_trace}",
                                 "sft.explanation_column=solutoin"]),
         "student_sft trains on column 'solutoin'"),
        (compose("student_sft", []), r"data.source must be set"),
        (compose("teacher_sft", ["size=tiny", "+sft.max_stepz=3"]),
         r"unknown key sft.max_stepz: did you mean sft.max_steps"),
        (compose("teacher_sft", ["size=tiny", "stage=teacher_stf"]),
         "stage='teacher_stf': rlt_mono.stages.sft runs student_sft or teacher_sft"),
    ]
    empty = _rows_file(tmp_path, [{"question": QUESTION, "solution": SOLUTION, "explanation": "x"},
                                  {"question": QUESTION, "solution": SOLUTION, "explanation": " "}])
    cases.append((compose("student_sft", ["size=tiny", "data=custom", f"data.source={empty}",
                                          "sft.explanation_column=explanation"]),
                  r"rows.jsonl: row 1: column 'explanation' is empty \(fix the row, or set data.on_bad_row=skip"))
    for index, (cfg, message) in enumerate(cases):
        cfg.output_dir = str(tmp_path / f"run{index}")
        with pytest.raises(UserError, match=message) as caught:
            build_sft(cfg)
        assert "\n" not in str(caught.value)
    assert issubclass(ConfigError, UserError)


def test_end_of_turn_token_comes_from_the_chat_template(tokenizer):
    assert end_of_turn_token(tokenizer, "model.model_name_or_path") == "<|im_end|>"
    plain = tokenizer.__class__.from_pretrained(tokenizer.name_or_path)
    plain.chat_template = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    assert end_of_turn_token(plain, "model.model_name_or_path") is None  # TRL appends the tokenizer's eos
    plain.chat_template = "{% for m in messages %}{{ m['content'] }} END OF TURN{% endfor %}"
    with pytest.raises(UserError, match=r"closes an assistant turn with 'END OF TURN', which is not one token"):
        end_of_turn_token(plain, "model.model_name_or_path")


def test_sft_configs_have_rlt_warmup_settings_and_instantiate(tmp_path):
    assert {f.name for f in dataclasses.fields(SFTStageConfig)} - {f.name for f in dataclasses.fields(trl.SFTConfig)} \
        == {"explanation_column", "early_stopping_patience", "diversity_prompts", "diversity_samples",
            "diversity_temperature", "diversity_max_new_tokens"}
    for name, size in itertools.product(("teacher_sft", "student_sft"), ("tiny", "full")):
        cfg = compose(name, [f"size={size}", f"output_dir={tmp_path}"])
        assert (cfg.stage, cfg.output_dir, cfg.resume_from_checkpoint) == (name, str(tmp_path), None)
        sft = dict(cfg.sft, output_dir=str(tmp_path), bf16=False, use_cpu=True, optim="adamw_torch")  # CPU-checkable
        args = instantiate(SFTStageConfig, sft, "sft")
        assert args.completion_only_loss is True and args.eos_token is None
    gpu = compose("teacher_sft").sft
    assert (gpu.learning_rate, gpu.lr_scheduler_type, gpu.warmup_steps, gpu.adam_beta2, gpu.weight_decay,
            gpu.num_train_epochs) == (1e-5, "cosine", 0.05, 0.95, 1e-4, 10)
    assert gpu.per_device_train_batch_size * gpu.gradient_accumulation_steps == 16
    assert gpu.bf16 and gpu.gradient_checkpointing
    assert compose("student_sft").sft.explanation_column == "explanation"
    assert compose("teacher_sft").model.dtype == "float32"


def test_the_prompt_ids_are_the_rl_prompt_even_where_bpe_would_merge_across_the_boundary():
    # The teacher prompt ends with "\n\n"; with Qwen2's BPE an explanation starting with a newline merges with it
    # into one "\n\n\n" token if the joined text is encoded, and the model would train on a context RL never
    # shows it. The prompt and the completion are encoded apart.
    from qwen2_tokenizer import qwen2_tokenizer

    tokenizer = qwen2_tokenizer()
    explanation = "\nAdd the apples: 3 + 5 = 8."
    rows = [{"question": QUESTION, "solution": SOLUTION, "reasoning_trace": explanation}]
    example = build_sft_dataset(rows, tokenizer, "teacher_sft", "reasoning_trace", "<|im_end|>")[0]
    prompt = tokenizer.apply_chat_template(PromptFormat().teacher_messages(QUESTION, SOLUTION), tokenize=False,
                                           continue_final_message=True)
    prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    completion_ids = tokenizer(explanation + PromptFormat().explanation_end, add_special_tokens=False)["input_ids"]
    assert example["input_ids"] == [*prompt_ids, *completion_ids, tokenizer.convert_tokens_to_ids("<|im_end|>")]
    assert example["completion_mask"] == [0] * len(prompt_ids) + [1] * (len(completion_ids) + 1)
    joined = tokenizer(prompt + explanation, add_special_tokens=False)["input_ids"]
    assert joined[: len(prompt_ids)] != prompt_ids  # encoding the joined text would indeed have merged
