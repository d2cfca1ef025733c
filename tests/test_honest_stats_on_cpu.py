"""Honest statistics: intervals over too few rows are flagged, ``compare`` refuses evals over
different held-out sets and answers a file of another shape in one line; ``rescore`` of a folder without rows."""

import json
import logging

import pytest

from rlt_mono.stages.eval import EVAL_FILE, ROWS_FILE, main, warn_capped, warn_too_few
from rlt_mono.stages.eval_compare import compare_table, questions_fingerprint
from rlt_mono.study.eval_stats import MIN_ROWS_FOR_INTERVAL, summarize

EXPECTED = 'an eval.json (a JSON object whose "metrics" map each figure to its "mean", "low", "high", "n")'


def test_one_row_has_no_interval_and_few_rows_are_flagged():
    assert summarize([1.0], 0.95, 100, 0) == {"mean": 1.0, "low": None, "high": None, "n": 1, "too_few": True}
    assert summarize([0.0, 1.0], 0.95, 100, 0)["too_few"] is True
    assert summarize([0.0, 1.0] * (MIN_ROWS_FOR_INTERVAL // 2), 0.95, 100, 0)["too_few"] is False


def test_the_eval_warns_once_naming_each_figure_on_too_few_rows(caplog):
    summary = {"metrics": {"student/accuracy": summarize([1.0], 0.95, 10, 0),
                           "teacher/reward": summarize([-1.0] * MIN_ROWS_FOR_INTERVAL, 0.95, 10, 0)},
               "by_heldout": {"templates": {"metrics": {"student/accuracy": summarize([1.0, 0.0], 0.95, 10, 0)}}}}
    with caplog.at_level(logging.WARNING, logger="rlt_mono.stages.eval"):
        warn_too_few(summary)
    assert [r.getMessage() for r in caplog.records] == [
        "eval: student/accuracy (n=1), student/accuracy [templates] (n=2) rest on fewer than 30 questions: their "
        "intervals are not to be trusted (marked too_few in eval.json); evaluate more held-out rows"]


def _eval_folder(folder, questions, accuracy=0.5):
    folder.mkdir()
    metrics = {"student/accuracy": summarize([accuracy] * len(questions), 0.95, 10, 0)}
    (folder / EVAL_FILE).write_text(json.dumps({"questions": len(questions), "metrics": metrics}))
    (folder / ROWS_FILE).write_text("".join(json.dumps({"question": q, "correct": True}) + "\n" for q in questions))
    return folder / EVAL_FILE


def test_compare_refuses_evals_over_different_questions(tmp_path, capsys):
    a = _eval_folder(tmp_path / "a", ["q1", "q2"])
    b = _eval_folder(tmp_path / "b", ["q1", "q3"])
    same = _eval_folder(tmp_path / "c", ["q2", "q1"])
    assert main(["compare", str(a), str(same)]) == 0
    assert "WARNING" not in capsys.readouterr().out
    assert main(["compare", str(a), str(b)]) == 2
    assert capsys.readouterr().err == (
        f"error: {tmp_path / 'a'}, {tmp_path / 'b'}: evaluated on different held-out questions, so their figures "
        "are not comparable; evaluate on the same rows, or pass --allow-different-questions\n")
    table = compare_table([a, b], allow_different_questions=True)
    assert table.splitlines()[0] == ("**WARNING: these evals ran on DIFFERENT held-out questions; the figures are "
                                     "not comparable question for question.**")
    assert "0.500 [0.500, 0.500] (too few rows) (n=2)" in table


def test_a_stored_fingerprint_is_read_before_the_rows(tmp_path):
    a = _eval_folder(tmp_path / "a", ["q1"])
    b = _eval_folder(tmp_path / "b", ["q1"])
    result = json.loads(b.read_text())
    b.write_text(json.dumps({**result, "questions_sha256": questions_fingerprint(["other"])}))
    with pytest.raises(ValueError, match="different held-out questions"):
        compare_table([a, b])
    assert "0.500 [no interval] (too few rows) (n=1)" in compare_table([a, a])


@pytest.mark.parametrize("content, says", [
    (b"[1, 2]", 'a JSON list without "metrics"'),
    (b'{"questions": 3}', 'a JSON dict without "metrics"'),
    (b'{"metrics": {"student/accuracy": {"low": 0}}}', 'metrics.student/accuracy has no "mean" and "n"'),
    (b"\x80\x81\xff\x00", "not text (a binary file?)"),
])
def test_compare_answers_a_file_of_another_shape_in_one_line(tmp_path, capsys, content, says):
    path = tmp_path / "x.json"
    path.write_bytes(content)
    assert main(["compare", str(path)]) == 2
    assert capsys.readouterr().err == f"error: {path}: {says}; expected {EXPECTED}\n"


def test_compare_of_a_missing_file_and_rescore_without_rows(tmp_path, capsys):
    assert main(["compare", str(tmp_path / "nope.json")]) == 2
    assert capsys.readouterr().err == (f"error: {tmp_path / 'nope.json'}: no such file; expected {EXPECTED}, "
                                       "e.g. outputs/eval/<run>/eval.json\n")
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / EVAL_FILE).write_text("{}")
    assert main(["rescore", str(folder)]) == 2
    assert capsys.readouterr().err == (f"error: {folder}: no eval_rows.jsonl here; pass an eval run folder (with "
                                       "eval.json and eval_rows.jsonl)\n")


def test_the_eval_warns_when_most_answers_run_to_the_cap(caplog):
    def summary(capped):
        return {"metrics": {"student/capped_frac": summarize([1.0] * capped + [0.0] * (10 - capped), 0.95, 10, 0)}}

    with caplog.at_level(logging.WARNING, logger="rlt_mono.stages.eval"):
        warn_capped(summary(4), 512)  # 40%: long answers happen, no warning
        warn_capped({"metrics": {}}, 512)  # no student half
        warn_capped(summary(10), 512)
    assert [r.getMessage() for r in caplog.records] == [
        "eval: 100% of the student's answers ran to eval.student_max_new_tokens=512 tokens without ending: look at "
        "its answers in eval_rows.jsonl; a model that repeats one token is broken (its training diverged), one whose "
        "answers are long needs a higher cap"]
