"""bench/study_combine.py: the teacher-reward / student-accuracy points and their correlation across runs."""

import importlib.util
from pathlib import Path

import pytest

spec = importlib.util.spec_from_file_location("study_combine", Path(__file__).parents[1] / "bench" / "study_combine.py")
combine = importlib.util.module_from_spec(spec)
spec.loader.exec_module(combine)


def _teacher(label, rewards_by_seed):
    sets = {}
    for held_out, by_seed in rewards_by_seed.items():
        sets[f"held_out_{held_out}"] = {"reward": {"per_seed": by_seed,
                                                   "mean": sum(by_seed.values()) / len(by_seed)}}
    return {"label": label, **sets}


def _arm(label, accuracy_by_seed):
    return {"label": label, **{f"held_out_{h}": {"per_seed": a} for h, a in accuracy_by_seed.items()}}


def test_a_teacher_of_every_seed_gives_a_point_per_seed_and_a_shared_teacher_one_point():
    teachers = [_teacher("sft_teacher", {"templates": {0: -7.0}, "instances": {0: -8.0}}),
                _teacher("rl_teacher", {"templates": {0: -5.0, 1: -6.0}, "instances": {0: -5.5, 1: -6.5}})]
    arms = [_arm("sft_teacher", {"templates": {0: 0.1, 1: 0.2, 2: 0.3}, "instances": {0: 0.2, 1: 0.2, 2: 0.5}}),
            _arm("rl_teacher", {"templates": {0: 0.4, 1: 0.1}, "instances": {0: 0.3, 1: 0.2}}),
            _arm("base", {"templates": {2: 0.05}, "instances": {2: 0.1}})]
    points = combine.teacher_student_points(teachers, arms)
    assert [(p["teacher"], p["held_out"], p["seeds"], p["teacher_reward"], p["student_accuracy"]) for p in points] == [
        ("sft_teacher", "templates", [0, 1, 2], -7.0, pytest.approx(0.2)),
        ("sft_teacher", "instances", [0, 1, 2], -8.0, pytest.approx(0.3)),
        ("rl_teacher", "templates", [0], -5.0, 0.4), ("rl_teacher", "templates", [1], -6.0, 0.1),
        ("rl_teacher", "instances", [0], -5.5, 0.3), ("rl_teacher", "instances", [1], -6.5, 0.2)]
    r = combine.correlation(points)
    # templates: rewards (-7, -5, -6), accuracies (0.2, 0.4, 0.1): deviations (-1, 1, 0) and
    # (-1/30, 1/6, -2/15) -> r = 0.2 / (sqrt(2) * sqrt(0.04667)) = 0.6547.
    assert r["pearson_templates"] == pytest.approx(0.2 / (2 ** 0.5 * (7 / 150) ** 0.5), abs=1e-6)
    assert r["pearson_instances"] is not None and r["pearson"] is not None and len(r["points"]) == 6


def test_a_label_without_its_student_arm_gives_no_point():
    teachers = [_teacher("rl_teacher@150", {"templates": {1: -5.0}, "instances": {1: -6.0}})]
    assert combine.teacher_student_points(teachers, [_arm("rl_teacher", {"templates": {1: 0.2},
                                                                         "instances": {1: 0.2}})]) == []
    assert combine.correlation([])["pearson"] is None


def test_differences_pair_entries_of_the_same_label_only():
    labels = ["base", "sft_teacher", "rl_teacher", "rl_teacher@200", "sft_teacher@best_correct",
              "rl_teacher@best_correct", "raw_traces@best_correct"]
    assert combine.compared_pairs(labels) == [
        ("rl_teacher", "sft_teacher"), ("rl_teacher", "base"), ("sft_teacher", "base"),
        ("rl_teacher@best_correct", "sft_teacher@best_correct"), ("rl_teacher@best_correct", "raw_traces@best_correct"),
        ("sft_teacher@best_correct", "raw_traces@best_correct")]  # rl_teacher@200 has no partner of its label


def _main(monkeypatch, *argv):
    import sys

    monkeypatch.setattr(sys, "argv", ["study_combine.py", *argv])
    combine.main()


def test_each_arm_keeps_the_run_it_was_taken_from(tmp_path, monkeypatch):
    import json

    for run in ("first", "second"):
        (tmp_path / run / "seed0").mkdir(parents=True)  # seed folders whose steps did not run
    out = tmp_path / "study.json"
    _main(monkeypatch, "--run", f"first={tmp_path / 'first' / 'seed0'}", "--run",
          f"second={tmp_path / 'second' / 'seed0'}", "--arm", "base=first", "--arm", "rl_teacher=second",
          "--out", str(out), "--device", "H200")
    study = json.loads(out.read_text())
    assert study["runs"] == {"first": [str(tmp_path / "first" / "seed0")],
                             "second": [str(tmp_path / "second" / "seed0")]}
    assert [(arm["label"], arm["run"], arm["missing"]) for arm in study["arms"]] == [
        ("base", "first", True), ("rl_teacher", "second", True)]
    table = (tmp_path / "study_table.md").read_text().splitlines()
    assert table[:4] == ["| arm | run | seeds | held-out templates [95% CI] | held-out instances [95% CI] |",
                         "| --- | --- | --- | --- | --- |", "| base | first | — | — | — |",
                         "| rl_teacher | second | — | — | — |"]


def test_an_arm_from_a_run_no_run_option_gives_is_one_line(tmp_path, monkeypatch, capsys):
    (tmp_path / "seed0").mkdir()
    with pytest.raises(SystemExit) as stop:
        _main(monkeypatch, "--run", f"first={tmp_path / 'seed0'}", "--arm", "base=frist", "--out",
              str(tmp_path / "study.json"))
    assert stop.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1].endswith(
        "error: --arm names run ['frist'], which no --run gives: the runs are ['first']")
    assert not (tmp_path / "study.json").exists()
