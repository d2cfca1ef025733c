"""bench/bench_mono.py on CPU: its command line, the one config both training arms are built from, the status a
child reports, and how ``all`` and ``envelope`` act on those statuses (with a fake child runner)."""

import dataclasses
import errno
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import trl

from rlt_mono.errors import UserError

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench" / "bench_mono.py"

spec = importlib.util.spec_from_file_location("bench_mono", BENCH)
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)


def parse(*argv):
    return bench.build_parser().parse_args(list(argv))


@pytest.fixture
def bf16_gpu(monkeypatch):
    """The arms' config is the GPU one (bf16, liger-kernel's layers): let transformers accept bf16 and rlt_mono find
    liger-kernel (the gpu extra's) and let its layers through on this CPU-only machine."""
    import transformers.training_args

    from rlt_mono.rl import build, grpo_config

    monkeypatch.setattr(transformers.training_args, "is_torch_bf16_gpu_available", lambda: True)
    monkeypatch.setattr(grpo_config, "is_liger_kernel_available", lambda: True)
    monkeypatch.setattr(build, "check_gpu_kernels", lambda cfg, on_gpu: None)


# ---- command line ----------------------------------------------------------------------------------------------


def test_help_needs_no_torch_or_vllm():
    top = subprocess.run([sys.executable, str(BENCH), "--help"], capture_output=True, text=True, timeout=60)
    assert top.returncode == 0, top.stderr
    assert "{rlt,trl,vllm,vllm_inproc,pcie,all,envelope,planner,scale}" in top.stdout
    probe = (
        "import runpy, sys\n"
        f"sys.argv = [{str(BENCH)!r}, 'envelope', '--help']\n"
        "try:\n"
        f"    runpy.run_path({str(BENCH)!r}, run_name='__main__')\n"
        "except SystemExit as exit:\n"
        "    assert exit.code == 0, exit.code\n"
        "print('LOADED', sorted(m for m in ('torch', 'vllm', 'trl', 'transformers') if m in sys.modules))\n"
    )
    envelope = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert envelope.returncode == 0, envelope.stderr
    assert "--micro-batches" in envelope.stdout and "--cap-gib" in envelope.stdout
    assert "--pcie-gib" not in envelope.stdout and "--micro-batch " not in envelope.stdout
    assert envelope.stdout.strip().endswith("LOADED []")


@pytest.mark.parametrize("argv", [
    ["pcie", "--arch", "0.5b"],  # pcie takes only --pcie-gib
    ["vllm", "--steps", "2"],  # vllm does not train
    ["trl", "--placement", "student_gpu"],  # placement is rlt_mono's
    ["envelope", "--micro-batch", "4"],  # envelope sets the micro-batch itself
    ["rlt", "--modes", "rlt"],
])
def test_each_subcommand_rejects_options_it_does_not_use(argv, capsys):
    with pytest.raises(SystemExit) as exit:
        parse(*argv)
    assert exit.value.code == 2
    assert "unrecognized arguments" in capsys.readouterr().err


def test_child_command_lines_carry_the_parents_values():
    options = parse("all", "--arch", "1.5b", "--completion-length", "64", "--steps", "3", "--detokenize", "true",
                    "--pcie-gib", "0.5", "--placement", "student_gpu")
    assert bench.child_argv("pcie", options) == ["--pcie-gib", "0.5"]
    assert bench.child_argv("vllm", options) == ["--arch", "1.5b", "--models", "/tmp/bench_models",
                                                 "--completion-length", "64", "--completions", "32", "--util", "0.3"]
    for mode in ("rlt", "trl"):
        child = parse(mode, *bench.child_argv(mode, options))
        assert (child.arch, child.completion_length, child.steps, child.detokenize) == ("1.5b", 64, 3, "true")
        assert child.cap_gib is None and child.result_file is None
    assert parse("rlt", *bench.child_argv("rlt", options)).placement == "student_gpu"


@pytest.mark.parametrize("command", [  # the module docstring's and docs/PERFORMANCE.md's command lines
    "all --arch 0.5b --completion-length 1024 --steps 8 --out results.json",
    "all --modes pcie,vllm,trl,rlt --arch 0.5b --completion-length 1024 --steps 8",
    "rlt --arch 7b --completion-length 4096 --steps 1 --micro-batch 2 --score-micro-batch 2 --util 0.3",
    "envelope --arch 0.5b --completion-length 4096 --cap-gib 12 --vllm-gib 4 --micro-batches 1,2,4,8 --steps 2",
    "planner --pairs 0.5b:1024,1.5b:4096:2 --steps 2 --out planner.json",
])
def test_documented_command_lines_parse(command):
    options = parse(*command.split())
    assert options.command == command.split()[0]
    if "--arch" in command:
        assert options.arch == command.split()[command.split().index("--arch") + 1]


def test_completions_must_be_whole_micro_batches(capsys):
    with pytest.raises(SystemExit):
        bench.main(["trl", "--completions", "30", "--micro-batch", "4"])
    assert "--completions 30 must be a multiple of --micro-batch 4" in capsys.readouterr().err


# ---- one config for both training arms -------------------------------------------------------------------------


def arm_configs(tmp_path, *argv):
    options = parse("trl", *argv)
    cfg = bench.compose_bench(options, tmp_path / "teacher", tmp_path / "student", tmp_path / "run")
    return bench.grpo_configs(cfg)


def test_both_arms_get_every_shared_trl_field_equal(tmp_path, bf16_gpu):
    rlt_args, trl_args = arm_configs(tmp_path, "--completion-length", "256", "--completions", "16", "--micro-batch",
                                     "2", "--steps", "5", "--util", "0.25", "--optim", "adamw_torch")
    assert type(trl_args) is trl.GRPOConfig and isinstance(rlt_args, trl.GRPOConfig)
    rlt_fields, trl_fields = bench.grpo_fields(rlt_args), bench.grpo_fields(trl_args)
    assert bench.config_differences(rlt_fields, trl_fields) == []
    assert len(trl_fields) == len(dataclasses.fields(trl.GRPOConfig)) - len(bench.ARM_SPECIFIC)
    # The bench options, and the RLT run's settings from cfgs/trainer/grpo_mono.yaml, in the TRL arm.
    expected = dict(max_steps=5, per_device_train_batch_size=2, gradient_accumulation_steps=8, steps_per_generation=8,
                    generation_batch_size=16, num_generations=8, max_completion_length=256, optim="adamw_torch",
                    vllm_gpu_memory_utilization=0.25, use_vllm=True, vllm_mode="colocate", vllm_enable_sleep_mode=True,
                    generation_kwargs={"detokenize": False, "min_tokens": 256, "ignore_eos": True},
                    learning_rate=1e-6, lr_scheduler_type="constant", beta=0.04, temperature=0.7, loss_type="grpo",
                    scale_rewards="group", sync_ref_model=True, ref_model_mixup_alpha=0.9, ref_model_sync_steps=32,
                    bf16=True, gradient_checkpointing=True, save_strategy="no", report_to=[], seed=0, logging_steps=1)
    assert {name: trl_fields[name] for name in expected} == expected
    assert trl_args.output_dir == str(tmp_path / "run")


def test_detokenize_reaches_both_arms(tmp_path, bf16_gpu):
    rlt_args, trl_args = arm_configs(tmp_path, "--detokenize", "true")
    assert rlt_args.vllm_detokenize is True
    assert trl_args.generation_kwargs["detokenize"] is True


def test_a_change_to_one_arm_is_reported(tmp_path, bf16_gpu):
    rlt_args, trl_args = arm_configs(tmp_path)
    trl_args.learning_rate = 2e-6
    trl_args.generation_kwargs["detokenize"] = True
    assert bench.config_differences(bench.grpo_fields(rlt_args), bench.grpo_fields(trl_args)) == [
        "generation_kwargs", "learning_rate"]
    assert bench.config_differences({"a": 1}, {"a": 1, "b": 2}) == ["b"]


def test_bench_builds_the_rltconfig_build_trainer_builds(tmp_path, bf16_gpu, monkeypatch):
    """The TRL arm derives its config from bench's RLTConfig; it must be the one build_trainer gives the rlt arm."""
    import rlt_mono.rl.build as build

    built = {}

    class Stop(Exception):
        pass

    def capture(cls, values, group):
        if group == "trainer":
            built["args"] = build_instantiate(cls, values, group)
            raise Stop  # the config is all this test needs: no model loads
        return build_instantiate(cls, values, group)

    build_instantiate = build.instantiate
    monkeypatch.setattr(build, "instantiate", capture)
    options = parse("rlt", "--completion-length", "128", "--detokenize", "true")
    cfg = bench.compose_bench(options, tmp_path / "teacher", tmp_path / "student", tmp_path / "run")
    cfg.placement.rollout = "auto"  # no vLLM on this machine: transformers rollouts, use_vllm=False
    with pytest.raises(Stop):
        build.build_trainer(cfg)
    rlt_args, _ = bench.grpo_configs(cfg, use_vllm=False)
    assert built["args"].to_dict() == rlt_args.to_dict()


def test_prompts_leave_room_for_a_whole_completion(tmp_path, tokenizer):
    """The TRL and vLLM modes prepare prompts as build_trainer does: the prompt budget is the model's context
    minus max_completion_length."""
    cfg = bench.compose_bench(parse("vllm", "--completion-length", "256"), tmp_path / "teacher", tmp_path / "student")
    with pytest.raises(UserError, match="over the 4-token prompt budget"):
        bench.prompt_dataset(cfg, tokenizer, context=260)


# ---- child results ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("err, status", [
    (torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB."), "out_of_memory"),
    (RuntimeError("CUDA error: out of memory\nCUDA kernel errors might be asynchronously reported"), "out_of_memory"),
    (OSError(errno.ENOSPC, "No space left on device"), "error"),
    (RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 8 GiB"), "error"),
    (ValueError("generation_batch_size (30) must be divisible by num_generations (8)."), "error"),
])
def test_classify_failure(err, status):
    assert bench.classify_failure(err) == status


def test_an_oom_under_another_exception_is_out_of_memory():
    try:
        try:
            raise torch.OutOfMemoryError("CUDA out of memory.")
        except torch.OutOfMemoryError as oom:
            raise RuntimeError("step failed") from oom
    except RuntimeError as err:
        assert bench.classify_failure(err) == "out_of_memory"


@pytest.mark.parametrize("err, status, message", [
    (OSError(errno.ENOSPC, "No space left on device"), "error", "OSError: [Errno 28] No space left on device"),
    (torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1.00 GiB.\nmore"), "out_of_memory",
     "OutOfMemoryError: CUDA out of memory. Tried to allocate 1.00 GiB."),
])
def test_a_failing_mode_writes_its_status(tmp_path, monkeypatch, err, status, message):
    def fail(a):
        raise err

    monkeypatch.setitem(bench.MODES, "pcie", fail)
    result_file = tmp_path / "result.json"
    assert bench.main(["pcie", "--result-file", str(result_file)]) == 1
    assert json.loads(result_file.read_text()) == {"mode": "pcie", "status": status, "error": message}


def test_a_mode_that_runs_writes_ok_with_its_measurements(tmp_path, monkeypatch):
    monkeypatch.setitem(bench.MODES, "vllm", lambda a: {"mode": "vllm", "median_tokens_per_s": 9.0})
    result_file = tmp_path / "result.json"
    assert bench.main(["vllm", "--completion-length", "8", "--result-file", str(result_file)]) == 0
    assert json.loads(result_file.read_text()) == {"mode": "vllm", "arch": "0.5b", "completion_length": 8,
                                                   "completions": 32, "util": 0.3, "median_tokens_per_s": 9.0,
                                                   "status": "ok"}


def test_run_child_reads_the_childs_result_file(tmp_path):
    result = bench.run_child("vllm", ["--steps", "2"], tmp_path / "logs")  # rejected: no result written
    assert result["status"] == "error"
    assert result["error"] == "the child exited with code 2 without writing a result"
    assert "unrecognized arguments: --steps 2" in Path(result["log"]).read_text()
    result = bench.run_child("pcie", ["--pcie-gib", "0.001"], tmp_path / "logs")  # no CUDA here
    assert result["mode"] == "pcie" and result["status"] == "error" and result["error"]
    assert "pcie failed" in Path(result["log"]).read_text()


def test_run_child_times_the_childs_process(tmp_path, monkeypatch):
    """``process_seconds``: from the child's start to its exit, read around the child alone."""
    clock = iter([100.0, 107.5])
    monkeypatch.setattr(bench.time, "perf_counter", lambda: next(clock))

    def child(command, **kwargs):
        Path(command[-1]).write_text(json.dumps({"mode": "vllm", "status": "ok"}))
        return subprocess.CompletedProcess(command, 0)

    monkeypatch.setattr(bench.subprocess, "run", child)
    result = bench.run_child("vllm", [], tmp_path / "logs")
    assert (result["status"], result["process_seconds"]) == ("ok", 7.5)


# ---- envelope and all, with a fake child runner ----------------------------------------------------------------


class FakeRunner:
    """Answers each child with the next status; records the command lines."""

    def __init__(self, *outcomes):
        self.outcomes = list(outcomes)
        self.calls = []

    def __call__(self, mode, argv):
        self.calls.append((mode, argv))
        outcome = self.outcomes.pop(0)
        return dict(outcome) if isinstance(outcome, dict) else {"mode": mode, "status": outcome}


def option(argv, flag):
    return argv[argv.index(flag) + 1]


def test_envelope_stops_at_the_first_out_of_memory():
    runner = FakeRunner("ok", "ok", "out_of_memory", "ok")
    results = list(bench.envelope(parse("envelope", "--micro-batches", "1,2,4,8", "--accumulation", "4",
                                        "--cap-gib", "12", "--vllm-gib", "4"), runner))
    assert [(r["micro_batch"], r["completions_per_step"], r["status"], r["fits"]) for r in results] == [
        (1, 4, "ok", True), (2, 8, "ok", True), (4, 16, "out_of_memory", False)]
    assert [option(argv, "--micro-batch") for _, argv in runner.calls] == ["1", "2", "4"]
    mode, argv = runner.calls[2]
    assert mode == "rlt"
    assert (option(argv, "--score-micro-batch"), option(argv, "--completions"), option(argv, "--steps")) == (
        "4", "16", "2")
    assert (option(argv, "--cap-gib"), option(argv, "--vllm-gib")) == ("12.0", "4.0")


def test_envelope_reports_an_error_as_an_error_not_as_out_of_memory():
    disk_full = {"mode": "rlt", "status": "error", "error": "OSError: [Errno 28] No space left on device"}
    results = list(bench.envelope(parse("envelope", "--micro-batches", "1,2,4"), FakeRunner("ok", disk_full, "ok")))
    assert [(r["status"], r["fits"]) for r in results] == [("ok", True), ("error", None)]
    assert results[-1]["error"] == "OSError: [Errno 28] No space left on device"


@pytest.mark.parametrize("last, code", [("out_of_memory", 0), ("error", 1)])
def test_envelope_exit_code_and_out_file(tmp_path, monkeypatch, last, code):
    runner = FakeRunner("ok", last)
    monkeypatch.setattr(bench, "run_child", lambda mode, argv, log_dir: runner(mode, argv))
    out = tmp_path / "envelope.json"
    assert bench.main(["envelope", "--micro-batches", "2,4,8", "--out", str(out)]) == code
    assert [(r["micro_batch"], r["status"]) for r in json.loads(out.read_text())] == [(2, "ok"), (4, last)]


def arm(mode, learning_rate):
    return {"mode": mode, "status": "ok", "grpo_config": {"learning_rate": learning_rate, "beta": 0.04}}


def test_all_runs_the_modes_in_order_and_checks_the_arms_agree(tmp_path, monkeypatch):
    runner = FakeRunner(arm("trl", 1e-6), arm("rlt", 1e-6), "error")
    monkeypatch.setattr(bench, "run_child", lambda mode, argv, log_dir: runner(mode, argv))
    out = tmp_path / "results.json"
    assert bench.main(["all", "--modes", "trl,rlt,pcie", "--steps", "8", "--out", str(out)]) == 1  # pcie failed
    assert [mode for mode, _ in runner.calls] == ["trl", "rlt", "pcie"]
    assert option(runner.calls[0][1], "--steps") == "8" and runner.calls[2][1] == ["--pcie-gib", "1.0"]
    assert [r["status"] for r in json.loads(out.read_text())] == ["ok", "ok", "error"]


def test_all_marks_an_arm_with_a_different_config_an_error():
    results = list(bench.run_all(parse("all", "--modes", "rlt,trl"), FakeRunner(arm("rlt", 1e-6), arm("trl", 2e-6))))
    assert results[0]["status"] == "ok"
    assert results[1]["status"] == "error"
    assert results[1]["error"] == "GRPO config differs from the other arm's in ['learning_rate']"


def test_all_rejects_an_unknown_mode(capsys):
    with pytest.raises(SystemExit):
        bench.main(["all", "--modes", "rlt,nope"])
    assert "--modes: unknown ['nope']" in capsys.readouterr().err


def test_planner_runs_each_pair_and_divides_prediction_by_measurement(tmp_path, monkeypatch):
    measured = {"mode": "rlt", "status": "ok", "device_peak/generate": 25.0, "device_peak/score": 8.0,
                "device_peak/train": 10.0, "predicted/generate": 26.0, "predicted/score": 6.0,
                "predicted/train": 11.5}
    runner = FakeRunner(measured, {"mode": "rlt", "status": "out_of_memory"})
    monkeypatch.setattr(bench, "run_child", lambda mode, argv, log_dir: runner(mode, argv))
    out = tmp_path / "planner.json"
    assert bench.main(["planner", "--pairs", "0.5b:1024,7b:4096:1", "--out", str(out)]) == 1  # the 7B pair failed
    results = json.loads(out.read_text())
    assert results[0]["ratio/generate"] == 26.0 / 25.0
    assert results[0]["ratio/score"] == 0.75  # an under-prediction
    assert results[0]["ratio/train"] == 1.15
    assert "ratio/train" not in results[1]
    assert [(option(argv, "--arch"), option(argv, "--completion-length"), option(argv, "--micro-batch"),
             option(argv, "--steps")) for _, argv in runner.calls] == [("0.5b", "1024", "4", "2"),
                                                                       ("7b", "4096", "1", "2")]


@pytest.mark.parametrize("pairs", ["0.5b", "3b:1024", "0.5b:long", "0.5b:1024:2:9"])
def test_planner_rejects_a_malformed_pair(pairs, capsys):
    with pytest.raises(SystemExit) as exit_info:
        bench.main(["planner", "--pairs", pairs])
    assert exit_info.value.code == 2
    assert "arch:completion_length[:micro_batch]" in capsys.readouterr().err


def test_measured_peaks_take_the_largest_over_every_step():
    rows = [{"phase/train/device_peak_gib": 9.5, "phase/score/device_peak_gib": 7.0},
            {"phase/train/device_peak_gib": 9.0, "phase/score/device_peak_gib": 7.5, "phase/train/seconds": 1.0}]
    assert bench.measured_peaks(rows) == {"device_peak/train": 9.5, "device_peak/score": 7.5}


def test_step_timer_wraps_the_colocated_engine_and_leaves_a_servers_alone():
    from types import SimpleNamespace

    def fake(mode):
        def call():
            return None
        llm = SimpleNamespace(generate=call, sleep=call, wake_up=call)
        generation = SimpleNamespace(sync_weights=call, **({"llm": llm} if mode == "colocate" else {}))
        return SimpleNamespace(args=SimpleNamespace(vllm_mode=mode), vllm_generation=generation,
                               _tokenize_prompts=call), call

    colocated, call = fake("colocate")
    bench.StepTimer().wrap_generation(colocated)
    llm = colocated.vllm_generation.llm
    assert all(getattr(llm, name) is not call for name in ("generate", "sleep", "wake_up"))
    served, call = fake("server")  # placement=async: the engine runs in the server's process, no .llm here
    bench.StepTimer().wrap_generation(served)
    assert served.vllm_generation.sync_weights is not call and served._tokenize_prompts is not call


# ---- scale: throughput over GPUs --------------------------------------------------------------------------------
def measured(seconds, completions=32):
    """A child's ok result: ``seconds`` the median of its timed steps (after a warm-up step of 9 s)."""
    return {"mode": "rlt", "status": "ok", "step_seconds": [9.0, seconds, seconds], "median_step_seconds": seconds,
            "completions_per_step": completions, "completions_per_s": completions / seconds,
            "phase/generate/seconds": 1.0}


def scale_main(monkeypatch, *outcomes, argv):
    """``bench.main(["scale", *argv])`` with each child answered by the next of ``outcomes``; its exit code and the
    runner (the children's command lines)."""
    runner = FakeRunner(*outcomes)
    monkeypatch.setattr(bench, "run_child", lambda mode, child, log_dir: runner(mode, child))
    return bench.main(["scale", *argv]), runner


def placements(runner):
    return [f"{option(argv, '--placement')}:{option(argv, '--gpus')}" for _, argv in runner.calls]


def test_scale_runs_each_arm_with_its_placement_and_strategy(tmp_path, monkeypatch):
    out = tmp_path / "scale.json"
    code, runner = scale_main(monkeypatch, measured(4.0), measured(4.4, 64), measured(5.0), measured(5.0, 64),
                              "out_of_memory", measured(4.5, 64),
                              argv=["--arch", "1.5b", "--arms", "mono:1,dp:2,student_gpu:2,fsdp2:2,dp:4,split:2",
                                    "--out", str(out)])
    assert code == 1
    results = json.loads(out.read_text())["results"]
    assert [r["optimizer_steps_per_s"] for r in results if r["status"] == "ok"] == [1 / 4.0, 1 / 4.4, 1 / 5.0,
                                                                                    1 / 5.0, 1 / 4.5]
    assert "optimizer_steps_per_s" not in results[4] and results[4]["gpus"] == 4
    assert results[5]["placement"] == "split"
    # fsdp2 is placement dp with the teacher sharded; dp arms (split: dp over two GPUs) say ddp; mono and
    # student_gpu take no strategy.
    assert [(option(argv, "--placement"), option(argv, "--gpus"), "--strategy" in argv and option(argv, "--strategy"))
            for _, argv in runner.calls] == [("mono", "1", False), ("dp", "2", "ddp"), ("student_gpu", "2", False),
                                             ("dp", "2", "fsdp2"), ("dp", "4", "ddp"), ("dp", "2", "ddp")]
    table = bench.scale_table(results)
    assert "| 1 | 2 | dp | 2 | 64 | 4.40 s | 14.55 | 0.227 | 1.00 / nan / nan s | nan s: nan / nan / nan s |" in table
    assert "| 1 | 4 | fsdp2 | 2 | 64 | 5.00 s | 12.80 | 0.200 |" in table
    assert "| 1 | 5 | dp | 4 | | out_of_memory:  | | | | |" in table


def test_scale_starts_no_run_that_would_end_past_max_minutes(tmp_path, monkeypatch, caplog):
    """Runs of 10 minutes each under --max-minutes 35: the first three start (the third by 20 + 10 <= 35), the
    fourth would end at 40 and is not started, nor any after it; the JSON holds the three."""
    clock = [0.0]
    monkeypatch.setattr(bench.time, "monotonic", lambda: clock[0])

    def ten_minutes(mode, child, log_dir):
        clock[0] += 600
        return measured(8.0)

    monkeypatch.setattr(bench, "run_child", ten_minutes)
    out = tmp_path / "scale.json"
    with caplog.at_level("INFO", logger="bench_mono"):
        code = bench.main(["scale", "--arms", "mono:1,async:2", "--rounds", "3", "--max-minutes", "35",
                           "--out", str(out)])
    assert code == 0
    assert [(r["round"], r["placement"]) for r in json.loads(out.read_text())["results"]] == [
        (1, "mono"), (1, "async"), (2, "async")]
    stop = "stopped before run 4 of 6, mono (30.0 of --max-minutes 35 spent; the longest run took 10.0 min)"
    assert stop in caplog.text


@pytest.mark.parametrize("minutes", ["0", "-5"])
def test_scale_refuses_a_time_budget_of_nothing(minutes, capsys):
    with pytest.raises(SystemExit):
        bench.main(["scale", "--max-minutes", minutes])
    assert f"--max-minutes {float(minutes)}: a time above 0" in capsys.readouterr().err


def test_scale_keeps_where_each_runs_time_outside_its_steps_goes(tmp_path, monkeypatch):
    """The child's process time and its setup (models, trainer, train() to the first step) stay with each run in
    the summary and show in the table; a run that does not report them keeps none."""
    out = tmp_path / "scale.json"
    setup = {"process_seconds": 213.4, "setup/models_s": 20.2, "setup/build_trainer_s": 95.0,
             "setup/to_first_step_s": 12.4}
    code, _ = scale_main(monkeypatch, {**measured(8.0), **setup}, measured(4.0),
                         argv=["--arms", "mono:1,async:2", "--out", str(out)])
    assert code == 0
    record = json.loads(out.read_text())
    mono, fast = record["summary"]["arms"]
    assert {k: mono["runs"][0][k] for k in setup} == setup
    assert not set(setup) & set(fast["runs"][0])
    table = bench.scale_table(record["results"])
    assert "| 1 | 1 | mono | 1 | 32 | 8.00 s | 4.00 | 0.125 | 1.00 / nan / nan s | 213 s: 20 / 95 / 12 s |" in table


def test_scale_rounds_reverse_the_order_every_other_round(monkeypatch):
    code, runner = scale_main(monkeypatch, *[measured(4.0)] * 9, argv=["--arms", "mono:1,dp:2,async:2",
                                                                       "--rounds", "3"])
    assert code == 0
    assert placements(runner) == ["mono:1", "dp:2", "async:2",  # the first pass in the order given,
                                  "async:2", "dp:2", "mono:1",  # the second reversed,
                                  "mono:1", "dp:2", "async:2"]  # the third in order again
    assert [(r, p, arm) for r, p, arm in bench.scale_order([("mono", 1), ("async", 2)], 2)] == [
        (1, 1, ("mono", 1)), (1, 2, ("async", 2)), (2, 1, ("async", 2)), (2, 2, ("mono", 1))]


def test_scale_summary_sets_each_arm_against_the_first_round_by_round(tmp_path, monkeypatch):
    """Three rounds of mono:1 (32 completions a step), dp:2 (64) and async:2 (32); the order alternates, so the
    children answer the first round as mono, dp, async and the second as async, dp, mono."""
    out = tmp_path / "scale.json"
    code, _ = scale_main(monkeypatch,
                         measured(8.0), measured(8.0, 64), measured(4.0),  # the first round
                         measured(4.0), measured(8.0, 64), measured(10.0),  # the second (reversed)
                         measured(8.0), measured(10.0, 64), measured(5.0),  # the third
                         argv=["--arms", "mono:1,dp:2,async:2", "--rounds", "3", "--commit", "abc1234",
                               "--out", str(out)])
    assert code == 0
    summary = json.loads(out.read_text())["summary"]
    assert summary["baseline"] == "mono:1"
    mono, dp, fast = summary["arms"]
    # mono's step: 8, 10, 8 s -> median 8 s, 4 completions/s, 1/8 optimizer steps/s.
    assert (mono["median_step_seconds"], mono["median_completions_per_s"], mono["median_optimizer_steps_per_s"]) == (
        8.0, 4.0, 0.125)
    assert "vs_baseline" not in mono and mono["rounds_ok"] == 3 and mono["failed_rounds"] == []
    assert [(run["round"], run["position"], run["step_seconds"]) for run in mono["runs"]] == [
        (1, 1, [9.0, 8.0, 8.0]), (2, 3, [9.0, 10.0, 10.0]), (3, 1, [9.0, 8.0, 8.0])]
    # async: 4, 4, 5 s against mono's 8, 10, 8: optimizer steps/s ratios 8/4 = 2, 10/4 = 2.5, 8/5 = 1.6; the same
    # completions a step, so the same completions/s ratios. Median 2.0. With three rounds, a resample's median is the
    # lowest ratio with probability 7/27 (two or three picks of it), above the interval's 2.5%: the interval runs from
    # the lowest ratio to the highest.
    vs = fast["vs_baseline"]
    assert vs["rounds"] == [1, 2, 3]
    for figure in ("optimizer_steps_per_s", "completions_per_s"):
        assert vs[figure]["per_round"] == pytest.approx([2.0, 2.5, 1.6])
        assert vs[figure]["median"] == pytest.approx(2.0)
        assert (vs[figure]["interval"]["low"], vs[figure]["interval"]["high"]) == pytest.approx((1.6, 2.5))
        assert vs[figure]["interval"]["confidence"] == 0.95
    assert fast["median_optimizer_steps_per_s"] == 0.25  # 1/4, 1/4, 1/5
    # dp: 8, 8, 10 s for 64 completions: optimizer steps/s ratios 1, 1.25, 0.8; completions/s twice those.
    assert dp["vs_baseline"]["optimizer_steps_per_s"]["per_round"] == pytest.approx([1.0, 1.25, 0.8])
    assert dp["vs_baseline"]["completions_per_s"]["per_round"] == pytest.approx([2.0, 2.5, 1.6])
    assert dp["vs_baseline"]["completions_per_s"]["median"] == pytest.approx(2.0)
    assert dp["completions_per_step"] == 64 and dp["median_completions_per_s"] == 8.0  # 64/8, 64/8, 64/10
    table = bench.scale_summary_table(summary)
    assert "| mono:1 | 32 | 3 of 3 | 8.00 s | 4.00 | 0.125 | baseline | baseline |  |" in table
    assert ("| async:2 | 32 | 3 of 3 | 4.00 s | 8.00 | 0.250 | **2.00×** [1.60, 2.50] (r1 2.00, r2 2.50, r3 1.60) | "
            "**2.00×** [1.60, 2.50] (r1 2.00, r2 2.50, r3 1.60) |  |") in table


def test_a_failed_run_leaves_the_other_rounds_figures_and_says_which_failed(tmp_path, monkeypatch):
    out = tmp_path / "scale.json"
    crash = {"mode": "rlt", "status": "error", "error": "RuntimeError: the server did not start"}
    code, _ = scale_main(monkeypatch,
                         measured(8.0), measured(4.0),  # the first round: mono, async
                         crash, measured(10.0),  # the second: async fails, then mono
                         measured(8.0), measured(5.0),  # the third: mono, async
                         argv=["--arms", "mono:1,async:2", "--rounds", "3", "--out", str(out)])
    assert code == 1
    document = json.loads(out.read_text())
    assert [(r["round"], r["placement"], r["status"]) for r in document["results"]] == [
        (1, "mono", "ok"), (1, "async", "ok"), (2, "async", "error"), (2, "mono", "ok"), (3, "mono", "ok"),
        (3, "async", "ok")]
    mono, fast = document["summary"]["arms"]
    assert mono["rounds_ok"] == 3 and mono["median_step_seconds"] == 8.0
    assert fast["rounds_ok"] == 2 and fast["failed_rounds"] == [2]
    assert fast["runs"][1] == {"round": 2, "position": 1, "status": "error",
                               "error": "RuntimeError: the server did not start"}
    # Rounds 1 and 3 only: ratios 8/4 = 2 and 8/5 = 1.6, median their mean 1.8; async's median step (4 + 5) / 2.
    vs = fast["vs_baseline"]
    assert vs["rounds"] == [1, 3] and fast["median_step_seconds"] == 4.5
    assert vs["optimizer_steps_per_s"]["per_round"] == pytest.approx([2.0, 1.6])
    assert vs["optimizer_steps_per_s"]["median"] == pytest.approx(1.8)
    table = bench.scale_summary_table(document["summary"])
    assert "| async:2 | 32 | 2 of 3 | 4.50 s |" in table
    assert table.endswith("(r1 2.00, r3 1.60) | r2 error: RuntimeError: the server did not start |")


def test_one_round_gives_ratios_without_an_interval(monkeypatch, tmp_path):
    out = tmp_path / "scale.json"
    code, _ = scale_main(monkeypatch, measured(8.0), measured(5.0), "out_of_memory",
                         argv=["--arms", "mono:1,async:2,dp:2", "--out", str(out)])
    assert code == 1
    summary = json.loads(out.read_text())["summary"]
    ratio = summary["arms"][1]["vs_baseline"]["optimizer_steps_per_s"]
    assert ratio["per_round"] == [1.6] and ratio["median"] == 1.6
    assert ratio["interval"] == {"confidence": 0.95, "low": None, "high": None, "resamples": 0}
    table = bench.scale_summary_table(summary)
    assert "**1.60×** one round: no interval (r1 1.60)" in table
    assert "| dp:2 | | 0 of 1 | | | | | | r1 out_of_memory:  |" in table


def test_the_scale_record_says_what_ran_where(tmp_path, monkeypatch):
    """--out holds the commit, the GPUs the runs saw (a stand-in nvidia-smi here), the command line and each run's
    per-step seconds; without --commit, the checkout's."""
    calls = tmp_path / "nvidia-smi-args"
    smi = tmp_path / "bin" / "nvidia-smi"
    smi.parent.mkdir()
    smi.write_text(f'#!/bin/sh\necho "$@" > {calls}\necho "NVIDIA H200"\necho "NVIDIA H200"\n')
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{smi.parent}:{os.environ['PATH']}")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    out = tmp_path / "scale.json"
    argv = ["--arch", "0.5b", "--arms", "mono:1,async:2", "--rounds", "2", "--commit", "abc1234", "--out", str(out)]
    scale_main(monkeypatch, measured(8.0), measured(4.0), measured(4.2), measured(7.9), argv=argv)
    document = json.loads(out.read_text())
    assert {k: document[k] for k in ("commit", "device", "command", "rounds", "arms")} == {
        "commit": "abc1234", "device": "2 x NVIDIA H200",
        "command": f"CUDA_VISIBLE_DEVICES=2,3 python3 bench/bench_mono.py scale --arch 0.5b --arms mono:1,async:2 "
                   f"--rounds 2 --commit abc1234 --out {out}",
        "rounds": 2, "arms": "mono:1,async:2"}
    assert calls.read_text().split() == ["--query-gpu=name", "--format=csv,noheader", "--id", "2,3"]
    assert [(r["round"], r["position"], r["step_seconds"], r["completions_per_s"], r["optimizer_steps_per_s"])
            for r in document["results"]] == [(1, 1, [9.0, 8.0, 8.0], 4.0, 0.125), (1, 2, [9.0, 4.0, 4.0], 8.0, 0.25),
                                              (2, 1, [9.0, 4.2, 4.2], 32 / 4.2, 1 / 4.2),
                                              (2, 2, [9.0, 7.9, 7.9], 32 / 7.9, 1 / 7.9)]
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout
    scale_main(monkeypatch, measured(8.0), argv=["--arms", "mono:1", "--out", str(out)])
    assert json.loads(out.read_text())["commit"] == head.strip()


@pytest.mark.parametrize("argv, message", [
    (["--rounds", "0"], "--rounds 0: the arms must run at least once (1 or more)"),
    (["--arms", "mono:1,async:2,mono:1"], "--arms lists mono:1 twice: --rounds runs the arms again")])
def test_scale_refuses_no_round_or_an_arm_twice_in_one_line(argv, message, monkeypatch, capsys):
    runner = FakeRunner()
    monkeypatch.setattr(bench, "run_child", lambda mode, child, log_dir: runner(mode, child))
    with pytest.raises(SystemExit) as exit_info:
        bench.main(["scale", *argv])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.endswith(f": error: {message}\n") and err.count("\n") == 1, err  # one line, no usage block
    assert runner.calls == []


@pytest.mark.parametrize("arms", ["mono:2", "student_gpu:1", "split:4", "dp:0", "ring:2", "dp", "fsdp2:x"])
def test_scale_rejects_a_malformed_arm(arms, capsys):
    with pytest.raises(SystemExit) as exit_info:
        bench.main(["scale", "--arms", arms])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "expected arm:gpus" in err and err.count("\n") == 1, err  # one line, no usage block


def test_a_dp_child_runs_under_accelerate_with_one_rank_per_gpu(tmp_path):
    argv = ["--arch", "1.5b", "--placement", "dp", "--gpus", "4"]
    command, env = bench.child_command("rlt", argv, tmp_path / "r.json", str(tmp_path))
    assert command[:3] == [sys.executable, "-m", "rlt_mono.launch"]
    assert option(command, "--num_processes") == "4" and option(command, "--num_machines") == "1"
    assert command[-10:] == [str(BENCH), "rlt", *argv, "--result-file", str(tmp_path / "r.json")]
    assert env["RLT_MONO_LAUNCHED"] == "1" and env["RLT_MONO_RANK_ERRORS"] == str(tmp_path)
    assert option(command, "--config_file").endswith("ddp.yaml")
    sharded, _ = bench.child_command("rlt", [*argv, "--strategy", "fsdp2"], tmp_path / "r.json", str(tmp_path))
    assert option(sharded, "--config_file").endswith("fsdp2.yaml")
    mono, _ = bench.child_command("rlt", ["--placement", "mono"], tmp_path / "r.json", str(tmp_path))
    assert mono == [sys.executable, str(BENCH), "rlt", "--placement", "mono", "--result-file", str(tmp_path / "r.json")]


def test_strategy_is_placement_dps_and_reaches_the_config(capsys):
    with pytest.raises(SystemExit):
        bench.main(["rlt", "--placement", "mono", "--strategy", "fsdp2"])
    assert "add --placement dp" in capsys.readouterr().err
    options = parse("rlt", "--placement", "dp", "--gpus", "2", "--strategy", "fsdp2")
    overrides = bench.bench_overrides(options, Path("t"), Path("s"), None)
    assert "placement.strategy=fsdp2" in overrides and "placement=dp" in overrides


@pytest.mark.parametrize(("placement", "gpus"), [("dp", "0"), ("mono", "2"), ("student_gpu", "4")])
def test_rlt_gpus_must_match_the_placement(placement, gpus, capsys):
    with pytest.raises(SystemExit):
        bench.main(["rlt", "--placement", placement, "--gpus", gpus])
    assert "mono takes 1, student_gpu and async 2, dp 1 or more" in capsys.readouterr().err


def test_the_planner_predicts_mono_and_dp_runs_and_leaves_the_two_gpu_placements_out(monkeypatch, tokenizer):
    from types import SimpleNamespace

    from rlt_mono.config import compose

    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: SimpleNamespace(total_memory=80 * 2**30))
    trainer = SimpleNamespace(train_dataset={"prompt": ["What is 2 + 2?", "What is 12 + 30?"]},
                              processing_class=tokenizer)
    assert bench.predicted_peaks(compose("teacher_rlt_mono", ["placement=student_gpu"]), trainer, "0.5b") == {}
    assert bench.predicted_peaks(compose("teacher_rlt_mono", ["placement=async"]), trainer, "0.5b") == {}
    mono = bench.predicted_peaks(compose("teacher_rlt_mono", ["placement=mono"]), trainer, "0.5b")
    dp = bench.predicted_peaks(compose("teacher_rlt_mono", ["placement=dp", "placement.num_processes=2"]), trainer,
                               "0.5b")
    assert set(mono) == {"predicted/generate", "predicted/score", "predicted/train", "predicted_table", "prompt_length"}
    assert dp["predicted/train"] > mono["predicted/train"]  # DDP's gradient buckets
    assert "DDP gradient buckets" in dp["predicted_table"]


def test_a_random_weight_model_is_built_once_under_the_projects_lock(tmp_path, monkeypatch):
    """The ranks of a dp run share one model folder: the first builds it while holding the lock
    (rlt_mono.runs.lock.exclusive, the one file lock), the others find it built."""
    built = []

    def build(arch, path, seed):
        from rlt_mono.runs.lock import _flock, _open_lock_file
        fd = _open_lock_file(tmp_path / ".0.5b-teacher.lock")
        built.append(_flock(fd, wait=False))  # another descriptor cannot take the lock while it is held
        path.mkdir(parents=True)
        (path / "config.json").write_text("{}")

    monkeypatch.setattr(bench, "_build_model", build)
    first = bench.make_model("0.5b", "teacher", tmp_path, seed=0)
    assert bench.make_model("0.5b", "teacher", tmp_path, seed=0) == first == tmp_path / "0.5b-teacher"
    assert built == [False]
