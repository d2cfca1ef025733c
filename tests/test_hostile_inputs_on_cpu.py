"""Hostile inputs: each used to end in a traceback or pass in silence. Now a user's mistake is one line (exit code 2
from the command line), what cannot work is refused before it starts, and an option the run does not read is named
in one warning. Checks that happen before any model loads are driven in-process, on the embedded tiny pair."""

import errno
import importlib.util
import json
import logging
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from rlt_mono import cli, runtime
from rlt_mono.config import ConfigError, compose
from rlt_mono.data import pretrained
from rlt_mono.errors import UserError
from rlt_mono.placement import PlacementError, check_main_process_port
from rlt_mono.rl import build
from rlt_mono.runs import checkpoints
from rlt_mono.runs import lock as run_lock
from rlt_mono.runs.atomic_write import DiskError
from rlt_mono.stages import sampler as explanation_sampler


class Stop(Exception):
    """Raised by a stand-in for a model load: the checks before it have passed."""


def _no_model_load(*args, **kwargs):
    raise Stop


def _gguf(path: Path) -> Path:
    """A small, whole GGUF file (one float32 tensor), written with the gguf package transformers reads them with."""
    import gguf

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(1)
    writer.add_tensor("weight", np.ones((64, 64), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


# ---- 1. a cached model file cut short --------------------------------------------------------------------------
def test_a_converted_model_cut_short_is_converted_again_and_a_cut_gguf_is_one_line(tmp_path, monkeypatch, caplog):
    conversions = []

    def convert(source, folder, dtype):  # transformers' GGUF loader is slow; any folder with weights will do
        conversions.append(source)
        save_file({"weight": torch.ones(64, 64)}, folder / "model.safetensors")

    monkeypatch.setattr(pretrained, "_convert", convert)
    source = _gguf(tmp_path / "tiny.gguf")
    folder = Path(pretrained.materialize(None, str(source), "float32", cache_dir=tmp_path / "cache"))
    weights = folder / "model.safetensors"
    whole = weights.stat().st_size
    with open(weights, "r+b") as handle:  # a copy or a full disk stopped it; the folder still says complete
        handle.truncate(whole - 100)
    with caplog.at_level(logging.WARNING, logger="rlt_mono.data.pretrained"):
        again = pretrained.materialize(None, str(source), "float32", cache_dir=tmp_path / "cache")
    assert again == str(folder) and conversions == [source, source]
    assert [r.getMessage() for r in caplog.records] == [
        f"{folder}: model.safetensors has {whole - 100:,} bytes where its header describes {whole:,} (cut short); "
        f"converting {source} again"]
    assert torch.equal(load_file(weights)["weight"], torch.ones(64, 64))  # what a SafetensorError stopped before

    cut = tmp_path / "cut.gguf"
    cut.write_bytes(source.read_bytes()[:-1000])  # an interrupted download
    with pytest.raises(UserError, match=rf"^model.gguf_file={cut}: {cut} \({cut.stat().st_size:,} bytes\) cannot be "
                                        r"read as GGUF \(.+\): the file is cut short or damaged; download or copy it "
                                        r"again$"):
        pretrained.materialize(None, str(cut), "float32", cache_dir=tmp_path / "cache")
    assert len(conversions) == 2


# ---- 2. sft.eos_token outside the vocabulary -------------------------------------------------------------------
def test_an_eos_token_outside_the_vocabulary_is_one_line_naming_the_key(tmp_path, monkeypatch):
    from rlt_mono.data.models import model_path
    from rlt_mono.stages.sft import build_sft

    monkeypatch.setattr("rlt_mono.stages.sft.load_model", _no_model_load)
    cfg = compose("teacher_sft", ["size=tiny", f"output_dir={tmp_path}", "sft.eos_token='<|no_such_token|>'"])
    with pytest.raises(ConfigError) as err:
        build_sft(cfg)
    assert str(err.value) == (f"sft.eos_token='<|no_such_token|>' is not a token of model.model_name_or_path="
                              f"{model_path(cfg.model, cfg.seed, 'model')}'s vocabulary: set one of its tokens, or "
                              "sft.eos_token=null for the token its chat template ends a turn with")


# ---- 3. a port out of range ------------------------------------------------------------------------------------
@pytest.mark.parametrize("port", [99999, 0, -1, "29500", True, 2.5])
def test_a_main_process_port_out_of_range_is_refused(port):
    with pytest.raises(PlacementError) as err:
        check_main_process_port(port)
    assert str(err.value) == (f"placement.main_process_port={port!r}: a TCP port, a whole number from 1 to 65535 (or "
                              "null for a free one)")
    assert [check_main_process_port(ok) for ok in (None, 1, 29500, 65535)] == [None, 1, 29500, 65535]


# ---- 4. a folder that cannot be written ------------------------------------------------------------------------
def test_a_run_folder_on_a_read_only_disk_is_one_line(tmp_path, monkeypatch):
    """A new run's folder (run_dir) under a read-only mount: the parent exists, the mkdir of the run's own folder is
    refused (EROFS); root, which ignores permission bits, meets it the same way."""
    read_only = tmp_path / "mnt"
    read_only.mkdir()
    mkdir = Path.mkdir

    def refuse_inside(self, *args, **kwargs):
        if self.parent == read_only:
            raise OSError(errno.EROFS, "Read-only file system", str(self))
        return mkdir(self, *args, **kwargs)

    monkeypatch.setattr(Path, "mkdir", refuse_inside)
    cfg = compose("teacher_sft", ["size=tiny", f"run_dir={read_only}/run"])
    with pytest.raises(checkpoints.CheckpointError) as err:
        cli.hold_run_folder(cfg)
    assert str(err.value) == (f"run_dir={read_only}/run: cannot create {read_only}/run (Read-only file system): "
                              "choose a folder you can write to (output_dir=...)")


# ---- 5. a .lock that is a folder -------------------------------------------------------------------------------
def test_a_lock_path_that_is_a_folder_is_one_line(tmp_path, monkeypatch):
    (tmp_path / run_lock.LOCK_FILE).mkdir()
    with pytest.raises(UserError) as err:
        run_lock.acquire(tmp_path)
    assert str(err.value) == (f"{tmp_path.resolve() / run_lock.LOCK_FILE} is a folder, where rlt_mono keeps a lock "
                              "file: remove that folder (it is not rlt_mono's), then run again")
    monkeypatch.setenv(run_lock.ENGINE_LOCK_ENV, str(tmp_path / run_lock.LOCK_FILE))
    with pytest.raises(UserError, match=r"\.lock is a folder, where rlt_mono keeps a lock file"):
        with run_lock.engine_start():
            pass


# ---- 6. liger-kernel without the package -----------------------------------------------------------------------
def test_sft_liger_kernel_without_the_package_or_a_gpu_is_one_line(tmp_path, monkeypatch):
    from rlt_mono.stages.sft import build_sft

    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "liger_kernel"
                        else real_find_spec(name, *a))  # as on a machine without liger-kernel
    monkeypatch.setattr("rlt_mono.stages.sft.load_model", _no_model_load)
    cfg = compose("teacher_sft", ["size=tiny", f"output_dir={tmp_path}", "sft.use_liger_kernel=true"])
    with pytest.raises(ConfigError) as err:
        build.check_gpu_kernels(cfg, on_gpu=True, group="sft")
    assert str(err.value) == ("sft.use_liger_kernel=true needs the liger-kernel package, which is not installed: pip "
                              "install liger-kernel (or pip install -e '.[gpu]'), or set sft.use_liger_kernel=false")
    with pytest.raises(ConfigError) as err:  # this machine has no GPU, and size=tiny trains on the CPU
        build_sft(cfg)
    assert str(err.value) == ("sft.use_liger_kernel=true runs liger-kernel's Triton kernels on a GPU, and this run has "
                              "none (no CUDA device, or sft.use_cpu=true): set sft.use_liger_kernel=false")


# ---- 7. LoRA rank and target modules ---------------------------------------------------------------------------
def test_lora_rank_is_bounded_by_the_hidden_size_and_targets_must_be_the_teachers_layers(tmp_path, monkeypatch):
    from rlt_mono import build_trainer

    teacher_loads = []
    load_model = build.load_model

    def recorded(path, key, **kwargs):
        teacher_loads.append(key)
        return load_model(path, key, **kwargs)

    monkeypatch.setattr(build, "load_model", recorded)
    with pytest.raises(ConfigError) as err:
        build_trainer(compose("demo_tiny", [f"output_dir={tmp_path / 'a'}", "model.lora_r=4096"]))
    assert str(err.value) == ("model.lora_r=4096: above the teacher's hidden size (64), the most an adapter's rank can "
                              "use: set model.lora_r from 1 to 64 (or 0: train every weight)")
    assert teacher_loads == []  # refused from the teacher's config, before its weights load
    with pytest.raises(ConfigError) as err:
        build_trainer(compose("demo_tiny", [f"output_dir={tmp_path / 'b'}", "model.lora_r=4",
                                            "model.lora_target_modules=[q_proj,no_such_proj]"]))
    assert str(err.value) == ("model.lora_target_modules=['q_proj', 'no_such_proj']: no_such_proj not among the "
                              "teacher's linear layers; choose from down_proj, gate_proj, k_proj, o_proj, q_proj, "
                              "up_proj, v_proj (or all-linear)")
    assert teacher_loads == ["model.model_name_or_path"]  # peft would have adapted q_proj alone, without a word


# ---- 8. a checkpoint of another stage --------------------------------------------------------------------------
def _checkpoint(run: Path, step: int, stage: str | None) -> Path:
    folder = run / f"checkpoint-{step}"
    folder.mkdir(parents=True)
    for name in (*checkpoints.TRAINING_STATE_FILES, checkpoints.RNG_FILE, "model.safetensors"):
        (folder / name).write_text(json.dumps({"global_step": step}) if name == checkpoints.TRAINER_STATE else "x")
    checkpoints.write_manifest(folder, step, stage)
    return folder


def test_teacher_sft_refuses_to_resume_a_checkpoint_of_the_rl_stage(tmp_path):
    from rlt_mono.stages.sft import build_sft, run_sft

    rl_checkpoint = _checkpoint(tmp_path / "rl", 4, "teacher_rlt")
    legacy = _checkpoint(tmp_path / "old_rl", 4, None)  # saved before manifests named their stage
    (legacy.parent / "config.yaml").write_text("stage: teacher_rlt\n")
    for checkpoint in (rl_checkpoint, legacy):
        cfg = compose("teacher_sft", ["size=tiny", f"output_dir={tmp_path / 'sft'}",
                                      f"resume_from_checkpoint={checkpoint}"])
        with pytest.raises(checkpoints.CheckpointError) as err:
            build_sft(cfg)
        assert str(err.value) == (f"{checkpoint} was saved by stage teacher_rlt, not teacher_sft: a checkpoint resumes "
                                  "only the stage that saved it; to train teacher_sft from that run's model, leave "
                                  "resume_from_checkpoint unset and set model.model_name_or_path="
                                  f"{checkpoint.parent / 'final'}")
    # a checkpoint the SFT stage saves records it, and the same stage resumes from it
    run_sft(compose("teacher_sft", ["size=tiny", f"output_dir={tmp_path / 'sft'}", "sft.max_steps=1",
                                    "sft.save_steps=1", "sft.diversity_prompts=0", "data.max_rows=8"]))
    saved = tmp_path / "sft" / "checkpoint-1"
    assert json.loads((saved / checkpoints.MANIFEST).read_text())["stage"] == "teacher_sft"
    assert checkpoints.resolve_resume(tmp_path / "sft", True, max_steps=1, stage="teacher_sft") == str(saved)


# ---- 9. options the stage does not read ------------------------------------------------------------------------
def test_options_a_stage_does_not_read_are_named_in_one_warning_each(tmp_path, monkeypatch, caplog):
    from rlt_mono.stages.sft import build_sft

    monkeypatch.setattr("rlt_mono.stages.sft.load_model", _no_model_load)
    with caplog.at_level(logging.WARNING, logger="rlt_mono.rl.build"), pytest.raises(Stop):
        build_sft(compose("teacher_sft", ["size=tiny", f"output_dir={tmp_path / 'sft'}", "memory=auto",
                                          "placement=student_gpu"]))
    assert [r.getMessage() for r in caplog.records] == [
        "memory=auto is ignored: it plans the GPU memory of an RL run, and this run is teacher_sft",
        "placement=student_gpu is ignored: teacher_sft trains one model in one process (placement=dp spreads it over "
        "GPUs)"]
    caplog.clear()
    monkeypatch.setattr(explanation_sampler, "model_path", _no_model_load)
    cfg = compose("distill", ["size=tiny", f"output_dir={tmp_path / 'distill'}", "distill.vllm_kv_cache_gib=2"])
    with caplog.at_level(logging.WARNING, logger="rlt_mono.rl.build"), pytest.raises(Stop):
        explanation_sampler.load_stage_models(cfg, None, 0.7, left_align_padding=True)
    assert [r.getMessage() for r in caplog.records] == [
        "distill.vllm_kv_cache_gib=2 is ignored: this run samples with transformers, not vLLM (no CUDA GPU, no vllm "
        "package, or placement.rollout=transformers)"]


# ---- 10. a full disk before the first checkpoint ---------------------------------------------------------------
def test_a_full_disk_before_the_first_checkpoint_does_not_advise_a_resume(tmp_path):
    from types import SimpleNamespace

    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("stage: teacher_rlt\n")
    (run / "metrics.jsonl").write_text('{"event": "step", "step": 1}\n')
    trainer = SimpleNamespace(state=SimpleNamespace(global_step=1))
    with pytest.raises(DiskError) as err, checkpoints.training_failures(trainer, run, "x"):
        raise OSError(errno.ENOSPC, "No space left on device", str(run / ".partial-checkpoint-1" / "optimizer.pt"))
    assert str(err.value).startswith(
        f"disk full while writing {run}/.partial-checkpoint-1/optimizer.pt: free space, then start the run again in a "
        "new output_dir (or with output_dir unset): it saved no checkpoint yet, so there is nothing to resume; ")
    with pytest.raises(checkpoints.CheckpointError) as err:  # the same folder again: no resume offered either
        checkpoints.check_fresh_output_dir(run)
    assert str(err.value) == (f"output_dir={run} already holds a run (metrics.jsonl, config.yaml) that saved no "
                              "complete checkpoint, so it cannot be resumed: start the new run in another output_dir "
                              "(or leave output_dir unset)")
    _checkpoint(run, 2, "teacher_rlt")
    assert checkpoints.how_to_continue(run) == (f"resume with output_dir={run} resume_from_checkpoint=true (last "
                                                f"complete checkpoint: {run}/checkpoint-2)")


# ---- 11. an eval with nothing to check the answers against ------------------------------------------------------
def test_an_eval_without_answers_says_why_the_accuracy_is_not_measured(tmp_path, monkeypatch, caplog, tokenizer):
    from rlt_mono.stages.eval import EVAL_FILE, run_eval

    rows = [{"question": f"Is {i} nice?", "solution": "It depends."} for i in range(3)]  # no answer column
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    monkeypatch.setattr(explanation_sampler.TransformersGenerator, "generate", lambda self, prompt_ids, n, t: [
        [tokenizer("<|begin_of_solution|>Yes.<|end_of_solution|>")["input_ids"]] for _ in prompt_ids])
    with caplog.at_level(logging.WARNING, logger="rlt_mono.stages.eval"):
        run_eval(compose("eval", ["size=tiny", f"output_dir={tmp_path / 'out'}", "model.model_name_or_path=null",
                                  "data=custom", f"data.source={data}", "data.eval_rows=3"]))
    assert json.loads((tmp_path / "out" / EVAL_FILE).read_text())["metrics"]["student/accuracy"]["n"] == 0
    assert (f"eval: student/accuracy is not measured (n=0): no held-out row of data.source={data} has an answer to "
            "check the student's against (an answer column, or a solution stating 'The answer is ...'); add an "
            "answer column, or set eval.student_accuracy=false") in [r.getMessage() for r in caplog.records]


@pytest.mark.parametrize(("stage", "mode", "exposed"), [
    ("teacher_sft", "student_gpu", "0"), ("student_sft", "auto", "0"), ("teacher_sft", "dp", "0,1"),
    ("teacher_rlt", "student_gpu", "0,1"), ("eval", "mono", "0")])
def test_an_sft_stage_sees_one_gpu_whatever_placement_it_ignores(monkeypatch, stage, mode, exposed):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(cli.shutil, "which", lambda name: "/usr/bin/nvidia-smi")
    monkeypatch.setattr(runtime, "gpus_present", lambda: 2)
    cli.expose_gpus(cli.exposed_mode(stage, mode))
    assert os.environ["CUDA_VISIBLE_DEVICES"] == exposed


def test_a_prompt_leaves_room_for_a_completion_in_the_shorter_of_the_teachers_and_the_engines_context():
    from types import SimpleNamespace

    from rlt_mono.rl.build import prompt_room

    def args(completion, engine, use_vllm=True):
        return SimpleNamespace(max_completion_length=completion, vllm_max_model_length=engine, use_vllm=use_vllm)

    assert prompt_room(32768, args(512, 2048)) == 1536  # the engine's 2,048 tokens, not the model's 32,768
    assert prompt_room(32768, args(512, None)) == 32256
    assert prompt_room(32768, args(512, 2048, use_vllm=False)) == 32256  # no engine: its length does not apply
    assert prompt_room(1024, args(512, 4096)) == 512
    with pytest.raises(ConfigError, match=r"^trainer.max_completion_length=4096 leaves no room for a prompt in a "
                                          r"2048-token context \(trainer.vllm_max_model_length\): lower it, or raise "
                                          r"it$"):
        prompt_room(32768, args(4096, 2048))
