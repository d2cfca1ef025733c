"""A pipeline folder holds no path of where it was (rlt_mono.stages.pipeline): its stages run in it and record paths
relative to it, so a copy continues as the original would have, after a kill -9 too, and ends with the files of an
uninterrupted run. The pipeline's settings (cfgs/train.yaml: study, steps, rerun_changed, keep_checkpoints) are
typed: a wrong one is one line and exit code 2, one a single stage ignores is a warning naming it."""

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf

from rlt_mono import cli
from rlt_mono.config import compose
from rlt_mono.errors import UserError
from rlt_mono.runs.checkpoints import MANIFEST
from rlt_mono.stages import pipeline
from rlt_mono.stages.pipeline_steps import STEPS, pipeline_options

ROOT = Path(__file__).resolve().parent.parent
# The smallest stages the other pipeline tests run; distill writes one question at a time, so a kill can land
# between two of them.
SMALL = ["pipeline.teacher_sft.overrides=['size=tiny','sft.max_steps=4','sft.save_steps=2']",
         "pipeline.teacher_rlt.overrides=['trainer.max_steps=2','trainer.save_steps=2',"
         "'trainer.max_completion_length=24']",
         "pipeline.distill.overrides=['size=tiny','data.max_rows=4','distill.rows_per_batch=1']"]
ROWS = 4
BEFORE_DISTILL = "steps=[teacher_sft,teacher_rlt]"
UP_TO_DISTILL = "steps=[teacher_sft,teacher_rlt,distill]"
# Keys whose values differ between any two runs: wall times and speeds.
VOLATILE = ("runtime", "per_second", "seconds", "tokens_per_s", "step_time")


def _start(folder: Path, steps: str, log: Path) -> subprocess.Popen:
    with log.open("a") as out:  # a file, not a pipe: a pipe nobody reads would stop the pipeline when full
        return subprocess.Popen([sys.executable, "-m", "rlt_mono.cli", "pipeline_tiny", f"output_dir={folder}", steps,
                                 *SMALL], cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)


def _run(folder: Path, steps: str) -> str:
    log = folder.parent / f"{folder.name}.log"
    process = _start(folder, steps, log)
    assert process.wait(timeout=1200) == 0, log.read_text()[-3000:]
    return log.read_text()


def _copy_and_delete(source: Path, target: Path) -> Path:
    shutil.copytree(source, target, symlinks=True)
    shutil.rmtree(source)
    return target


def _content(path: Path, folder: Path):
    """What must be equal between two runs: bytes, or for JSON, JSONL and YAML the values without ``VOLATILE`` keys;
    the new-folder time (run_dir, unused: output_dir is set) and, in the pipeline's own config.yaml, output_dir (the
    folder's own name) left out."""
    def clean(value):
        if isinstance(value, dict):
            return {k: clean(v) for k, v in value.items() if not any(word in k for word in VOLATILE)}
        return [clean(v) for v in value] if isinstance(value, list) else value

    if path.name == MANIFEST:  # its sizes of the checkpoint's files include trainer_state.json's times
        manifest = json.loads(path.read_text())
        return {**manifest, "files": sorted(manifest["files"])}
    if path.suffix == ".jsonl":
        return [clean(json.loads(line)) for line in path.read_text().splitlines()]
    if path.suffix == ".json":
        return clean(json.loads(path.read_text()))
    if path.suffix == ".yaml":
        config = yaml.safe_load(path.read_text())
        return {k: v for k, v in config.items() if k != "run_dir" and (k != "output_dir" or path.parent != folder)}
    return path.read_bytes()


def _files(folder: Path) -> dict[str, object]:
    # the plot draws the phase times
    return {str(p.relative_to(folder)): _content(p, folder) for p in sorted(folder.rglob("*"))
            if p.is_file() and p.suffix != ".png"}


def _assert_same_files(folder: Path, reference: Path, temp: Path) -> None:
    """``folder``'s files equal ``reference``'s, and none names a folder under ``temp`` (where every copy was)."""
    ours, theirs = _files(folder), _files(reference)
    assert sorted(ours) == sorted(theirs)
    differ = [name for name in theirs if ours[name] != theirs[name]]
    assert not differ, differ
    named = [name for name in ours if str(temp).encode() in (folder / name).read_bytes()]
    assert named == ["config.yaml"]  # the pipeline's own output_dir, left out above


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    """An uninterrupted pipeline up to distill."""
    folder = tmp_path_factory.mktemp("reference") / "p"
    _run(folder, UP_TO_DISTILL)
    assert len((folder / "3_distill" / "distill.jsonl").read_text().splitlines()) == ROWS
    return folder


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """A pipeline run up to distill, then copied elsewhere and the original deleted."""
    original = tmp_path_factory.mktemp("original") / "p"
    _run(original, BEFORE_DISTILL)
    return _copy_and_delete(original, tmp_path_factory.mktemp("trained") / "p")


def test_a_copied_pipeline_continues_and_ends_with_the_files_of_an_uninterrupted_run(trained, reference, tmp_path,
                                                                                    tmp_path_factory):
    copy = tmp_path / "copy" / "p"
    shutil.copytree(trained, copy, symlinks=True)
    log = _run(copy, UP_TO_DISTILL)
    assert log.count("done already") == 2 and f"0 already written, {ROWS} to explain" in log
    assert json.loads((copy / "1_teacher_sft" / "sft_summary.json").read_text())["final"] == "1_teacher_sft/final"
    assert OmegaConf.load(copy / "3_distill" / "config.yaml").model.model_name_or_path == "2_teacher_rlt/final"
    assert {json.loads(line)["teacher"] for line in (copy / "3_distill" / "distill.jsonl").open()} == {
        "2_teacher_rlt/final"}
    _assert_same_files(copy, reference, tmp_path_factory.getbasetemp())


def _children(pid: int) -> list[int]:
    return [int(child) for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    except (FileNotFoundError, IndexError):
        return False


def _kill_when(process: subprocess.Popen, reached, log: Path) -> None:
    """kill -9 the pipeline ``process`` once ``reached()``, then wait for its stages to die with it (Linux's
    parent-death signal); the pipeline ending first fails with its log."""
    deadline = time.monotonic() + 900
    while not reached():
        assert process.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
        time.sleep(0.02)
    stages = _children(process.pid)
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    deadline = time.monotonic() + 60
    while any(_alive(stage) for stage in stages) and time.monotonic() < deadline:
        time.sleep(0.05)


@pytest.mark.skipif(sys.platform != "linux", reason="the stage dies with its pipeline by Linux's parent-death signal")
def test_a_copied_pipeline_killed_mid_distill_ends_with_the_files_of_an_uninterrupted_run(trained, reference,
                                                                                           tmp_path, tmp_path_factory):
    killed = tmp_path / "killed" / "p"
    shutil.copytree(trained, killed, symlinks=True)
    process = _start(killed, UP_TO_DISTILL, tmp_path / "killed.log")
    rows = killed / "3_distill" / "distill.jsonl"
    _kill_when(process, lambda: rows.is_file() and b"\n" in rows.read_bytes(), tmp_path / "killed.log")
    written = rows.read_text().count("\n")  # whole lines: a line cut short is written again
    assert 1 <= written < ROWS  # killed between two questions' rows, not after the last
    # moved once more: distill's rows are checked against the teacher it recorded, relative to the folder
    moved = _copy_and_delete(killed, tmp_path / "moved" / "p")
    log = _run(moved, UP_TO_DISTILL)
    assert f"{written} already written, {ROWS - written} to explain" in log
    _assert_same_files(moved, reference, tmp_path_factory.getbasetemp())


@pytest.mark.skipif(sys.platform != "linux", reason="the stage dies with its pipeline by Linux's parent-death signal")
@pytest.mark.parametrize("when", ["before its first checkpoint", "after its first checkpoint"])
def test_a_pipeline_killed_in_a_training_stage_and_moved_ends_with_the_files_of_an_uninterrupted_run(
        when, reference, tmp_path, tmp_path_factory):
    """kill -9 while teacher_sft trains: before its first save the step starts again in an empty folder, after it
    the step resumes from its checkpoint; either way, moved elsewhere and rerun, every file is the uninterrupted
    run's (config.yaml records no resume, the checkpoints' training arguments are as configured, the loss summed
    and the tokens counted carry over)."""
    killed = tmp_path / "killed" / "p"
    log = tmp_path / "killed.log"
    process = _start(killed, UP_TO_DISTILL, log)
    stage = killed / "1_teacher_sft"

    def reached() -> bool:
        if when == "after its first checkpoint":
            return (stage / "checkpoint-2").is_dir()
        metrics = stage / "metrics.jsonl"
        return metrics.is_file() and b'"step": 1' in metrics.read_bytes()

    _kill_when(process, reached, log)
    assert not (stage / "final").exists()  # killed inside the stage
    moved = _copy_and_delete(killed, tmp_path / "moved" / "p")
    rerun = _run(moved, UP_TO_DISTILL)
    if when == "after its first checkpoint":
        assert "resume_from_checkpoint=true" in rerun
    else:
        assert "stopped before its first checkpoint: starting it again" in rerun
    _assert_same_files(moved, reference, tmp_path_factory.getbasetemp())


# ---- the pipeline's settings ------------------------------------------------------------------------------------
def _pipeline(root: Path, *overrides: str) -> Path:
    return pipeline.run_pipeline(compose("pipeline_tiny", [f"output_dir={root}", *overrides]))


@pytest.mark.parametrize(("override", "error"), [
    ("rerun_changed=maybe", "rerun_changed must be true or false, got 'maybe'"),
    ("keep_checkpoints=no", "keep_checkpoints must be true or false, got 'no'"),
    ("study=1", "study must be true or false, got 1"),
    ("+keep_checkpoint=false", "unknown key keep_checkpoint: did you mean keep_checkpoints?"),
    ("steps=distill", "steps must be a list of step names, e.g. steps=[distill,student_sft] (or null: every step), "
                      "got 'distill'"),
    ("+rerun_changed=true", "Could not append to config. An item is already at 'rerun_changed'. Either remove + "
                            "prefix: 'rerun_changed=true' Or add a second + to add or override 'rerun_changed': "
                            "'++rerun_changed=true'"),
])
def test_a_wrong_pipeline_setting_is_one_line_and_exit_2_before_anything_is_written(override, error, tmp_path,
                                                                                      capsys, launched):
    root = tmp_path / "p"
    assert cli.main(["pipeline_tiny", f"output_dir={root}", override]) == 2
    assert capsys.readouterr().err == f"error: {error}\n"
    assert launched == [] and not (root / "config.yaml").exists()


@pytest.mark.parametrize(("stage", "override", "warning"), [
    ("teacher_sft", "rerun_changed=true", "rerun_changed=true is a pipeline's setting: stage teacher_sft ignores it"),
    ("distill", "keep_checkpoints=false", "keep_checkpoints=false is a pipeline's setting: stage distill ignores it"),
    ("eval", "steps=[eval_teacher]", "steps=[eval_teacher] is a pipeline's setting: stage eval ignores it"),
])
def test_a_pipeline_setting_given_to_a_single_stage_is_a_warning_naming_it(stage, override, warning, caplog):
    def warnings(overrides: list[str]) -> list[str]:
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="rlt_mono.stages.pipeline_steps"):
            cli.check_run_keys(compose(stage, ["size=tiny", *overrides]))
        return [r.getMessage() for r in caplog.records if r.name == "rlt_mono.stages.pipeline_steps"]

    assert warnings([override]) == [warning]
    assert warnings([]) == []


def test_plus_steps_still_composes():
    # (the settings' defaults are train.yaml's alone: tests/test_config_defaults_on_cpu.py)
    # bench/study_gsm.sh of earlier commits wrote +steps=[...]: Hydra adds to a key whose value is null
    assert pipeline_options(compose("pipeline_tiny", ["+steps=[distill,student_sft]"])).steps == ["distill",
                                                                                                  "student_sft"]


def test_keep_checkpoints_false_on_a_finished_pipeline_deletes_the_finished_steps_checkpoints(tmp_path, launched):
    root = tmp_path / "p"
    _pipeline(root)
    trained = [root / name for name in ("1_teacher_sft", "2_teacher_rlt", "4_student_sft")]
    assert all((folder / "checkpoint-2").is_dir() for folder in trained)  # kept by default
    launched.clear()
    _pipeline(root, "steps=[teacher_sft,teacher_rlt]", "keep_checkpoints=false")
    assert launched == []  # both done already
    assert [(folder / "checkpoint-2").is_dir() for folder in trained] == [False, False, True]  # steps=[...] only
    assert all((folder / "final" / "config.json").is_file() for folder in trained)
    _pipeline(root, "keep_checkpoints=false")
    assert not (root / "4_student_sft" / "checkpoint-2").exists()


def test_a_refused_rerun_leaves_the_pipeline_config_as_it_was(tmp_path, launched):
    root = tmp_path / "p"
    _pipeline(root)
    before = (root / "config.yaml").read_bytes()
    launched.clear()
    with pytest.raises(UserError, match=r"pipeline step eval_teacher .* \(data.max_rows: 6 -> 2\): set them back"):
        _pipeline(root, "pipeline.eval.overrides=['size=tiny','data.max_rows=2']")
    assert launched == [] and (root / "config.yaml").read_bytes() == before
    _pipeline(root, "pipeline.eval.overrides=['size=tiny','data.max_rows=2']", "rerun_changed=true")
    assert launched == ["3_distill", "5_eval_teacher", "6_eval_student"]
    assert yaml.safe_load((root / "config.yaml").read_text())["rerun_changed"] is True


def test_stages_get_paths_in_the_pipeline_folder_relative_and_a_launch_relative_input_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "rows.jsonl").write_text('{"question": "q", "solution": "s"}\n')
    steps = {p.stage: p for p in pipeline.plan(compose("pipeline_tiny", ["data=custom", "data.source=rows.jsonl"]),
                                                tmp_path / "p")}
    assert list(steps) == list(STEPS)
    for step in ("teacher_sft", "teacher_rlt", "distill", "eval_teacher"):  # the stages that read the dataset
        assert steps[step].overrides[-1] == f"data.source={tmp_path}/rows.jsonl"
        assert steps[step].settings["data.source"] == f"{tmp_path}/rows.jsonl"
    assert steps["student_sft"].settings["data.source"] == "3_distill/distill.jsonl"  # the wiring stays relative
    assert steps["distill"].settings["model.model_name_or_path"] == "2_teacher_rlt/final"
    assert steps["distill"].folder == tmp_path / "p" / "3_distill"


def test_distill_continues_a_folder_whose_record_names_the_same_teacher_absolute(tmp_path, monkeypatch):
    from rlt_mono.stages.sampler import check_resume_matches

    (tmp_path / "2_teacher_rlt" / "final").mkdir(parents=True)
    (tmp_path / "other").mkdir()
    distilled = tmp_path / "3_distill"
    distilled.mkdir()
    # what a pipeline of an earlier rlt_mono recorded: the teacher by its absolute path
    (distilled / "config.yaml").write_text(f"stage: distill\nmodel:\n  model_name_or_path: "
                                           f"{tmp_path}/2_teacher_rlt/final\n")
    monkeypatch.chdir(tmp_path)  # where a stage of the pipeline runs
    keys = ("model.model_name_or_path",)
    check_resume_matches(distilled, OmegaConf.create({"stage": "distill",
                                                      "model": {"model_name_or_path": "2_teacher_rlt/final"}}), keys)
    with pytest.raises(UserError, match=rf"^output_dir={distilled} was written with model.model_name_or_path="
                                        rf"\"{tmp_path}/2_teacher_rlt/final\", not \"other\": set"):
        check_resume_matches(distilled, OmegaConf.create({"stage": "distill",
                                                          "model": {"model_name_or_path": "other"}}), keys)
