"""Nothing lost, nothing silent: run folders, verified checkpoints, resume checks and one-line user errors.

Each test reproduces a finding of the new-user study (a half-written checkpoint picked for a resume, two runs
in one folder, a resume past max_steps, values that silently change the run, a traceback for a fixable input)
and asserts the behaviour that replaced it.
"""

import datetime
import errno
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rlt_mono.config import ConfigError, compose, instantiate
from rlt_mono.data.models import resolve_model_path
from rlt_mono.rl.grpo_config import RLTConfig
from rlt_mono.runs import checkpoints
from rlt_mono.runs.checkpoints import resolve_output_dir

ROOT = Path(__file__).resolve().parent.parent


def _fake_checkpoint(run: Path, step: int, *, manifest: bool = True, skip: tuple[str, ...] = ()) -> Path:
    folder = run / f"checkpoint-{step}"
    folder.mkdir(parents=True)
    for name in (*checkpoints.TRAINING_STATE_FILES, checkpoints.RNG_FILE, "model.safetensors"):
        if name not in skip:
            content = json.dumps({"global_step": step}) if name == checkpoints.TRAINER_STATE else "x" * 100
            (folder / name).write_text(content)
    if manifest:
        checkpoints.write_manifest(folder, step)
    return folder


# ---- run folders --------------------------------------------------------------------------------------
def test_two_runs_started_in_the_same_second_get_two_folders(tmp_path):
    run_dir = tmp_path / "outputs" / "demo" / "2026-11-22_11-00-00"
    first, second = checkpoints.new_run_dir(run_dir), checkpoints.new_run_dir(run_dir)
    assert (first.name, second.name) == ("2026-11-22_11-00-00", "2026-11-22_11-00-00_2")
    assert first.is_dir() and second.is_dir()


def test_a_new_run_lands_in_the_configs_run_dir(tmp_path):
    stamp = datetime.datetime.now().strftime("%Y-%m-%d_%H-")
    default = compose("demo_tiny").run_dir  # outputs/<run_name>/<time>, from the root config
    assert default.startswith(f"outputs/demo_tiny/{stamp}")
    cfg = compose("demo_tiny", [f"run_dir={tmp_path}/mine/${{now:%Y}}"])
    folder = resolve_output_dir(cfg.output_dir, cfg.run_dir, resuming=False)
    assert folder == tmp_path / "mine" / stamp[:4] and folder.is_dir()


def test_reusing_an_output_dir_without_resume_names_both_ways_forward(tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n')
    _fake_checkpoint(tmp_path, 1)
    with pytest.raises(checkpoints.CheckpointError, match=r"already holds a run \(metrics.jsonl, checkpoint-1\): "
                       r"continue it with resume_from_checkpoint=true, or start a new one in another output_dir"):
        resolve_output_dir(str(tmp_path), "demo", resuming=False)
    assert resolve_output_dir(str(tmp_path / "empty"), "demo", resuming=False) == tmp_path / "empty"
    (tmp_path / "a_file").write_text("")
    with pytest.raises(checkpoints.CheckpointError, match=r"cannot create .*a_file/run \(Not a directory\)"):
        resolve_output_dir(str(tmp_path / "a_file" / "run"), "demo", resuming=False)
    assert resolve_output_dir(str(tmp_path), "demo", resuming=True) == tmp_path


# ---- checkpoints ------------------------------------------------------------------------------------
def test_resume_true_takes_the_newest_complete_checkpoint_and_says_what_it_skipped(tmp_path, caplog):
    _fake_checkpoint(tmp_path, 2)
    _fake_checkpoint(tmp_path, 4, skip=("optimizer.pt",), manifest=False)
    truncated = _fake_checkpoint(tmp_path, 6)
    (truncated / "optimizer.pt").write_text("x" * 10)  # a save cut short
    (tmp_path / f"{checkpoints.STAGING_PREFIX}checkpoint-8").mkdir()  # a save killed mid-way: never a candidate
    assert checkpoints.resolve_resume(tmp_path, True, max_steps=10) == str(tmp_path / "checkpoint-2")
    skipped = "\n".join(r.getMessage() for r in caplog.records)
    assert "checkpoint-6: optimizer.pt has 10 bytes, 100 were written" in skipped
    assert "checkpoint-4: optimizer.pt missing" in skipped


@pytest.mark.parametrize("missing", ["optimizer.pt", "rng_state.pth", "scheduler.pt"])
def test_a_checkpoint_without_training_state_is_refused(tmp_path, missing):
    folder = _fake_checkpoint(tmp_path, 3, skip=(missing,), manifest=False)
    with pytest.raises(checkpoints.CheckpointError, match=f"cannot be resumed: {missing} missing"):
        checkpoints.resolve_resume(tmp_path, str(folder), max_steps=10)


def test_resume_past_max_steps_and_resume_without_checkpoints_are_errors(tmp_path):
    folder = _fake_checkpoint(tmp_path, 4)
    with pytest.raises(checkpoints.CheckpointError, match="at step 4 and trainer.max_steps=2: nothing left"):
        checkpoints.resolve_resume(tmp_path, str(folder), max_steps=2)
    empty = tmp_path / "other"
    empty.mkdir()
    with pytest.raises(checkpoints.CheckpointError, match="no complete checkpoint in"):
        checkpoints.resolve_resume(empty, True, max_steps=2)
    assert checkpoints.resolve_resume(tmp_path, None, max_steps=2) is None


# ---- values that silently changed the run ----------------------------------------------------------------
@pytest.mark.parametrize(("override", "message"), [
    ("trainer.max_steps=0", "max_steps must be > 0, got 0"),
    ("trainer.max_steps=-1", "max_steps must be > 0, got -1"),
    ("trainer.beta=-1", "beta must be >= 0, got -1"),
    ("trainer.num_generations=1", "num_generations must be >= 2"),
    ("trainer.temperature=0", "temperature must be > 0"),
    ("trainer.per_device_train_batch_size=0", "per_device_train_batch_size must be > 0"),
    ("trainer.learning_rate=abc", "learning_rate must be a number, got 'abc'"),
])
def test_trainer_values_that_change_the_run_silently_are_refused(override, message, tmp_path):
    cfg = compose("demo_tiny", [override])
    with pytest.raises(ConfigError, match=f"^trainer: {message}"):
        instantiate(RLTConfig, {**cfg.trainer, "output_dir": str(tmp_path)}, "trainer")


def test_a_missing_local_model_folder_is_not_called_a_hub_id(tmp_path):
    with pytest.raises(ConfigError, match=f"model.model_name_or_path={tmp_path}/nope: no such folder"):
        resolve_model_path(f"{tmp_path}/nope", 0)
    assert resolve_model_path("Qwen/Qwen2.5-0.5B-Instruct", 0) == "Qwen/Qwen2.5-0.5B-Instruct"


def test_an_unset_mandatory_key_is_one_line():
    with pytest.raises(ConfigError, match=r"^data: data.source must be set"):
        from rlt_mono.data.rows import DataConfig

        instantiate(DataConfig, compose("demo_tiny", ["data=custom"]).data, "data")


# ---- the command line --------------------------------------------------------------------------------
def _cli(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "rlt_mono.cli", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout)


def test_help_lists_config_groups_and_how_to_list_keys():
    result = _cli("--help", timeout=60)
    assert result.returncode == 0
    assert "placement  async auto dp mono split student_gpu" in result.stdout
    assert "--show-config" in result.stdout and "demo_tiny" in result.stdout
    shown = _cli("demo_tiny", "--show-config", "trainer.max_steps=7", timeout=60)
    assert shown.returncode == 0 and "max_steps: 7" in shown.stdout


@pytest.mark.parametrize("args", [
    ("nope",),
    ("demo_tiny", "trainer.max_steps=-1"),
    ("demo_tiny", "model.model_name_or_path=/nowhere/model"),
    ("demo_tiny", "data=custom"),
    ("demo_tiny", "data=custom", "data.source=/nowhere/rows.jsonl"),
    ("demo_tiny", "resume_from_checkpoint=true"),
    ("demo_tiny", "placement=student_gpu"),
    ("demo_tiny", "seed=abc"),
    ("demo_tiny", "trainer.max_completion_length=5000"),
    ("demo_tiny", "placement.strategy=fsdp2"),
])
def test_user_mistakes_end_in_one_line_and_exit_code_2(args, tmp_path):
    result = _cli(*args, f"output_dir={tmp_path / 'run'}" if args[0] != "nope" else "")
    assert result.returncode == 2, result.stderr[-2000:]
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("error: ") and "Traceback" not in result.stderr


def test_a_run_that_stops_before_writing_leaves_no_empty_folder(tmp_path, monkeypatch):
    """output_dir unset: the run makes run_dir, and removes it again when it stops on a mistake before writing."""
    result = _cli("demo_tiny", "model.model_name_or_path=/nowhere/model", f"run_dir={tmp_path / 'runs' / 'a'}")
    assert result.returncode == 2 and "model.model_name_or_path=/nowhere/model" in result.stderr
    assert list((tmp_path / "runs").iterdir()) == []
    (tmp_path / "kept").mkdir()
    (tmp_path / "kept" / "config.yaml").write_text("x")
    (tmp_path / "empty").mkdir()
    # this process's own record: a folder the run wrote into stays, an empty one goes
    monkeypatch.setattr(checkpoints, "_made_run_dirs", [tmp_path / "kept", tmp_path / "empty"])
    assert checkpoints.remove_unused_run_dirs() == [tmp_path / "empty"]
    assert (tmp_path / "kept" / "config.yaml").is_file() and not (tmp_path / "empty").exists()


def test_disk_full_during_a_save_names_the_last_good_checkpoint(tmp_path, monkeypatch, caplog):
    from rlt_mono.errors import UserError
    from rlt_mono.rl.trainer import RLTTrainer
    from rlt_mono.stages.teacher_rlt import run_teacher_rlt

    save = RLTTrainer._save_optimizer_and_scheduler

    def fill_the_disk_at_step_2(self, output_dir):
        if self.state.global_step == 2:
            raise OSError(errno.ENOSPC, "No space left on device", f"{output_dir}/optimizer.pt")
        save(self, output_dir)

    monkeypatch.setattr(RLTTrainer, "_save_optimizer_and_scheduler", fill_the_disk_at_step_2)
    released, release = [], RLTTrainer.release

    def release_then_fail_again(self):  # as a device that failed once may fail again while freeing memory
        released.append(self.state.global_step)
        release(self)
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr(RLTTrainer, "release", release_then_fail_again)
    out = tmp_path / "run"
    cfg = compose("demo_tiny", [f"output_dir={out}", "trainer.max_steps=3", "trainer.save_steps=1",
                                "trainer.plot_metrics=false"])
    expected = (rf"^disk full while writing .*optimizer.pt: free space, then resume with output_dir={out} "
                rf"resume_from_checkpoint=true \(last complete checkpoint: {out}/checkpoint-1\)")
    with pytest.raises(UserError, match=expected):
        run_teacher_rlt(cfg)
    # the failed stage still let go of what its trainer held, and its own error, not release's, reached the user
    assert released == [2]
    assert "releasing the trainer after the failure failed too: RuntimeError: CUDA error" in caplog.text
    assert sorted(p.name for p in out.iterdir() if "checkpoint" in p.name) == [
        f"{checkpoints.STAGING_PREFIX}checkpoint-2", "checkpoint-1"]
    assert checkpoints.resolve_resume(out, True, max_steps=3) == str(out / "checkpoint-1")


def test_too_few_rows_and_a_runaway_row_stop_before_training(tmp_path):
    rows = [{"question": f"What is {i} + {i}?", "solution": f"The answer is {2 * i}."} for i in range(3)]
    few = tmp_path / "few.jsonl"
    few.write_text("".join(json.dumps(r) + "\n" for r in rows))
    result = _cli("demo_tiny", "data=custom", f"data.source={few}", "data.eval_rows=0",
                  f"output_dir={tmp_path / 'a'}")
    assert result.returncode == 2, result.stderr[-2000:]
    assert "has 3 usable training rows (0 skipped) but one optimizer step needs 4 distinct prompts" in result.stderr
    assert not (tmp_path / "a" / "final").exists()  # no untrained teacher saved as if trained
    huge = tmp_path / "huge.jsonl"
    huge.write_text("".join(json.dumps(r) + "\n" for r in [*rows * 3, {"question": "x " * 30_000, "solution": "1"}]))
    result = _cli("demo_tiny", "data=custom", f"data.source={huge}", "data.eval_rows=0",
                  f"output_dir={tmp_path / 'b'}")
    assert result.returncode == 2, result.stderr[-2000:]
    assert "row 9" in result.stderr.splitlines()[-1] and "tokens" in result.stderr.splitlines()[-1]
    # a megabyte row is stopped by the length guard every stage shares, before any tokenizer sees it
    huge.write_text("".join(json.dumps(r) + "\n" for r in [*rows * 3, {"question": "x " * 500_000, "solution": "1"}]))
    result = _cli("demo_tiny", "data=custom", f"data.source={huge}", "data.eval_rows=0",
                  f"output_dir={tmp_path / 'c'}")
    assert result.returncode == 2, result.stderr[-2000:]
    assert "row 9: column 'question' has 1,000,000 characters" in result.stderr.splitlines()[-1]


def test_a_run_stopped_after_its_last_checkpoint_resumes_to_its_final_teacher(tmp_path, monkeypatch):
    import shutil

    from safetensors.torch import load_file

    from rlt_mono.rl.trainer import RLTTrainer
    from rlt_mono.runs.outputs import METRICS_FILE, read_metrics
    from rlt_mono.stages.teacher_rlt import run_teacher_rlt

    released, release = [], RLTTrainer.release
    monkeypatch.setattr(RLTTrainer, "release", lambda self: (released.append(self.state.global_step), release(self)))

    out = tmp_path / "run"
    overrides = [f"output_dir={out}", "trainer.max_steps=2", "trainer.save_steps=1", "trainer.plot_metrics=false",
                 "trainer.max_completion_length=16"]
    run_teacher_rlt(compose("demo_tiny", overrides))
    trained = load_file(out / "final" / "model.safetensors")
    shutil.rmtree(out / "final")  # as if killed between the checkpoint of step 2 and final/
    run_teacher_rlt(compose("demo_tiny", [*overrides, "resume_from_checkpoint=true"]))
    restored = load_file(out / "final" / "model.safetensors")
    assert all(torch.equal(restored[name], trained[name]) for name in trained)  # no extra step trained
    assert [r["step"] for r in read_metrics(out / METRICS_FILE)] == [1, 2]
    assert len(released) == 2  # each stage let go of its trainer once it was done


def test_a_full_disk_reported_by_safetensors_is_one_line_too(tmp_path):
    """Seen on an H200 whose disk filled: save_final's safetensors writer reported ENOSPC as its own error type."""
    from types import SimpleNamespace

    from rlt_mono.errors import UserError

    class SafetensorError(Exception):
        pass

    trainer = SimpleNamespace(state=SimpleNamespace(global_step=24))
    with pytest.raises(UserError, match=rf"^disk full while writing {tmp_path}: free space, then start the run again"):
        with checkpoints.training_failures(trainer, tmp_path, "x"):
            raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")
    with pytest.raises(SafetensorError):  # anything else is still a bug, with its traceback
        with checkpoints.training_failures(trainer, tmp_path, "x"):
            raise SafetensorError("Error while serializing: header too large")
