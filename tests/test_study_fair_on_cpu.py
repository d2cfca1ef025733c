"""The fair study's summary (bench/study_fair.py): arms, intervals over seeds/templates/questions, the positive
control and the paired differences, from hand-made eval folders."""

import gzip
import hashlib
import json
import lzma
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "study_fair.py"


def _eval_folder(root: Path, student: str, arm: str, correct: dict[str, list[bool]], cut=lambda i: i == 0) -> None:
    """``correct[set]``: one answer per question; 10 templates of the questions in order; ``cut(i)``: question i's
    answer was cut at the cap."""
    rows = [{"question": f"{held_out} question {i}", "heldout": held_out, "template": i % 10, "correct": ok,
             "capped": cut(i)}
            for held_out, answers in correct.items() for i, ok in enumerate(answers)]
    folder = root / student / arm / "eval"
    folder.mkdir(parents=True)
    (folder / "eval_rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (folder / "eval.json").write_text("{}\n")  # the summary the eval writes after its rows


def _run(*args):
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True)


def _summarize(tmp_path, *roots, resamples=400):
    """Each root exported (as a study keeps it), then the summary of the exports."""
    answers = tmp_path / "answers"
    for root in roots:
        exported = _run("export", root, "--out", answers, "--device", "H100", "--commit", "abc1234",
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
    assert study["commit"] == ["abc1234"] and study["device"] == ["H100"] and study["commands"] == ["bash x.sh"]
    assert {"student": "s", "arm": "worked", "seed": 1, "device": "H100", "commit": "abc1234",
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
    assert (out / "study.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"  # the plot of the arms


def test_a_run_added_to_one_arm_leaves_every_other_arm_and_difference_as_it_was(tmp_path):
    """Each arm's seeds and each held-out set's questions are drawn from streams of their own: a later run of
    another arm (or a new arm) does not move an interval already quoted."""
    root = tmp_path / "study"
    n = 120
    _eval_folder(root, "s", "untrained_plain", {"instances": [i % 4 == 0 for i in range(n)]})
    for seed in (0, 1):
        _eval_folder(root, "s", f"worked_s{seed}", {"instances": [(i + seed) % 2 == 0 for i in range(n)]})
        _eval_folder(root, "s", f"rl_teacher_s{seed}", {"instances": [(i + seed) % 3 != 0 for i in range(n)]})
    before, out = _summarize(tmp_path / "before", root)
    assert before.returncode == 0, before.stderr
    first = json.loads((out / "study.json").read_text())["students"]["s"]
    _eval_folder(root, "s", "rl_teacher_s2", {"instances": [i % 3 == 0 for i in range(n)]})
    _eval_folder(root, "s", "sft_teacher_s0", {"instances": [i % 5 != 0 for i in range(n)]})
    after, out = _summarize(tmp_path / "after", root)
    assert after.returncode == 0, after.stderr
    second = json.loads((out / "study.json").read_text())["students"]["s"]
    for arm in ("untrained_plain", "worked"):
        assert second["arms"][arm] == first["arms"][arm]
    assert second["positive_control"] == first["positive_control"]
    assert second["differences"]["rl_teacher - worked"] != first["differences"]["rl_teacher - worked"]  # its arm grew


def test_a_worked_arm_no_better_than_untrained_fails_the_control(tmp_path):
    root = tmp_path / "study"
    same = {"instances": [i % 5 == 0 for i in range(100)]}
    _eval_folder(root, "s", "untrained", same)
    _eval_folder(root, "s", "worked_s0", {"instances": [i % 5 == 0 or i % 50 == 1 for i in range(100)]})  # +0.02
    result, out = _summarize(tmp_path, root)
    control = json.loads((out / "study.json").read_text())["students"]["s"]["positive_control"]
    assert control["difference"] == 0.02 and not control["passes"]
    assert "FAILS" in result.stdout


def test_a_student_without_the_control_arm_is_said_to_have_no_control(tmp_path):
    root = tmp_path / "study"
    n = 40
    _eval_folder(root, "s", "untrained_plain", {"instances": [i % 4 == 0 for i in range(n)]})        # 0.25
    _eval_folder(root, "s", "worked_common_s0", {"instances": [i % 2 == 0 for i in range(n)]})      # 0.50
    _eval_folder(root, "s", "rl_teacher_s0", {"instances": [i % 2 == 0 for i in range(n)]})
    result, out = _summarize(tmp_path, root)
    assert result.returncode == 0, result.stderr
    entry = json.loads((out / "study.json").read_text())["students"]["s"]
    assert entry["positive_control"] is None
    assert entry["differences"]["worked_common - untrained_plain"]["held_out_instances"]["difference"] == 0.25
    assert ("Positive control (s): not run (it needs the worked students and an untrained one): no comparison of "
            "this student's arms rests on it.") in result.stdout


def test_a_difference_with_an_arm_cut_at_the_cap_is_also_given_where_neither_arm_cut(tmp_path):
    root = tmp_path / "study"
    n = 200
    # sft_teacher: 0.40, but 40 of its answers (i % 5 == 4) cut at the cap and wrong; right on 80 of the other 160
    _eval_folder(root, "s", "sft_teacher_s0", {"instances": [i % 5 != 4 and i % 2 == 0 for i in range(n)]},
                 cut=lambda i: i % 5 == 4)
    # rl_teacher: 0.50 (every even question), one answer cut (0.5% is under the bar)
    _eval_folder(root, "s", "rl_teacher_s0", {"instances": [i % 2 == 0 for i in range(n)]})
    result, out = _summarize(tmp_path, root)
    assert result.returncode == 0, result.stderr
    figures = json.loads((out / "study.json").read_text())["students"]["s"]["differences"]["rl_teacher - sft_teacher"]
    d = figures["held_out_instances"]
    assert d["difference"] == 0.1 and d["cut_above_bar"] == {"sft_teacher": 0.2}
    # neither cut: the 159 questions with i % 5 != 4 and i != 0; rl right on 79 of them, sft on the same 79
    assert d["uncut"]["questions"] == 159 and d["uncut"]["difference"] == 0.0
    low, high = d["uncut"]["ci95"]
    assert low <= 0.0 <= high and high - low < 1e-9  # the same answers: every resample gives zero
    assert ("rl_teacher - sft_teacher, held out instances: +0.100" in (out / "study_table.md").read_text()
            and "above 5%: sft_teacher 20.0%; on the 159 questions neither arm cut: +0.000" in result.stdout)


def test_the_uncut_questions_are_those_no_seed_of_either_arm_cut(tmp_path):
    root = tmp_path / "study"
    n = 100  # templates i % 10
    for seed, cut_template in ((0, 3), (1, 7)):  # each seed of sft_teacher cuts another template's answers (10%)
        _eval_folder(root, "s", f"sft_teacher_s{seed}", {"instances": [i % 4 == 0 for i in range(n)]},
                     cut=lambda i, t=cut_template: i % 10 == t)
        _eval_folder(root, "s", f"rl_teacher_s{seed}", {"instances": [i % 2 == 0 for i in range(n)]},
                     cut=lambda i: False)
    result, out = _summarize(tmp_path, root)
    d = json.loads((out / "study.json").read_text())["students"]["s"]["differences"]["rl_teacher - sft_teacher"]
    d = d["held_out_instances"]
    assert d["difference"] == 0.25 and d["cut_above_bar"] == {"sft_teacher": 0.1}, result.stderr
    # uncut: the 80 questions of templates other than 3 and 7; rl right on the even ones (50), sft on i % 4 == 0 (25)
    assert d["uncut"]["questions"] == 80 and d["uncut"]["difference"] == 0.3125
    # per template the difference is 0.5 (even templates) or 0 (1, 5, 9): a resample lies between
    low, high = d["uncut"]["ci95"]
    assert 0 <= low < 0.3125 < high <= 0.5


def test_the_uncut_bootstrap_averages_over_the_uncut_questions_each_resample_drew():
    sys.path.insert(0, str(SCRIPT.parent))
    import numpy as np
    from study.stats import _uncut_difference

    correct = [np.array([[1.0, 1.0, 0.0, 1.0]]), np.array([[0.0, 1.0, 0.0, 0.0]])]
    uncut = np.array([True, True, True, False])  # question 3 was cut
    weights = np.array([[1.0, 1.0, 1.0, 1.0],   # every question once: uncut means 2/3 and 1/3
                        [2.0, 0.0, 1.0, 5.0]])  # question 0 twice, question 2 once: 2/3 and 0/3
    d = _uncut_difference(correct, [c.repeat(2, axis=0) for c in correct], uncut, weights)
    assert d["questions"] == 3 and d["difference"] == round(2 / 3 - 1 / 3, 4)
    # resample differences 1/3 and 2/3: the percentiles interpolate between them
    assert d["ci95"] == [round(1 / 3 + 0.025 / 3, 4), round(1 / 3 + 0.975 / 3, 4)]
    assert _uncut_difference(correct, correct, np.zeros(4, dtype=bool), weights) == {"questions": 0}


def test_a_difference_without_an_arm_over_the_bar_has_no_uncut_figure(tmp_path):
    root = tmp_path / "study"
    _eval_folder(root, "s", "sft_teacher_s0", {"instances": [i % 3 == 0 for i in range(100)]})
    _eval_folder(root, "s", "rl_teacher_s0", {"instances": [i % 2 == 0 for i in range(100)]})
    result, out = _summarize(tmp_path, root)
    d = json.loads((out / "study.json").read_text())["students"]["s"]["differences"]["rl_teacher - sft_teacher"]
    assert set(d["held_out_instances"]) == {"difference", "ci95"}, result.stderr
    assert "neither arm cut" not in result.stdout


def test_an_answer_loops_when_its_ending_came_four_times():
    sys.path.insert(0, str(SCRIPT.parent))
    from study.answers import LOOP_TAIL_CHARS, looped

    assert LOOP_TAIL_CHARS == 40
    unit = "149 - 248 = "  # 12 characters, so the 40-character ending comes back at each turn
    # 7 turns and a part: 89 characters of loop hold the ending at 5 places (they overlap); 4 turns: at 2
    assert looped("Step 1: subtract. " + unit * 7 + "149 -")  # inside one line, cut mid-repeat
    assert looped("Step 1: subtract. " + unit * 6 + "149 -")  # 77 characters: 4 places
    assert not looped("Step 1: subtract. " + unit * 5 + "149 -")  # 65 characters: 3 places
    block = "\\[\n0.8x = 10\\% of x\n\\]\n"  # a block of short lines, 23 characters: 5 turns hold the ending 4 times
    assert looped("So:\n" + block * 5)
    assert not looped("So:\n" + block * 4)
    # a list whose items repeat a fact line, then an ending of its own
    items = "".join(f"- {thing}: Mary has 5 grandchildren, so 5 {thing}s.\n" for thing in ("hat", "scarf", "mitten",
                                                                                         "sweater", "sock"))
    assert not looped(items + "So Mary knits 25 things in all. The answer is 25.")
    assert not looped("ab" * 19) and not looped("")  # shorter than the ending it would repeat


def test_the_share_of_answers_that_loop_is_exported_and_summarised(tmp_path):
    root = tmp_path / "study"
    folder = root / "s" / "rl_teacher_s0" / "eval"
    folder.mkdir(parents=True)
    loop, plain = "Add the two numbers: 3 + 4 = 7.\n" * 6, "Add the two numbers: 3 + 4 = 7.\nThe answer is 7."
    rows = [{"question": f"q{i}", "heldout": "instances", "template": i % 5, "correct": i % 2 == 0,
             "capped": i < 3, "student_output": loop if i < 3 else plain} for i in range(20)]
    (folder / "eval_rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (folder / "eval.json").write_text("{}\n")
    result, out = _summarize(tmp_path, root)
    assert result.returncode == 0, result.stderr
    exported = json.loads((tmp_path / "answers" / "s" / "rl_teacher_s0.json").read_text())
    assert exported["looped"] == "111" + "0" * 17
    figures = json.loads((out / "study.json").read_text())["students"]["s"]["arms"]["rl_teacher"]
    assert figures["held_out_instances"]["looped_frac"] == 0.15
    assert (out / "study_table.md").read_text().splitlines()[2].endswith("| 15.0% | 15.0% |")
    # an export written before the loop bit: no share, said as unknown
    del exported["looped"]
    (tmp_path / "answers" / "s" / "rl_teacher_s0.json").write_text(json.dumps(exported))
    again = _run("summarize", tmp_path / "answers", "--out", tmp_path / "old", "--resamples", 50)
    figures = json.loads((tmp_path / "old" / "study.json").read_text())["students"]["s"]["arms"]["rl_teacher"]
    assert figures["held_out_instances"]["looped_frac"] is None, again.stderr
    assert (tmp_path / "old" / "study_table.md").read_text().splitlines()[2].endswith("| 15.0% | — |")


def test_templates_are_resampled_as_clusters():
    sys.path.insert(0, str(SCRIPT.parent))
    import numpy as np
    from study.stats import _question_weights

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


def test_a_study_root_summarized_as_it_is_says_where_its_runs_ran(tmp_path):
    """Summarized from its eval folders (not exports), a root's runs are in study.json's runs, commit and commands
    (the root's commit and each eval's own command), the device unknown: not silently empty lists."""
    root = tmp_path / "study"
    _eval_folder(root, "s", "worked_s0", {"instances": [True, False] * 10})
    _eval_folder(root, "s", "untrained", {"instances": [False] * 20})
    (root / "commit").write_text("abc1234\n")
    (root / "command").write_text("bash study.sh students\n")
    (root / "s" / "worked_s0" / "eval" / "command").write_text("bash study.sh control\n")
    out = tmp_path / "out"
    result = _run("summarize", root, "--out", out, "--resamples", 50)
    assert result.returncode == 0, result.stderr
    study = json.loads((out / "study.json").read_text())
    assert (study["commit"], study["device"], study["commands"]) == (
        ["abc1234"], ["?"], ["bash study.sh control", "bash study.sh students"])
    assert [(r["arm"], r["seed"]) for r in study["runs"]] == [("untrained", 0), ("worked", 0)]


def test_a_run_that_keeps_its_own_command_is_exported_with_it(tmp_path):
    # one root, two commands: the eval folder's own command wins over --command, the latest command on the root
    _eval_folder(tmp_path / "study", "s", "untrained", {"instances": [True, False]})
    _eval_folder(tmp_path / "study", "s", "worked_s0", {"instances": [True, True]})
    (tmp_path / "study" / "s" / "worked_s0" / "eval" / "command").write_text("STUDY_ARMS=worked bash x.sh fair 0\n")
    exported = _run("export", tmp_path / "study", "--out", tmp_path / "answers", "--device", "d", "--commit", "c",
                    "--command", "STUDY_ARMS=untrained bash x.sh fair 1,2")
    assert exported.returncode == 0, exported.stderr
    commands = {name: json.loads((tmp_path / "answers" / "s" / f"{name}.json").read_text())["command"]
                for name in ("untrained_s0", "worked_s0")}
    assert commands == {"untrained_s0": "STUDY_ARMS=untrained bash x.sh fair 1,2",
                        "worked_s0": "STUDY_ARMS=worked bash x.sh fair 0"}


def test_an_eval_whose_summary_is_not_written_yet_is_left_out_of_the_export(tmp_path):
    _eval_folder(tmp_path / "study", "s", "untrained", {"instances": [True, False]})
    _eval_folder(tmp_path / "study", "s", "worked_s0", {"instances": [True, True]})
    (tmp_path / "study" / "s" / "worked_s0" / "eval" / "eval.json").unlink()
    exported = _run("export", tmp_path / "study", "--out", tmp_path / "answers", "--device", "d", "--commit", "c",
                    "--command", "x")
    assert exported.returncode == 0 and exported.stdout == f"{tmp_path / 'answers' / 's' / 'untrained_s0.json'}\n"
    assert "worked_s0/eval: no eval.json beside its rows yet (the eval is ending): left out" in exported.stderr


def test_answered_finds_a_run_exported_at_the_same_commit_in_either_form(tmp_path):
    _eval_folder(tmp_path / "study", "s", "rl_teacher_s1", {"instances": [True]})
    assert _run("export", tmp_path / "study", "--out", tmp_path / "answers", "--device", "d", "--commit",
                "abc1234def", "--command", "x").returncode == 0

    def asked(*extra):
        return _run("answered", tmp_path / "answers", "s", *extra).returncode

    assert asked("rl_teacher_s1", "--commit", "abc1234") == 0  # the short id of the exported one
    assert asked("rl_teacher_s1", "--commit", "abc1234def5678") == 0  # the exported one is the short id
    assert asked("rl_teacher_s1", "--commit", "abc9999") == 1  # another commit: run again
    assert asked("rl_teacher_s1") == 0  # no commit asked: any
    assert asked("rl_teacher_s0") == 1  # another seed


@pytest.mark.parametrize("empty", [True])
def test_an_unfinished_eval_is_one_line(tmp_path, empty):
    folder = tmp_path / "study" / "s" / "untrained" / "eval"
    folder.mkdir(parents=True)
    (folder / "eval_rows.jsonl").write_text("")
    result, _ = _summarize(tmp_path, tmp_path / "study")
    assert result.returncode == 2 and "eval_rows.jsonl is empty: that eval did not finish" in result.stderr


def _environ() -> dict[str, str]:
    """This process's environment, with this interpreter first on PATH and as PYTHON: the scripts call python3
    (launch_mono.sh) and ${PYTHON:-python3}, which must be the one that has rlt_mono's dependencies."""
    return {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
            "PYTHON": sys.executable}


def _fair_sh(*args, timeout=900, env=None):
    """bench/study_fair.sh on the embedded tiny pair (STUDY_TINY=1), from the repository root."""
    env = {**{k: v for k, v in _environ().items() if not k.startswith(("RANK", "LOCAL_RANK", "WORLD_SIZE",
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
    root.mkdir()
    (root / "command").write_text("STUDY_ARMS=x bash offline_host/gpu_pipeline.sh fair control 0\n")
    first = _fair_sh("control", root, "0", env={"STUDY_KEEP_STUDENTS": "1"})
    assert first.returncode == 0 and "worked_s0=0" in (root / "DONE").read_text(), first.stdout + first.stderr
    student = root / "qwen2.5_coder_0.5b_instruct"
    for arm in ("untrained", "untrained_plain", "worked_s0"):
        assert (student / arm / "eval" / "eval.json").is_file(), arm
        # each eval keeps the command that started the study, which a later command on the root may overwrite
        assert (student / arm / "eval" / "command").read_text() == (root / "command").read_text(), arm
    assert (student / "worked_s0" / "sft" / "final").is_dir()
    prompts = {arm: (student / arm / "eval" / "config.yaml").read_text().split("student_prompt: ")[1].split("\n")[0]
               for arm in ("untrained", "untrained_plain")}
    assert prompts == {"untrained": "student", "untrained_plain": "plain"}
    stamp = (student / "worked_s0" / "eval" / "eval.json").stat().st_mtime_ns
    sft_stamp = (student / "worked_s0" / "sft" / "metrics.jsonl").stat().st_mtime_ns
    # a later command on the root: what finished is skipped, and an eval it did not run is not said to be its own
    (root / "command").write_text("bash offline_host/gpu_pipeline.sh fair control 1\n")
    (student / "untrained" / "eval" / "command").unlink()
    shutil.rmtree(student / "worked_s0" / "sft" / "final")  # as after an eval without STUDY_KEEP_STUDENTS
    again = _fair_sh("control", root, "0", timeout=300)
    assert again.returncode == 0 and (student / "worked_s0" / "eval" / "eval.json").stat().st_mtime_ns == stamp
    assert (student / "worked_s0" / "sft" / "metrics.jsonl").stat().st_mtime_ns == sft_stamp  # not trained again
    assert not (student / "untrained" / "eval" / "command").exists()
    assert (student / "worked_s0" / "eval" / "command").read_text() == ("STUDY_ARMS=x bash "
                                                                        "offline_host/gpu_pipeline.sh fair control 0\n")


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
    run = _fair_sh("teachers", root, "0", timeout=600, env={"STUDY_SFT_SEEDS": "1"})
    assert run.returncode == 0 and (root / "DONE").read_text().startswith("teachers=0 "), run.stdout + run.stderr
    sft = (root / "teachers" / "sft" / "config.yaml").read_text()
    assert "explanation_column: trace" in sft and f"source: {root / 'traces' / 'traces.jsonl'}" in sft
    # seed 0's RL keeps its checkpoints: every one but the last (final/) teaches; the answer-only teacher is shown
    # and rewarded on the answer line, in RL and when it explains
    assert sorted(p.name for p in (root / "distilled").iterdir()) == ["rl_answer_s0.jsonl", "rl_s0.jsonl",
                                                                      "rl_step1.jsonl", "sft.jsonl", "sft_s1.jsonl"]
    # the SFT teacher's second sample (STUDY_SFT_SEEDS=1): the same teacher, distill seed 1
    for name, seed in (("sft", 0), ("sft_s1", 1)):
        config = (root / "teachers" / f"distill_{name}" / "config.yaml").read_text()
        assert f"model_name_or_path: {root / 'teachers' / 'sft' / 'final'}" in config
        assert f"\nseed: {seed}\n" in config
    # ... of the same questions (data.seed=0: the run seed samples the explanations, not the rows)
    questions = [{json.loads(x)["question"] for x in (root / "distilled" / f"{name}.jsonl").read_text().splitlines()}
                 for name in ("sft", "sft_s1")]
    assert questions[0] == questions[1] and len(questions[0]) == 4
    # (the embedded rows' solution is the answer line either way: the setting is what differs)
    for folder in ("rl_answer_s0/rl", "distill_rl_answer_s0"):
        assert "gsm_solution: answer" in (root / "teachers" / folder / "config.yaml").read_text()
    assert "gsm_solution: worked" in (root / "teachers" / "distill_rl_s0" / "config.yaml").read_text()
    worked_rows = [json.loads(line) for line in (root / "distilled" / "rl_s0.jsonl").read_text().splitlines()]
    assert {row["teacher"] for row in worked_rows} == {str(root / "teachers" / "rl_s0" / "rl" / "final")}
    stamp = (root / "distilled" / "rl_s0.jsonl").stat().st_mtime_ns

    taught = _fair_sh("students", root, "0", timeout=600,
                      env={"STUDY_UNTRAINED": "0",
                           "STUDY_ARMS": "untrained_plain,worked,rl_teacher,rl_teacher_step1,worked_common,"
                                         "rl_teacher_answer_only"})
    assert taught.returncode == 0, taught.stdout + taught.stderr
    student = root / "qwen2.5_coder_0.5b_instruct"  # the folder is named for the student the full study trains
    done = " ".join(f"{student.name}/{arm}=0" for arm in ("untrained_plain", "worked_s0", "rl_teacher_s0",
                                                             "rl_teacher_step1_s0", "worked_common_s0",
                                                             "rl_teacher_answer_only_s0"))
    assert (root / "DONE").read_text().startswith(done + " ")
    # the control's arms in the same slots: the plain-prompt untrained eval, the worked solutions of every question
    assert "student_prompt: plain" in (student / "untrained_plain" / "eval" / "config.yaml").read_text()
    config = (student / "worked_s0" / "sft" / "config.yaml").read_text()
    assert "source: embedded" in config and "explanation_column: none" in config
    # the worked solutions alone, of the SFT teacher's questions
    config = (student / "worked_common_s0" / "sft" / "config.yaml").read_text()
    assert f"source: {root / 'distilled' / 'sft.jsonl'}" in config and "explanation_column: none" in config
    config = (student / "rl_teacher_step1_s0" / "sft" / "config.yaml").read_text()
    assert f"source: {root / 'distilled' / 'rl_step1.jsonl'}" in config and "explanation_column: explanation" in config
    assert (student / "rl_teacher_s0" / "eval" / "eval.json").is_file()
    # the answer-only teacher's students learn its explanations + the worked solution (worked_target), not its
    # answer line alone
    worked_rows = student / "rl_teacher_answer_only_s0" / "rows.jsonl"
    config = (student / "rl_teacher_answer_only_s0" / "sft" / "config.yaml").read_text()
    assert f"source: {worked_rows}" in config and "explanation_column: explanation" in config
    distilled = [json.loads(x) for x in (root / "distilled" / "rl_answer_s0.jsonl").read_text().splitlines()]
    taught_rows = [json.loads(x) for x in worked_rows.read_text().splitlines()]
    assert [r["solution"] for r in taught_rows] == [f"{r['reasoning_trace']}\n{r['solution']}" for r in distilled]
    assert [r["explanation"] for r in taught_rows] == [r["explanation"] for r in distilled]
    # an evaluated student's weights are deleted; its config and metrics stay
    for run in ("worked_s0", "rl_teacher_s0", "rl_teacher_step1_s0", "worked_common_s0"):
        assert not (student / run / "sft" / "final").exists() and (student / run / "sft" / "metrics.jsonl").is_file()
    # the SFT teacher's students of seed 1 read its seed-1 sample (those of seed 0 its own distill, sft: the
    # mapping's unit test)
    sft_students = _fair_sh("students", root, "1", timeout=600,
                            env={"STUDY_UNTRAINED": "0", "STUDY_ARMS": "sft_teacher"})
    assert sft_students.returncode == 0, sft_students.stdout + sft_students.stderr
    config = (student / "sft_teacher_s1" / "sft" / "config.yaml").read_text()
    assert f"source: {root / 'distilled' / 'sft_s1'}.jsonl" in config
    again = _fair_sh("teachers", root, "0", timeout=300, env={"STUDY_SFT_SEEDS": "1"})
    assert again.returncode == 0 and (root / "distilled" / "rl_s0.jsonl").stat().st_mtime_ns == stamp


def test_a_student_whose_training_diverges_is_not_tried_again_and_is_named(tmp_path):
    root = tmp_path / "study"
    started = time.monotonic()
    run = _fair_sh("students", root, "0", timeout=600,
                   env={"STUDY_ARMS": "worked", "STUDY_SFT": "sft.learning_rate=1e30 sft.warmup_steps=0"})
    assert run.returncode == 0 and (root / "DONE").read_text().startswith("qwen2.5_coder_0.5b_instruct/worked_s0=1 ")
    assert "qwen2.5_coder_0.5b_instruct worked seed 0 failed" in run.stdout + run.stderr
    log = (root / "logs" / "qwen2.5_coder_0.5b_instruct_worked_s0_sft.log").read_text()
    assert "the update made the weights non-finite" in log and "trying again" not in log
    assert not (root / "qwen2.5_coder_0.5b_instruct" / "worked_s0" / "sft" / "final").exists()
    assert time.monotonic() - started < 300  # no 30-second wait and second run on top of the first


def test_a_student_whose_answers_are_exported_at_the_study_commit_is_not_run_again(tmp_path):
    root, student = tmp_path / "study", "qwen2.5_coder_0.5b_instruct"
    root.mkdir()
    (root / "commit").write_text("abc1234\n")
    for arm, commit in (("untrained_plain", "abc1234def"), ("untrained", "0000000")):
        _eval_folder(tmp_path / "earlier" / arm, student, arm, {"instances": [True]})
        assert _run("export", tmp_path / "earlier" / arm, "--out", tmp_path / "answers", "--device", "d",
                    "--commit", commit, "--command", "x").returncode == 0
    run = _fair_sh("students", root, "0", timeout=600,
                   env={"STUDY_ARMS": "untrained,untrained_plain", "STUDY_ANSWERS": str(tmp_path / "answers")})
    assert run.returncode == 0, run.stdout + run.stderr
    assert (f"bench/study_fair.sh: {student} untrained_plain_s0: its answers are in {tmp_path / 'answers'}; not run "
            "again") in run.stderr
    assert not (root / student / "untrained_plain").exists()
    # left out before the jobs are dealt: the one job left is the only lane
    assert (root / "DONE").read_text().startswith(f"{student}/untrained=0 seconds=")
    # the other's answers are of another commit: it runs
    assert (root / student / "untrained" / "eval" / "eval.json").is_file()


def test_every_command_of_the_full_study_passes_the_check_and_nothing_runs(tmp_path):
    """STUDY_CHECK=1 on the full-size study (not STUDY_TINY): every part, both students, every arm; each command
    composed and checked as on a GPU host (an empty liger_kernel package stands in for the GPU one)."""
    (tmp_path / "site" / "liger_kernel").mkdir(parents=True)
    (tmp_path / "site" / "liger_kernel" / "__init__.py").write_text("")
    root = tmp_path / "study"
    root.mkdir()
    (root / "command").write_text("bash offline_host/gpu_pipeline.sh fair students 0,1,2\n")
    env = {k: v for k, v in _environ().items() if not k.startswith(("STUDY_", "CUDA_VISIBLE"))}
    env.update(STUDY_CHECK="1", STUDY_STUDENTS="qwen2.5_coder_0.5b_instruct,qwen2.5_coder_1.5b_instruct",
               STUDY_ARMS="worked_common,rl_teacher,sft_teacher,untrained,untrained_plain,traces,"
                          "rl_teacher_answer_only,worked,rl_teacher_step47",
               STUDY_EXPLANATIONS="",  # not the repository's kept teachers, some of which are left out (rounded)
               PYTHONPATH=f"{tmp_path / 'site'}:{env.get('PYTHONPATH', '')}".rstrip(":"))
    run = subprocess.run(["bash", "bench/study_fair.sh", "control,traces,teachers,students", str(root), "0,1,2"],
                         cwd=SCRIPT.parents[1], env=env, capture_output=True, text=True, timeout=600)
    codes = [item.rpartition("=") for item in (root / "DONE").read_text().split() if not item.startswith("seconds")]
    assert run.returncode == 0 and [c for c in codes if c[2] != "0"] == []
    # traces, teachers; a student's control part (untrained x 2, worked x 3 seeds) and students part (6 arms x 3
    # seeds, rl_teacher_step47 x 3 seeds, untrained x 2), for each student
    assert len(codes) == 1 + 1 + 2 * (2 + 3) + 2 * (6 * 3 + 3 + 2)
    logs = sorted((root / "logs").iterdir())
    failed = [log.name for log in logs if "pass every check a run makes" not in log.read_text()]
    assert failed == [] and len(logs) >= 60
    # nothing ran: no run folder (no eval's command file either), no distilled file
    assert sorted(p.name for p in root.iterdir()) == ["DONE", "command", "logs", "traces"]


def test_study_rl_reaches_the_teachers_rl_runs_and_nothing_else(tmp_path):
    """STUDY_RL's words go to each RL run's command after the study's own (a later memory= wins) and to no other
    stage: with an option the RL group lacks, the RL checks fail naming it while the teacher's SFT and distill pass."""
    (tmp_path / "site" / "liger_kernel").mkdir(parents=True)
    (tmp_path / "site" / "liger_kernel" / "__init__.py").write_text("")
    env = {k: v for k, v in _environ().items() if not k.startswith(("STUDY_", "CUDA_VISIBLE"))}
    env.update(STUDY_CHECK="1", PYTHONPATH=f"{tmp_path / 'site'}:{env.get('PYTHONPATH', '')}".rstrip(":"))

    def teachers(root, words):
        subprocess.run(["bash", "bench/study_fair.sh", "teachers", str(root), "0"], cwd=SCRIPT.parents[1],
                       env={**env, "STUDY_RL": words}, capture_output=True, text=True, timeout=600)
        return (root / "DONE").read_text().split()[0], {p.stem: p.read_text() for p in (root / "logs").iterdir()}

    done, logs = teachers(tmp_path / "speed", "memory=speed trainer.learning_rate=1.0e-6")
    assert done == "teachers=0" and all("pass every check a run makes" in text for text in logs.values())
    done, logs = teachers(tmp_path / "typo", "trainer.no_such_option=1")
    assert done == "teachers=1"
    assert "no_such_option" in logs["rl_s0_rl"] and "no_such_option" in logs["rl_answer_s0_rl"]
    assert "pass every check" in logs["teacher_sft"] and "no_such_option" not in logs["teacher_sft"]


@pytest.mark.parametrize(("student", "lanes"), [("qwen2.5_coder_0.5b_instruct", ["a", "b", "c", "d"]),
                                               ("qwen2.5_coder_1.5b_instruct", ["a+c", "b+d"])])
def test_students_share_a_card_two_at_a_time_except_the_1_5b_which_has_one_to_itself(tmp_path, student, lanes):
    env = {k: v for k, v in _environ().items() if not k.startswith(("STUDY_", "CUDA_VISIBLE"))}
    env.update(STUDY_CHECK="1", STUDY_GPUS="0,1", STUDY_STUDENTS=student, STUDY_UNTRAINED="0",
               STUDY_ARMS="rl_teacher,sft_teacher", STUDY_EXPLANATIONS="")
    run = subprocess.run(["bash", "bench/study_fair.sh", "students", str(tmp_path / "study"), "0,1"],
                         cwd=SCRIPT.parents[1], env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    # the jobs in dealing order: a, b, c, d; a lane's jobs run one after another, joined by "+" in DONE
    jobs = dict(zip("abcd", (f"{student}/{arm}_s{seed}" for arm in ("rl_teacher", "sft_teacher") for seed in (0, 1))))
    names = [item.rpartition("=")[0] for item in (tmp_path / "study" / "DONE").read_text().split()
             if not item.startswith("seconds")]
    assert names == ["+".join(jobs[j] for j in lane.split("+")) for lane in lanes]


def test_the_students_of_a_kept_teacher_that_trained_bfloat16_weights_are_not_run(tmp_path):
    """A kept teacher whose run trained its full weights in bfloat16 (most of each step rounded away) teaches no
    student unless STUDY_ROUNDED_TEACHERS=1; float32 teachers, LoRA adapters, and worked_common (which reads only
    the SFT teacher's questions) still run. bench/study_fair.py rounded names those teachers."""
    kept = tmp_path / "kept"
    _kept_folder(kept, {name: {"q0": -4.0} for name in ("sft", "rl_s0", "rl_s1", "rl_step30", "rl_answer_s0")})
    manifest = json.loads((kept / "manifest.json").read_text())
    model = {"sft": {"dtype": "float32"}, "rl_s0": {"dtype": "float32"}, "rl_s1": {"dtype": "bfloat16"},
             "rl_step30": {"dtype": "bfloat16", "lora_r": 0}, "rl_answer_s0": {"dtype": "bfloat16", "lora_r": 16}}
    for name, fields in model.items():
        manifest["teachers"][name]["config"] = {"training": {"model": fields}}
    (kept / "manifest.json").write_text(json.dumps(manifest))
    named = _run("rounded", kept)
    assert (named.returncode, named.stdout) == (0, "rl_s1\nrl_step30\n"), named.stderr
    env = {k: v for k, v in _environ().items() if not k.startswith(("STUDY_", "CUDA_VISIBLE"))}
    env.update(STUDY_CHECK="1", STUDY_GPUS="0", STUDY_SLOTS="1", STUDY_UNTRAINED="0", STUDY_EXPLANATIONS=str(kept),
               STUDY_ARMS="rl_teacher,sft_teacher,rl_teacher_step30,rl_teacher_answer_only,worked_common")
    student = "qwen2.5_coder_0.5b_instruct"

    def run(root, **extra):
        done = subprocess.run(["bash", "bench/study_fair.sh", "students", str(root), "0,1"], cwd=SCRIPT.parents[1],
                              env={**env, **extra}, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr
        lanes = [item.rpartition("=")[0] for item in (root / "DONE").read_text().split()
                 if not item.startswith("seconds")]
        return done.stderr, lanes

    stderr, lanes = run(tmp_path / "study")
    assert lanes == ["+".join(f"{student}/{job}" for job in ("rl_teacher_s0", "sft_teacher_s0", "sft_teacher_s1",
                                                            "rl_teacher_answer_only_s0", "rl_teacher_answer_only_s1",
                                                            "worked_common_s0", "worked_common_s1"))]
    for job, teacher in (("rl_teacher_s1", "rl_s1"), ("rl_teacher_step30_s0", "rl_step30"),
                         ("rl_teacher_step30_s1", "rl_step30")):
        assert (f"bench/study_fair.sh: {student} {job}: its teacher {teacher} trained bfloat16 or float16 weights, "
                "most of each step rounded away (docs/STUDY.md, \"Steps that round away\"); not run "
                "(STUDY_ROUNDED_TEACHERS=1 runs it)\n") in stderr
    stderr, lanes = run(tmp_path / "again", STUDY_ROUNDED_TEACHERS="1")
    assert "rounded away" not in stderr and lanes[0].count("+") == 9  # all 10 runs: the checkpoint's too, each seed
    # a manifest that cannot be read: no teacher is known sound, so no student runs
    (kept / "manifest.json").write_text("{not json")
    root = tmp_path / "unread"
    unread = subprocess.run(["bash", "bench/study_fair.sh", "students", str(root), "0,1"], cwd=SCRIPT.parents[1],
                            env=env, capture_output=True, text=True, timeout=600)
    assert (root / "DONE").read_text().startswith("students=1 "), unread.stderr
    assert (f"bench/study_fair.sh: {kept}/manifest.json: which teachers trained bfloat16 weights was not read "
            "(above); no student runs\n") in unread.stderr
    assert sorted(path.name for path in root.iterdir()) == ["DONE", "logs"] and not any((root / "logs").iterdir())


def test_study_slots_must_be_a_whole_number(tmp_path):
    bad = _fair_sh("students", tmp_path / "x", env={"STUDY_SLOTS": "0"})
    assert bad.returncode == 2 and bad.stderr == "bench/study_fair.sh: STUDY_SLOTS=0: a whole number >= 1\n"


@pytest.mark.parametrize(("knob", "value"), [("STUDY_RETRY_SECONDS", "1.5"), ("STUDY_MEMORY_TRIES", "ten")])
def test_the_retry_knobs_must_be_whole_numbers(tmp_path, knob, value):
    bad = _fair_sh("students", tmp_path / "x", env={knob: value})
    assert bad.returncode == 2 and bad.stderr == f"bench/study_fair.sh: {knob}={value}: a whole number\n"


def test_an_unknown_arm_is_one_line_naming_the_arms(tmp_path):
    bad = _fair_sh("students", tmp_path / "x", env={"STUDY_ARMS": "traces,rl"})
    assert bad.returncode == 2 and bad.stderr == ("bench/study_fair.sh: unknown arm 'rl' (arms: untrained, "
                                                  "untrained_plain, worked, traces, sft_teacher, rl_teacher, "
                                                  "rl_teacher_answer_only, rl_teacher_step<N>, worked_common)\n")


def _rl_teacher(root: Path, name: str, seed: int, reward: str, evals: list[tuple[int, float]],
                generate: list[float], finished: bool = True, trainer: str = "", steps_done: str | None = None) -> None:
    """A hand-made RL teacher run folder: config.yaml (``trainer``: more trainer keys, one per line), metrics.jsonl
    (a step row per entry of ``generate``, the evaluations of ``evals``, the end-of-training row), final/ when
    ``finished``, checkpoint-2, and a README.md whose "steps done" line reads ``steps_done`` when given."""
    folder = root / "teachers" / name / "rl"
    (folder / "checkpoint-2").mkdir(parents=True)
    if finished:
        (folder / "final").mkdir()
    if steps_done is not None:
        (folder / "README.md").write_text(f"# rlt_mono run `teacher_rlt_mono`: rl\n\n| | |\n| --- | --- |\n"
                                          f"| seed | {seed} |\n| steps done | {steps_done} |\n"
                                          "| mean reward | -3.3 (steps 1-2) -> -3.0 (steps 2-3) |\n\n## Files\n\n"
                                          "- `final/`: the trained teacher and its tokenizer\n")
    (folder / "config.yaml").write_text(
        f"seed: {seed}\ndata:\n  gsm_solution: {reward}\ntrainer:\n  per_device_train_batch_size: 32\n"
        "  gradient_accumulation_steps: 8\n  steps_per_generation: 8\n"
        + "".join(f"  {line}\n" for line in trainer.split("\n") if line))
    # the parts as the trainer logs them (r_ss - r_kl + match_penalty = eval_reward where the penalty is logged;
    # the first evaluation logs none: left out of that part's curve)
    rows = [{"event": "eval", "step": step, "eval_reward": value, "eval_runtime": 3.0,
             "eval_teacher_reward/r_ss": value / 2, "eval_teacher_reward/r_kl": -value / 2 - 1.0,
             **({"eval_teacher_reward/match_penalty": -1.0} if k else {})} for k, (step, value) in enumerate(evals)]
    rows += [{"event": "step", "step": i + 1, "reward": -4.0 + i, "phase/generate/seconds": seconds,
              "phase/score/seconds": 2.0 + i % 2, "phase/train/seconds": [5.0, 6.0, 7.0, 100.0][i % 4],
              "step_time": 10.0 + i, "phase/train/device_peak_gib": 30.0 + i, "alignment/unmatched_frac": 0.5}
             for i, seconds in enumerate(generate)]
    rows.sort(key=lambda row: (row["step"], row["event"] == "step"))
    rows.append({"event": "summary", "step": len(generate), "train_runtime": 99.0})
    (folder / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))


def test_an_rl_teachers_training_figures_are_averaged_over_each_10_steps_in_turn(tmp_path):
    """23 steps of reward -4, -3, ..., 18: the means of steps 1-10, 11-20 and 21-23 (whether the reward still rose
    when the run stopped), beside the first and last 10."""
    root, out = tmp_path / "study", tmp_path / "teachers.json"
    _rl_teacher(root, "rl_s0", 0, "worked", [(0, -6.0), (23, -2.0)], [10.0] * 23)
    assert _teachers(root, out).returncode == 0
    rl = json.loads(out.read_text())["teachers"]["rl_s0"]
    assert rl["by_10_steps"]["reward"] == [0.5, 10.5, 17.0]
    assert rl["first_last_10"]["reward"] == [0.5, 13.5]


def _distill_row(question: str, template: int, total: float, r_ss: float, r_kl: float, matched: bool, wrong: int,
                 explanation: str) -> dict:
    return {"question": question, "solution": f"{question} solved", "explanation": explanation, "template": template,
            "r_ss": r_ss, "r_kl": r_kl, "total": total, "matched": matched, "wrong_equations": wrong}


def _write_rows(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def _teachers_root(root: Path) -> None:
    """A hand-made teachers part: the SFT teacher, rl_s0 (4 of max_steps 4, 3 evaluations), an unfinished rl_s1,
    rl_s2 stopped by trainer.max_minutes at step 3 of 10 with final/ left out (its README says the teacher is in
    final/), the answer-only teacher; rl_s0's finished distill with its log (questions q0 q1 q2, templates 0 1 2),
    the SFT teacher's partial distill (q2 q0; distilled/sft.jsonl, which differs, is not read) and rl_s0's
    checkpoint 2's distill only as distilled/rl_step2.jsonl (q1 q2 q0): q0 and q2 are common."""
    sft = root / "teachers" / "sft"
    sft.mkdir(parents=True)
    (sft / "sft_summary.json").write_text(json.dumps({
        "steps": 60, "rows": {"train": 900, "heldout": 47}, "heldout_loss_before": 1.5,
        "heldout_curve": [{"step": 0, "eval_loss": 1.5}, {"step": 20, "eval_loss": 0.9},
                          {"step": 40, "eval_loss": 0.8}, {"step": 60, "eval_loss": 0.85}],
        "early_stopping": {"stopped_early": True, "best_step": 40, "best_heldout_loss": 0.8}}))
    _rl_teacher(root, "rl_s0", 0, "worked", [(0, -6.0), (2, -4.0), (4, -2.0)], [10.0, 12.0, 11.0, 30.0],
                trainer="max_steps: 4\nmax_minutes: 11")
    _rl_teacher(root, "rl_s1", 1, "worked", [(0, -5.0)], [10.0], finished=False,
                steps_done="1 of 10: stopped, or still running")
    _rl_teacher(root, "rl_s2", 2, "worked", [(0, -4.0), (3, -1.0)], [10.0, 10.0, 10.0], finished=False,
                trainer="max_steps: 10\nmax_minutes: 11",
                steps_done="3 of 10: stopped by trainer.max_minutes=11; the trained teacher is in `final/`")
    _rl_teacher(root, "rl_answer_s0", 0, "answer", [(0, -1.0), (4, -0.5)], [9.0, 9.0, 9.0, 9.0])
    # rl_s0's distill names its teacher under this root, the SFT teacher's as the GPU host did (another root)
    for name, teacher in (("rl_s0", f"{root}/teachers/rl_s0/rl/final"), ("sft", "/host/study/teachers/sft/final")):
        distill = root / "teachers" / f"distill_{name}"
        distill.mkdir()
        (distill / "config.yaml").write_text(f"model:\n  model_name_or_path: {teacher}\n"
                                             "data:\n  gsm_solution: worked\n")
    _write_rows(root / "teachers" / "distill_rl_s0" / "distill.jsonl", [
        _distill_row("q0", 0, -3.0, -1.0, 2.0, True, 0, "abcd"),
        _distill_row("q1", 1, -4.0, -1.0, 3.0, False, 1, "x" * 10),
        _distill_row("q2", 2, -6.5, -1.0, 4.0, False, 2, "abcdefgh")])
    _write_rows(root / "teachers" / "distill_sft" / "distill.jsonl", [
        _distill_row("q2", 2, -5.0, -2.0, 3.0, True, 0, "y" * 12),
        _distill_row("q0", 0, -6.0, -3.0, 3.0, True, 0, "abc")])
    _write_rows(root / "distilled" / "sft.jsonl", [_distill_row(f"q{i}", i, 0.0, 0.0, 0.0, True, 0, "z")
                                                   for i in range(3)])
    _write_rows(root / "distilled" / "rl_step2.jsonl", [
        _distill_row("q1", 1, -1.0, -1.5, 0.5, True, 0, "w" * 100),
        _distill_row("q2", 2, -2.0, -1.0, 1.0, False, 0, "abcde"),
        _distill_row("q0", 0, -3.0, -0.5, 2.5, True, 3, "abcdef")])
    (root / "logs").mkdir()
    (root / "logs" / "distill_rl_s0.log").write_text(
        "2026-11-27 19:48:00,000 INFO rlt_mono.stages.distill: distill: 0 already written, 3 to explain\n"
        f"2026-11-27 19:48:01,443 INFO rlt_mono.stages.distill: distill: wrote 3 questions to {root}/teachers/"
        "distill_rl_s0/distill.jsonl (phase/generate/seconds 2.0, phase/score/seconds 5.3)\n")
    # the SFT teacher's distill stopped part-way: its log has no end line
    (root / "logs" / "distill_sft.log").write_text(
        "2026-11-27 19:48:00,000 INFO rlt_mono.stages.distill: distill: 0 already written, 3 to explain\n"
        "2026-11-27 19:48:09,000 INFO rlt_mono.stages.distill: distill: 2/3 questions\n")


# The common block of _teachers_root's q0 and q2, by hand: rl_s0 (-3, -6.5), sft (-6, -5), rl_step2 (-3, -2)
COMMON = {"questions": 2, "templates": 2, "distills": {
    "rl_s0": {"mean_total": -4.75, "mean_r_ss": -1.0, "mean_r_kl": 3.0, "matched_frac": 0.5,
              "wrong_equations_frac": 0.5, "mean_explanation_chars": 6.0},
    "rl_step2": {"mean_total": -2.5, "mean_r_ss": -0.75, "mean_r_kl": 1.75, "matched_frac": 0.5,
                 "wrong_equations_frac": 0.5, "mean_explanation_chars": 5.5},
    "sft": {"mean_total": -5.5, "mean_r_ss": -2.5, "mean_r_kl": 3.0, "matched_frac": 1.0,
            "wrong_equations_frac": 0.0, "mean_explanation_chars": 7.5}}}


def _teachers(root: Path, out: Path, commit: str = "abc1234"):
    return _run("teachers", root, "--out", out, "--device", "H100", "--commit", commit, "--command", "bash x.sh")


def test_the_teachers_file_holds_each_finished_teachers_curve_steps_and_phase_medians(tmp_path):
    root, out = tmp_path / "study", tmp_path / "results" / "teachers.json"
    _teachers_root(root)
    # a common block already in the file is replaced by the root's, not merged into
    out.parent.mkdir()
    out.write_text(json.dumps({"teachers": {}, "distills": {}, "common": {
        "questions": 9, "templates": 1, "distills": {"old": {"mean_total": 1.0}}}}))
    result = _teachers(root, out)
    assert result.returncode == 0, result.stderr
    assert result.stdout == (f"{out}: added teacher sft, teacher rl_answer_s0, teacher rl_s0, teacher rl_s2, "
                             "distill rl_s0, distill sft; already there: none; common: 2 questions of 2 templates, "
                             "3 distills\n")
    # rl_s1 has no final/ and its README says it did not save a teacher: left out with a warning naming it
    assert (f"WARNING: {root / 'teachers' / 'rl_s1' / 'rl'}: no final/ and its README.md does not say the trained "
            "teacher is in final/ (not finished): left out") in result.stderr
    # the SFT teacher's distill has no end line: kept as partial, with a warning
    assert (f"WARNING: {root / 'teachers' / 'distill_sft'}: not finished (no end line in "
            f"{root / 'logs' / 'distill_sft.log'}): kept as partial (2 rows)") in result.stderr
    saved = json.loads(out.read_text())
    assert sorted(saved["teachers"]) == ["rl_answer_s0", "rl_s0", "rl_s2", "sft"]
    rl = saved["teachers"]["rl_s0"]
    assert rl["eval_reward_curve"] == [[0, -6.0], [2, -4.0], [4, -2.0]]
    assert rl["eval_reward_parts"] == {"r_ss": [[0, -3.0], [2, -2.0], [4, -1.0]],
                                       "r_kl": [[0, 2.0], [2, 1.0], [4, 0.0]],
                                       "match_penalty": [[2, -1.0], [4, -1.0]]}
    assert rl["median_seconds_per_step"] == {"generate": 11.5, "score": 2.5, "train": 6.5}
    # 4 steps: the first and the last 10 are all of them; no step logged the reward's parts: left out
    assert rl["first_last_10"] == {"reward": [-2.5, -2.5], "unmatched_frac": [0.5, 0.5]}
    assert rl["by_10_steps"] == {"reward": [-2.5], "unmatched_frac": [0.5]}
    assert (rl["median_step_seconds"], rl["peak_device_gib"]) == (11.5, 33.0)
    assert (rl["steps"], rl["completions_per_step"], rl["completions"], rl["generation_batch"]) == (4, 256, 1024, 256)
    assert (rl["seed"], rl["reward_setting"], rl["checkpoints"]) == (0, "worked", [2])
    assert (rl["device"], rl["commit"], rl["command"]) == ("H100", "abc1234", "bash x.sh")
    # every step done under a time limit: not stopped by it; no max_steps configured: not stopped either
    assert (rl["max_steps"], rl["stopped_by_time_limit"]) == (4, False)
    assert saved["teachers"]["rl_answer_s0"]["reward_setting"] == "answer"
    assert (saved["teachers"]["rl_answer_s0"]["max_steps"], saved["teachers"]["rl_answer_s0"]["stopped_by_time_limit"]
            ) == (None, False)
    # rl_s2's final/ was left out of the archive; its README says where the teacher was: exported, stopped at 3 of 10
    stopped = saved["teachers"]["rl_s2"]
    assert (stopped["steps"], stopped["max_steps"], stopped["stopped_by_time_limit"]) == (3, 10, True)
    assert (stopped["eval_reward_curve"], stopped["completions"]) == ([[0, -4.0], [3, -1.0]], 768)
    sft = saved["teachers"]["sft"]
    assert (sft["steps"], sft["heldout_loss_first"], sft["heldout_loss_best"], sft["best_step"]) == (60, 1.5, 0.8, 40)
    distill = saved["distills"]["rl_s0"]
    assert (distill["teacher"], distill["rows"], distill["mean_total"]) == ("rl_s0/rl/final", 3, -4.5)
    assert (distill["complete"], distill["seconds"]) == (True, {"generate": 2.0, "score": 5.3})
    partial = saved["distills"]["sft"]  # teachers/distill_sft/distill.jsonl, not distilled/sft.jsonl
    assert (partial["teacher"], partial["rows"], partial["mean_total"]) == ("sft/final", 2, -5.5)
    assert (partial["complete"], partial["seconds"]) == (False, {})
    assert saved["common"] == COMMON
    assert len(out.read_text()) < 6000


def test_a_checkpoint_that_explained_is_listed_with_its_teacher_though_its_folder_was_not_sent_back(tmp_path):
    root, out = tmp_path / "study", tmp_path / "teachers.json"
    _teachers_root(root)
    shutil.rmtree(root / "teachers" / "rl_s0" / "rl" / "checkpoint-2")  # an archive leaves the weights out
    distill = root / "teachers" / "distill_rl_step3"
    distill.mkdir()
    (distill / "config.yaml").write_text("model:\n  model_name_or_path: /host/study/teachers/rl_s0/rl/checkpoint-3\n"
                                         "data:\n  gsm_solution: worked\n")
    _write_rows(distill / "distill.jsonl", [_distill_row("q0", 0, -2.0, -1.0, 1.0, True, 0, "ab")])
    result = _teachers(root, out)
    assert result.returncode == 0, result.stderr
    saved = json.loads(out.read_text())
    assert saved["distills"]["rl_step3"]["teacher"] == "rl_s0/rl/checkpoint-3"
    # rl_s0's checkpoint 3 from the distill's teacher; checkpoint 2 neither in the folder nor explained with
    assert saved["teachers"]["rl_s0"]["checkpoints"] == [3]
    assert saved["teachers"]["rl_answer_s0"]["checkpoints"] == [2]


def test_common_writes_each_distills_rows_of_the_questions_every_distill_explained(tmp_path):
    root, out = tmp_path / "study", tmp_path / "common"
    _teachers_root(root)
    result = _run("common", root, "--out", out)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "".join(f"{out / name}.jsonl.gz: 2 rows\n" for name in ("rl_s0", "rl_step2", "sft"))
    assert sorted(p.name for p in out.iterdir()) == ["rl_s0.jsonl.gz", "rl_step2.jsonl.gz", "sft.jsonl.gz"]
    written = {name: [json.loads(line) for line in gzip.decompress((out / f"{name}.jsonl.gz").read_bytes())
                      .decode().splitlines()] for name in ("rl_s0", "rl_step2", "sft")}
    # q0 and q2 in every file, sorted by question id (the same order in each, whatever order the distill wrote), each
    # row as the distill wrote it after its question id
    ids = {question: hashlib.sha256(question.encode()).hexdigest()[:12] for question in ("q0", "q2")}
    assert sorted(ids, key=ids.get) == ["q0", "q2"]
    assert {name: [(row["question_id"], row["question"]) for row in rows] for name, rows in written.items()} == {
        name: [(ids["q0"], "q0"), (ids["q2"], "q2")] for name in written}
    distilled = [json.loads(line) for line in
                 (root / "teachers" / "distill_sft" / "distill.jsonl").read_text().splitlines()]  # q2, q0
    assert written["sft"] == [{"question_id": ids[row["question"]], **row} for row in distilled[::-1]]
    assert list(written["sft"][0]) == ["question_id", *distilled[0]]


def _kept(tmp_path: Path) -> tuple[Path, Path, Path]:
    """``_teachers_root`` as a teachers part's machine sends it back (``study.tgz`` and the distilled parts unpacked
    into one root: the study's commit and command beside the teachers), its students' files (``common``) and the
    explanations ``keep`` kept of it."""
    root, common, kept = tmp_path / "study", tmp_path / "common", tmp_path / "study_data" / "explanations"
    _teachers_root(root)
    (root / "commit").write_text("abc1234def\n")
    (root / "command").write_text("STUDY_RL_MINUTES=11 bash offline_host/gpu_pipeline.sh fair teachers 0,1,2\n")
    assert _run("common", root, "--out", common).returncode == 0
    result = _run("keep", root, "--out", kept)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "".join(f"{kept / name}.jsonl.xz: 2 rows, kept\n" for name in ("rl_s0", "rl_step2", "sft"))
    return root, common, kept


def test_the_kept_explanations_are_the_students_rows_and_restore_rebuilds_their_files_byte_for_byte(tmp_path):
    root, common, kept = _kept(tmp_path)
    manifest = json.loads((kept / "manifest.json").read_text())["teachers"]
    assert sorted(p.name for p in kept.iterdir()) == ["manifest.json", "rl_s0.jsonl.xz", "rl_step2.jsonl.xz",
                                                      "sft.jsonl.xz"]
    for name, entry in manifest.items():
        rows = lzma.decompress((kept / f"{name}.jsonl.xz").read_bytes())
        assert rows == gzip.decompress((common / f"{name}.jsonl.gz").read_bytes())  # what the students read
        assert (entry["file"], entry["rows"], entry["sha256"]) == (f"{name}.jsonl.xz", 2, hashlib.sha256(rows)
                                                                   .hexdigest())
        assert (entry["commit"], entry["command"]) == ("abc1234def", "STUDY_RL_MINUTES=11 bash offline_host/"
                                                                     "gpu_pipeline.sh fair teachers 0,1,2")
    # the teacher below teachers/, its training run's config and its distill's, where the root has them
    rl = manifest["rl_s0"]
    assert rl["teacher"] == "rl_s0/rl/final"
    assert (rl["config"]["training"]["seed"], rl["config"]["training"]["trainer"]["max_minutes"]) == (0, 11)
    assert rl["config"]["distill"]["data"] == {"gsm_solution": "worked"}
    assert manifest["sft"]["teacher"] == "sft/final" and manifest["sft"]["config"]["training"] is None
    assert manifest["rl_step2"]["teacher"] is None and manifest["rl_step2"]["config"] == {"training": None,
                                                                                          "distill": None}

    restored = tmp_path / "restored"
    result = _run("restore", kept, "--out", restored)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "".join(f"{restored / name}.jsonl.gz: 2 rows\n" for name in ("rl_s0", "rl_step2", "sft"))
    assert sorted(p.name for p in restored.iterdir()) == sorted(p.name for p in common.iterdir())
    for path in common.iterdir():
        assert (restored / path.name).read_bytes() == path.read_bytes()
    # a second keep of the same rows changes nothing
    again = _run("keep", root, "--out", kept)
    assert again.returncode == 0 and again.stdout.endswith(f"{kept / 'sft'}.jsonl.xz: 2 rows, already kept\n")
    assert json.loads((kept / "manifest.json").read_text())["teachers"] == manifest


def test_a_second_keep_of_other_rows_for_a_teacher_is_one_line_unless_replaced(tmp_path):
    root, _, kept = _kept(tmp_path)
    before = {path.name: path.read_bytes() for path in kept.iterdir()}
    sft = root / "teachers" / "distill_sft" / "distill.jsonl"
    sft.write_text(sft.read_text().replace('"abc"', '"abC"'))
    refused = _run("keep", root, "--out", kept)
    held = json.loads((kept / "manifest.json").read_text())["teachers"]["sft"]["sha256"]
    assert refused.returncode == 2 and refused.stdout == ""
    assert refused.stderr.startswith(f"error: {kept / 'sft.jsonl.xz'}: sft is kept already with other rows (sha256 "
                                     f"{held[:12]}, these ") and refused.stderr.count("\n") == 1
    assert refused.stderr.endswith("): keep these into another folder, or pass --replace\n")
    assert {path.name: path.read_bytes() for path in kept.iterdir()} == before  # nothing written
    replaced = _run("keep", root, "--out", kept, "--replace")
    assert replaced.returncode == 0 and f"{kept / 'sft'}.jsonl.xz: 2 rows, replaced\n" in replaced.stdout
    assert "abC" in lzma.decompress((kept / "sft.jsonl.xz").read_bytes()).decode()


def test_keep_as_keeps_a_teacher_of_another_part_under_its_own_name(tmp_path):
    """The 48K RL teacher's part names it rl_s0 in its root, beside a kept rl_s0: --as keeps it as rl_full_s0, the
    teacher rl_teacher_full's students read; the entry says which distill of the root it was."""
    root, _, kept = _kept(tmp_path)
    held = json.loads((kept / "manifest.json").read_text())["teachers"]
    result = _run("keep", root, "--out", kept, "--as", "rl_s0=rl_full_s0")
    assert result.returncode == 0, result.stderr
    assert f"{kept / 'rl_full_s0'}.jsonl.xz: 2 rows, kept\n" in result.stdout
    assert f"{kept / 'sft'}.jsonl.xz: 2 rows, already kept\n" in result.stdout and "rl_s0.jsonl" not in result.stdout
    manifest = json.loads((kept / "manifest.json").read_text())["teachers"]
    assert manifest["rl_full_s0"]["distill_in_root"] == "rl_s0" and "distill_in_root" not in manifest["rl_s0"]
    assert manifest["rl_full_s0"]["sha256"] == held["rl_s0"]["sha256"]  # the same rows, under another name
    assert manifest["rl_full_s0"]["teacher"] == "rl_s0/rl/final" and manifest["rl_s0"] == held["rl_s0"]
    sys.path.insert(0, str(SCRIPT.parent))
    from study.layout import _arm_distill, _kept_teacher
    assert _arm_distill("rl_teacher_full", 1) == ("rl_full_s1", "rl_full_s1")
    assert _kept_teacher("rl_teacher_full", 0) == "rl_full_s0"
    for names, message in ((["rl_s9=rl_full_s9"], "no distill rl_s9 to keep under another name (it has rl_s0, "
                                                  "rl_step2, sft)"),
                           (["rl_s0"], "--as rl_s0: each DISTILL=NAME, both named"),
                           (["rl_s0="], "--as rl_s0=: each DISTILL=NAME, both named")):
        refused = _run("keep", root, "--out", kept, *[word for name in names for word in ("--as", name)])
        assert refused.returncode == 2 and message in refused.stderr and refused.stderr.count("\n") == 1


def test_the_full_rl_teachers_students_are_compared_with_the_short_rl_and_the_sft_teachers(tmp_path):
    root = tmp_path / "study"
    n = 100
    _eval_folder(root, "s", "sft_teacher_s0", {"instances": [i % 2 == 0 for i in range(n)]})      # 0.50
    _eval_folder(root, "s", "rl_teacher_s0", {"instances": [i % 5 != 0 for i in range(n)]})       # 0.80
    _eval_folder(root, "s", "rl_teacher_full_s0", {"instances": [i % 10 != 0 for i in range(n)]})  # 0.90
    result, out = _summarize(tmp_path, root)
    assert result.returncode == 0, result.stderr
    student = json.loads((out / "study.json").read_text())["students"]["s"]
    assert list(student["arms"]) == ["sft_teacher", "rl_teacher", "rl_teacher_full"]
    differences = student["differences"]
    assert differences["rl_teacher_full - rl_teacher"]["held_out_instances"]["difference"] == 0.1
    assert differences["rl_teacher_full - sft_teacher"]["held_out_instances"]["difference"] == 0.4


def test_replace_refuses_to_narrow_the_kept_questions_to_a_partial_distills(tmp_path):
    """A later part whose checkpoint distill stopped early narrows the questions every distill explained: --replace
    would then keep every teacher, the SFT teacher's too, on fewer questions. Refused, nothing written."""
    root, _, kept = _kept(tmp_path)
    before = {path.name: path.read_bytes() for path in kept.iterdir()}
    _write_rows(root / "distilled" / "rl_step2.jsonl", [_distill_row("q0", 0, -3.0, -0.5, 2.5, True, 3, "abcdef")])
    refused = _run("keep", root, "--out", kept, "--replace")
    assert (refused.returncode, refused.stderr) == (
        2, f"error: {kept / 'rl_s0.jsonl.xz'}: --replace would keep rl_s0 on 1 of its 2 kept questions: a distill in "
           f"{root} that explained fewer questions (a partial one) narrows the questions every distill explained; "
           "move it out of the root, or keep into another folder\n")
    assert {path.name: path.read_bytes() for path in kept.iterdir()} == before


def test_restore_checks_each_kept_file_against_its_sha256_and_overwrites_no_other_rows(tmp_path):
    _, common, kept = _kept(tmp_path)
    # other rows in the folder restored into: refused
    out = tmp_path / "restored"
    out.mkdir()
    (out / "sft.jsonl.gz").write_bytes(gzip.compress(b'{"question": "q9"}\n'))
    refused = _run("restore", kept, "--out", out)
    assert refused.returncode == 2 and refused.stderr == (f"error: {out / 'sft.jsonl.gz'}: holds other rows than the "
                                                          "kept ones: restore into an empty folder\n")
    # a kept file that is not the one the manifest names
    (kept / "rl_s0.jsonl.xz").write_bytes(lzma.compress(b'{"question": "q0"}\n'))
    broken = _run("restore", kept, "--out", tmp_path / "elsewhere")
    assert broken.returncode == 2 and broken.stderr.startswith(f"error: {kept / 'rl_s0.jsonl.xz'}: its rows are not "
                                                               "the ones kept (sha256 ")
    assert not (tmp_path / "elsewhere").exists()
    nothing = _run("restore", tmp_path / "none", "--out", out)
    assert nothing.returncode == 2 and nothing.stderr == (f"error: {tmp_path / 'none'}: no manifest.json naming kept "
                                                          "explanations (bench/study_fair.py keep <root> --out "
                                                          f"{tmp_path / 'none'} writes them)\n")


def test_the_students_part_takes_the_kept_explanations_when_its_distilled_folder_holds_none(tmp_path):
    _, common, kept = _kept(tmp_path)
    root, student = tmp_path / "students", "qwen2.5_coder_0.5b_instruct"
    root.mkdir()
    (root / "commit").write_text("abc1234\n")
    # the arm's answers are committed already: no student trains, the explanations are still laid out
    _eval_folder(tmp_path / "earlier", student, "rl_teacher_s0", {"instances": [True]})
    assert _run("export", tmp_path / "earlier", "--out", tmp_path / "answers", "--device", "d", "--commit",
                "abc1234", "--command", "x").returncode == 0
    env = {"STUDY_ARMS": "rl_teacher", "STUDY_ANSWERS": str(tmp_path / "answers"), "STUDY_EXPLANATIONS": str(kept)}
    run = _fair_sh("students", root, "0", timeout=300, env=env)
    assert run.returncode == 0, run.stdout + run.stderr
    distilled = root / "distilled"
    for path in common.iterdir():
        assert (distilled / path.name).read_bytes() == path.read_bytes()
        assert (distilled / path.name.removesuffix(".gz")).read_bytes() == gzip.decompress(path.read_bytes())
    # a distilled folder that holds explanations is left as it is; one of a kept teacher's name with other rows
    # (a raw distill unpacked there, say) stops the part before any student trains on it
    (distilled / "sft.jsonl.gz").unlink()
    (distilled / "sft.jsonl").write_text("{}\n")
    (root / "DONE").unlink()
    again = _fair_sh("students", root, "0", timeout=300, env={**env, "STUDY_ARMS": "sft_teacher"})
    assert again.returncode == 0 and not (distilled / "sft.jsonl.gz").exists()
    assert (distilled / "sft.jsonl").read_text() == "{}\n"
    assert (root / "DONE").read_text().startswith("students=1 ")
    assert (f"error: {distilled / 'sft.jsonl'} holds other rows than the kept sft ({kept}): remove it, or write it "
            f"again with bench/study_fair.py restore {kept} --out <an empty folder>\n") in again.stderr
    assert not (root / student / "sft_teacher_s0").exists()


def test_a_teachers_part_whose_sft_distill_put_in_first_is_not_the_kept_one_trains_nothing(tmp_path):
    kept, root = tmp_path / "kept", tmp_path / "study"
    _kept_folder(kept, {"sft": {"q0": -4.0, "q1": -5.0}})
    _traces(root)
    (root / "distilled").mkdir()
    (root / "distilled" / "sft.jsonl").write_text('{"question": "another part\'s SFT explanation"}\n')
    run = _fair_sh("teachers", root, "0", timeout=300,
                   env={"STUDY_ANSWER_ONLY": "0", "STUDY_SFT_DISTILL": "after", "STUDY_EXPLANATIONS": str(kept)})
    assert (root / "DONE").read_text().startswith("teachers=1 "), run.stdout + run.stderr
    assert f"{root / 'distilled' / 'sft.jsonl'} holds other rows than the kept sft" in run.stderr
    assert not (root / "teachers").exists()


def test_a_teachers_part_run_again_on_its_root_passes_its_own_distills_of_kept_teachers(tmp_path):
    """A teachers part resumed on its root finds its own distills (raw rows, copied to distilled/) of teachers kept
    with other rows: its own output, not a file put in, so it runs (its finished runs skipped); another file of a
    kept teacher's name still stops it."""
    kept, root = tmp_path / "kept", tmp_path / "study"
    _kept_folder(kept, {"sft": {"q0": -4.0, "q1": -5.0}, "rl_s0": {"q0": -1.0}})
    _traces(root)
    env = {"STUDY_ANSWER_ONLY": "0", "STUDY_SFT_DISTILL": "after", "STUDY_EXPLANATIONS": str(kept)}
    first = _fair_sh("teachers", root, "0", timeout=600, env=env)
    assert (root / "DONE").read_text().startswith("teachers=0 "), first.stdout + first.stderr
    assert {"sft.jsonl", "rl_s0.jsonl"} <= {path.name for path in (root / "distilled").iterdir()}
    again = _fair_sh("teachers", root, "0", timeout=600, env=env)
    assert (root / "DONE").read_text().startswith("teachers=0 "), again.stdout + again.stderr
    assert "holds other rows" not in again.stderr
    (root / "distilled" / "rl_s0.jsonl").write_text('{"question": "another part\'s RL explanation"}\n')
    third = _fair_sh("teachers", root, "0", timeout=600, env=env)
    assert (root / "DONE").read_text().startswith("teachers=1 "), third.stdout + third.stderr
    assert f"{root / 'distilled' / 'rl_s0.jsonl'} holds other rows than the kept rl_s0" in third.stderr
    assert "kept sft" not in third.stderr


def test_check_distilled_takes_the_kept_rows_whole_or_as_restored_and_names_any_other(tmp_path):
    """A file of a kept teacher's name must hold that teacher's kept rows: the whole kept file (an SFT distill put
    in a teachers part first) or its rows of the questions every kept teacher explained (what restore writes)."""
    kept = tmp_path / "kept"
    _kept_folder(kept, {"sft": {"q0": -4.0, "q1": -5.0}, "rl_s0": {"q0": -1.0}})  # rl_s0 explained q0 alone
    whole, restored = tmp_path / "whole", tmp_path / "restored"
    whole.mkdir()
    (whole / "sft.jsonl").write_bytes(lzma.decompress((kept / "sft.jsonl.xz").read_bytes()))  # q0 and q1
    (whole / "rl_s9.jsonl").write_text("a teacher not kept: not checked\n")
    assert _run("restore", kept, "--out", restored).returncode == 0
    (restored / "sft.jsonl").write_bytes(gzip.decompress((restored / "sft.jsonl.gz").read_bytes()))  # q0 alone
    assert len((restored / "sft.jsonl").read_text().splitlines()) == 1
    for folder in (whole, restored):
        result = _run("check-distilled", kept, folder)
        assert (result.returncode, result.stderr) == (0, ""), folder
    (whole / "rl_s0.jsonl").write_bytes((whole / "sft.jsonl").read_bytes())  # the SFT teacher's rows as rl_s0's
    result = _run("check-distilled", kept, whole)
    assert (result.returncode, result.stderr) == (
        2, f"error: {whole / 'rl_s0.jsonl'} holds other rows than the kept rl_s0 ({kept}): remove it, or write it "
           f"again with bench/study_fair.py restore {kept} --out <an empty folder>\n")


def test_an_empty_common_set_is_one_line_and_writes_nothing(tmp_path):
    root, out = tmp_path / "study", tmp_path / "common"
    _write_rows(root / "teachers" / "distill_rl_s0" / "distill.jsonl", [_distill_row("q0", 0, -1.0, -1.0, 0.0, True, 0,
                                                                                    "a")])
    _write_rows(root / "distilled" / "sft.jsonl", [_distill_row("q1", 1, -1.0, -1.0, 0.0, True, 0, "a")])
    result = _run("common", root, "--out", out)
    assert result.returncode == 2 and result.stderr == (f"error: {root}: no question every distill explained "
                                                        "(rl_s0, sft): nothing written\n")
    assert not out.exists()


def test_the_teachers_file_is_merged_into_and_a_teacher_is_added_once(tmp_path):
    first, later, out = tmp_path / "first", tmp_path / "later", tmp_path / "teachers.json"
    _rl_teacher(first, "rl_s0", 0, "worked", [(0, -6.0), (4, -2.0)], [10.0, 10.0, 10.0, 10.0])
    _rl_teacher(later, "rl_s1", 1, "worked", [(0, -5.0), (4, -3.0)], [20.0, 20.0, 20.0, 20.0])
    assert _teachers(first, out, commit="aaa").returncode == 0
    merged = _teachers(later, out, commit="bbb")
    assert merged.returncode == 0 and merged.stdout.endswith("added teacher rl_s1; already there: none\n")
    saved = json.loads(out.read_text())["teachers"]
    assert {name: entry["commit"] for name, entry in saved.items()} == {"rl_s0": "aaa", "rl_s1": "bbb"}
    assert saved["rl_s0"]["eval_reward_curve"] == [[0, -6.0], [4, -2.0]]
    # the same teacher again (another commit, same figures) is already there; other figures are refused
    again = _teachers(first, out, commit="ccc")
    assert again.returncode == 0 and again.stdout.endswith("added nothing; already there: teacher rl_s0\n")
    metrics = first / "teachers" / "rl_s0" / "rl" / "metrics.jsonl"
    metrics.write_text(metrics.read_text().replace('"eval_reward": -2.0', '"eval_reward": -2.5'))
    changed = _teachers(first, out, commit="ddd")
    assert changed.returncode == 2 and changed.stderr == (
        f"error: {out} has teacher rl_s0 already, from commit aaa on H100, with other figures: one is added "
        "once (delete its entry to replace it)\n")
    assert json.loads(out.read_text())["teachers"]["rl_s0"]["commit"] == "aaa"


def test_a_root_without_teachers_is_one_line(tmp_path):
    (tmp_path / "study").mkdir()
    result = _teachers(tmp_path / "study", tmp_path / "teachers.json")
    assert result.returncode == 2 and result.stderr == (f"error: no teachers/ under {tmp_path / 'study'}: pass the "
                                                        "root the teachers part of bench/study_fair.sh wrote\n")
    assert not (tmp_path / "teachers.json").exists()
    missing = _run("summarize", tmp_path / "study", "--out", tmp_path / "out", "--teachers", tmp_path / "no.json")
    assert missing.returncode == 2 and missing.stderr.count("\n") == 1
    assert missing.stderr.startswith(f"error: --teachers {tmp_path / 'no.json'}: no such file")


def _correct(accuracy: float, n: int = 20) -> list[bool]:
    return [i < round(accuracy * n) for i in range(n)]


def _curves(**curves) -> dict:
    return {"teachers": {name: {"reward_setting": "answer" if "answer" in name else "worked",
                                "eval_reward_curve": curve} for name, curve in curves.items()}}


def test_the_teachers_plot_draws_each_rl_teachers_held_out_curves_from_the_parts_files(tmp_path):
    """teachers-plot merges the parts' files and draws every RL teacher with two or more evaluations (a teacher of
    one evaluation, and the SFT teacher, have no curve), in 64 colours; files with no curve are one line."""
    from PIL import Image

    part0, part1 = tmp_path / "teachers_s0.json", tmp_path / "teachers_s1.json"
    first = _curves(rl_s0=[[0, -2.7], [25, -2.6], [50, -2.5]])
    first["teachers"]["rl_s0"]["eval_reward_parts"] = {"r_ss": [[0, -1.85], [25, -1.86], [50, -1.85]],
                                                       "r_kl": [[0, 0.83], [25, 0.72], [50, 0.63]]}
    first["teachers"]["sft"] = {"steps": 171}
    part0.write_text(json.dumps(first))
    part1.write_text(json.dumps(_curves(rl_s1=[[0, -2.7], [25, -2.58]], rl_answer_s0=[[0, -5.1]])))
    out = tmp_path / "teachers.png"
    drawn = _run("teachers-plot", part0, part1, "--out", out)
    assert (drawn.returncode, drawn.stdout) == (0, f"{out}: rl_s0, rl_s1\n"), drawn.stderr
    image = Image.open(out)
    assert image.format == "PNG" and image.mode == "P" and len(image.getcolors()) <= 64
    assert image.size[0] > 2 * image.size[1]  # three panels side by side
    flat = tmp_path / "flat.json"
    flat.write_text(json.dumps(_curves(rl_s0=[[0, -2.7]])))
    refused = _run("teachers-plot", flat, "--out", tmp_path / "none.png")
    assert (refused.returncode, refused.stderr) == (
        2, "error: no RL teacher with a held-out curve of two or more evaluations in these teachers files\n")
    assert not (tmp_path / "none.png").exists()


def test_the_teachers_plot_draws_two_runs_of_one_teacher_side_by_side_under_their_tags(tmp_path):
    """Two files holding one teacher name with other figures (a seed trained in bfloat16, then in float32) are
    refused as one study, but drawn side by side under --tags; a tag count that is not the file count is refused."""
    bf16, fp32 = tmp_path / "bf16.json", tmp_path / "fp32.json"
    bf16.write_text(json.dumps(_curves(rl_s0=[[0, -2.7], [25, -2.6]])))
    fp32.write_text(json.dumps(_curves(rl_s0=[[0, -2.7], [25, -2.4]])))
    out = tmp_path / "teachers.png"
    merged = _run("teachers-plot", bf16, fp32, "--out", out)
    assert merged.returncode == 2 and "rl_s0 is in two files with other figures" in merged.stderr
    drawn = _run("teachers-plot", bf16, fp32, "--tags", "bfloat16,float32", "--out", out)
    assert (drawn.returncode, drawn.stdout) == (0, f"{out}: rl_s0 bfloat16, rl_s0 float32\n"), drawn.stderr
    assert out.is_file()
    wrong = _run("teachers-plot", bf16, fp32, "--tags", "bfloat16", "--out", tmp_path / "wrong.png")
    assert (wrong.returncode, wrong.stderr) == (
        2, "error: --tags bfloat16: one distinct label per teachers file (2 given)\n")
    assert not (tmp_path / "wrong.png").exists()


def test_the_correlation_of_teacher_reward_and_student_accuracy_is_computed_over_the_points(tmp_path):
    root, out = tmp_path / "study", tmp_path / "out"
    # points (teacher reward, accuracy on held-out instances): sft_teacher (mean of the step-0 rewards -6, -5, -4:
    # -5, 0.30), rl_teacher s0 (-2, 0.50), s1 (-3, 0.60), s2 (-1, 0.55), rl_teacher_step2 (rl_s0 at step 2: -4, 0.40).
    # Pearson by hand: x - mean = (-2, 1, 0, 2, -1), y - mean = (-.17, .03, .13, .08, -.07): 0.60 / sqrt(10 x 0.058)
    # = 0.788; the ranks (1, 4, 3, 5, 2) and (1, 3, 5, 4, 2): rho = 1 - 6 x 6 / (5 x 24) = 0.7
    for arm, accuracy in (("sft_teacher_s0", 0.30), ("rl_teacher_s0", 0.50), ("rl_teacher_s1", 0.60),
                          ("rl_teacher_s2", 0.55), ("rl_teacher_step2_s0", 0.40), ("rl_teacher_answer_only_s0", 0.9),
                          ("untrained", 0.1)):
        # held-out templates: only two arms, too few points there
        sets = {"instances": _correct(accuracy), **({"templates": _correct(accuracy)} if arm in (
            "sft_teacher_s0", "rl_teacher_step2_s0") else {})}
        _eval_folder(root, "s", arm, sets)
    out.mkdir()
    (out / "teachers.json").write_text(json.dumps(_curves(
        rl_s0=[[0, -6.0], [2, -4.0], [4, -2.0]], rl_s1=[[0, -5.0], [4, -3.0]], rl_s2=[[0, -4.0], [4, -1.0]],
        rl_answer_s0=[[0, -0.5], [4, -0.1]])))
    result = _run("summarize", root, "--out", out, "--resamples", 400)  # the teachers file in --out by default
    assert result.returncode == 0, result.stderr
    study = json.loads((out / "study.json").read_text())
    assert {"commit", "commands", "device", "students", "teachers"} <= set(study)
    assert study["teachers"] == [str(out / "teachers.json")]
    entry = study["students"]["s"]
    assert {"arms", "positive_control", "differences", "correlation"} <= set(entry)
    correlation = entry["correlation"]
    assert [(p["arm"], p["teacher"], p["teacher_reward"], p["seeds"], p["held_out_instances"])
            for p in correlation["points"]] == [
        ("sft_teacher", "sft", -5.0, [0], 0.3), ("rl_teacher", "rl_s0", -2.0, [0], 0.5),
        ("rl_teacher", "rl_s1", -3.0, [1], 0.6), ("rl_teacher", "rl_s2", -1.0, [2], 0.55),
        ("rl_teacher_step2", "rl_s0", -4.0, [0], 0.4)]
    assert correlation["points"][0]["reward_from"] == "step 0 of rl_s0, rl_s1, rl_s2 (mean)"
    assert correlation["x"] == "the teacher's held-out reward (eval_reward)"  # no common block in the file
    assert correlation["points"][4]["reward_step"] == 2 and correlation["points"][1]["reward_step"] == 4
    instances = correlation["held_out_instances"]
    assert instances["points"] == 5 and round(instances["pearson_r"], 3) == 0.788
    assert instances["spearman_rho"] == 0.7
    low, high = instances["ci95"]["pearson_r"]
    assert -1 <= low < 0.788 < high <= 1
    # the students' answers resampled (templates, questions, seeds), the points fixed: r moves, within [-1, 1]
    by_answers = instances["ci95_answers"]["pearson_r"]
    assert -1 <= by_answers[0] < 0.788 < by_answers[1] <= 1 and instances["ci95_answers"]["pearson_r_resamples_used"]
    # four RL teachers: rl_s0 at steps 4 and 2, rl_s1, rl_s2 (the SFT teacher is not one)
    assert correlation["rl_teachers"] == 4
    # the declared reading, within the RL teachers (the SFT point left out): x - mean = (.5, -.5, 1.5, -1.5), y - mean
    # = (-.0125, .0875, .0375, -.1125): 0.175 / sqrt(5 x 0.021875) = 0.529; ranks (3, 2, 4, 1) and (2, 4, 3, 1):
    # rho = 1 - 6 x 6 / (4 x 15) = 0.4
    within = correlation["within_rl"]["held_out_instances"]
    assert within["points"] == 4 and round(within["pearson_r"], 3) == 0.529 and within["spearman_rho"] == 0.4
    assert "Within the RL teachers: held out templates: too few points (fewer than 3) (n=1); held out instances: " \
           "r +0.529 [" in (out / "study_table.md").read_text()
    assert correlation["held_out_templates"] == {"points": 2, "result": "too few points (fewer than 3)"}
    assert "rl_teacher_answer_only" in correlation["left_out"] and correlation["missing"] == []
    text = (out / "study_table.md").read_text()
    assert ("Teacher held-out reward vs student accuracy (s; points: sft_teacher, rl_teacher s0, rl_teacher s1, "
            "rl_teacher s2, rl_teacher_step2; 4 RL teachers): held out templates: too few points (fewer than 3) "
            f"(n=2); held out instances: r +0.788 [{low:+.3f}, {high:+.3f}] over points, [{by_answers[0]:+.3f}, "
            f"{by_answers[1]:+.3f}] over answers, rho +0.700 [") in text
    # the table lists the arms in the study's order
    arms = [line.split(" | ")[1] for line in text.splitlines() if line.startswith("| s |")]
    assert arms == ["untrained", "sft_teacher", "rl_teacher", "rl_teacher_answer_only", "rl_teacher_step2"]


def test_answers_that_no_resample_can_change_leave_the_correlation_where_it_is_over_answers(tmp_path):
    """Every student answers all its questions right or all wrong: no resample of templates, questions or seeds
    moves an accuracy, so r over the answers is r itself, while resampling the points still moves it."""
    root, out = tmp_path / "study", tmp_path / "out"
    for arm, right in (("sft_teacher_s0", False), ("sft_teacher_s1", False), ("rl_teacher_s0", True),
                       ("rl_teacher_s1", False), ("rl_teacher_s2", True), ("rl_teacher_step2_s0", True)):
        _eval_folder(root, "s", arm, {"instances": [right] * 20})
    out.mkdir()
    (out / "teachers.json").write_text(json.dumps(_curves(
        rl_s0=[[0, -6.0], [2, -4.0], [4, -2.0]], rl_s1=[[0, -5.0], [4, -3.0]], rl_s2=[[0, -4.0], [4, -1.0]])))
    result = _run("summarize", root, "--out", out, "--resamples", 200)
    assert result.returncode == 0, result.stderr
    correlation = json.loads((out / "study.json").read_text())["students"]["s"]["correlation"]
    # points (x, y): sft (-5, 0), rl s0 (-2, 1), s1 (-3, 0), s2 (-1, 1), step2 (-4, 1); x - mean = (-2, 1, 0, 2, -1),
    # y - mean = (-.6, .4, -.6, .4, .4): 2.0 / sqrt(10 x 1.2) = 0.5774
    instances = correlation["held_out_instances"]
    assert instances["pearson_r"] == 0.5774
    assert instances["ci95_answers"]["pearson_r"] == [0.5774, 0.5774]
    low, high = instances["ci95"]["pearson_r"]
    assert low < 0.5774 < high


def test_too_few_points_and_a_missing_teacher_are_said_not_computed(tmp_path):
    root, out = tmp_path / "study", tmp_path / "out"
    for arm, accuracy in (("rl_teacher_s0", 0.5), ("rl_teacher_s1", 0.6), ("rl_teacher_s2", 0.7)):
        _eval_folder(root, "s", arm, {"instances": _correct(accuracy)})
    teachers = tmp_path / "teachers.json"
    teachers.write_text(json.dumps(_curves(rl_s0=[[0, -6.0], [4, -2.0]], rl_s1=[[4, -3.0]], rl_s2=[])))
    result = _run("summarize", root, "--out", out, "--teachers", teachers, "--resamples", 50)
    assert result.returncode == 0, result.stderr
    correlation = json.loads((out / "study.json").read_text())["students"]["s"]["correlation"]
    assert [p["teacher"] for p in correlation["points"]] == ["rl_s0", "rl_s1"]
    assert correlation["missing"] == ["rl_teacher seed 2: no held-out reward of rl_s2 in the teachers file"]
    assert correlation["held_out_instances"] == {"points": 2, "result": "too few points (fewer than 3)"}
    assert "held out instances: too few points (fewer than 3) (n=2)." in (out / "study_table.md").read_text()


def test_three_points_give_r_without_an_interval_and_arms_sort_in_the_study_order():
    sys.path.insert(0, str(SCRIPT.parent))
    import numpy as np
    from study.layout import arm_rank
    from study.stats import correlation_figures
    from study.summary import _reward_at

    three = correlation_figures([1.0, 2.0, 3.0], [0.2, 0.1, 0.4], 100, np.random.default_rng(0))
    # Pearson by hand: x - 2 = (-1, 0, 1), y - 0.2333 = (-0.0333, -0.1333, 0.1667): 0.2 / sqrt(2 x 0.04667) = 0.655
    assert round(three["pearson_r"], 3) == 0.655 and three["spearman_rho"] == 0.5
    assert three["ci95"] == "no interval under 4 points"
    assert correlation_figures([1.0, 1.0, 1.0], [0.2, 0.1, 0.4], 100, np.random.default_rng(0))["pearson_r"] is None
    # a checkpoint's step with no evaluation: the nearest one (the earlier on a tie), its step reported
    assert _reward_at([[0, -6.0], [2, -4.0], [4, -2.0]], 3) == [2, -4.0]
    assert _reward_at([[0, -6.0], [2, -4.0], [4, -2.0]], 4) == [4, -2.0]
    arms = ["zeta", "rl_teacher_step10", "rl_teacher", "rl_teacher_step2", "traces", "untrained", "worked", "alpha"]
    assert sorted(arms, key=arm_rank) == ["untrained", "worked", "traces", "rl_teacher", "rl_teacher_step2",
                                          "rl_teacher_step10", "alpha", "zeta"]


def test_with_a_common_block_the_correlation_uses_each_teachers_reward_on_the_common_questions(tmp_path):
    teachers_root, root, out = tmp_path / "teachers_run", tmp_path / "study", tmp_path / "out"
    _teachers_root(teachers_root)
    assert _teachers(teachers_root, out / "teachers.json").returncode == 0
    for arm, accuracy in (("sft_teacher_s0", 0.30), ("rl_teacher_s0", 0.50), ("rl_teacher_s1", 0.60),
                          ("rl_teacher_step2_s0", 0.40), ("rl_teacher_answer_only_s0", 0.9)):
        _eval_folder(root, "s", arm, {"instances": _correct(accuracy)})
    result = _run("summarize", root, "--out", out, "--resamples", 100)
    assert result.returncode == 0, result.stderr
    correlation = json.loads((out / "study.json").read_text())["students"]["s"]["correlation"]
    # the common block's mean_total of each teacher's distill (COMMON), not the held-out reward (rl_s0's is -2.0)
    assert [(p["arm"], p["teacher"], p["distill"], p["teacher_reward"], p["seeds"], p["held_out_instances"])
            for p in correlation["points"]] == [
        ("sft_teacher", "sft", "sft", -5.5, [0], 0.3), ("rl_teacher", "rl_s0", "rl_s0", -4.75, [0], 0.5),
        ("rl_teacher_step2", "rl_s0", "rl_step2", -2.5, [0], 0.4)]
    assert {p["reward_from"] for p in correlation["points"]} == {
        "the mean RLT reward of its kept explanations of the 2 questions every teacher explained"}
    assert correlation["x"] == ("the mean RLT reward of the teacher's kept explanations of the 2 questions every "
                                "teacher explained (the teachers file's common block)")
    # rl_s1 has no distill in the root
    assert correlation["missing"] == ["rl_teacher seed 1: no mean reward of distill rl_s1 in the teachers file's "
                                      "common block"]
    # Pearson by hand: x - mean = (-1.25, -0.5, 1.75), y - mean = (-0.1, 0.1, 0): 0.075 / sqrt(4.875 x 0.02) = 0.2402;
    # the ranks (1, 2, 3) and (1, 3, 2): rho = 1 - 6 x 2 / (3 x 8) = 0.5
    instances = correlation["held_out_instances"]
    assert (instances["points"], instances["pearson_r"], instances["spearman_rho"]) == (3, 0.2402, 0.5)
    assert ("Teacher reward on the common questions vs student accuracy (s; points: sft_teacher, rl_teacher s0, "
            "rl_teacher_step2; 2 RL teachers): ") in (out / "study_table.md").read_text()


def _kept_folder(folder: Path, totals: dict[str, dict[str, float]]) -> None:
    """A folder as ``keep`` writes it: per teacher its rows (question, template, the reward ``total`` and parts)."""
    folder.mkdir(parents=True)
    manifest = {"teachers": {}}
    for name, by_question in totals.items():
        rows = [{"question_id": question, "question": f"question {question}", "template": int(question[1:]) % 2,
                 "explanation": "x" * 4, "total": total, "r_ss": total / 2, "r_kl": -total / 2, "matched": True,
                 "wrong_equations": 0, "reasoning_trace": "2 + 2 = 4", "answer": "4",
                 "solution": "The answer is 4." if name.startswith("rl_answer") else "2 + 2 = 4\nThe answer is 4."}
                for question, total in sorted(by_question.items())]
        data = "".join(json.dumps(row) + "\n" for row in rows).encode()
        (folder / f"{name}.jsonl.xz").write_bytes(lzma.compress(data))
        manifest["teachers"][name] = {"file": f"{name}.jsonl.xz", "rows": len(rows),
                                      "sha256": hashlib.sha256(data).hexdigest()}
    (folder / "manifest.json").write_text(json.dumps(manifest))


def test_a_check_of_the_students_part_restores_the_kept_rows_and_logs_the_rows_each_student_reads(tmp_path):
    """STUDY_CHECK=1 on a students part with kept explanations: the kept rows are restored into the root as a run
    restores them, so each checked command, first in its log, names the file that student would read: sft_teacher
    seed 1 the SFT teacher's sample 1, seed 0 the kept sft; a kept sample missing from a distilled folder fails the
    check as it fails a run."""
    kept = tmp_path / "kept"
    _kept_folder(kept, {name: {"q0": -4.0, "q1": -3.0} for name in ("sft", "sft_s1", "rl_s0", "rl_answer_s0")})
    env = {k: v for k, v in _environ().items() if not k.startswith(("STUDY_", "CUDA_VISIBLE"))}
    env.update(STUDY_CHECK="1", STUDY_GPUS="0", STUDY_SLOTS="1", STUDY_UNTRAINED="0", STUDY_EXPLANATIONS=str(kept),
               STUDY_ARMS="sft_teacher,rl_teacher")
    root = tmp_path / "study"
    done = subprocess.run(["bash", "bench/study_fair.sh", "students", str(root), "0,1"], cwd=SCRIPT.parents[1],
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    student = "qwen2.5_coder_0.5b_instruct"
    assert sorted(p.name for p in (root / "distilled").glob("*.jsonl")) == [
        "rl_answer_s0.jsonl", "rl_s0.jsonl", "sft.jsonl", "sft_s1.jsonl"]

    def source(job: str) -> str:
        first = (root / "logs" / f"{student}_{job}_sft.log").read_text().splitlines()[0]
        assert first.startswith("bench/study_stage.sh: CUDA_VISIBLE_DEVICES=0 ./launch_mono.sh student_sft ")
        return first.split("data.source=")[1].split()[0]

    assert source("sft_teacher_s0") == str(root / "distilled" / "sft.jsonl")
    assert source("sft_teacher_s1") == str(root / "distilled" / "sft_s1.jsonl")
    assert source("rl_teacher_s0") == str(root / "distilled" / "rl_s0.jsonl")
    # a distilled folder that came with the root, lacking the kept sample 1: nothing is checked, the part fails
    other = tmp_path / "other"
    (other / "distilled").mkdir(parents=True)
    (other / "distilled" / "sft.jsonl").write_bytes(lzma.decompress((kept / "sft.jsonl.xz").read_bytes()))
    done = subprocess.run(["bash", "bench/study_fair.sh", "students", str(other), "0,1"], cwd=SCRIPT.parents[1],
                          env=env, capture_output=True, text=True, timeout=600)
    assert "no sft_s1.jsonl, which" in done.stderr and (other / "DONE").read_text().startswith("students=1")


def test_teachers_files_of_several_parts_merge_and_the_kept_rows_give_the_common_block(tmp_path):
    """Each teachers part writes its own file (the SFT teacher is trained again in each); the summary merges them,
    the later file's sft kept, and takes each teacher's reward from the kept rows the students read."""
    root, out = tmp_path / "study", tmp_path / "out"
    part0, part1 = tmp_path / "teachers_s0.json", tmp_path / "teachers_s1.json"
    sft0, sft1 = {"steps": 60, "commit": "aaa0000"}, {"steps": 61, "commit": "bbb1111"}  # the SFT teacher, again
    part0.write_text(json.dumps({"teachers": {**_curves(rl_s0=[[0, -6.0], [4, -2.0]])["teachers"], "sft": sft0},
                                 "common": COMMON}))
    part1.write_text(json.dumps({"teachers": {**_curves(rl_s1=[[0, -5.0], [4, -3.0]])["teachers"], "sft": sft1},
                                 "common": COMMON}))
    # rl_s0 kept for q0..q2, sft and rl_s1 for q0..q3: the questions all explained are q0..q2
    _kept_folder(tmp_path / "kept", {"rl_s0": {"q0": -1.0, "q1": -2.0, "q2": -3.0},
                                     "rl_s1": {"q0": -2.0, "q1": -2.0, "q2": -2.0, "q3": -9.0},
                                     "sft": {"q0": -4.0, "q1": -5.0, "q2": -6.0, "q3": -9.0}})
    for arm, accuracy in (("sft_teacher_s0", 0.30), ("rl_teacher_s0", 0.50), ("rl_teacher_s1", 0.60)):
        _eval_folder(root, "s", arm, {"instances": _correct(accuracy)})
    for run, name in (("sft_teacher_s0", "sft"), ("rl_teacher_s0", "rl_s0"), ("rl_teacher_s1", "rl_s1")):
        read = tmp_path / "distilled" / f"{name}.jsonl"  # each student read its teacher's whole kept file
        read.parent.mkdir(exist_ok=True)
        read.write_bytes(lzma.decompress((tmp_path / "kept" / f"{name}.jsonl.xz").read_bytes()))
        _trained(root, "s", run, str(read))
    result = _run("summarize", root, "--out", out, "--resamples", 100, "--teachers", part0, part1,
                  "--explanations", tmp_path / "kept")
    assert result.returncode == 0, result.stderr
    study = json.loads((out / "study.json").read_text())
    assert (study["teachers"], study["explanations"]) == ([str(part0), str(part1)], str(tmp_path / "kept"))
    points = study["students"]["s"]["correlation"]["points"]
    # the kept rows' mean total over q0..q2, not COMMON's (sft -5.5, rl_s0 -4.75) nor the held-out curves
    assert [(p["arm"], p["distill"], p["teacher_reward"], p["seeds"]) for p in points] == [
        ("sft_teacher", "sft", -5.0, [0]), ("rl_teacher", "rl_s0", -2.0, [0]), ("rl_teacher", "rl_s1", -2.0, [1])]
    assert {p["reward_from"] for p in points} == {
        "the mean RLT reward of its kept explanations of the 3 questions every teacher explained"}
    assert study["students"]["s"]["correlation"]["x"] == (
        "the mean RLT reward of the teacher's kept explanations of the 3 questions every teacher explained (the kept "
        f"explanations in {tmp_path / 'kept'})")
    assert f"WARNING: teacher sft: taken from {part1}, the later part" in result.stderr
    # another teacher in two files with other figures is refused: only the SFT teacher is trained again
    clash = tmp_path / "teachers_clash.json"
    clash.write_text(json.dumps(_curves(rl_s0=[[0, -6.0], [4, -1.0]])))
    result = _run("summarize", root, "--out", out, "--teachers", part0, clash)
    assert (result.returncode, result.stderr) == (
        2, f"error: --teachers: teacher rl_s0 is in two files with other figures (the later: {clash}): only sft is "
           "trained again by each part\n")
    # kept teachers with no question in common
    _kept_folder(tmp_path / "apart", {"rl_s0": {"q0": -1.0}, "sft": {"q1": -4.0}})
    result = _run("summarize", root, "--out", out, "--teachers", part0, "--explanations", tmp_path / "apart")
    assert (result.returncode, result.stderr) == (
        2, f"error: --explanations {tmp_path / 'apart'}: no question every kept teacher explained\n")
    # --explanations without a teachers file is one line
    (out / "study.json").unlink()
    result = _run("summarize", root, "--out", tmp_path / "elsewhere", "--explanations", tmp_path / "kept")
    assert (result.returncode, result.stderr) == (
        2, "error: --explanations needs --teachers: the teachers files it gives a common block\n")


def _trained(root: Path, student: str, run: str, source: str) -> None:
    """The SFT run's config beside a run's eval folder, as student_sft writes it: what the student was trained on."""
    (root / student / run / "sft").mkdir(parents=True)
    (root / student / run / "sft" / "config.yaml").write_text(yaml.safe_dump({"data": {"source": source}}))


def test_each_taught_run_records_the_rows_it_read_and_the_summary_refuses_other_rows_than_the_kept(tmp_path):
    """export keeps, per trained student, its training file's name and sha256 (trained_on); summarize with
    --explanations checks each taught arm's rows against the kept teacher's sha256 (sft_teacher and worked_common
    read sft, rl_teacher seed s rl_s<s>) and refuses a run taught by other rows (an earlier part's teachers)."""
    kept, root = tmp_path / "kept", tmp_path / "study"
    _kept_folder(kept, {"sft": {"q0": -4.0, "q1": -5.0}, "rl_s0": {"q0": -1.0, "q1": -2.0}})
    distilled = tmp_path / "distilled"
    distilled.mkdir()
    for name in ("sft", "rl_s0"):  # the students' files: the kept rows, as restore writes them
        (distilled / f"{name}.jsonl").write_bytes(lzma.decompress((kept / f"{name}.jsonl.xz").read_bytes()))
    (distilled / "rl_s1.jsonl").write_text('{"question": "an earlier part\'s explanation"}\n')
    for run, source in (("sft_teacher_s0", distilled / "sft.jsonl"), ("worked_common_s0", distilled / "sft.jsonl"),
                        ("rl_teacher_s0", distilled / "rl_s0.jsonl"), ("worked_s0", "gsm_symbolic")):
        _eval_folder(root, "s", run, {"instances": _correct(0.5)})
        _trained(root, "s", run, str(source))
    _eval_folder(root, "s", "untrained", {"instances": _correct(0.2)})
    answers = tmp_path / "answers"
    exported = _run("export", root, "--out", answers, "--device", "1× H200", "--commit", "c", "--command", "x")
    assert exported.returncode == 0, exported.stderr
    said = {path.stem: json.loads(path.read_text()).get("trained_on") for path in (answers / "s").iterdir()}
    sft_sha = json.loads((kept / "manifest.json").read_text())["teachers"]["sft"]["sha256"]
    assert said == {"sft_teacher_s0": {"file": "sft.jsonl", "sha256": sft_sha},
                    "worked_common_s0": {"file": "sft.jsonl", "sha256": sft_sha},
                    "rl_teacher_s0": {"file": "rl_s0.jsonl",
                                      "sha256": hashlib.sha256((distilled / "rl_s0.jsonl").read_bytes()).hexdigest()},
                    "worked_s0": {"file": "gsm_symbolic", "sha256": None}, "untrained_s0": None}
    out = tmp_path / "out"
    result = _run("summarize", answers, "--out", out, "--resamples", 50, "--explanations", kept, "--teachers",
                  _teachers_file(tmp_path))
    assert result.returncode == 0 and "do not record" not in result.stderr, result.stderr
    # a student of seed 1 taught by rows the folder does not keep for rl_s1 (the folder has no rl_s1 at all)
    _eval_folder(root, "s", "rl_teacher_s1", {"instances": _correct(0.6)})
    _trained(root, "s", "rl_teacher_s1", str(distilled / "rl_s1.jsonl"))
    result = _run("summarize", root, "--out", out, "--explanations", kept, "--teachers", _teachers_file(tmp_path))
    assert (result.returncode, result.stderr) == (
        2, f"error: --explanations {kept}: 1 run(s) read other rows than the kept teacher's: s/rl_teacher_s1 "
           "(rl_s1.jsonl, not the kept rl_s1); summarize them without --explanations, or run them again\n")
    # the same file changed after the export: the sha256 differs from the kept sft's
    (distilled / "sft.jsonl").write_text('{"question": "other"}\n')
    (root / "s" / "rl_teacher_s1").rename(tmp_path / "set_aside")
    result = _run("summarize", root, "--out", out, "--explanations", kept, "--teachers", _teachers_file(tmp_path))
    assert result.returncode == 2 and "s/sft_teacher_s0 (sft.jsonl, not the kept sft), s/worked_common_s0" in (
        result.stderr)
    # a run that does not say what it read is refused too: the answers of students taught by explanations no
    # longer kept (exported before trained_on) would otherwise enter the summary beside the new ones
    (root / "s" / "sft_teacher_s0" / "sft" / "config.yaml").unlink()
    (root / "s" / "worked_common_s0" / "sft" / "config.yaml").unlink()
    result = _run("summarize", root, "--out", out, "--explanations", kept, "--teachers", _teachers_file(tmp_path))
    assert (result.returncode, result.stderr) == (
        2, f"error: --explanations {kept}: 2 run(s) do not record what they were trained on, so whether they read "
           "the kept rows cannot be checked: s/sft_teacher_s0, s/worked_common_s0; summarize them without "
           "--explanations, or run them again\n")
    # without --explanations the summary takes them (no kept rows to check them against)
    assert _run("summarize", root, "--out", out, "--teachers", _teachers_file(tmp_path)).returncode == 0


def test_the_summary_refuses_traces_runs_that_did_not_read_the_committed_traces(tmp_path):
    """summarize --traces: each traces run's trained_on against the sha256 of the committed traces unpacked."""
    rows = '{"question": "q0", "trace": "2 + 2 = 4"}\n'
    committed = tmp_path / "traces.jsonl.gz"
    committed.write_bytes(gzip.compress(rows.encode()))
    root = tmp_path / "study"
    (root / "traces").mkdir(parents=True)
    (root / "traces" / "traces.jsonl").write_text(rows)
    (tmp_path / "other.jsonl").write_text('{"question": "q0", "trace": "another"}\n')
    for run, source in (("traces_s0", root / "traces" / "traces.jsonl"), ("traces_s1", tmp_path / "other.jsonl")):
        _eval_folder(root, "s", run, {"instances": _correct(0.5)})
        _trained(root, "s", run, str(source))
    out = tmp_path / "out"
    result = _run("summarize", root, "--out", out, "--traces", committed)
    assert (result.returncode, result.stderr) == (
        2, f"error: --traces {committed}: 1 run(s) read other traces: s/traces_s1 (other.jsonl); summarize them "
           "without --traces, or run them again\n")
    (root / "s" / "traces_s1").rename(tmp_path / "set_aside")
    result = _run("summarize", root, "--out", out, "--traces", committed)
    assert result.returncode == 0, result.stderr
    study = json.loads((out / "study.json").read_text())
    assert study["traces"] == str(committed) and study["requirements"]["rows_checked"]["met"]
    # without --traces: taken, and said to be unchecked
    assert _run("summarize", root, "--out", out).returncode == 0
    assert json.loads((out / "study.json").read_text())["requirements"]["rows_checked"]["short"] == [
        "the rows of s/traces were not checked against the kept ones (--explanations, --traces)"]
    assert _run("summarize", root, "--out", out, "--traces", tmp_path / "other.jsonl").returncode == 2


def test_a_run_that_read_the_restored_rows_passes_the_check_where_the_kept_teachers_explained_other_questions(
        tmp_path):
    """Where the kept teachers explained different questions (a teacher kept with fewer), restore writes each one's
    rows of the questions all of them explained: a student that read those (or its teacher's whole kept file) read
    the kept rows, and the summary takes it; one that read a third set of rows is refused."""
    kept, root = tmp_path / "kept", tmp_path / "study"
    _kept_folder(kept, {"sft": {"q0": -4.0, "q1": -5.0, "q2": -6.0}, "rl_s0": {"q0": -1.0, "q1": -2.0}})
    restored = tmp_path / "distilled"
    assert _run("restore", kept, "--out", restored).returncode == 0
    for name in ("sft", "rl_s0"):
        (restored / f"{name}.jsonl").write_bytes(gzip.decompress((restored / f"{name}.jsonl.gz").read_bytes()))
    whole_sft = tmp_path / "whole" / "sft.jsonl"  # the kept file itself, all 3 questions
    whole_sft.parent.mkdir()
    whole_sft.write_bytes(lzma.decompress((kept / "sft.jsonl.xz").read_bytes()))
    assert whole_sft.read_bytes() != (restored / "sft.jsonl").read_bytes()
    for run, source in (("sft_teacher_s0", restored / "sft.jsonl"), ("worked_common_s0", whole_sft),
                        ("rl_teacher_s0", restored / "rl_s0.jsonl")):
        _eval_folder(root, "s", run, {"instances": _correct(0.5)})
        _trained(root, "s", run, str(source))
    out = tmp_path / "out"
    result = _run("summarize", root, "--out", out, "--resamples", 50, "--explanations", kept, "--teachers",
                  _teachers_file(tmp_path))
    assert result.returncode == 0 and "do not record" not in result.stderr, result.stderr
    other = tmp_path / "other" / "sft.jsonl"  # sft of q1 and q2: neither the kept file nor what restore wrote
    other.parent.mkdir()
    other.write_text("".join(whole_sft.read_text().splitlines(keepends=True)[1:]))
    (root / "s" / "sft_teacher_s0" / "sft" / "config.yaml").unlink()
    (root / "s" / "sft_teacher_s0" / "sft").rmdir()
    _trained(root, "s", "sft_teacher_s0", str(other))
    result = _run("summarize", root, "--out", out, "--resamples", 50, "--explanations", kept, "--teachers",
                  _teachers_file(tmp_path))
    assert result.returncode == 2 and "s/sft_teacher_s0 (sft.jsonl, not the kept sft)" in result.stderr, (
        result.stderr)


def _teachers_file(tmp_path: Path) -> Path:
    path = tmp_path / "teachers.json"
    path.write_text(json.dumps(_curves(rl_s0=[[0, -6.0], [4, -2.0]])))
    return path


def test_one_gpu_teachers_leave_out_the_answer_only_teacher_and_explain_with_the_sft_teacher_after_rl(tmp_path):
    """STUDY_ANSWER_ONLY=0: no answer-only RL run. STUDY_SFT_DISTILL=after: the SFT teacher's distill starts once the
    RL run has ended (its marker written), so on one GPU the RL run's memory plan is read with the card to itself."""
    root = tmp_path / "study"
    _traces(root)
    run = _fair_sh("teachers", root, "0", timeout=600,
                   env={"STUDY_ANSWER_ONLY": "0", "STUDY_SFT_DISTILL": "after"})
    assert run.returncode == 0 and (root / "DONE").read_text().startswith("teachers=0 "), run.stdout + run.stderr
    assert sorted(p.name for p in (root / "distilled").iterdir()) == ["rl_s0.jsonl", "rl_step1.jsonl", "sft.jsonl"]
    assert not (root / "teachers" / "rl_answer_s0").exists()
    ended = (root / "teachers" / "rl_s0" / "rl_ended").stat().st_mtime_ns
    sft_distill = root / "teachers" / "distill_sft"
    assert min(p.stat().st_mtime_ns for p in sft_distill.rglob("*") if p.is_file()) >= ended


def test_the_answer_only_teacher_alone_beside_an_sft_distill_the_root_holds(tmp_path):
    """STUDY_ANSWER_ONLY=only: the SFT teacher, then the answer-only RL teacher alone (no worked-reward seed run,
    whatever the seeds say). An SFT distill the root holds already (an earlier part's kept rows) is not run again:
    every RL teacher then pairs with the same SFT explanations."""
    root = tmp_path / "study"
    _traces(root)
    (root / "distilled").mkdir()
    kept_sft = '{"question": "kept by an earlier part"}\n'
    (root / "distilled" / "sft.jsonl").write_text(kept_sft)
    run = _fair_sh("teachers", root, "0,1", timeout=600,
                   env={"STUDY_ANSWER_ONLY": "only", "STUDY_SFT_DISTILL": "after"})
    assert run.returncode == 0 and (root / "DONE").read_text().startswith("teachers=0 "), run.stdout + run.stderr
    assert sorted(p.name for p in (root / "distilled").iterdir()) == ["rl_answer_s0.jsonl", "sft.jsonl"]
    assert (root / "distilled" / "sft.jsonl").read_text() == kept_sft
    teachers = root / "teachers"
    assert sorted(p.name for p in teachers.iterdir()) == ["distill_rl_answer_s0", "rl_answer_s0", "sft"]
    for run_dir in (teachers / "rl_answer_s0" / "rl", teachers / "distill_rl_answer_s0"):
        assert yaml.safe_load((run_dir / "config.yaml").read_text())["data"]["gsm_solution"] == "answer", run_dir


@pytest.mark.parametrize(("knob", "value", "said"), [("STUDY_SFT_DISTILL", "later", "beside or after"),
                                                     ("STUDY_ANSWER_ONLY", "no", "0, 1 or only"),
                                                     ("STUDY_EXPLANATION_TOKENS", "long", "a whole number >= 1"),
                                                     ("STUDY_MINUTES", "soon", "a number of minutes > 0"),
                                                     ("STUDY_MINUTES", "0.0", "a number of minutes > 0")])
def test_a_teachers_knob_out_of_its_choices_is_one_line(tmp_path, knob, value, said):
    run = _fair_sh("teachers", tmp_path / "study", "0", timeout=60, env={knob: value})
    assert run.returncode == 2 and run.stderr.strip() == f"bench/study_fair.sh: {knob}={value}: {said}"


def test_under_study_minutes_a_slot_starts_no_run_that_would_end_past_the_budget(tmp_path):
    """STUDY_MINUTES=0.1 (6 s), one slot, runs of two 2-second stages (a stand-in launch_mono.sh): the first run
    starts, the next two would end past the budget by the slot's longest run so far (4 s), so they are named and
    left for a later part; the slot ends with code 3."""
    repo = tmp_path / "repo"
    (repo / "bench").mkdir(parents=True)
    for name in ("study_fair.sh", "study_stage.sh"):
        shutil.copy(SCRIPT.parents[1] / "bench" / name, repo / "bench" / name)
    record = tmp_path / "commands.txt"
    (repo / "launch_mono.sh").write_text(f'#!/usr/bin/env bash\necho "$*" >> {record}\nsleep 2\n')
    (repo / "launch_mono.sh").chmod(0o755)
    root = tmp_path / "study"
    env = {k: v for k, v in _environ().items() if not k.startswith(("STUDY_", "CUDA_VISIBLE"))}
    env.update(STUDY_GPUS="0", STUDY_SLOTS="1", STUDY_ARMS="worked", STUDY_MINUTES="0.1")
    run = subprocess.run(["bash", "bench/study_fair.sh", "students", str(root), "0,1,2"], cwd=repo, env=env,
                         capture_output=True, text=True, timeout=120)
    student = "qwen2.5_coder_0.5b_instruct"
    assert (root / "DONE").read_text().startswith(
        f"{student}/worked_s0+{student}/worked_s1+{student}/worked_s2=3 "), run.stdout + run.stderr
    # (two 2-second stages and the shell between them: 4 or 5 whole seconds as bash counts them, more on a busy
    # machine; any figure of 4 or more leaves the next two out of the 6 s)
    said = re.search(r"bench/study_fair.sh: not started, as they would end past STUDY_MINUTES=0.1 \(the slot's longest "
                     rf"run took (\d+) s\): {student}/worked_s1 {student}/worked_s2\n", run.stderr)
    assert said and int(said[1]) >= 4, run.stderr
    lines = record.read_text().splitlines()
    assert [line.split()[0] for line in lines] == ["student_sft", "eval"] and "seed=0" in lines[0]


def test_rl_teachers_on_two_gpus_each_train_data_parallel_with_a_steps_work_unchanged(tmp_path):
    """STUDY_RL_GPUS=2 on four GPUs: seed 0's RL on GPUs 0,1 and seed 1's on 2,3, each placement=dp over two ranks
    with half the micro-batches a rank (the same 256 completions a step); every other run on one GPU. A stand-in
    launch_mono.sh records each command and the GPUs it was given."""
    repo = tmp_path / "repo"
    (repo / "bench").mkdir(parents=True)
    for name in ("study_fair.sh", "study_stage.sh"):
        shutil.copy(SCRIPT.parents[1] / "bench" / name, repo / "bench" / name)
    record = tmp_path / "commands.txt"
    (repo / "launch_mono.sh").write_text(f'#!/usr/bin/env bash\necho "$CUDA_VISIBLE_DEVICES $*" >> {record}\n'
                                         'echo "the config and its overrides pass every check a run makes"\n')
    (repo / "launch_mono.sh").chmod(0o755)
    root = tmp_path / "study"
    (root / "traces").mkdir(parents=True)
    (root / "traces" / "traces.jsonl").write_text("{}\n")
    env = {k: v for k, v in _environ().items() if not k.startswith(("STUDY_", "CUDA_VISIBLE"))}
    env.update(STUDY_CHECK="1", STUDY_GPUS="0,1,2,3", STUDY_RL_GPUS="2", STUDY_ANSWER_ONLY="0")
    run = subprocess.run(["bash", "bench/study_fair.sh", "teachers", str(root), "0,1"], cwd=repo, env=env,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and (root / "DONE").read_text().startswith("teachers=0 "), run.stdout + run.stderr
    lines = record.read_text().splitlines()
    rl = {line.split()[0]: line for line in lines if "teacher_rlt_mono" in line}
    assert sorted(rl) == ["0,1", "2,3"]
    for line in rl.values():
        words = line.split()
        assert {"placement=dp", "placement.num_processes=2", "trainer.gradient_accumulation_steps=4",
                "trainer.steps_per_generation=4", "trainer.per_device_train_batch_size=32"} <= set(words)
        # the step's work as on one GPU: 32 completions x 4 micro-batches x 2 ranks (a later override wins)
        accumulation = [w for w in words if w.startswith("trainer.gradient_accumulation_steps=")]
        assert accumulation == ["trainer.gradient_accumulation_steps=8", "trainer.gradient_accumulation_steps=4"]
    others = [line.split()[0] for line in lines if "teacher_rlt_mono" not in line]
    assert others and all("," not in gpus for gpus in others)  # teacher SFT and the distills: one GPU each
    assert {line.split()[0] for line in lines if "distill" in line.split()[1:3]} == {"0", "2"}


def test_the_seed_t_interval_is_welchs_over_the_per_seed_accuracies():
    sys.path.insert(0, str(SCRIPT.parent))
    from study.stats import seed_t_interval

    # by hand: means 0.58967 and 0.541, difference 0.04867; variances of the mean 3.0111e-5 and 9.3000e-5 (sum
    # 1.23111e-4, SE 0.011095); Welch df 1.23111e-4**2 / (3.0111e-5**2 / 2 + 9.3e-5**2 / 2) = 3.17 -> t(3) = 3.182,
    # half-width 0.035305
    t = seed_t_interval([0.580, 0.590, 0.599], [0.544, 0.523, 0.556])
    assert t == {"difference": 0.0487, "ci95": [0.0134, 0.084], "df": 3.17, "seeds": [3, 3]}
    # an arm of one seed counts as exact: a one-sample interval, df 2
    one = seed_t_interval([0.8, 0.9, 1.0], [0.5])
    assert one == {"difference": 0.4, "ci95": [round(0.4 - 4.303 * 0.1 / 3 ** 0.5, 4),
                                               round(0.4 + 4.303 * 0.1 / 3 ** 0.5, 4)], "df": 2.0, "seeds": [3, 1]}
    assert seed_t_interval([0.5], [0.4]) is None
    # seeds that agree exactly: no spread, a zero-width interval
    assert seed_t_interval([0.6, 0.6], [0.5, 0.5])["ci95"] == [0.1, 0.1]


def test_a_difference_of_arms_with_several_seeds_carries_the_seeds_alone_interval(tmp_path):
    root = tmp_path / "study"
    for seed, step in enumerate((2, 3, 4)):
        _eval_folder(root, "s", f"rl_teacher_s{seed}", {"instances": [i % step == 0 for i in range(60)]})
        _eval_folder(root, "s", f"sft_teacher_s{seed}", {"instances": [i % (step + 1) == 0 for i in range(60)]})
    result, out = _summarize(tmp_path, root)
    d = json.loads((out / "study.json").read_text())["students"]["s"]["differences"]["rl_teacher - sft_teacher"]
    # per seed: RL 30/60, 20/60, 15/60; SFT 20/60, 15/60, 12/60
    sys.path.insert(0, str(SCRIPT.parent))
    from study.stats import seed_t_interval
    expected = seed_t_interval([0.5, round(20 / 60, 4), 0.25], [round(20 / 60, 4), 0.25, 0.2])
    assert d["held_out_instances"]["seed_t"] == expected, result.stderr
    assert expected["seeds"] == [3, 3] and expected["ci95"][0] < expected["difference"] < expected["ci95"][1]
    table = (out / "study_table.md").read_text()
    assert (f"rl_teacher - sft_teacher, held out instances: {d['held_out_instances']['difference']:+.3f}" in table
            and f"(the seeds alone, Welch t, df {expected['df']:g}: [{expected['ci95'][0]:+.3f}, "
                f"{expected['ci95'][1]:+.3f}])" in table)


def test_the_requirements_name_what_falls_short_of_the_finished_study(tmp_path):
    sys.path.insert(0, str(SCRIPT.parent))
    from study.summary import REQUIRED_ARMS, requirements

    def arm(seeds, questions=1000, templates=15, capped=0.0):
        return {"seeds": seeds, "held_out_instances": {"questions": questions, "templates": 63, "capped_frac": capped},
                "held_out_templates": {"questions": questions, "templates": templates, "capped_frac": capped}}

    small = "qwen2.5_coder_0.5b_instruct"
    arms = {name: arm([0] if name.startswith("untrained") else [0, 1, 2]) for name in REQUIRED_ARMS}
    students = {small: {"arms": arms, "positive_control": {"passes": True}, "correlation": {"rl_teachers": 4}}}
    rl = {f"rl_s{seed}": {"reward_setting": "worked", "completions": 48_128} for seed in range(3)}
    teachers = {"teachers": {"sft": {"steps": 171}, **rl},
                "common": {"distills": ["sft", "sft_s1", "sft_s2", "rl_s0", "rl_s1", "rl_s2"]}}
    rules = requirements(students, ["abc1234"], teachers=teachers)
    assert {rule for rule, r in rules.items() if not r["met"]} == {"students"}
    assert rules["students"]["short"] == ["qwen2.5_coder_1.5b_instruct"]
    # RL short of 48K completions; the SFT arm's seeds reading one sample; an untrained prompt cut on 6% of a set;
    # no teachers file at all
    teachers["teachers"]["rl_s1"]["completions"] = 16_640
    teachers["common"]["distills"] = ["sft", "rl_s0", "rl_s1", "rl_s2"]
    arms["untrained_plain"] = arm([0], capped=0.06)
    rules = requirements(students, ["abc1234"], teachers=teachers)
    assert rules["rl_completions"]["short"] == ["rl_s1: 16,640"]
    assert rules["distinct_teachers"]["short"] == [f"{small}/sft_teacher: 1 (sft)"]
    assert rules["untrained_cap"]["short"] == [f"{small}/untrained_plain held_out_instances: 6.0% cut",
                                               f"{small}/untrained_plain held_out_templates: 6.0% cut"]
    without = requirements(students, ["abc1234"])
    assert without["rl_completions"]["short"] == ["no teachers file"]
    assert without["distinct_teachers"]["short"] == [
        f"{small}/{arm}: not known (no common block of the teachers' distills: --explanations)"
        for arm in ("sft_teacher", "rl_teacher")]
    arms["untrained_plain"] = arm([0])
    # one arm missing, one with two seeds, one set too small, too few templates, a failed control, 3 RL teachers,
    # two commits: each named
    del arms["traces"]
    arms["rl_teacher"] = arm([0, 1])
    arms["sft_teacher"] = arm([0, 1, 2], questions=999)
    arms["worked"] = arm([0, 1, 2], templates=14)
    students[small].update(positive_control={"passes": False}, correlation={"rl_teachers": 3})
    rules = requirements(students, ["abc1234", "def5678"])
    assert rules["arms"]["short"] == [f"{small}/traces"]
    assert rules["seeds"]["short"] == [f"{small}/rl_teacher: 2"]
    # a checkpoint's arm is a correlation point: one student suffices; worked_common, a control, needs three
    arms["rl_teacher_step30"], arms["worked_common"] = arm([0]), arm([0])
    assert requirements(students, ["abc1234"])["seeds"]["short"] == [f"{small}/rl_teacher: 2",
                                                                     f"{small}/worked_common: 1"]
    del arms["rl_teacher_step30"], arms["worked_common"]
    assert rules["held_out_sets"]["short"] == [
        f"{small}/worked held_out_templates: 1000 questions, 14 templates",
        f"{small}/sft_teacher held_out_instances: 999 questions, 63 templates",
        f"{small}/sft_teacher held_out_templates: 999 questions, 15 templates"]
    assert rules["positive_control"]["short"] == [f"{small}: fails"]
    assert rules["correlation"]["short"] == [f"{small}: 3 RL teachers"]
    assert rules["one_commit"] == {"met": False, "short": ["2 commits: abc1234, def5678"]}
    # taught runs summarized without --explanations: their rows unchecked, named
    assert rules["rows_checked"]["met"]
    rules = requirements(students, ["abc1234"], rows_checked=False)
    assert rules["rows_checked"] == {"met": False, "short": [
        f"the rows of {small}/rl_teacher, {small}/rl_teacher_answer_only, {small}/sft_teacher were not checked "
        "against the kept ones (--explanations, --traces)"]}
    arms["traces"] = arm([0, 1, 2])
    assert requirements(students, ["abc1234"], traces_checked=False)["rows_checked"]["short"] == [
        f"the rows of {small}/traces were not checked against the kept ones (--explanations, --traces)"]


def test_an_interim_summary_says_which_requirements_it_does_not_meet_yet(tmp_path):
    root = tmp_path / "study"
    for seed in range(3):
        _eval_folder(root, "s", f"worked_s{seed}", {"instances": [True] * 40})
    _eval_folder(root, "s", "untrained", {"instances": [False] * 40})
    result, out = _summarize(tmp_path, root)
    rules = json.loads((out / "study.json").read_text())["requirements"]
    assert result.returncode == 0, result.stderr
    assert {rule for rule, r in rules.items() if r["met"]} == {"seeds", "positive_control", "one_commit",
                                                               "rows_checked", "distinct_teachers", "untrained_cap"}
    assert rules["correlation"]["short"] == ["s: 0 RL teachers"]
    assert (out / "study_table.md").read_text().endswith(
        "The finished study's requirements: met: seeds, positive_control, one_commit, rows_checked, "
        "distinct_teachers, untrained_cap; not met: students "
        "(qwen2.5_coder_0.5b_instruct; qwen2.5_coder_1.5b_instruct), arms (s/untrained_plain; s/traces; "
        "s/sft_teacher; s/rl_teacher; ...), held_out_sets (s/untrained held_out_instances: 40 questions, 10 "
        "templates; s/untrained held_out_templates: none; s/worked held_out_instances: 40 questions, 10 templates; "
        "s/worked held_out_templates: none), correlation (s: 0 RL teachers), rl_completions (no teachers file).\n")


def test_the_answer_only_teachers_students_learn_its_explanation_and_the_worked_solution(tmp_path):
    sys.path.insert(0, str(SCRIPT.parent))
    from study.kept import _kept_digests, worked_target
    from study.layout import StudyError

    row = {"question_id": "q0", "question": "Ann has 2 and gets 2. How many?", "reasoning_trace": "2 + 2 = 4",
           "answer": "4", "solution": "The answer is 4.", "explanation": "Add them."}
    (line,) = worked_target([json.dumps(row)])
    assert json.loads(line) == {**row, "solution": "2 + 2 = 4\nThe answer is 4."}
    # a worked-solution row (the RLT mapping's) is not an answer-only row: refused, naming the row
    worked = json.dumps({**row, "solution": "2 + 2 = 4\nThe answer is 4."})
    with pytest.raises(StudyError, match="^row 1: not an answer-only row"):
        worked_target([worked])
    # the command the students part runs, then the digest the summary accepts for its students
    kept = tmp_path / "kept"
    _kept_folder(kept, {"sft": {"q0": -4.0, "q1": -3.0}, "rl_answer_s0": {"q0": -4.5, "q1": -3.5}})
    rows = tmp_path / "rl_answer_s0.jsonl"
    rows.write_bytes(lzma.decompress((kept / "rl_answer_s0.jsonl.xz").read_bytes()))
    out = tmp_path / "student" / "rows.jsonl"
    result = _run("worked-target", rows, "--out", out)
    assert result.returncode == 0 and result.stdout == f"{out}: 2 rows, the worked solution as the target\n"
    assert [json.loads(x)["solution"] for x in out.read_text().splitlines()] == ["2 + 2 = 4\nThe answer is 4."] * 2
    digests = _kept_digests(kept)
    assert hashlib.sha256(out.read_bytes()).hexdigest() in digests["rl_answer_s0"]
    assert hashlib.sha256(rows.read_bytes()).hexdigest() in digests["rl_answer_s0"]
    assert hashlib.sha256(out.read_bytes()).hexdigest() not in digests["sft"]
    missing = _run("worked-target", tmp_path / "none.jsonl", "--out", out)
    assert (missing.returncode, missing.stderr) == (2, f"error: {tmp_path / 'none.jsonl'}: no such file\n")



@pytest.mark.parametrize("value", ["0", "1,x", "1,,2"])
def test_the_sft_seeds_must_be_seeds_from_1(tmp_path, value):
    bad = _fair_sh("teachers", tmp_path / "x", env={"STUDY_SFT_SEEDS": value})
    assert bad.returncode == 2 and bad.stderr == (f"bench/study_fair.sh: STUDY_SFT_SEEDS={value}: seeds >= 1, "
                                                  "comma-separated\n")
    twice = _fair_sh("teachers", tmp_path / "x", env={"STUDY_SFT_SEEDS": "1,2,1"})
    assert twice.returncode == 2 and twice.stderr == "bench/study_fair.sh: STUDY_SFT_SEEDS=1,2,1: each seed once\n"


def test_a_students_part_refuses_a_distilled_folder_missing_a_kept_sample_or_holding_one_not_kept(tmp_path):
    sys.path.insert(0, str(SCRIPT.parent))
    from study.kept import check_students_inputs

    kept, distilled = tmp_path / "kept", tmp_path / "distilled"
    _kept_folder(kept, {name: {"q0": -4.0} for name in ("sft", "sft_s1", "rl_s0", "rl_answer_s0")})
    distilled.mkdir()
    for name in ("sft", "sft_s1", "rl_s0", "rl_answer_s0"):
        (distilled / f"{name}.jsonl").write_bytes(lzma.decompress((kept / f"{name}.jsonl.xz").read_bytes()))
    assert check_students_inputs(kept, distilled) == []
    # sft_s1 gone: its students would read sft; an sft_s2 there that is not kept: its students' rows unchecked
    (distilled / "sft_s1.jsonl").rename(distilled / "sft_s2.jsonl")
    assert check_students_inputs(kept, distilled) == [
        f"{distilled}: no sft_s1.jsonl, which {kept} keeps (its students would read other rows): restore it with "
        f"bench/study_fair.py restore {kept} --out <an empty folder>",
        f"{distilled / 'sft_s2'}.jsonl: an SFT teacher's sample that {kept} does not keep (its students' rows could "
        "not be checked): keep it (bench/study_fair.py keep) or remove it"]
    # the command the students part runs: exit 2 and the lines, with --students only
    result = _run("check-distilled", kept, distilled, "--students")
    assert result.returncode == 2 and result.stderr.count("error: ") == 2
    assert _run("check-distilled", kept, distilled).returncode == 0


def test_the_worked_target_of_an_answer_only_row_is_the_worked_mappings_solution():
    sys.path.insert(0, str(SCRIPT.parent))
    from study.kept import worked_target

    from rlt_mono.data.gsm_symbolic import item_row

    item = {"question": "Ann has 3 pens and buys 4. How many pens?", "answer": "7",
            "metadata": {"answer_cot": "She buys 4 more.\n3 + 4 = 7\n#### 7"}}
    answer_only, worked = item_row(item, 5, "answer"), item_row(item, 5, "worked")
    (line,) = worked_target([json.dumps(answer_only)])
    assert json.loads(line)["solution"] == worked["solution"] == "She buys 4 more.\n3 + 4 = 7\nThe answer is 7."


def test_the_sft_teachers_seeded_samples_teach_their_seeds_students_and_are_points_of_their_own():
    sys.path.insert(0, str(SCRIPT.parent))
    from study.layout import _arm_distill, _kept_teacher
    from study.summary import correlation_points

    assert _arm_distill("sft_teacher", 1, {"sft", "sft_s1"}) == ("sft", "sft_s1")
    assert _arm_distill("sft_teacher", 2, {"sft", "sft_s1"}) == ("sft", "sft")  # no seed-2 sample: the one distill
    assert _arm_distill("sft_teacher", 0, {"sft", "sft_s0"}) == ("sft", "sft")  # seed 0 reads the teacher's own
    assert _kept_teacher("sft_teacher", 1, {"sft", "sft_s1"}) == "sft_s1"
    assert _kept_teacher("worked_common", 1, {"sft", "sft_s1"}) == "sft"  # the worked solutions of sft's questions
    figures = {"held_out_instances": {"per_seed": [0.5, 0.6, 0.7]}}
    arms = {"sft_teacher": {"seeds": [0, 1, 2], **figures}, "rl_teacher": {"seeds": [0, 1, 2], **figures}}
    common = {"questions": 10, "distills": {name: {"mean_total": total} for name, total in
                                            (("sft", -2.6), ("sft_s1", -2.7), ("sft_s2", -2.5), ("rl_s0", -2.1),
                                             ("rl_s1", -2.2), ("rl_s2", -2.0))}}
    points, missing = correlation_points(arms, {"teachers": {}, "common": common})
    assert missing == []
    assert [(p["arm"], p["distill"], p["seeds"], p["teacher_reward"], p["held_out_instances"]) for p in points] == [
        ("sft_teacher", "sft", [0], -2.6, 0.5), ("sft_teacher", "sft_s1", [1], -2.7, 0.6),
        ("sft_teacher", "sft_s2", [2], -2.5, 0.7), ("rl_teacher", "rl_s0", [0], -2.1, 0.5),
        ("rl_teacher", "rl_s1", [1], -2.2, 0.6), ("rl_teacher", "rl_s2", [2], -2.0, 0.7)]
    # without the seeded samples: one SFT point over its seeds, as before
    del common["distills"]["sft_s1"], common["distills"]["sft_s2"]
    points, _ = correlation_points(arms, {"teachers": {}, "common": common})
    assert [(p["arm"], p["distill"], p["seeds"]) for p in points][0] == ("sft_teacher", "sft", [0, 1, 2])
