"""The fair study's summary (bench/study_fair.py): arms, intervals over seeds/templates/questions, the positive
control and the paired differences, from hand-made eval folders."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "study_fair.py"


def _eval_folder(root: Path, student: str, arm: str, correct: dict[str, list[bool]]) -> None:
    """``correct[set]``: one answer per question; 10 templates of the questions in order."""
    rows = [{"question": f"{held_out} question {i}", "heldout": held_out, "template": i % 10, "correct": ok,
             "capped": i == 0}
            for held_out, answers in correct.items() for i, ok in enumerate(answers)]
    folder = root / student / arm / "eval"
    folder.mkdir(parents=True)
    (folder / "eval_rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def _run(*args):
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True)


def _summarize(tmp_path, *roots, resamples=400):
    """Each root exported (as a study keeps it), then the summary of the exports."""
    answers = tmp_path / "answers"
    for root in roots:
        exported = _run("export", root, "--out", answers, "--device", "nvidia-h100", "--commit", "abc1234",
                        "--command", "bash x.sh")
        if exported.returncode:
            return exported, None
    out = tmp_path / "out"
    return _run("summarize", answers, "--out", out, "--resamples", resamples), out


def test_arms_control_and_differences_are_computed_from_the_rows(tmp_path):
    root = tmp_path / "study"
    n = 200
    _eval_folder(root, "s", "untrained", {"instances": [i % 5 == 0 for i in range(n)],      # 0.20
                                          "templates": [i % 10 == 0 for i in range(n)]})    # 0.10
    _eval_folder(root, "s", "untrained_plain", {"instances": [i % 4 == 0 for i in range(n)],  # 0.25
                                                "templates": [i % 10 == 0 for i in range(n)]})
    for seed, extra in ((0, 0), (1, 1)):  # 0.50 and 0.55 on instances: mean 0.525
        answers = [i % 2 == 0 or (extra and i % 20 == 1) for i in range(n)]
        _eval_folder(root, "s", f"worked_s{seed}", {"instances": answers, "templates": [i % 5 == 0 for i in range(n)]})
    result, out = _summarize(tmp_path, root)
    assert result.returncode == 0, result.stderr
    study = json.loads((out / "study.json").read_text())
    assert study["commit"] == ["abc1234"] and study["device"] == ["nvidia-h100"] and study["commands"] == ["bash x.sh"]
    assert {"student": "s", "arm": "worked", "seed": 1, "device": "nvidia-h100", "commit": "abc1234",
            "command": "bash x.sh"} in study["runs"]
    # the summary of the eval folders themselves is the summary of their exports
    direct = _run("summarize", root, "--out", tmp_path / "direct", "--resamples", 400)
    assert json.loads((tmp_path / "direct" / "study.json").read_text())["students"] == study["students"], direct.stderr
    arms = study["students"]["s"]["arms"]
    assert arms["worked"]["seeds"] == [0, 1] and arms["worked"]["held_out_instances"]["per_seed"] == [0.5, 0.55]
    assert arms["worked"]["held_out_instances"]["accuracy"] == 0.525
    assert arms["untrained"]["held_out_instances"]["accuracy"] == 0.2
    assert arms["untrained"]["held_out_templates"]["templates"] == 10
    assert arms["untrained"]["held_out_instances"]["capped_frac"] == 0.005  # one of 200 answers cut
    low, high = arms["worked"]["held_out_instances"]["ci95"]
    assert low < 0.525 < high
    control = study["students"]["s"]["positive_control"]
    # against the better untrained prompt (plain, 0.25): +0.275, far above zero
    assert control["baseline"] == "untrained_plain" and control["difference"] == 0.275 and control["passes"]
    # half the templates all right, half all wrong: resampling templates as clusters makes the interval wide
    assert 0 < control["ci95"][0] < 0.2 and control["ci95"][1] > 0.35
    assert "Positive control (s): worked - untrained_plain on held out instances: +0.275" in \
        (out / "study_table.md").read_text()


def test_a_worked_arm_no_better_than_untrained_fails_the_control(tmp_path):
    root = tmp_path / "study"
    same = {"instances": [i % 5 == 0 for i in range(100)]}
    _eval_folder(root, "s", "untrained", same)
    _eval_folder(root, "s", "worked_s0", {"instances": [i % 5 == 0 or i % 50 == 1 for i in range(100)]})  # +0.02
    result, out = _summarize(tmp_path, root)
    control = json.loads((out / "study.json").read_text())["students"]["s"]["positive_control"]
    assert control["difference"] == 0.02 and not control["passes"]
    assert "FAILS" in result.stdout


def test_templates_are_resampled_as_clusters():
    sys.path.insert(0, str(SCRIPT.parent))
    import numpy as np
    from study_fair import _question_weights

    templates = np.array([0, 0, 0, 1, 1, 2])
    weights = _question_weights(templates, 300, np.random.default_rng(0))
    # every resample draws three templates, each with as many questions as it has: 6 question draws in a resample
    # when the three templates drawn have sizes summing to 6 -- and a resample's weights sit on whole templates
    for row in weights:
        for template in (0, 1, 2):
            members = templates == template
            assert row[members].sum() % members.sum() == 0
    assert (weights.sum(1) != 6).any()  # template sizes differ, so the resample size varies


def test_no_eval_folder_is_one_line_and_a_run_is_exported_once(tmp_path):
    result, _ = _summarize(tmp_path, tmp_path / "nothing")
    assert result.returncode == 2 and result.stderr.count("\n") == 1
    assert result.stderr.startswith("error: no <student>/<arm>/eval/eval_rows.jsonl under ")
    _eval_folder(tmp_path / "study", "s", "untrained", {"instances": [True, False]})
    assert _summarize(tmp_path, tmp_path / "study")[0].returncode == 0
    again = _run("export", tmp_path / "study", "--out", tmp_path / "answers", "--device", "d", "--commit", "c",
                 "--command", "x")
    assert again.returncode == 2 and "untrained_s0.json exists: a run is exported once" in again.stderr


@pytest.mark.parametrize("empty", [True])
def test_an_unfinished_eval_is_one_line(tmp_path, empty):
    folder = tmp_path / "study" / "s" / "untrained" / "eval"
    folder.mkdir(parents=True)
    (folder / "eval_rows.jsonl").write_text("")
    result, _ = _summarize(tmp_path, tmp_path / "study")
    assert result.returncode == 2 and "eval_rows.jsonl is empty: that eval did not finish" in result.stderr


def _fair_sh(*args, timeout=900, env=None):
    """bench/study_fair.sh on the embedded tiny pair (STUDY_TINY=1), from the repository root."""
    env = {**{k: v for k, v in os.environ.items() if not k.startswith(("RANK", "LOCAL_RANK", "WORLD_SIZE",
                                                                       "MASTER_", "STUDY_"))}, "STUDY_TINY": "1",
           **(env or {})}
    return subprocess.run(["bash", "bench/study_fair.sh", *map(str, args)], cwd=SCRIPT.parents[1], env=env,
                          capture_output=True, text=True, timeout=timeout)


def test_an_unknown_part_is_one_line_naming_the_parts(tmp_path):
    bad = _fair_sh("traces,teechers", tmp_path / "x")
    assert bad.returncode == 2 and bad.stderr == ("bench/study_fair.sh: unknown part 'teechers' (parts: "
                                                  "control, traces, teachers, students)\n")


def test_the_control_part_runs_on_the_tiny_pair_and_a_rerun_skips_what_finished(tmp_path):
    root = tmp_path / "study"
    first = _fair_sh("control", root, "0")
    assert first.returncode == 0 and "worked_s0=0" in (root / "DONE").read_text(), first.stdout + first.stderr
    student = root / "qwen2.5_coder_0.5b_instruct"
    for arm in ("untrained", "untrained_plain", "worked_s0"):
        assert (student / arm / "eval" / "eval.json").is_file(), arm
    assert (student / "worked_s0" / "sft" / "final").is_dir()
    prompts = {arm: (student / arm / "eval" / "config.yaml").read_text().split("student_prompt: ")[1].split("\n")[0]
               for arm in ("untrained", "untrained_plain")}
    assert prompts == {"untrained": "student", "untrained_plain": "plain"}
    stamp = (student / "worked_s0" / "eval" / "eval.json").stat().st_mtime_ns
    again = _fair_sh("control", root, "0", timeout=300)
    assert again.returncode == 0 and (student / "worked_s0" / "eval" / "eval.json").stat().st_mtime_ns == stamp


def test_the_traces_part_runs_on_the_tiny_pair_into_a_traces_file(tmp_path):
    root = tmp_path / "study"
    run = _fair_sh("traces", root)
    assert run.returncode == 0 and (root / "DONE").read_text().startswith("traces=0 "), run.stdout + run.stderr
    config = (root / "traces" / "eval" / "config.yaml").read_text()
    assert "split: train" in config and "student_prompt: plain" in config
    answered = len((root / "traces" / "eval" / "eval_rows.jsonl").read_text().splitlines())
    assert answered == 6  # size=tiny's data.max_rows: a sample of the 52 training rows (60 less 8 held out)
    kept = len((root / "traces" / "traces.jsonl").read_text().splitlines())
    log = (root / "logs" / "traces.log").read_text()
    assert f"{root / 'traces' / 'traces.jsonl'}: {kept} of 6 training questions answered right" in log
    stamp = (root / "traces" / "eval" / "eval.json").stat().st_mtime_ns
    again = _fair_sh("traces", root, timeout=300)
    assert again.returncode == 0 and (root / "traces" / "eval" / "eval.json").stat().st_mtime_ns == stamp


def _traces(root: Path) -> None:
    """A hand-made traces file: 24 sums, a worked solution and a trace each."""
    rows = [{"question": f"Tom has {a} apples and buys {a + 2} more. How many apples does he have?",
             "solution": f"{a} + {a + 2} = {2 * a + 2}\nThe answer is {2 * a + 2}.", "answer": str(2 * a + 2),
             "template": a % 3, "trace": f"He starts with {a} and adds {a + 2}: {a} + {a + 2} = {2 * a + 2}."}
            for a in range(2, 26)]
    (root / "traces").mkdir(parents=True)
    (root / "traces" / "traces.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_the_teachers_and_students_parts_chain_on_the_tiny_pair(tmp_path):
    root = tmp_path / "study"
    _traces(root)
    run = _fair_sh("teachers", root, "0", timeout=600)
    assert run.returncode == 0 and (root / "DONE").read_text().startswith("teachers=0 "), run.stdout + run.stderr
    sft = (root / "teachers" / "sft" / "config.yaml").read_text()
    assert "explanation_column: trace" in sft and f"source: {root / 'traces' / 'traces.jsonl'}" in sft
    # seed 0's RL keeps its checkpoints: every one but the last (final/) teaches; the answer-only teacher is shown
    # and rewarded on the answer line, in RL and when it explains
    assert sorted(p.name for p in (root / "distilled").iterdir()) == ["rl_answer_s0.jsonl", "rl_s0.jsonl",
                                                                      "rl_step1.jsonl", "sft.jsonl"]
    # (the embedded rows' solution is the answer line either way: the setting is what differs)
    for folder in ("rl_answer_s0/rl", "distill_rl_answer_s0"):
        assert "gsm_solution: answer" in (root / "teachers" / folder / "config.yaml").read_text()
    assert "gsm_solution: worked" in (root / "teachers" / "distill_rl_s0" / "config.yaml").read_text()
    worked_rows = [json.loads(line) for line in (root / "distilled" / "rl_s0.jsonl").read_text().splitlines()]
    assert {row["teacher"] for row in worked_rows} == {str(root / "teachers" / "rl_s0" / "rl" / "final")}
    stamp = (root / "distilled" / "rl_s0.jsonl").stat().st_mtime_ns

    taught = _fair_sh("students", root, "0", timeout=600,
                      env={"STUDY_UNTRAINED": "0", "STUDY_ARMS": "rl_teacher,rl_teacher_step1"})
    assert taught.returncode == 0, taught.stdout + taught.stderr
    student = root / "qwen2.5_coder_0.5b_instruct"  # the folder is named for the student the full study trains
    done = f"{student.name}/rl_teacher_s0=0 {student.name}/rl_teacher_step1_s0=0 "
    assert (root / "DONE").read_text().startswith(done)
    config = (student / "rl_teacher_step1_s0" / "sft" / "config.yaml").read_text()
    assert f"source: {root / 'distilled' / 'rl_step1.jsonl'}" in config and "explanation_column: explanation" in config
    assert (student / "rl_teacher_s0" / "eval" / "eval.json").is_file()
    again = _fair_sh("teachers", root, "0", timeout=300)
    assert again.returncode == 0 and (root / "distilled" / "rl_s0.jsonl").stat().st_mtime_ns == stamp


def test_an_unknown_arm_is_one_line_naming_the_arms(tmp_path):
    bad = _fair_sh("students", tmp_path / "x", env={"STUDY_ARMS": "traces,rl"})
    assert bad.returncode == 2 and bad.stderr == ("bench/study_fair.sh: unknown arm 'rl' (arms: traces, sft_teacher, "
                                                  "rl_teacher, rl_teacher_answer_only, rl_teacher_step<N>)\n")
