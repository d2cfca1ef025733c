"""The held-out instances that repeat a training question but for its names (bench/study_fair.py ``duplicates`` and
``distinct``), from hand-built rows whose near-duplicates are known, and hand-made answer files whose accuracies
without them are counted by hand."""

import hashlib
import json
import lzma
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "study_fair.py"
ROOT = SCRIPT.parents[1]
sys.path.insert(0, str(SCRIPT.parent))

import study_fair  # noqa: E402
from study.duplicates import (  # noqa: E402
    duplicates_record,
    explained_ids,
    near_duplicates,
    numbers,
    split_arms,
    study_split,
)
from study.layout import StudyError  # noqa: E402

COMMITTED = ROOT / "study_data" / "gsm_symbolic_v2" / "heldout_near_duplicates.json"


def _row(row_id: str, template: int, question: str, steps: str | None = None) -> dict:
    return {"id": row_id, "template": template, "question": question, "steps": steps}


TRAINING = [
    _row("t1", 1, "Ann has 5 pink bricks. She buys 21 more. How many bricks?", "5 + 21 = 26"),
    _row("t2", 2, "Bob has 5 cats and 21 dogs. How many pets?", "5 + 21 = 26"),
    _row("t3", 3, "A farm sold 1,200 eggs at $2.50 each. How much?", "1200 * 2.5 = 3000"),
    _row("t4", 1, "Dee has 5 blue bricks. She buys 21 more. How many bricks?", "Dee: 5 + 21 = 26"),
]


def test_numbers_are_read_in_order_with_thousands_commas_and_by_value():
    assert numbers("It cost $1,250.50 for 3,4 items, 5.0 kg and 135.0 g; costs 5.") == ("1250.5", "3", "4", "5",
                                                                                          "135", "5")
    assert numbers("12,345,678 and 1,2345 and 7") == ("12345678", "1", "2345", "7")
    assert numbers("a 5-year-old, 20% off, 3:30 pm") == ("5", "20", "3", "30")
    assert numbers("no numbers here") == ()


def test_a_near_duplicate_has_the_template_and_the_numbers_in_order_of_a_training_question():
    held_out = [
        _row("h1", 1, "Eve has 5 white bricks. She buys 21 more. How many bricks?"),   # t1 and t4: names differ
        _row("h2", 5, "Fay has 5 white bricks. She buys 21 more. How many bricks?"),   # same numbers, other template
        _row("h3", 1, "Gus has 21 green bricks. She buys 5 more. How many bricks?"),   # same template, other order
        _row("h4", 3, "A shop sold 1200 eggs at $2.5 each. How much?"),                # t3's numbers, commas aside
        _row("h5", 3, "A shop sold 1,200 eggs at $2.25 each. How much?"),              # one number differs
        _row("h6", 2, "Hal has 5 cats, 21 dogs and 2 fish. How many pets?"),           # one number more
    ]
    assert near_duplicates(TRAINING, held_out) == {"h1": ["t1", "t4"], "h4": ["t3"]}


def test_the_record_says_which_match_an_explained_question_and_which_repeat_its_steps():
    held_out = [_row("h1", 1, "Eve has 5 white bricks. She buys 21 more.", "5 + 21 = 26"),
                _row("h4", 3, "A shop sold 1200 eggs at $2.5 each.", "1200 * 2.5 = 3,000"),
                _row("h9", 4, "Ivy has 9 hats.", "9")]
    record = duplicates_record(TRAINING, held_out, explained={"t4", "t2"})
    assert record["counts"] == {"training": 4, "explained": 2, "held_out_instances": 3, "near_duplicates": 2,
                                "near_duplicates_of_explained": 1, "same_steps": 1}
    assert record["near_duplicates"] == {
        "h1": {"template": 1, "training": ["t1", "t4"], "explained": True, "same_steps": True},   # t1's steps
        "h4": {"template": 3, "training": ["t3"], "explained": False, "same_steps": False}}
    with pytest.raises(StudyError, match="1 explained question.*no training question of this split"):
        duplicates_record(TRAINING, held_out, explained={"t4", "x9"})


def _keep(folder: Path, teachers: dict[str, list[str]]) -> Path:
    """keep's folder: per teacher its rows of the question ids given, and the manifest with their sha256."""
    folder.mkdir(parents=True)
    manifest = {"teachers": {}}
    for name, ids in teachers.items():
        data = "".join(json.dumps({"question_id": i, "question": f"question {i}"}) + "\n" for i in ids).encode()
        (folder / f"{name}.jsonl.xz").write_bytes(lzma.compress(data))
        manifest["teachers"][name] = {"file": f"{name}.jsonl.xz", "rows": len(ids),
                                      "sha256": hashlib.sha256(data).hexdigest()}
    (folder / "manifest.json").write_text(json.dumps(manifest))
    return folder


def test_the_explained_questions_are_those_every_kept_teacher_explained(tmp_path):
    assert explained_ids(_keep(tmp_path / "same", {"sft": ["t2", "t4"], "rl_s0": ["t4", "t2"]})) == {"t2", "t4"}
    with pytest.raises(StudyError, match="explained different questions \\(rl_s0 differ from sft\\)"):
        explained_ids(_keep(tmp_path / "other", {"sft": ["t2", "t4"], "rl_s0": ["t4"]}))


def test_the_duplicates_command_writes_the_split_s_near_duplicates_with_where_they_came_from(tmp_path, monkeypatch,
                                                                                          capsys):
    held_out = [_row("h1", 1, "Eve has 5 white bricks. She buys 21 more."), _row("h3", 1, "Gus has 21 and 5.")]
    monkeypatch.setattr(study_fair, "study_split", lambda: (TRAINING, held_out, {"source": "gsm_symbolic"}))
    out = tmp_path / "dups.json"
    assert study_fair.main(["duplicates", "--out", str(out), "--explanations",
                            str(_keep(tmp_path / "kept", {"sft": ["t1"]}))]) == 0
    saved = json.loads(out.read_text())
    assert saved["near_duplicates"] == {"h1": {"template": 1, "training": ["t1", "t4"], "explained": True,
                                               "same_steps": False}}
    assert saved["counts"]["near_duplicates"] == 1 and saved["data"] == {"source": "gsm_symbolic"}
    assert saved["command"].startswith(f"python bench/study_fair.py duplicates --out {out}")
    assert saved["commit"] and "numbers" in saved
    assert capsys.readouterr().out.strip() == (f"{out}: 1 of 2 held-out instances are near-duplicates of a training "
                                               "question; 1 match one of the 1 the teachers explained, 0 repeat a "
                                               "match's steps")


def test_the_committed_near_duplicates_are_those_of_the_study_s_split_now():
    """The committed file against the split the study's evals read, regenerated (the pinned reasoning-gym wheel)."""
    training, held_out, data = study_split()
    assert (len(training), len(held_out)) == (5242, 1000) and data["seed"] == 0
    committed = json.loads(COMMITTED.read_text())
    assert {held: entry["training"] for held, entry in committed["near_duplicates"].items()} == \
        near_duplicates(training, held_out)
    assert committed["counts"]["near_duplicates"] == len(committed["near_duplicates"]) > 0
    # the whole record: which match an explained question, which repeat its steps, the counts, the split's data
    record = duplicates_record(training, held_out, explained_ids(ROOT / "study_data" / "gsm_symbolic_v2" /
                                                                 "explanations"))
    assert {key: record[key] for key in ("near_duplicates", "counts")} == \
        {key: committed[key] for key in ("near_duplicates", "counts")}
    assert committed["data"] == data
    assert COMMITTED.stat().st_size < 100_000


def _answers(folder: Path, student: str, label: str, instances: str, templates: str = "10") -> None:
    """export's file of one run: held-out instances q0..q9 (template i % 5) right where ``instances`` says 1, then
    held-out templates u0.. right where ``templates`` says."""
    correct = instances + templates
    path = folder / student / f"{label}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({
        "device": "H200", "commit": "abc1234", "command": "bash study.sh",
        "question": [f"q{i}" for i in range(len(instances))] + [f"u{i}" for i in range(len(templates))],
        "heldout": "i" * len(instances) + "t" * len(templates),
        "template": [i % 5 for i in range(len(instances))] + [90 + i for i in range(len(templates))],
        "correct": correct, "capped": "0" * len(correct), "looped": "0" * len(correct)}))


def _duplicates_file(path: Path, ids: list[str]) -> Path:
    path.write_text(json.dumps({"commit": "def5678", "counts": {"near_duplicates": len(ids)},
                                "near_duplicates": {i: {"template": 0, "training": ["t1"], "explained": i == "q0"}
                                                    for i in ids}}))
    return path


def _run(*args):
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True)


def test_distinct_summarizes_the_held_out_instances_without_the_near_duplicates_and_on_them_alone(tmp_path):
    answers = tmp_path / "answers"
    # near-duplicates q0 (template 0) and q1 (template 1); the distinct questions q2..q9
    _answers(answers, "s", "untrained_s0", "0100000001")   # distinct 1/8 = 0.125; near-duplicates 1/2
    _answers(answers, "s", "worked_s0", "1111100000")      # distinct 3/8 = 0.375; near-duplicates 2/2
    _answers(answers, "s", "worked_s1", "1101111000")      # distinct 4/8 = 0.5; near-duplicates 2/2
    dups = _duplicates_file(tmp_path / "dups.json", ["q0", "q1"])
    out = tmp_path / "results" / "distinct_instances.json"
    result = _run("distinct", answers, "--duplicates", dups, "--out", out, "--resamples", 200)
    assert result.returncode == 0, result.stderr
    saved = json.loads(out.read_text())
    assert saved["commit"] == ["abc1234"] and saved["device"] == ["H200"] and saved["commands"] == ["bash study.sh"]
    assert saved["duplicates"]["commit"] == "def5678" and saved["duplicates"]["counts"]["near_duplicates"] == 2
    entry = saved["students"]["s"]
    worked = entry["distinct"]["arms"]["worked"]
    assert worked["seeds"] == [0, 1] and worked["per_seed"] == [0.375, 0.5] and worked["accuracy"] == 0.4375
    assert worked["questions"] == 8 and worked["ci95"][0] <= 0.4375 <= worked["ci95"][1]
    assert entry["distinct"]["arms"]["untrained"]["accuracy"] == 0.125
    assert entry["near_duplicates"]["arms"]["worked"]["accuracy"] == 1.0
    assert entry["near_duplicates"]["arms"]["untrained"]["accuracy"] == 0.5
    assert entry["near_duplicates"]["arms"]["worked"]["questions"] == 2
    assert entry["gap"] == {"untrained": 0.375, "worked": 0.5625}
    control = entry["distinct"]["positive_control"]
    assert control["baseline"] == "untrained" and control["difference"] == 0.3125
    assert entry["distinct"]["differences"]["worked - untrained"]["difference"] == 0.3125
    # within templates 0 and 1: the near-duplicates against q5 and q6 (worked: wrong in seed 0, right in seed 1)
    assert entry["template_matched"]["worked"] == {"near_duplicates": 1.0, "distinct": 0.5, "gap": 0.5,
                                                   "templates": 2, "questions": 2}
    # held-out instances only, and no question's answer in the results
    assert "held_out_templates" not in json.dumps(entry) and '"q2"' not in out.read_text()
    table = out.with_suffix(".md").read_text()
    assert "| worked | 0, 1 | 0.438 [" in table and "(n=8)" in table and "+0.562" in table


def test_near_duplicates_that_no_run_answered_are_refused():
    arms = {"s": {"worked": {0: [{"question": "q0", "heldout": "instances", "template": 0, "correct": True}]}}}
    distinct, alone = split_arms(arms, ["q0"])
    assert distinct["s"]["worked"][0] == [] and alone["s"]["worked"][0][0]["question"] == "q0"
    with pytest.raises(StudyError, match="1 of the 2 near-duplicates are no held-out instance these answers hold"):
        split_arms(arms, ["q0", "zz"])


@pytest.mark.parametrize("content, message", [
    (None, "no such file"),
    ("not json {", "not a JSON file"),
    ('{"counts": {}}', 'no "near_duplicates" object'),
    ('{"near_duplicates": {"zz": {"template": 0}}}', "the duplicates file is of another split"),
])
def test_a_missing_or_malformed_duplicates_file_is_one_line_and_exit_2(tmp_path, content, message):
    answers = tmp_path / "answers"
    _answers(answers, "s", "worked_s0", "1111100000")
    dups = tmp_path / "dups.json"
    if content is not None:
        dups.write_text(content)
    result = _run("distinct", answers, "--duplicates", dups, "--out", tmp_path / "out.json")
    assert result.returncode == 2
    assert result.stderr.startswith("error: ") and message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "out.json").exists()


def test_distinct_without_answers_is_one_line_and_exit_2(tmp_path):
    result = _run("distinct", tmp_path / "none", "--duplicates", _duplicates_file(tmp_path / "d.json", ["q0"]),
                  "--out", tmp_path / "out.json")
    assert result.returncode == 2 and result.stderr.startswith("error: no <student>/<arm>")
    assert len(result.stderr.strip().splitlines()) == 1
