"""GSM-Symbolic rows (rlt_mono.data.gsm_symbolic) and their two held-out sets (rlt_mono.data.rows), on CPU.

The pinned reasoning-gym wheel is downloaded from PyPI into the rlt_mono cache on first use, like CHAMP's."""

import sys
from dataclasses import replace

import pytest

from rlt_mono.config import default_cache_dir
from rlt_mono.data import gsm_symbolic
from rlt_mono.data.rows import DataConfig, DataConfigError, load_split
from rlt_mono.stages.eval import summarize_records
from rlt_mono.stages.sft import load_sft_rows

HELD_OUT_TEMPLATES = [0, 11, 19, 29, 40, 48, 56, 67, 80, 91]
# cfgs/data/gsm_symbolic.yaml's: every 5th of the 78 templates, the first 15
COMMITTED_HELD_OUT = [0, 8, 13, 18, 23, 30, 38, 43, 48, 53, 58, 66, 71, 81, 88]


@pytest.fixture(scope="module")
def config():
    return DataConfig(source="gsm_symbolic", embedded_rows=0, seed=0, gsm_items_per_template=6, eval_rows=40,
                      heldout_templates=HELD_OUT_TEMPLATES, heldout_template_rows=25)


def _template_of(config: DataConfig) -> dict[str, int]:
    rows = gsm_symbolic.generate_rows(default_cache_dir(), config.gsm_items_per_template, config.seed)
    return {" ".join(row["question"].split()): row["template"] for row in rows}


def test_rows_map_the_gsm8k_solution_onto_the_columns_and_are_deterministic_per_seed(config):
    rows = gsm_symbolic.generate_rows(default_cache_dir(), 2, seed=0)
    assert rows == gsm_symbolic.generate_rows(default_cache_dir(), 2, seed=0)
    again = gsm_symbolic.generate_rows(default_cache_dir(), 3, seed=0)  # more items per template extend fewer
    assert {r["question"] for r in rows} <= {r["question"] for r in again}
    assert {r["question"] for r in rows} != {r["question"] for r in gsm_symbolic.generate_rows(default_cache_dir(),
                                                                                                 2, seed=1)}
    templates = {row["template"] for row in rows}
    assert len(templates) == 78 and not templates & {*gsm_symbolic.NEEDS_FIX, *gsm_symbolic.FLAWED_TEMPLATES}
    for row in rows:
        assert row["solution"] == f"{row['reasoning_trace']}\nThe answer is {row['answer']}."
        assert row["answer"].lstrip("-").isdigit()
        assert "####" not in row["reasoning_trace"] and row["reasoning_trace"].strip() == row["reasoning_trace"]
    # the package's import never ran: its __init__ would import every task family
    assert not [name for name in sys.modules if name.startswith("reasoning_gym")]


def test_an_item_whose_arithmetic_does_not_check_is_dropped():
    item = {"question": "Q?", "answer": "168", "metadata": {"answer_cot": "2 * 84 = 168\n#### 168.0"}}
    assert gsm_symbolic.item_row(item, 5, "answer") == {"question": "Q?", "reasoning_trace": "2 * 84 = 168",
                                                        "solution": "The answer is 168.", "answer": "168",
                                                        "template": 5}
    assert gsm_symbolic.item_row(item, 5)["solution"] == "2 * 84 = 168\nThe answer is 168."
    wrong_final = {**item, "metadata": {"answer_cot": "2 * 84 = 168\n#### 167"}}
    money = {**item, "answer": "12.5", "metadata": {"answer_cot": "25 / 2 = 12.5\n#### 12.5"}}
    no_steps = {**item, "metadata": {"answer_cot": "#### 168"}}
    assert gsm_symbolic.item_row(wrong_final, 5) is None
    assert gsm_symbolic.item_row(money, 5) is None
    assert gsm_symbolic.item_row(no_steps, 5) is None


def test_both_held_out_sets_are_disjoint_from_every_training_row(config):
    template_of = _template_of(config)
    train = load_split(config, seed=7, split="train")
    heldout = load_split(config, seed=7, split="eval")
    train_questions = {" ".join(r["question"].split()) for r in train}
    by_set = {name: [r for r in heldout if r["heldout"] == name] for name in ("instances", "templates")}
    assert len(by_set["instances"]) == 40 and len(by_set["templates"]) == 25
    assert [r["heldout"] for r in heldout[:4]] == ["instances", "templates"] * 2  # any first rows hold both
    assert not train_questions & {" ".join(r["question"].split()) for r in heldout}
    assert not {template_of[q] for q in train_questions} & set(HELD_OUT_TEMPLATES)  # by template
    assert {template_of[" ".join(r["question"].split())] for r in by_set["templates"]} <= set(HELD_OUT_TEMPLATES)
    assert not {template_of[" ".join(r["question"].split())] for r in by_set["instances"]} & set(HELD_OUT_TEMPLATES)
    # the data seed, not the run seed, decides: every study seed trains and evaluates on the same rows
    assert heldout == load_split(config, seed=8, split="eval") and train == load_split(config, seed=8, split="train")
    # a held-out template's rows beyond the 25 sampled are in no split: SFT trains on none of them
    sft_train, sft_heldout, _ = load_sft_rows(config, 7, "teacher_sft", "reasoning_trace")
    assert {" ".join(r["question"].split()) for r in sft_train} == train_questions
    assert len(sft_heldout) == 65 and not {template_of[" ".join(r["question"].split())] for r in sft_train} & set(
        HELD_OUT_TEMPLATES)


def test_held_out_templates_are_refused_for_a_source_without_templates(config):
    with pytest.raises(DataConfigError, match=r"data.heldout_templates holds out whole templates of "
                                              r"data.source=gsm_symbolic; data.source=embedded has none"):
        replace(config, source="embedded", embedded_rows=10)
    for items in (0, 100_000):
        with pytest.raises(DataConfigError, match=rf"data.gsm_items_per_template must be in 1..1000 \(each item is a "
                                                  rf"generator call\), got {items}$"):
            replace(config, gsm_items_per_template=items)


def test_eval_reports_each_held_out_set_apart():
    rows = [{"heldout": "instances", "correct": True, "unparsed": False},
            {"heldout": "instances", "correct": False, "unparsed": True},
            {"heldout": "templates", "correct": False, "unparsed": False},
            {"heldout": "templates", "correct": False, "unparsed": False},
            {"heldout": "templates", "correct": True, "unparsed": False}]
    summary = summarize_records(rows, 0.95, 100, 0)
    assert summary["metrics"]["student/accuracy"]["mean"] == pytest.approx(2 / 5)
    instances, templates = summary["by_heldout"]["instances"], summary["by_heldout"]["templates"]
    assert instances["questions"] == 2 and instances["metrics"]["student/accuracy"]["mean"] == 0.5
    assert instances["metrics"]["student/unparsed_frac"]["mean"] == 0.5
    assert templates["questions"] == 3 and templates["metrics"]["student/accuracy"]["mean"] == pytest.approx(1 / 3)
    assert "by_heldout" not in summarize_records([{"correct": True}], 0.95, 100, 0)


def test_the_tiny_pipeline_runs_on_gsm_symbolic_end_to_end(tmp_path):
    """`./launch_mono.sh cfgs/run_cfg/pipeline_tiny.yaml data=gsm_symbolic`: the data option reaches every stage
    that reads the dataset, distill explains training rows only, and eval reports the held-out set of its rows."""
    import json
    import os
    import subprocess
    from pathlib import Path

    from omegaconf import OmegaConf

    root = tmp_path / "pipeline"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_"))}
    # fewer rows than the committed 100 items per template: the SFT stages score every held-out row on the CPU;
    # no student steps: the tiny random teacher may close its explanation at once, and student SFT then (rightly)
    # finds nothing to train on; what this test checks is where the data goes
    small = ["data.gsm_items_per_template=12", "data.eval_rows=60", "data.heldout_template_rows=60",
             "steps=[teacher_sft,teacher_rlt,distill,eval_teacher]"]
    result = subprocess.run(["./launch_mono.sh", "cfgs/run_cfg/pipeline_tiny.yaml", "data=gsm_symbolic", *small,
                             f"output_dir={root}"], cwd=Path(__file__).parents[1], env=env, capture_output=True,
                            text=True, timeout=600, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    for step in ("1_teacher_sft", "2_teacher_rlt", "3_distill", "5_eval_teacher"):
        data = OmegaConf.load(root / step / "config.yaml").data
        assert data.source == "gsm_symbolic" and list(data.heldout_templates) == COMMITTED_HELD_OUT, step
    config = DataConfig(source="gsm_symbolic", embedded_rows=0, seed=0, eval_rows=60, gsm_items_per_template=12,
                        heldout_templates=COMMITTED_HELD_OUT, heldout_template_rows=60)
    train = {" ".join(r["question"].split()) for r in load_split(config, 0, "train")}
    distilled = [json.loads(line) for line in (root / "3_distill" / "distill.jsonl").open()]
    assert distilled and {" ".join(r["question"].split()) for r in distilled} <= train
    evaluated = json.loads((root / "5_eval_teacher" / "eval.json").read_text())
    assert evaluated["questions"] == 6  # eval at size=tiny: the first 6 held-out rows, 3 of each set
    assert [evaluated["by_heldout"][name]["questions"] for name in ("instances", "templates")] == [3, 3]
    assert "student/unparsed_frac" in evaluated["metrics"]
