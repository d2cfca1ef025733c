"""The accounting of colocated vLLM's sleep/wake cycles (``rlt_mono.rl.sleep_leak``) on hand-made readings: flat
readings never warn, a steady growth warns once at the cycle it passes the bound, the warm-up stays out of the
baseline; and the trainer's hook reads the device at the right wake-ups and sleeps (a fake engine and reader).
The same accounting on a real engine: tests/test_gpu.py, ``test_sleep_wake_cycles_keep_device_memory_flat``."""

import logging
from types import SimpleNamespace

import pytest
import torch

from rlt_mono.memory import device as device_memory
from rlt_mono.memory.device import ProcessMemory
from rlt_mono.memory.model import GIB
from rlt_mono.rl.grpo_config import RLTConfig
from rlt_mono.rl.sleep_leak import SleepCycle, SleepLeakTracker
from rlt_mono.rl.trainer import RLTTrainer

STEP = GIB // 10  # 0.1 GiB
AWAKE, ASLEEP = 30 * GIB, 10 * GIB


def _feed(tracker: SleepLeakTracker, readings: list[tuple[int, int]]) -> None:
    for after_wake, after_sleep in readings:
        tracker.woke(after_wake)
        tracker.slept(after_sleep)


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "rlt_mono.rl.sleep_leak"
            and r.levelno == logging.WARNING]


def test_flat_readings_show_no_growth_and_never_warn(caplog):
    tracker = SleepLeakTracker(warn_bytes=GIB)
    with caplog.at_level(logging.WARNING, logger="rlt_mono.rl.sleep_leak"):
        _feed(tracker, [(AWAKE, ASLEEP)] * 20)
    assert len(tracker.cycles) == 20
    assert tracker.growth() == SleepCycle(0, 0)
    assert tracker.metrics() == {"memory/after_wake_gib": 30.0, "memory/after_sleep_gib": 10.0,
                                 "memory/after_wake_growth_gib": 0.0, "memory/after_sleep_growth_gib": 0.0}
    assert tracker.warned_at is None and _warnings(caplog) == []


def test_a_steady_growth_warns_once_at_the_cycle_it_passes_the_bound(caplog):
    """0.1 GiB more per cycle over 20 cycles; cycles 1-2 are the warm-up and cycles 3-5 the baseline (median:
    cycle 4), so cycle n has grown by (n - 4) x 0.1 GiB: 1.0 GiB (not above the bound) at 14, 1.1 at 15."""
    tracker = SleepLeakTracker(warn_bytes=GIB)
    readings = [(AWAKE + n * STEP, ASLEEP + n * STEP) for n in range(1, 21)]
    with caplog.at_level(logging.WARNING, logger="rlt_mono.rl.sleep_leak"):
        _feed(tracker, readings[:14])
        assert tracker.warned_at is None and _warnings(caplog) == []
        assert tracker.growth() == SleepCycle(10 * STEP, 10 * STEP)
        _feed(tracker, readings[14:])
    assert tracker.warned_at == 15
    [message] = _warnings(caplog)
    assert message.startswith("vLLM sleep/wake: after 15 cycles this process holds 1.10 GiB more with vLLM asleep "
                              "(1.10 GiB more awake) than over cycles 3-5")
    assert "trainer.vllm_enable_sleep_mode=false" in message and "trainer.vllm_gpu_memory_utilization" in message
    assert tracker.growth() == SleepCycle(16 * STEP, 16 * STEP)  # cycle 20; still reported after the warning
    assert tracker.metrics()["memory/after_sleep_growth_gib"] == pytest.approx(1.6, abs=1e-6)
    assert tracker.metrics()["memory/after_sleep_gib"] == pytest.approx(12.0, abs=1e-6)


def test_a_growth_of_the_awake_reading_alone_warns_too(caplog):
    tracker = SleepLeakTracker(warn_bytes=GIB)
    with caplog.at_level(logging.WARNING, logger="rlt_mono.rl.sleep_leak"):
        _feed(tracker, [(AWAKE, ASLEEP)] * 5 + [(AWAKE + 2 * GIB, ASLEEP)])
    assert tracker.warned_at == 6
    [message] = _warnings(caplog)
    assert "0.00 GiB more with vLLM asleep (2.00 GiB more awake)" in message


def test_the_baseline_leaves_out_the_warm_up(caplog):
    """The first cycles hold less (the optimizer state appears at the first optimizer step) or more (vLLM's
    first wake-up): counted in the baseline, the flat cycles after them would look like a 5 GiB growth."""
    tracker = SleepLeakTracker(warn_bytes=GIB)
    warm_up = [(AWAKE - 5 * GIB, ASLEEP - 5 * GIB), (AWAKE + 5 * GIB, ASLEEP + 5 * GIB)]
    with caplog.at_level(logging.WARNING, logger="rlt_mono.rl.sleep_leak"):
        _feed(tracker, warm_up)
        assert tracker.baseline() is None and tracker.growth() is None
        assert set(tracker.metrics()) == {"memory/after_wake_gib", "memory/after_sleep_gib"}
        _feed(tracker, [(AWAKE, ASLEEP)] * 18)
    assert tracker.baseline() == SleepCycle(AWAKE, ASLEEP)
    assert tracker.growth() == SleepCycle(0, 0) and _warnings(caplog) == []
    # The baseline is the median of its cycles: one odd reading among them does not move it.
    odd = SleepLeakTracker(warn_bytes=GIB, warmup_cycles=0)
    _feed(odd, [(AWAKE, ASLEEP), (AWAKE + 3 * GIB, ASLEEP + 3 * GIB), (AWAKE, ASLEEP)])
    assert odd.baseline() == SleepCycle(AWAKE, ASLEEP)


def test_a_sleep_without_a_wake_before_it_is_no_cycle():
    tracker = SleepLeakTracker(warn_bytes=GIB)
    tracker.slept(ASLEEP)  # an engine's first sleep, right after its start
    assert tracker.cycles == [] and tracker.metrics() == {}
    _feed(tracker, [(AWAKE, ASLEEP)])
    tracker.slept(ASLEEP + GIB)  # a second sleep closes nothing either
    assert tracker.cycles == [SleepCycle(AWAKE, ASLEEP)]


def test_bounds_are_checked():
    with pytest.raises(ValueError, match="warn_bytes must be > 0, got 0"):
        SleepLeakTracker(warn_bytes=0)
    with pytest.raises(ValueError, match="baseline_cycles >= 1, got 2 and 0"):
        SleepLeakTracker(warn_bytes=GIB, baseline_cycles=0)
    with pytest.raises(ValueError, match="sleep_leak_warn_gib must be > 0, got 0"):
        RLTConfig(output_dir="/tmp/x", max_steps=1, use_cpu=True, sleep_leak_warn_gib=0)
    with pytest.raises(ValueError, match="sleep_leak_warn_gib must be a number, got 'big'"):
        RLTConfig(output_dir="/tmp/x", max_steps=1, use_cpu=True, sleep_leak_warn_gib="big")


# ---- the trainer's hook ------------------------------------------------------------------------------------------
class FakeLLM:
    """vLLM's ``LLM.wake_up(tags)`` / ``LLM.sleep(level)``, recorded."""

    def __init__(self):
        self.calls = []

    def wake_up(self, tags=None):
        self.calls.append(("wake_up", tags))

    def sleep(self, level=1):
        self.calls.append(("sleep", level))


def _fake_trainer(llm, *, use_vllm=True, sleep_mode=True, device="cuda:0"):
    args = SimpleNamespace(vllm_mode="colocate", vllm_enable_sleep_mode=sleep_mode, sleep_leak_warn_gib=1.0)
    return SimpleNamespace(use_vllm=use_vllm, args=args, accelerator=SimpleNamespace(device=torch.device(device)),
                           vllm_generation=SimpleNamespace(llm=llm))


def test_the_trainer_reads_the_device_after_the_kv_cache_wakes_and_after_each_sleep(monkeypatch, caplog):
    """TRL's cycle: wake the weights (for the sync), wake the KV cache, generate, sleep(level=2); 20 cycles whose
    readings grow by 0.1 GiB each. The weights' wake-up is no reading; the rest reach the tracker in order."""
    cycles = [SleepCycle(AWAKE + n * STEP, ASLEEP + n * STEP) for n in range(1, 22)]
    readings = iter([value for cycle in cycles for value in (cycle.after_wake, cycle.after_sleep)])
    devices = []

    def reader(device):
        devices.append(device)
        return lambda: next(readings)

    monkeypatch.setattr(device_memory, "process_used_reader", reader)
    llm = FakeLLM()
    tracker = RLTTrainer._watch_vllm_sleep(_fake_trainer(llm))
    assert devices == [torch.device("cuda:0")]
    with caplog.at_level(logging.WARNING, logger="rlt_mono.rl.sleep_leak"):
        for _ in range(20):
            llm.wake_up(tags=["weights"])
            llm.wake_up(tags=["kv_cache"])
            llm.sleep(level=2)
    assert llm.calls[:3] == [("wake_up", ["weights"]), ("wake_up", ["kv_cache"]), ("sleep", 2)]
    assert len(llm.calls) == 60
    assert tracker.cycles == cycles[:20]
    assert tracker.warned_at == 15 and len(_warnings(caplog)) == 1
    llm.wake_up()  # a wake-up of everything (no tags) is a reading too
    llm.sleep()
    assert llm.calls[-2:] == [("wake_up", None), ("sleep", 1)] and tracker.cycles == cycles
    assert next(readings, None) is None  # every reading was taken (one at each weights' wake-up would run out)


@pytest.mark.parametrize("trainer", [dict(use_vllm=False), dict(sleep_mode=False), dict(device="cpu")],
                         ids=["transformers_rollouts", "vllm_awake", "no_cuda"])
def test_the_hook_is_off_without_a_sleeping_engine_on_a_gpu(monkeypatch, trainer):
    monkeypatch.setattr(device_memory, "process_used_reader", lambda device: pytest.fail("read the device"))
    llm = FakeLLM()
    assert RLTTrainer._watch_vllm_sleep(_fake_trainer(llm, **trainer)) is None
    assert llm.wake_up.__func__ is FakeLLM.wake_up and llm.sleep.__func__ is FakeLLM.sleep  # not wrapped


# ---- what a reading is -------------------------------------------------------------------------------------------
def test_a_reading_is_nvmls_figure_for_this_process_else_the_whole_devices(monkeypatch):
    import os

    own = os.getpid()
    listed = [[ProcessMemory(own, 12 * GIB, True), ProcessMemory(own + 1, 20 * GIB, True)]]
    monkeypatch.setattr(device_memory, "_processes", lambda device: listed[0])
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (48 * GIB, 80 * GIB))
    read = device_memory.process_used_reader(torch.device("cuda:0"))
    assert read() == 12 * GIB  # another process's 20 GiB is not this one's
    listed[0] = [ProcessMemory(own, 13 * GIB, True), ProcessMemory(own + 1, 40 * GIB, True)]
    assert read() == 13 * GIB
    listed[0] = None  # NVML stopped answering: the device's memory in use
    assert read() == 32 * GIB
    # This process not in NVML's list (another pid namespace) from the start: the device's memory in use.
    listed[0] = [ProcessMemory(own + 1, 20 * GIB, True)]
    assert device_memory.process_used_reader(torch.device("cuda:0"))() == 32 * GIB
