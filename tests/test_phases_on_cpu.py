"""Phase bookkeeping: nested phases add up to wall time; throughputs and MFU follow their formulas; the swapper
moves nothing on the CPU."""

import time

import pytest
import torch

from rlt_mono.rl.phases import DevicePeak, Phase, PhaseTimer, with_throughputs
from rlt_mono.rl.swapper import ModelSwapper


def test_nested_phases_exclude_their_children():
    phases = PhaseTimer("cpu")
    start = time.perf_counter()
    with phases.phase(Phase.TRAIN):
        time.sleep(0.05)
        with phases.phase(Phase.SCORE):
            time.sleep(0.03)
            with phases.phase(Phase.GENERATE):
                time.sleep(0.02)
    wall = time.perf_counter() - start
    m = phases.pop_metrics()
    assert m["phase/generate/seconds"] == pytest.approx(0.02, abs=0.015)
    assert m["phase/score/seconds"] == pytest.approx(0.03, abs=0.015)
    assert m["phase/train/seconds"] == pytest.approx(0.05, abs=0.015)
    assert sum(m.values()) == pytest.approx(wall, abs=0.005)
    assert phases.pop_metrics() == {}  # popped


def test_a_phase_ends_when_its_queued_device_work_does():
    # A fake device queue: work "launched" in a phase runs only when the timer synchronises. The train phase queues
    # 0.06 s and returns at once (as CUDA launches do); its seconds must hold that 0.06 s, the next phase's none.
    queued, syncs = [], []

    def synchronize():
        syncs.append(sum(queued))
        time.sleep(sum(queued))
        queued.clear()

    phases = PhaseTimer("cpu", synchronize=synchronize)
    with phases.phase(Phase.TRAIN):
        queued.append(0.06)
    with phases.phase(Phase.GENERATE):
        pass
    m = phases.pop_metrics()
    assert m["phase/train/seconds"] == pytest.approx(0.06, abs=0.015)
    assert m["phase/generate/seconds"] < 0.01
    assert syncs == [0, 0.06, 0, 0]  # at each phase's begin and end
    assert PhaseTimer("cpu")._synchronize is None  # a CPU timer has no device queue to wait for


def test_cpu_swapper_never_moves_models():
    timer = PhaseTimer("cpu")
    swapper = ModelSwapper("cpu", timer, pin_memory=True)
    model = torch.nn.Linear(4, 4)
    weight = model.weight.data_ptr()
    swapper.place(model, "student", offload=True)
    assert not swapper.is_offloaded(model)
    with swapper.resident(model, writeback=True) as resident:
        assert resident is model and model.weight.data_ptr() == weight
    assert timer.pop_metrics() == {}  # nothing swapped, nothing counted


def test_swaps_count_into_the_timer():
    timer = PhaseTimer("cpu")
    swapper = ModelSwapper("cpu", timer, pin_memory=True)
    swapper._count_swap(start=0.0, nbytes=3 * 1024**3)
    metrics = timer.pop_metrics()
    assert metrics["swap/gib"] == 3.0 and metrics["swap/seconds"] > 0


def test_throughputs_and_mfu(monkeypatch):
    metrics = {"phase/generate/seconds": 2.0, "generate/tokens": 1000.0, "phase/train/seconds": 4.0,
               "train/tokens": 2000.0}
    out = with_throughputs(dict(metrics), num_parameters=10**9, device=torch.device("cpu"))
    assert out["perf/generation_tokens_per_s"] == 500.0
    assert out["perf/train_tokens_per_s"] == 500.0
    assert "perf/mfu" not in out  # no peak known for a CPU
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H100 80GB HBM3")
    out = with_throughputs(dict(metrics), num_parameters=10**9, device=torch.device("cuda", 0))
    assert out["perf/mfu"] == pytest.approx(6 * 1e9 * 2000 / (4.0 * 989.4e12))
    assert "generate/prefix_cached_frac" not in out  # no prompt tokens counted


def test_prefix_cached_fraction_of_the_step():
    out = with_throughputs({"generate/prompt_tokens": 800.0, "generate/prefix_cached_tokens": 672.0},
                           num_parameters=10**9, device=torch.device("cpu"))
    assert out["generate/prefix_cached_frac"] == pytest.approx(0.84)


def test_device_peak_per_phase_sees_spikes_between_phase_edges_and_nests():
    gib = 1024**3
    level = {"bytes": 1 * gib}
    sampler = DevicePeak(lambda: level["bytes"], interval=0.001)
    timer = PhaseTimer("cpu", device_peak=sampler)
    try:
        with timer.phase(Phase.TRAIN):
            level["bytes"] = 5 * gib  # a spike that is over before the next phase edge: only the thread sees it
            time.sleep(0.05)
            level["bytes"] = 2 * gib
            with timer.phase(Phase.SCORE):
                level["bytes"] = 3 * gib
            level["bytes"] = 1 * gib
        with timer.phase(Phase.GENERATE):
            pass
    finally:
        timer.close()
    metrics = timer.pop_metrics()
    assert metrics["phase/train/device_peak_gib"] == 5.0
    assert metrics["phase/score/device_peak_gib"] == 3.0  # a window of its own, not the parent's spike
    assert metrics["phase/generate/device_peak_gib"] == 1.0  # reset at the phase's start
    assert "phase/train/peak_allocated_gib" not in metrics  # torch's allocator figures are CUDA-only
