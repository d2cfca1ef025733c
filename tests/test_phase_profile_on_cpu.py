"""bench/phase_profile.py: kernels attributed to the phase windows that launched them, and the busy/idle split."""

import importlib.util
import json
import sys
from pathlib import Path

import pytest

spec = importlib.util.spec_from_file_location("phase_profile", Path(__file__).parents[1] / "bench" / "phase_profile.py")
profile = importlib.util.module_from_spec(spec)
spec.loader.exec_module(profile)


def test_kernels_go_to_the_innermost_window_and_busy_time_is_the_union_of_their_intervals():
    windows = [("score", 0, 1000), ("generate", 100, 400), ("train", 1000, 2000), ("train", 2000, 2600)]
    kernels = [
        ("sm90_xmma_gemm_bf16bf16_bf16f32", 10, 210),  # score: overlaps the next one
        ("flash_fwd_kernel", 200, 300),  # starts inside the generate window nested in score: generate
        ("_forward_kernel", 500, 600),  # score, TRL's fused log-prob kernel
        ("nvjet_tst_128x256", 150, 190),  # generate
        ("void at::native::elementwise_kernel", 1100, 1300),  # train
        ("multi_tensor_apply_kernel adam", 2100, 2200),  # train, the second window
        ("memcpy HtoD", 3000, 3100),  # in no window: left out
    ]
    table = profile.phase_table(windows, kernels)
    assert list(table) == ["score", "generate", "train"]
    score, generate, train = table["score"], table["generate"], table["train"]
    # score's wall time leaves out the generate window nested in it: 1000 - 300 us
    assert score["wall_s"] == pytest.approx(700e-6)
    assert score["busy_s"] == pytest.approx(300e-6)  # (10, 210) and (500, 600); flash_fwd starts inside generate
    assert score["categories"] == pytest.approx({"gemm": 200e-6, "log-prob (TRL fused)": 100e-6})
    assert generate["wall_s"] == pytest.approx(300e-6)
    # (150, 190) and (200, 300) overlap nothing of each other: 40 + 100 us
    assert generate["busy_s"] == pytest.approx(140e-6)
    assert generate["categories"] == pytest.approx({"attention": 100e-6, "gemm": 40e-6})
    assert train["wall_s"] == pytest.approx(1600e-6) and train["busy_s"] == pytest.approx(300e-6)
    assert train["idle_s"] == pytest.approx(1300e-6) and train["busy_frac"] == pytest.approx(300 / 1600)
    assert [(k["name"], k["category"], k["calls"]) for k in train["top_kernels"]] == [
        ("void at::native::elementwise_kernel", "other", 1), ("multi_tensor_apply_kernel adam", "optimizer", 1)]


def test_overlapping_kernels_count_once_in_busy_time_and_fully_in_their_category():
    table = profile.phase_table([("train", 0, 100)], [("gemm_a", 0, 60), ("gemm_b", 40, 80), ("gemm_a", 90, 95)])
    assert table["train"]["busy_s"] == pytest.approx(85e-6)  # [0, 80) and [90, 95)
    assert table["train"]["categories"] == pytest.approx({"gemm": 105e-6})  # 60 + 40 + 5: kernel time, summed
    assert [(k["name"], k["calls"], k["seconds"]) for k in table["train"]["top_kernels"]] == [
        ("gemm_a", 2, pytest.approx(65e-6)), ("gemm_b", 1, pytest.approx(40e-6))]


def test_profiler_on_a_tiny_cpu_run_marks_the_chosen_step_after_its_generation(tmp_path):
    from rlt_mono import build_trainer, compose, release_trainer

    trainer = build_trainer(compose("demo_tiny", [f"output_dir={tmp_path / 'run'}", "trainer.max_steps=2"]))
    profiler = profile.PhaseProfiler(trainer, step=2)
    trainer.add_callback(profiler.callback)
    try:
        trainer.train()
    finally:
        release_trainer(trainer)
    assert profiler.table["step"] == 2 and profiler.table["kernels"] == 0  # a CPU run launches no device kernel
    phases = profiler.table["phases"]
    assert set(phases) == {"score", "train"}  # generation is left out: the profile starts when it ends
    assert phases["score"]["wall_s"] > 0 and phases["train"]["wall_s"] > 0
    assert phases["train"]["busy_s"] == 0 and phases["train"]["idle_s"] == phases["train"]["wall_s"]


@pytest.mark.parametrize("shape", ["list", "scale"])
def test_the_profiled_result_is_found_in_a_list_of_results_or_a_scale_record(shape, tmp_path, monkeypatch):
    profiled = {"arch": "0.5b", "chosen": {"per_device_train_batch_size": 4}, "profile": {"step": 2, "phases": {}}}
    results = [{"status": "ok"}, profiled]
    source = tmp_path / "bench.json"
    source.write_text(json.dumps(results if shape == "list" else {"commit": "abc1234", "results": results}))
    out = tmp_path / "profile.json"
    monkeypatch.setattr(sys, "argv", ["phase_profile.py", str(source), "--out", str(out), "--commit", "abc1234",
                                      "--device", "H200", "--command", "python3 bench/bench_mono.py ..."])
    profile.main()
    assert json.loads(out.read_text())["step"] == 2
