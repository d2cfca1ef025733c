"""bench/peer_trl_rlt.py on CPU: the plain TRL reward function a user would write computes rlt_mono's reward (same
values on a scored batch of the embedded pair, same token alignment on a real Qwen2 tokenizer), and ``--pairs`` runs
both sides on the same settings and writes their step times and ratio."""

import ast
import importlib.util
import json
from pathlib import Path

import pytest
from omegaconf import OmegaConf
from qwen2_tokenizer import qwen2_tokenizer

from rlt_mono import build_trainer, compose, release_trainer
from rlt_mono.data.prompts import PromptFormat, end_tag
from rlt_mono.rewards.alignment import align_samples

ROOT = Path(__file__).resolve().parent.parent
PEER = ROOT / "bench" / "peer_trl_rlt.py"

spec = importlib.util.spec_from_file_location("peer_trl_rlt", PEER)
peer = importlib.util.module_from_spec(spec)
spec.loader.exec_module(peer)

END = end_tag("explanation")
# Four completions per step, short: a scored batch in seconds.
TINY = ["trainer.per_device_train_batch_size=4", "trainer.gradient_accumulation_steps=1",
        "trainer.steps_per_generation=1", "trainer.plot_metrics=false"]


def test_peer_reward_equals_rlt_mono_reward_on_a_scored_batch(tmp_path):
    cfg = compose("demo_tiny", [f"output_dir={tmp_path / 'rlt'}", "trainer.max_steps=1",
                                "trainer.max_completion_length=48", *TINY])
    trainer = build_trainer(cfg)
    scored = {}
    reward = trainer.reward_funcs[0]

    def recording(**batch):  # the batch TRL hands the reward in a training step
        scored.update(batch)
        return reward(**batch)

    trainer.reward_funcs[0] = recording
    trainer.train()
    tokenizer = reward.tokenizer
    batch = {key: list(scored[key]) for key in ("prompts", "completion_ids", "question", "solution")}

    def add(text: str, row: int, eos: bool = True) -> None:  # a hand-made completion for a training row
        example = trainer.train_dataset[row]
        batch["completion_ids"].append(tokenizer(text, add_special_tokens=False)["input_ids"]
                                       + [tokenizer.eos_token_id] * eos)
        for key, column in (("prompts", "prompt"), ("question", "question"), ("solution", "solution")):
            batch[key].append(example[column])

    add("2 * 5 = 10. So 10 pens." + END, row=0)
    add("and then it goes on", row=4)  # never closed: the match penalty
    add(END, row=5)  # an empty explanation: both reductions' penalties
    add(" starts with a space" + END + " and text after the tag", row=6)
    add("\n3 * 4 = 12\n" + END, row=7, eos=False)
    expected = reward(**batch, completions=[tokenizer.decode(ids) for ids in batch["completion_ids"]])
    flags = reward.last_scores

    tokenizer, _, student, stop_ids = peer.load_peer_models(cfg, "cpu")  # the peer's own student
    rlt_reward = peer.make_rlt_reward(trainer.model, student, tokenizer, OmegaConf.to_container(cfg.reward),
                                      cfg.trainer.temperature, stop_ids)
    got = rlt_reward(**batch, completions=None)
    release_trainer(trainer)

    assert len(got) == len(expected) == 9
    assert got == pytest.approx(expected, abs=1e-4)
    assert [s["unmatched"] for s in flags[-5:]] == [False, True, False, False, False]
    assert flags[-3]["explanation_tokens"] == 0
    assert len({round(value, 3) for value in expected}) > 5  # distinct completions, distinct rewards


QUESTION = "Tom has 3 bags of 4 apples. How many apples?"
SOLUTION = "The answer is 12."


def _qwen_cases(tokenizer):
    def enc(text):
        return tokenizer(text, add_special_tokens=False)["input_ids"]

    cut = enc("so 🦜")[:-1]  # the parrot's last byte is not generated
    return [
        (SOLUTION, enc("3 * 4 = 12." + END) + [tokenizer.eos_token_id]),  # ".<" straddles the tag: trimmed
        (SOLUTION, enc("\n3 * 4 = 12" + END)),  # ">\n\n" + "\n" merge at the start: noncanonical
        (SOLUTION, enc("x.") + enc(END)),  # "." + "<|end_of_thought|>" is ".<" in the chat: noncanonical
        ("\n\nThe answer is 12.\n\n", enc("So 12.\n\n" + END)),  # a Bespoke-Stratos solution: ">\n\n" not scored
        (SOLUTION, [enc("t")[0], enc("he")[0]] + enc(" apples" + END)),  # ids the tokenizer would not give
        (SOLUTION, enc("naïve 😀 ∑ = 12" + END)),
        (SOLUTION, cut),
        (SOLUTION, cut + enc(" next" + END)),
        (SOLUTION, enc(END) + [tokenizer.eos_token_id]),
        (SOLUTION, enc("unfinished") + [tokenizer.eos_token_id, tokenizer.pad_token_id]),
    ]


def test_peer_alignment_equals_rlt_mono_on_a_qwen2_tokenizer():
    tokenizer = qwen2_tokenizer()
    stop_ids = {tokenizer.eos_token_id, tokenizer.pad_token_id}
    cases = _qwen_cases(tokenizer)
    samples = align_samples(tokenizer, PromptFormat(), [QUESTION] * len(cases), [s for s, _ in cases],
                            [ids for _, ids in cases], stop_ids)
    for (solution, ids), sample in zip(cases, samples, strict=True):
        explanation_ids, text, matched = peer.split_completion(tokenizer, ids, stop_ids)
        student_ids, explanation_span, solution_span = peer.student_chat(tokenizer, QUESTION, solution,
                                                                         explanation_ids, text)
        assert (student_ids, explanation_span, solution_span, matched) == (
            sample.student_ids, sample.explanation_span, sample.solution_span, sample.matched), tokenizer.decode(ids)
        assert text == sample.explanation_text
    # the cases reach every path of the alignment but re-tokenisation
    assert samples[0].trimmed and samples[1].noncanonical and samples[2].noncanonical
    assert not samples[-1].matched and samples[-2].explanation_ids == []


def test_pairs_write_both_sides_step_times_and_their_ratio(tmp_path):
    out = tmp_path / "pairs.json"
    argv = ["--config", "demo_tiny", "trainer.max_completion_length=16", *TINY, "--pairs", "1", "--steps", "2",
            "--out", str(out), "--workdir", str(tmp_path / "runs")]
    assert peer.main(argv) == out
    result = json.loads(out.read_text())
    assert result["device"] == "cpu" and result["commit"] and result["command"].endswith(" ".join(argv))
    (pair,) = result["pairs"]
    assert pair["order"] == "rlt,peer"
    assert len(pair["rlt_step_seconds"]) == len(pair["peer_step_seconds"]) == 2
    assert pair["rlt_median_step_s"] == pair["rlt_step_seconds"][1] > 0  # the first step is the warm-up
    assert pair["peer_median_step_s"] == pair["peer_step_seconds"][1] > 0
    assert pair["ratio"] == pytest.approx(pair["peer_median_step_s"] / pair["rlt_median_step_s"])
    assert result["median_ratio"] == pair["ratio"]
    assert result["median_ratio_interval"]["low"] is None  # one pair: no interval
    # Same settings, same seed, the same reward: on a CPU both sides sample and score the same completions.
    assert result["setting_differences"] == []
    assert result["settings"]["rlt"]["max_steps"] == result["settings"]["peer"]["max_steps"] == 2
    assert pair["peer_mean_reward"] == pytest.approx(pair["rlt_mean_reward"], abs=1e-4)


def test_the_documented_gpu_command_parses_and_composes():
    page = (ROOT / "docs" / "PERFORMANCE.md").read_text().split("## The peer a user would write")[1]
    command = page.split("```")[1].replace("\\\n", " ").split()
    assert command[:2] == ["python", "bench/peer_trl_rlt.py"]
    a = peer.build_parser().parse_intermixed_args(command[2:])
    assert (a.config, a.pairs, a.steps) == ("teacher_rlt_mono", 5, 5)
    cfg = compose(a.config, a.overrides)
    assert cfg.memory == "manual" and cfg.trainer.max_completion_length == 1024
    assert cfg.trainer.per_device_train_batch_size * cfg.trainer.gradient_accumulation_steps == 32
    assert dict(cfg.trainer.generation_kwargs) == {"min_tokens": 1024, "ignore_eos": True}


def test_median_interval_brackets_the_median_of_the_pairs():
    ratios = [0.9, 1.1, 1.2, 1.25, 1.4]
    interval = peer.median_interval(ratios)
    assert interval["low"] <= 1.2 <= interval["high"]
    assert 0.9 <= interval["low"] < interval["high"] <= 1.4
    assert peer.median_interval(ratios) == interval  # seeded


def test_a_planned_memory_setting_is_refused_in_one_line(tmp_path, capsys):
    with pytest.raises(SystemExit):
        peer.main(["--config", "demo_tiny", "memory=auto", "--steps", "1", "--out", str(tmp_path / "x.json")])
    assert "set memory=manual" in capsys.readouterr().err
    assert not (tmp_path / "x.json").exists()


def test_the_peer_imports_nothing_of_rlt_mono_reward_or_trainer():
    tree = ast.parse(PEER.read_text())
    rlt_side = next(node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == "run_rlt_mono")
    inside = {id(node) for node in ast.walk(rlt_side)}
    imported = [node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and id(node) not in inside]
    imported += [alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names]
    assert "rlt_mono.data.models" in imported
    assert not [name for name in imported if name.startswith(("rlt_mono.rewards", "rlt_mono.rl"))]
