"""Phase bookkeeping: nested phases add up to wall time; throughputs and MFU follow their formulas; the swapper
moves nothing on the CPU."""

import time

import pytest
import torch

from rlt_mono.phases import Phase, PhaseTimer, with_throughputs
from rlt_mono.swapper import ModelSwapper


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


def test_cpu_swapper_never_moves_models():
    timer = PhaseTimer("cpu")
    swapper = ModelSwapper("cpu", timer)
    model = torch.nn.Linear(4, 4)
    weight = model.weight.data_ptr()
    swapper.place(model, "student", offload=True)
    assert not swapper.is_offloaded(model)
    with swapper.resident(model, writeback=True) as resident:
        assert resident is model and model.weight.data_ptr() == weight
    assert timer.pop_metrics() == {}  # nothing swapped, nothing counted


def test_swaps_count_into_the_timer():
    timer = PhaseTimer("cpu")
    swapper = ModelSwapper("cpu", timer)
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
