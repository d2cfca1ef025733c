"""The "Does it teach?" study over seeds (``rlt_mono.study.aggregate``) on hand-made seed folders: two seeds, three
held-out-template and two held-out-instance questions, every figure checked against a hand computation."""

import json
import math
from pathlib import Path

import pytest

from rlt_mono.errors import UserError
from rlt_mono.runs.plots import trailing_mean
from rlt_mono.study.aggregate import (
    AGGREGATE_FILES,
    STEP_FOLDER_NAMES,
    STUDY_FILE,
    STUDY_TABLE_FILE,
    aggregate,
    main,
    seed_of,
)

TEMPLATES, INSTANCES = ("t1", "t2", "t3"), ("i1", "i2")
# arm eval step -> seed -> correctness per question (t1, t2, t3, i1, i2); None: an uncheckable answer
CORRECT = {
    "eval_teacher": {0: [0, 0, 1, 1, 0], 1: [0, 1, 1, 0, 0]},  # the base student (student half)
    "eval_student": {0: [1, 0, 1, 1, 1], 1: [1, 1, None, 1, 0]},  # trained on the RL teacher
    "eval_student_sft_teacher": {0: [0, 0, 1, 1, 0], 1: [1, 0, 0, 0, 1]},
    "eval_sft_teacher": {0: [0, 0, 0, 0, 0]},  # its student half is not an arm
}
# teacher eval step -> seed -> teacher reward ("total") per question; 10_eval_sft_teacher did not run in seed 1
REWARD = {
    "eval_teacher": {0: [-3.0, -2.0, -1.0, -1.0, -1.0], 1: [-1.5, -1.5, -1.5, -0.5, -0.5]},
    "eval_sft_teacher": {0: [-4.0, -4.0, -4.0, -3.0, -3.0]},
}


def _write_jsonl(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def _seed_folders(tmp_path: Path) -> list[Path]:
    """seed 0 named seed0 (no config.yaml), seed 1 named run_b with seed: 1 in its config.yaml and the first seed's
    teacher SFT linked in (as bench/study_gsm.sh does); the raw-traces arm ran in neither."""
    folders = [tmp_path / "seed0", tmp_path / "run_b"]
    folders[1].mkdir(parents=True)
    (folders[1] / "config.yaml").write_text("stage: pipeline\nseed: 1\n")
    for seed, root in enumerate(folders):
        for step in {*CORRECT, *REWARD}:
            if seed not in CORRECT[step]:
                continue
            rows = []
            for i, question in enumerate((*TEMPLATES, *INSTANCES)):
                correct = CORRECT[step][seed][i]
                row = {"question": question, "heldout": "templates" if question in TEMPLATES else "instances",
                       "correct": None if correct is None else bool(correct),
                       # the RL arm's seed-0 answer to t2 had no answer in it
                       "unparsed": None if correct is None else (step, seed, question) == ("eval_student", 0, "t2")}
                if step in REWARD:
                    row.update(total=REWARD[step][seed][i], r_ss=REWARD[step][seed][i] + 1.0, r_kl=1.0)
                rows.append(row)
            folder = root / STEP_FOLDER_NAMES[step]
            _write_jsonl(folder / "eval_rows.jsonl", rows)
            (folder / "eval.json").write_text(json.dumps({"questions": len(rows), "metrics": {}}))
    rl = folders[0] / "2_teacher_rlt" / "metrics.jsonl"
    _write_jsonl(rl, [
        {"event": "eval", "step": 0, "eval_reward": -3.0},
        {"event": "step", "step": 1, "reward": -2.5, "groups/tied_frac": 0.5, "groups/tied_frac_after_refill": 0.25},
        {"event": "step", "step": 2, "reward": -2.0, "groups/tied_frac": 0.75, "groups/tied_frac_after_refill": 0.5},
        {"event": "eval", "step": 2, "eval_reward": -2.0},
        {"event": "step", "step": 3, "reward": -1.5, "groups/tied_frac": 1.0, "groups/tied_frac_after_refill": 0.5},
        {"event": "summary", "step": 3, "train_runtime": 10.0},
    ])
    sft = folders[0] / "1_teacher_sft"
    sft.mkdir()
    (sft / "sft_summary.json").write_text(json.dumps({
        "steps": 40, "heldout_curve": [{"step": 10, "eval_loss": 1.2}, {"step": 20, "eval_loss": 1.1}],
        "diversity": {"distinct_per_prompt": 3.5}, "early_stopping": {"stopped_early": True, "best_step": 20}}))
    (folders[1] / "1_teacher_sft").symlink_to(sft)
    return folders


def _study(tmp_path: Path) -> dict:
    return aggregate(_seed_folders(tmp_path), tmp_path / "out", resamples=200)


def _arm(study: dict, name: str) -> dict:
    return next(arm for arm in study["arms"] if arm["name"] == name)


def test_an_arms_accuracy_pools_each_question_over_the_seeds_that_answered_it(tmp_path):
    study = _study(tmp_path)
    assert study["seeds"] == [0, 1]  # seed0 from its name, run_b from its config.yaml
    templates = _arm(study, "rl_teacher")["held_out_templates"]
    # per question over seeds: t1 (1+1)/2, t2 (0+1)/2, t3 1 (seed 1's answer uncheckable) -> 2.5 / 3
    assert templates["accuracy"] == pytest.approx(2.5 / 3)
    assert templates["per_seed"] == {0: pytest.approx(2 / 3), 1: pytest.approx(1.0)}
    assert templates["seed_spread"] == {"min": pytest.approx(2 / 3), "max": 1.0, "std": pytest.approx(1 / 6)}
    assert templates["questions"] == 3
    assert templates["unparsed_frac"] == pytest.approx((0 + 0.5 + 0) / 3)  # t2 unparsed in seed 0 only
    assert templates["ci95"][0] <= templates["accuracy"] <= templates["ci95"][1]
    instances = _arm(study, "rl_teacher")["held_out_instances"]
    assert instances["accuracy"] == pytest.approx(0.75) and instances["per_seed"] == {0: 1.0, 1: 0.5}
    base = _arm(study, "base")["held_out_templates"]  # the student half of 5_eval_teacher
    assert base["accuracy"] == pytest.approx((0 + 0.5 + 1) / 3) and base["per_seed"] == {0: pytest.approx(1 / 3),
                                                                                         1: pytest.approx(2 / 3)}


def test_paired_differences_average_each_questions_difference_over_seeds(tmp_path):
    differences = _study(tmp_path)["differences"]
    over_base = differences["held_out_templates"]["rl_teacher_minus_base"]
    # seed 0: t1 1-0, t2 0-0, t3 1-1; seed 1: t1 1-0, t2 1-1 (t3 uncheckable for the RL arm) -> t1 1, t2 0, t3 0
    assert over_base["mean"] == pytest.approx(1 / 3) and over_base["questions"] == 3
    assert over_base["per_seed"] == {0: pytest.approx(1 / 3), 1: pytest.approx(0.5)}
    over_sft = differences["held_out_instances"]["rl_teacher_minus_sft_teacher"]
    # seed 0: i1 1-1, i2 1-0; seed 1: i1 1-0, i2 0-1 -> i1 0.5, i2 0
    assert over_sft["mean"] == pytest.approx(0.25)
    assert differences["held_out_templates"]["rl_teacher_minus_raw_traces"] is None  # raw traces never ran


def test_a_missing_arm_is_reported_missing_not_guessed(tmp_path):
    study = _study(tmp_path)
    raw = _arm(study, "raw_traces")
    assert raw["missing"] is True and raw["seeds"] == [] and raw["missing_seeds"] == [0, 1]
    assert raw["held_out_templates"] is None and raw["held_out_instances"] is None
    sft_teacher = next(t for t in study["teachers"] if t["name"] == "sft_teacher")
    assert sft_teacher["seeds"] == [0] and sft_teacher["missing_seeds"] == [1] and sft_teacher["missing"] is False
    assert sft_teacher["held_out_templates"]["reward"]["per_seed"] == {0: -4.0}
    assert study["missing"][1] == ["10_eval_sft_teacher", "12_eval_student_raw_traces", "2_teacher_rlt/metrics.jsonl"]
    assert study["rl"][1] == {"missing": True}
    table = (tmp_path / "out" / STUDY_TABLE_FILE).read_text()
    assert "| raw_traces | the data's reasoning traces | — | — | — | — |" in table
    assert "seed 1: 10_eval_sft_teacher, 12_eval_student_raw_traces, 2_teacher_rlt/metrics.jsonl" in table


def test_the_correlation_pairs_each_teachers_reward_with_its_students_accuracy(tmp_path):
    correlation = _study(tmp_path)["correlation"]
    points = {(p["teacher"], p["seed"], p["held_out"]): (p["teacher_reward"], p["student_accuracy"])
              for p in correlation["points"]}
    expected = {("sft_teacher", 0, "templates"): (-4.0, 1 / 3), ("sft_teacher", 0, "instances"): (-3.0, 0.5),
                ("rl_teacher", 0, "templates"): (-2.0, 2 / 3), ("rl_teacher", 0, "instances"): (-1.0, 1.0),
                ("rl_teacher", 1, "templates"): (-1.5, 1.0), ("rl_teacher", 1, "instances"): (-0.5, 0.5)}
    assert points.keys() == expected.keys()
    assert all(points[key] == pytest.approx(value) for key, value in expected.items())
    xs, ys = [x for x, _ in expected.values()], [y for _, y in expected.values()]
    mean_x, mean_y = sum(xs) / len(xs), sum(ys) / len(ys)
    covariance = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys))
    r = covariance / math.sqrt(sum((x - mean_x) ** 2 for x in xs) * sum((y - mean_y) ** 2 for y in ys))
    assert correlation["pearson"] == pytest.approx(r) and 0 < r < 1


def test_rl_tied_fractions_curves_and_the_shared_teacher_sft(tmp_path):
    study = _study(tmp_path)
    rl = study["rl"][0]
    assert rl["tied_frac_mean"] == pytest.approx(0.75) and rl["tied_frac_after_refill_mean"] == pytest.approx(1.25 / 3)
    assert rl["eval_reward_curve"] == [[0, -3.0], [2, -2.0]] and rl["steps"] == 3
    assert trailing_mean([0.5, 0.75, 1.0], 2) == [0.5, 0.625, 0.875]  # rl_tied_groups.png's smoothing
    sft = study["teacher_sft"]
    assert sft["seeds"] == [0, 1] and sft["steps"] == 40 and "other_runs" not in sft  # one SFT, linked
    assert sft["early_stopping"]["best_step"] == 20 and len(sft["heldout_curve"]) == 2


def test_the_cli_writes_study_json_the_table_and_the_plots(tmp_path):
    out = tmp_path / "out"
    folders = [str(folder) for folder in _seed_folders(tmp_path)]
    assert main(["aggregate", *folders, "--out", str(out), "--command", "bash bench/study_gsm.sh r 0,1",
                 "--command", "python -m rlt_mono.study aggregate", "--device", "one H200"]) == 0
    study = json.loads((out / STUDY_FILE).read_text())
    assert {"arms", "teachers", "differences", "correlation", "rl", "teacher_sft", "commands", "device"} <= set(study)
    assert study["commands"] == ["bash bench/study_gsm.sh r 0,1", "python -m rlt_mono.study aggregate"]
    assert study["device"] == "one H200"
    arm = study["arms"][0]
    assert {"name", "trained_on", "seeds", "held_out_templates", "held_out_instances"} <= set(arm)
    assert {"accuracy", "ci95", "per_seed", "seed_spread", "unparsed_frac", "questions"} == set(
        arm["held_out_templates"])
    assert set(study["differences"]["held_out_templates"]) == {
        "rl_teacher_minus_sft_teacher", "rl_teacher_minus_raw_traces", "sft_teacher_minus_raw_traces",
        "rl_teacher_minus_base"}
    assert study["arms"][3]["held_out_templates"]["per_seed"] == {"0": pytest.approx(2 / 3), "1": 1.0}
    for name in AGGREGATE_FILES.values():
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
    table = (out / STUDY_TABLE_FILE).read_text()
    assert "| rl_teacher | the RL teacher's explanations | 0.833 [" in table
    assert "    bash bench/study_gsm.sh r 0,1" in table


def test_folders_without_a_seed_or_with_the_same_seed_are_refused(tmp_path):
    nameless = tmp_path / "somewhere"
    nameless.mkdir()
    with pytest.raises(UserError, match="no seed"):
        aggregate([nameless], tmp_path / "out")
    twin = tmp_path / "seed7"
    twin.mkdir()
    (nameless / "config.yaml").write_text("seed: 7\n")
    with pytest.raises(UserError, match="another seed"):
        aggregate([nameless, twin], tmp_path / "out")


def test_a_folder_named_after_its_seed_and_a_selection_reads_as_that_seed(tmp_path):
    """bench/study_gsm.sh's seed<N>-<selection> folders: one whose pipeline never ran has no config.yaml."""
    assert seed_of(tmp_path / "seed3-best_correct") == 3
    assert seed_of(tmp_path / "seed12") == 12
    with pytest.raises(UserError, match="no seed"):
        seed_of(tmp_path / "seed3best")
    with pytest.raises(UserError, match="no seed"):
        seed_of(tmp_path / "myseed3")
