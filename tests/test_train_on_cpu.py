"""End to end on CPU with the embedded tiny pair: training moves the teacher, files are written, resume works,
and the launcher passes overrides through and fails clearly."""

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from rlt_mono import build_trainer, compose, release_trainer
from rlt_mono.config import available_run_configs
from rlt_mono.rl.trainer import LEGACY_REFERENCE_FILE, REFERENCE_FILE
from rlt_mono.runs.outputs import METRICS_FILE, PLOT_FILE, SAMPLES_FILE, read_metrics

ROOT = Path(__file__).resolve().parent.parent


def _step_rows(out):
    return [r for r in read_metrics(out / METRICS_FILE) if "teacher_reward/total" in r]


def test_tiny_run_trains_writes_outputs_and_resumes(tmp_path):
    out = tmp_path / "run"
    cfg = compose("demo_tiny", [f"output_dir={out}", "trainer.max_steps=2", "trainer.save_steps=1",
                                "trainer.ref_model_sync_steps=1"])
    trainer = build_trainer(cfg)
    teacher_before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    student = trainer.teacher_reward.student_model
    student_before = {n: p.detach().clone() for n, p in student.named_parameters()}
    trainer.train()

    changed = [n for n, p in trainer.model.named_parameters() if not torch.equal(p.detach(), teacher_before[n])]
    assert len(changed) == len(teacher_before)  # every teacher tensor got an update
    assert all(torch.equal(p, student_before[n]) for n, p in student.named_parameters())  # student frozen

    rows = _step_rows(out)
    assert [r["step"] for r in rows] == [1, 2]
    for key in ("teacher_reward/r_ss", "teacher_reward/r_kl", "teacher_reward/match_penalty", "reward",
                "phase/generate/seconds", "phase/score/seconds", "phase/train/seconds", "completions/mean_length"):
        assert all(isinstance(r.get(key), (int, float)) for r in rows), key
    for r in rows:  # the reward TRL optimises is exactly our total
        assert abs(r["teacher_reward/total"] - r["reward"]) < 1e-4
    # Generation and optimizer steps aligned, no vLLM: TRL computes no policy log-probs, the reward runs the teacher.
    assert not trainer.trl_surface.expects_policy_log_probs
    assert all(r["score/reward_teacher_passes"] == 1 and "score/teacher_log_probs_reused" not in r for r in rows)
    samples = [json.loads(line) for line in (out / SAMPLES_FILE).read_text().splitlines()]
    assert len(samples) == 2 * cfg.trainer.explanation_samples_per_step
    assert {"explanation", "r_ss", "r_kl", "match_penalty", "total"} <= set(samples[0])
    assert (out / PLOT_FILE).stat().st_size > 10_000
    assert (out / "checkpoint-2" / "trainer_state.json").exists()
    assert (out / "config.yaml").read_text().count("max_steps: 2") == 1
    release_trainer(trainer)

    # the mixed reference of step 1 is in checkpoint-1 and comes back on resume
    saved_reference = load_file(out / "checkpoint-1" / REFERENCE_FILE)
    # beside the teacher's weights only in a folder of its own: vLLM would read a top-level one as the teacher's
    assert REFERENCE_FILE == "reference/model.safetensors"
    assert sorted(p.name for p in (out / "checkpoint-1").glob("*.safetensors")) == ["model.safetensors"]
    restored = build_trainer(compose("demo_tiny", [f"output_dir={out}", "trainer.max_steps=3",
                                                   f"resume_from_checkpoint={out / 'checkpoint-1'}"]))
    assert restored.resume_checkpoint == str(out / "checkpoint-1")
    initial = {n: p.detach().clone() for n, p in restored.ref_model.named_parameters()}
    restored._load_from_checkpoint(restored.resume_checkpoint)
    for name, param in restored.ref_model.named_parameters():
        if name in saved_reference:
            assert torch.equal(param.detach(), saved_reference[name]), name
    assert not all(torch.equal(p.detach(), initial[n]) for n, p in restored.ref_model.named_parameters())
    # a checkpoint saved before the reference had its own folder (reference_model.safetensors beside the teacher's
    # weights) restores it too
    legacy = tmp_path / "legacy-checkpoint"
    shutil.copytree(out / "checkpoint-1", legacy)
    (legacy / REFERENCE_FILE).rename(legacy / LEGACY_REFERENCE_FILE)
    with torch.no_grad():
        for name, param in restored.ref_model.named_parameters():
            param.copy_(initial[name])
    restored._load_from_checkpoint(str(legacy))
    for name, param in restored.ref_model.named_parameters():
        if name in saved_reference:
            assert torch.equal(param.detach(), saved_reference[name]), name
    release_trainer(restored)

    # resume from the first checkpoint, as after a crash in step 2: step 2 runs again and is recorded once
    resumed_cfg = compose("demo_tiny", [f"output_dir={out}", "trainer.max_steps=3",
                                        f"resume_from_checkpoint={out / 'checkpoint-1'}"])
    resumed = build_trainer(resumed_cfg)
    resumed.train(resume_from_checkpoint=resumed_cfg.resume_from_checkpoint)
    assert resumed.state.global_step == 3
    assert [r["step"] for r in _step_rows(out)] == [1, 2, 3]
    samples = [json.loads(line) for line in (out / SAMPLES_FILE).read_text().splitlines()]
    assert [s["step"] for s in samples] == [step for step in (1, 2, 3)
                                            for _ in range(cfg.trainer.explanation_samples_per_step)]
    release_trainer(resumed)


def _launch(*args, timeout=600):
    return subprocess.run(["./launch_mono.sh", *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def test_launcher_passes_overrides_to_the_trainer(tmp_path):
    result = _launch("cfgs/run_cfg/demo_tiny.yaml", "trainer.max_steps=1", "trainer.max_completion_length=12",
                     "reward.not_matched_penalty=-5.0", f"output_dir={tmp_path}")
    assert result.returncode == 0, result.stderr[-3000:]
    rows = _step_rows(tmp_path)
    assert [r["step"] for r in rows] == [1]
    assert rows[0]["completions/max_length"] <= 12
    # With 12 tokens few explanations close; each unmatched one carries the overridden penalty.
    assert rows[0]["teacher_reward/match_penalty"] == -5.0 * rows[0]["alignment/unmatched_frac"]
    assert (tmp_path / "final" / "config.json").exists()


def test_launcher_errors_are_one_clear_line():
    bad_override = _launch("demo_tiny", "trainer.max_stepz=3", timeout=300)
    assert bad_override.returncode == 2
    assert bad_override.stderr.strip().splitlines() == [bad_override.stderr.strip()]
    assert bad_override.stderr == ("error: unknown key trainer.max_stepz: did you mean trainer.max_steps, "
                                   "trainer.save_steps or trainer.eval_steps?\n")
    missing = _launch("cfgs/run_cfg/nope.yaml", timeout=60)
    assert missing.returncode == 2
    assert missing.stderr.strip() == (f"error: run config cfgs/run_cfg/nope.yaml not found relative to the current "
                                      f"folder {ROOT}; run configs: {' '.join(available_run_configs())}")


def test_a_finished_run_closes_its_process_group_and_a_failed_one_leaves_it(monkeypatch):
    """The group a GPU run's accelerate starts (gloo here) is destroyed after a successful stage, so the process
    exits without torch's destroy_process_group() warning; after an error another rank may still wait in it."""
    import socket

    import torch.distributed as dist

    from rlt_mono import cli

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    monkeypatch.setattr(cli, "_run", lambda argv: (0, ""))
    assert cli.main([]) == 0 and not dist.is_initialized()
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    monkeypatch.setattr(cli, "_run", lambda argv: (2, ""))
    try:
        assert cli.main([]) == 2 and dist.is_initialized()
    finally:
        dist.destroy_process_group()


def test_resume_true_without_output_dir_is_a_config_error():
    from rlt_mono.config import ConfigError

    with pytest.raises(ConfigError, match="resume_from_checkpoint=true resumes from the newest checkpoint"):
        build_trainer(compose("demo_tiny", ["resume_from_checkpoint=true"]))
