"""The students' texts and their thoughts graded (bench/study_fair.py ``outputs`` and ``thoughts``), from
hand-made eval folders and kept explanations whose right answers are counted by hand."""

import hashlib
import json
import lzma
import subprocess
import sys
from pathlib import Path

import pytest

from rlt_mono.data.prompts import between

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "study_fair.py"
sys.path.insert(0, str(SCRIPT.parent))

from study.layout import StudyError  # noqa: E402
from study.thoughts import (  # noqa: E402
    graded_runs,
    last_boxed,
    plain_right,
    read_outputs,
    right,
    summarize_thoughts,
    teachers_figures,
    write_outputs,
)


def _run(*args):
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True)


def _taught(thought: str, solution: str) -> str:
    return f"<|begin_of_thought|>{thought}<|end_of_thought|>\n\n<|begin_of_solution|>{solution}<|end_of_solution|>"


# Answers to questions whose right answer is 7, one of each kind: both parts right; thought wrong, graded right;
# thought right, graded wrong; no thought at all (cut before its end tag) and graded wrong; a thought right without a
# \boxed{} (math-verify reads its 7), graded right; an empty thought; a whole, right thought whose solution was cut.
KINDS = [
    _taught("3 + 4 = 7, so \\boxed{7}", "3 + 4 = 7.\nThe answer is 7."),
    _taught("3 + 5 = 8, so \\boxed{8}", "3 + 4 = 7.\nThe answer is 7."),
    _taught("3 + 4 = 7, so \\boxed{7}", "3 + 5 = 8.\nThe answer is 8."),
    "<|begin_of_thought|>Let us add the blocks of the walk and",
    _taught("3 + 4 makes 7", "3 + 4 = 7.\nThe answer is 7."),
    _taught("\n\n", "3 + 4 = 7.\nThe answer is 7."),
    "<|begin_of_thought|>3 + 4 = \\boxed{7}<|end_of_thought|>\n\n<|begin_of_solution|>3 + 4",
]
GRADED = [True, True, False, False, True, True, False]  # the eval's flags for KINDS


def _eval_folder(root: Path, student: str, run: str, kinds: list[int], held_out: str = "instances") -> None:
    """One eval run: question i answered with KINDS[kinds[i]], template i % 3."""
    rows = [{"question": f"{held_out} question {i}", "solution": "3 + 4 = 7.\nThe answer is 7.", "answer": "7",
             "heldout": held_out, "template": i % 3, "student_output": KINDS[k], "correct": GRADED[k],
             "capped": k == 3} for i, k in enumerate(kinds)]
    folder = root / student / run / "eval"
    folder.mkdir(parents=True)
    (folder / "eval_rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (folder / "eval.json").write_text("{}\n")


def _export(root: Path, answers: Path) -> None:
    done = _run("export", root, "--out", answers, "--device", "H100", "--commit", "abc1234", "--command", "bash x.sh")
    assert done.returncode == 0, done.stderr


def test_the_last_box_is_read_whole_and_a_text_without_one_is_wrong_by_it_alone():
    assert last_boxed("\\boxed{3} then \\boxed{\\frac{14}{2}} done") == "\\boxed{\\frac{14}{2}}"
    assert last_boxed("\\boxed{7") is None and last_boxed("no box") is None and last_boxed(None) is None
    assert right("7", "\\boxed{3} then \\boxed{\\frac{14}{2}}", boxed_only=True)
    assert right("7", "the total is 7") and not right("7", "the total is 7", boxed_only=True)
    assert not right("7", None) and not right("7", "\\boxed{8}")


def test_between_takes_the_first_part_and_none_without_its_end_tag():
    text = _taught("first", "second") + _taught("third", "fourth")
    assert between(text, "thought") == "first"
    assert between(text, "solution") == "second"
    assert between("<|begin_of_thought|>cut at the cap", "thought") is None
    assert between("no tags", "solution") is None


@pytest.mark.parametrize(("text", "answer", "expected"), [
    ("The answer is 84.", "84", True),
    ("The answer is: $1,000$.", "1000", True),
    ("**The answer is 12**", "13", False),
    ("so the count is \\(\\boxed{129}\\).", "129", True),
    ("The answer is 5. Then \\boxed{6}", "5", True),  # the stated answer before a box
    ("The answer is 282 - (1/3) * 282.", "188", False),  # an expression: read as its first number
    ("the total is 940.", "940", None),  # nothing stated: unread
    ("\\boxed{\\frac{22}{9}}", "3", None),
    ("The answer is 4.", None, None),
])
def test_the_plain_grader_reads_the_stated_number(text, answer, expected):
    assert plain_right(text, answer) is expected


def test_outputs_keep_each_answer_in_the_exported_order_and_are_written_once(tmp_path):
    root, out = tmp_path / "study", tmp_path / "outputs"
    _eval_folder(root, "s", "rl_teacher_s0", [0, 1, 2, 3])
    written = write_outputs(root, out)
    assert written == [out / "s" / "rl_teacher_s0.jsonl.xz"]
    lines = [json.loads(line) for line in lzma.decompress(written[0].read_bytes()).decode().splitlines()]
    assert [line["output"] for line in lines] == KINDS[:4]
    assert {line["answer"] for line in lines} == {"7"}
    assert len({line["question"] for line in lines}) == 4 and "question" not in lines[0]["question"]  # ids, not text
    assert read_outputs(written[0]) == {line["question"]: line for line in lines}
    with pytest.raises(StudyError, match="written once"):
        write_outputs(root, out)
    with pytest.raises(StudyError, match="no finished"):
        write_outputs(tmp_path / "empty", tmp_path / "elsewhere")


def test_each_answer_is_graded_twice_and_counted_by_kind(tmp_path):
    root, answers, out = tmp_path / "study", tmp_path / "answers", tmp_path / "outputs"
    _eval_folder(root, "s", "rl_teacher_s0", [0, 1, 1, 2, 3])
    _eval_folder(root, "s", "rl_teacher_s1", [0, 0, 1, 2, 2])
    _export(root, answers)
    write_outputs(root, out)
    runs = graded_runs(answers, out)
    rows = runs["s"]["rl_teacher"][0]
    fields = ("thought", "thought_right", "thought_right_boxed", "correct", "regraded")
    assert [tuple(r[f] for f in fields) for r in rows] == [
        (True, True, True, True, True), (True, False, False, True, True), (True, False, False, True, True),
        (True, True, True, False, False), (False, None, None, False, False)]
    assert [r["plain_right"] for r in rows] == [True, True, True, False, None]
    figures = summarize_thoughts(runs, resamples=50, seed=0)["s"]["arms"]["rl_teacher"]["held_out_instances"]
    # ten answers: thoughts right in rows (s0: 0, 3; s1: 0, 1, 3, 4) = 6; graded right s0: 0, 1, 2; s1: 0, 1, 2 = 6
    assert figures["answers"] == 10
    assert figures["with_thought"] == 0.9
    assert figures["graded_right"] == 0.6
    assert figures["thought_right"] == 0.6
    assert figures["right_thought_wrong"] == 0.3  # kind 1: s0's rows 1 and 2, s1's row 2
    assert figures["wrong_thought_right"] == 0.3  # kind 2: s0's row 3, s1's rows 3 and 4
    assert figures["thought_right_per_seed"] == [0.4, 0.8]
    assert figures["thought_right_boxed"] == 0.6  # every thought here states its answer in a box
    assert figures["regrade_agrees"] == 1.0
    assert figures["plain_grader_read"] == 0.9 and figures["plain_grader_agrees"] == 1.0


def test_unboxed_empty_and_whole_thoughts_are_told_apart(tmp_path):
    """A right thought without a box counts by the eval's grader, not by the box alone; an empty thought is no
    thought (an arm of them has no thought figures); a whole thought counts though its solution was cut."""
    root, answers, out = tmp_path / "study", tmp_path / "answers", tmp_path / "outputs"
    _eval_folder(root, "s", "sft_teacher_s0", [4, 4, 6, 1])
    _eval_folder(root, "s", "worked_common_s0", [5, 5, 5, 5])
    _export(root, answers)
    write_outputs(root, out)
    runs = graded_runs(answers, out)
    assert [(r["thought"], r["thought_right"], r["thought_right_boxed"]) for r in runs["s"]["sft_teacher"][0]] == [
        (True, True, False), (True, True, False), (True, True, True), (True, False, False)]
    figures = summarize_thoughts(runs, resamples=20, seed=0)["s"]["arms"]
    assert figures["sft_teacher"]["held_out_instances"]["thought_right"] == 0.75
    assert figures["sft_teacher"]["held_out_instances"]["thought_right_boxed"] == 0.25
    assert figures["sft_teacher"]["held_out_instances"]["wrong_thought_right"] == 0.25  # the cut solution
    empty = figures["worked_common"]["held_out_instances"]
    assert empty["with_thought"] == 0.0 and empty["thought_right"] is None and empty["graded_right"] == 1.0


def test_two_measures_of_one_arm_resample_its_seeds_together(tmp_path):
    """Where every answer's thought is right exactly when its graded answer is, thought − graded is 0 in every
    resample, though the seeds differ: the two measures of one run are drawn together."""
    root, answers, out = tmp_path / "study", tmp_path / "answers", tmp_path / "outputs"
    _eval_folder(root, "s", "rl_teacher_s0", [0, 0, 3, 3, 0, 3])
    _eval_folder(root, "s", "rl_teacher_s1", [0, 3, 3, 3, 3, 3])
    _export(root, answers)
    write_outputs(root, out)
    differences = summarize_thoughts(graded_runs(answers, out), resamples=200, seed=0)["s"]["differences"]
    assert differences["rl_teacher (thought) - rl_teacher (graded)"]["held_out_instances"] == {
        "questions": 6, "difference": 0.0, "ci95": [0.0, 0.0]}


def test_the_thoughts_of_two_arms_are_compared_on_the_same_questions(tmp_path):
    root, answers, out = tmp_path / "study", tmp_path / "answers", tmp_path / "outputs"
    _eval_folder(root, "s", "rl_teacher_s0", [1] * 6)   # thoughts all wrong, answers all right
    _eval_folder(root, "s", "sft_teacher_s0", [0] * 6)  # both right
    _eval_folder(root, "s", "untrained_plain", [3] * 6)  # no thought, all wrong
    _export(root, answers)
    write_outputs(root, out)
    students = summarize_thoughts(graded_runs(answers, out), resamples=50, seed=0)
    differences = students["s"]["differences"]
    assert differences["rl_teacher (thought) - sft_teacher (thought)"]["held_out_instances"] == {
        "questions": 6, "difference": -1.0, "ci95": [-1.0, -1.0]}
    assert differences["rl_teacher (thought) - rl_teacher (graded)"]["held_out_instances"]["difference"] == -1.0
    assert differences["sft_teacher (thought) - untrained_plain (graded)"]["held_out_instances"]["difference"] == 1.0
    assert differences["rl_teacher (thought) - sft_teacher (thought)"]["held_out_templates"] == {"questions": 0}
    untrained = students["s"]["arms"]["untrained_plain"]["held_out_instances"]
    assert untrained["with_thought"] == 0.0 and untrained["thought_right"] is None and untrained["graded_right"] == 0.0


def test_outputs_of_other_questions_are_refused(tmp_path):
    root, answers, out = tmp_path / "study", tmp_path / "answers", tmp_path / "outputs"
    _eval_folder(root, "s", "rl_teacher_s0", [0, 1])
    _export(root, answers)
    other = tmp_path / "other"
    _eval_folder(other, "s", "rl_teacher_s0", [0, 1], held_out="templates")
    write_outputs(other, out)
    with pytest.raises(StudyError, match="the outputs of another run"):
        graded_runs(answers, out)
    with pytest.raises(StudyError, match="has its outputs"):
        graded_runs(answers, tmp_path / "none")


def _keep(folder: Path, teachers: dict[str, list[str]]) -> None:
    """keep's folder: per teacher its rows (question q<i>, template i % 2, right answer 7) and the manifest."""
    folder.mkdir(parents=True)
    manifest = {"teachers": {}}
    for name, explanations in teachers.items():
        data = "".join(json.dumps({"question_id": f"q{i}", "question": f"question {i}", "answer": "7",
                                   "template": i % 2, "explanation": text, "r_ss": -1.0 - i, "r_kl": 0.5 * i}) + "\n"
                       for i, text in enumerate(explanations)).encode()
        (folder / f"{name}.jsonl.xz").write_bytes(lzma.compress(data))
        manifest["teachers"][name] = {"file": f"{name}.jsonl.xz", "rows": len(explanations),
                                      "sha256": hashlib.sha256(data).hexdigest()}
    (folder / "manifest.json").write_text(json.dumps(manifest))


def test_each_kept_explanation_is_graded_as_an_answer(tmp_path):
    kept = tmp_path / "kept"
    right_one, wrong, unboxed = "so \\boxed{7}", "so \\boxed{8}", "the total is 8"
    _keep(kept, {"sft": [right_one, right_one, right_one, unboxed],
                 "rl_s0": [right_one, wrong, wrong, "the total is 7"]})
    figures = teachers_figures(kept, resamples=50, seed=0)
    assert figures["sft"]["rows"] == 4 and figures["sft"]["boxed"] == 0.75 and figures["sft"]["right"] == 0.75
    assert figures["sft"]["right_boxed"] == 0.75
    assert "minus_sft" not in figures["sft"]
    assert figures["rl_s0"]["right"] == 0.5 and figures["rl_s0"]["boxed"] == 0.75
    assert figures["rl_s0"]["right_boxed"] == 0.25  # its last, unboxed right one does not count by the box alone
    assert figures["rl_s0"]["minus_sft"]["sft"]["questions"] == 4
    assert figures["rl_s0"]["minus_sft"]["sft"]["difference"] == -0.25
    assert figures["rl_s0"]["minus_sft"]["sft"]["difference_boxed"] == -0.5
    # r_ss -1 - i, r_kl 0.5 i of row i: rl_s0's right rows 0 and 3, wrong rows 1 and 2; sft's right rows 0-2
    assert figures["rl_s0"]["reward_parts"] == {"right": {"rows": 2, "r_ss": -2.5, "r_kl": 0.75},
                                                "wrong": {"rows": 2, "r_ss": -2.5, "r_kl": 0.75}}
    assert figures["sft"]["reward_parts"] == {"right": {"rows": 3, "r_ss": -2.0, "r_kl": 0.5},
                                              "wrong": {"rows": 1, "r_ss": -4.0, "r_kl": 1.5}}
    low, high = figures["rl_s0"]["ci95"]
    assert 0.0 <= low <= 0.5 <= high <= 1.0


def test_the_command_writes_the_json_and_the_table(tmp_path):
    root, answers, out, kept = tmp_path / "study", tmp_path / "answers", tmp_path / "outputs", tmp_path / "kept"
    _eval_folder(root, "s", "rl_teacher_s0", [0, 1, 2, 3])
    _export(root, answers)
    assert _run("outputs", root, "--out", out).returncode == 0
    _keep(kept, {"sft": ["\\boxed{7}"], "rl_s0": ["\\boxed{8}"]})
    done = _run("thoughts", answers, "--outputs", out, "--explanations", kept, "--out", tmp_path / "result",
                "--resamples", 20)
    assert done.returncode == 0, done.stderr
    result = json.loads((tmp_path / "result" / "thoughts.json").read_text())
    assert result["commit"] == ["abc1234"] and result["device"] == ["H100"] and len(result["runs"]) == 1
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=SCRIPT.parent, capture_output=True, text=True)
    assert result["analysis_commit"].split("+")[0] == (head.stdout.strip() if head.returncode == 0 else "unknown")
    assert result["students"]["s"]["arms"]["rl_teacher"]["held_out_instances"]["thought_right"] == 0.5
    assert result["teachers"]["rl_s0"]["minus_sft"]["sft"]["difference"] == -1.0
    table = (tmp_path / "result" / "thoughts_table.md").read_text()
    assert ("| s | rl_teacher | 0 | held_out_instances | 0.750 | 0.500 | 0.500 | 0.500 | 0.250 | 0.250 | 1.000 |"
            in table)
    assert ("| rl_s0 | 1 | 1.000 | 0.000 [0.000, 0.000] | 0.000 | sft -1.000 [-1.000, -1.000] | - | -1.000, 0.000 |"
            in table)
    missing = _run("thoughts", answers, "--outputs", tmp_path / "none", "--out", tmp_path / "r2")
    assert missing.returncode == 2 and "has its outputs" in missing.stderr
