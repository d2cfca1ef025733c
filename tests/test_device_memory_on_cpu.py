"""What the memory planner plans against (rlt_mono/memory/device.py): the card's total less what other live
processes hold, never the memory free at one instant. The device is faked: torch.cuda's readings and NVML's
process list are the recorded numbers of an H100 80GB run."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf
from transformers import Qwen2Config

from rlt_mono.config import compose
from rlt_mono.errors import UserError
from rlt_mono.memory import device as device_memory
from rlt_mono.memory import planner as memory_planner
from rlt_mono.memory.device import ProcessMemory, capacity
from rlt_mono.memory.model import GIB, QWEN25_ARCHS
from rlt_mono.rl import build

# An H100 80GB as torch.cuda.mem_get_info reports it (vLLM's error in results/h100_qlora.json: "79.18 GiB").
H100_TOTAL = int(79.18 * GIB)
# Recorded on H100: memory=auto started right after another process had used the GPU and saw 48.9 GiB free;
# the same 7B + 7B run with memory=manual (micro-batch 2, reward micro-batch 2, vLLM 0.3) ran, peaking at 59.1 GiB.
FREE_AT_THAT_INSTANT = int(48.9 * GIB)
OWN_CONTEXT = GIB // 2
OWN_PID = 1000
ROOT = Path(__file__).resolve().parent.parent


def test_memory_of_no_live_process_is_not_subtracted():
    # NVML no longer lists the process that had used the GPU; its 29.8 GiB are still counted as in use
    found = capacity(H100_TOTAL, FREE_AT_THAT_INSTANT, [ProcessMemory(OWN_PID, OWN_CONTEXT, True)], OWN_PID)
    assert found.usable == H100_TOTAL and found.held_by_others == 0
    assert found.unattributed == H100_TOTAL - FREE_AT_THAT_INSTANT - OWN_CONTEXT
    assert found.releasing(None)  # worth another look
    assert found.warnings("cuda:0", 10.0) == [
        "29.8 GiB of cuda:0 is in use by no live process this one can see (still after 10 s): not subtracted from "
        "the card's 79.2 GiB; if it is still held when vLLM starts, vLLM refuses to start"]
    # listed but exited: the same
    exited = capacity(H100_TOTAL, FREE_AT_THAT_INSTANT, [ProcessMemory(OWN_PID, OWN_CONTEXT, True),
                                                         ProcessMemory(77, 29 * GIB, False)], OWN_PID)
    assert exited.usable == H100_TOTAL and exited.exited == (ProcessMemory(77, 29 * GIB, False),)
    assert "(still after 10 s; NVML's pid 77 not running here)" in exited.warnings("cuda:0", 10.0)[0]


def test_other_live_processes_are_subtracted_and_named():
    other = ProcessMemory(4242, H100_TOTAL - FREE_AT_THAT_INSTANT - OWN_CONTEXT, True)
    found = capacity(H100_TOTAL, FREE_AT_THAT_INSTANT, [ProcessMemory(OWN_PID, OWN_CONTEXT, True), other], OWN_PID)
    assert found.held_by_others == other.used and found.usable == FREE_AT_THAT_INSTANT + OWN_CONTEXT
    assert found.unattributed == 0 and not found.releasing(None)
    assert found.warnings("cuda:0", 0.0) == [
        "other processes hold 29.8 GiB of cuda:0 (pid 4242 29.8 GiB): the plan uses the 49.4 GiB left of the "
        "card's 79.2"]
    # a live process whose usage NVML does not give may hold everything that nothing else explains
    unknown = capacity(H100_TOTAL, FREE_AT_THAT_INSTANT, [ProcessMemory(OWN_PID, OWN_CONTEXT, True),
                                                          ProcessMemory(4242, None, True)], OWN_PID)
    assert unknown.usable == FREE_AT_THAT_INSTANT + OWN_CONTEXT and unknown.unattributed == 0
    assert "(pid 4242 usage unknown)" in unknown.warnings("cuda:0", 0.0)[0]
    # an idle card: nothing to say
    idle = capacity(H100_TOTAL, H100_TOTAL - OWN_CONTEXT, [ProcessMemory(OWN_PID, OWN_CONTEXT, True)], OWN_PID)
    assert idle.usable == H100_TOTAL and idle.warnings("cuda:0", 0.0) == []


def test_without_nvml_the_free_memory_once_it_stops_growing():
    first = capacity(H100_TOTAL, FREE_AT_THAT_INSTANT, None, OWN_PID)
    assert first.usable == FREE_AT_THAT_INSTANT and first.releasing(None)
    released = capacity(H100_TOTAL, H100_TOTAL - OWN_CONTEXT, None, OWN_PID)
    assert not released.releasing(first)  # less than RELEASE_NOISE in use
    held = capacity(H100_TOTAL, FREE_AT_THAT_INSTANT + GIB // 4, None, OWN_PID)
    assert not held.releasing(first)  # barely moved: someone holds it
    assert held.warnings("cuda:0", 1.0) == [
        "NVML lists no processes on cuda:0: the plan uses what is free after 1 s, 49.1 of the card's 79.2 GiB "
        "(30.0 GiB held by other processes or not yet released)"]


# ---- the reading, on a faked device --------------------------------------------------------------------------


class FakeDevice:
    """torch.cuda.mem_get_info and NVML's process list, one reading after another (the last one repeats)."""

    def __init__(self, readings: list[tuple[int, list[tuple[int, int | None]] | None]]):
        self.readings, self.looks, self.uuids = readings, 0, []

    def reading(self):
        return self.readings[min(self.looks, len(self.readings) - 1)]

    def mem_get_info(self, device):
        free, _ = self.reading()
        self.looks += 1
        return free, H100_TOTAL

    def pynvml(self) -> types.SimpleNamespace:
        error = type("NVMLError", (Exception,), {})

        def processes(handle):
            listed = self.readings[min(self.looks - 1, len(self.readings) - 1)][1]
            if listed is None:
                raise error("Not Supported")
            return [types.SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in listed]

        return types.SimpleNamespace(NVMLError=error, nvmlInit=lambda: None, nvmlShutdown=lambda: None,
                                     nvmlDeviceGetHandleByUUID=self.uuids.append,
                                     nvmlDeviceGetComputeRunningProcesses=processes)


@pytest.fixture
def device(monkeypatch):
    """Install a FakeDevice's readings; sleeping is skipped and counted."""
    waits = []

    def install(readings) -> FakeDevice:
        fake = FakeDevice(readings)
        monkeypatch.setattr(torch.cuda, "mem_get_info", fake.mem_get_info)
        monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: types.SimpleNamespace(uuid="abc-1"))
        monkeypatch.setitem(sys.modules, "pynvml", fake.pynvml())
        monkeypatch.setattr(device_memory.time, "sleep", waits.append)
        fake.waits = waits
        return fake

    return install


def exited_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", ""])
    child.wait()
    return child.pid


def rl_config():
    """The GPU run config (memory=auto, full fine-tuning, 8-bit Adam, 4096-token completions) for a 7B pair."""
    cfg = compose("teacher_rlt_mono", [])
    assert (cfg.memory, cfg.trainer.optim, cfg.trainer.max_completion_length, cfg.model.lora_r) == (
        "auto", "adamw_bnb_8bit", 4096, 0)
    return cfg


class OneGpu:
    """placement=mono on cuda:0."""

    def device(self, role):
        return "cuda:0"

    def beside_actor(self, role):
        return False

    one_step_off = False  # the rollout colocated, not on a server of its own


QWEN_7B = Qwen2Config(**{k: v for k, v in QWEN25_ARCHS["7b"].items() if k != "model_type"})


def test_the_7b_run_that_ran_by_hand_is_not_refused_at_48_9_gib_free(device, caplog):
    """The recorded refusal, through the build step: the memory of a process that had just used the GPU still
    counted as in use (48.9 of 79.18 GiB free) and stayed so for the whole wait. Before rlt_mono.memory.device,
    ``build.fit_memory`` planned against that free memory and stopped with "TRAIN needs 57.7 GiB, the card has 48.9
    free: model.lora_r=16"."""
    fake = device([(FREE_AT_THAT_INSTANT, [(os.getpid(), OWN_CONTEXT), (exited_pid(), 29 * GIB)])])
    cfg = rl_config()
    with caplog.at_level(logging.INFO):
        assert build.fit_memory(cfg, OneGpu(), QWEN_7B, QWEN_7B, prompt_length=200)
    assert set(fake.uuids) == {"GPU-abc-1"}  # NVML finds the device by torch's UUID
    assert len(fake.waits) == device_memory.RELEASE_WAIT_S / device_memory.RELEASE_POLL_S  # it waited, then planned
    assert "in use by no live process this one can see (still after 10 s; NVML's pid" in caplog.text
    assert "card 79.2 GiB, held by other processes 0.0, usable 79.2;" in caplog.text
    assert cfg.model.lora_r == 0  # full fine-tuning, as configured
    # the plan's changes reach the config, each logged once as key: before -> after
    planned = memory_planner.fit_plan("auto", memory_planner.settings_from_config(
        rl_config(), total_gib=H100_TOTAL / GIB, free_gib=H100_TOTAL / GIB, arch="7b", prompt_length=200))[1]
    assert planned and {key: OmegaConf.select(cfg, key) for key in planned} == planned
    (line,) = [record.message for record in caplog.records if record.message.startswith("memory=auto set ")]
    assert line == "memory=auto set " + ", ".join(f"{key}: {OmegaConf.select(rl_config(), key)} -> {value}"
                                                   for key, value in planned.items())
    # the settings that ran by hand fit the same card
    manual = memory_planner.settings_from_config(compose("teacher_rlt_mono", [
        "memory=manual", "trainer.per_device_train_batch_size=2", "trainer.gradient_accumulation_steps=16",
        "trainer.steps_per_generation=16", "reward.micro_batch_size=2", "trainer.vllm_gpu_memory_utilization=0.3"]),
        total_gib=H100_TOTAL / GIB, free_gib=H100_TOTAL / GIB, arch="7b", prompt_length=200)
    assert memory_planner.plan(manual).fits
    # planning against that instant's free memory is what refused it
    at_that_instant = memory_planner.settings_from_config(rl_config(), total_gib=H100_TOTAL / GIB,
                                                          free_gib=FREE_AT_THAT_INSTANT / GIB, arch="7b",
                                                          prompt_length=200)
    with pytest.raises(UserError, match=r"TRAIN needs 57\.7 GiB, the card has 48\.9 beside other processes' 30\.3: "
                                        r"model\.lora_r=16$"):
        memory_planner.fit_plan("auto", at_that_instant)


def test_memory_released_while_it_waits_is_the_cards(device):
    # the first look sees the exited process's memory; a second later it is back
    fake = device([(FREE_AT_THAT_INSTANT, [(os.getpid(), OWN_CONTEXT)]),
                   (H100_TOTAL - OWN_CONTEXT, [(os.getpid(), OWN_CONTEXT)])])
    card = device_memory.read_capacity(torch.device("cuda:0"))
    assert (card.usable, card.total) == (H100_TOTAL, H100_TOTAL)
    assert len(fake.waits) == 1


def test_a_live_process_is_planned_around_and_named(device, caplog):
    """Another live process (this test's parent) holds 29.8 GiB: the plan uses what it leaves, says so, and refuses
    the 7B full fine-tune with the recorded advice."""
    other = H100_TOTAL - FREE_AT_THAT_INSTANT - OWN_CONTEXT
    fake = device([(FREE_AT_THAT_INSTANT, [(os.getpid(), OWN_CONTEXT), (os.getppid(), other)])])
    cfg = rl_config()
    with caplog.at_level(logging.INFO), pytest.raises(UserError, match=r"TRAIN needs 57\.7 GiB, the card has 49\.4 "
                                                                         r"beside other processes' 29\.8: model\.lora_r"
                                                                         r"=16$"):
        build.fit_memory(cfg, OneGpu(), QWEN_7B, QWEN_7B, prompt_length=200)
    assert fake.waits == []  # nothing to wait for
    assert (f"GPU memory: other processes hold 29.8 GiB of cuda:0 (pid {os.getppid()} 29.8 GiB): the plan uses the "
            "49.4 GiB left of the card's 79.2") in caplog.text
    assert "card 79.2 GiB, held by other processes 29.8, usable 49.4;" in caplog.text


def test_without_nvml_it_waits_while_free_memory_grows(device, caplog):
    fake = device([(FREE_AT_THAT_INSTANT, None), (FREE_AT_THAT_INSTANT + 10 * GIB, None),
                   (FREE_AT_THAT_INSTANT + 10 * GIB, None)])
    with caplog.at_level(logging.INFO):
        card = device_memory.read_capacity(torch.device("cuda:0"))
    assert (card.usable, card.total) == (FREE_AT_THAT_INSTANT + 10 * GIB, H100_TOTAL) and len(fake.waits) == 2
    assert "NVML cannot list the processes on cuda:0 (Not Supported)" in caplog.text
    assert "GPU memory: NVML lists no processes on cuda:0: the plan uses what is free after 2 s" in caplog.text


def test_the_cli_shows_what_other_processes_hold():
    shown = subprocess.run([sys.executable, "-m", "rlt_mono.memory.planner", "teacher_rlt_mono", "--arch", "1.5b",
                            "--gpu-gib", "24", "--free-gib", "20"], cwd=ROOT, capture_output=True, text=True,
                           timeout=120)
    assert "memory plan (predicted device-level peaks): card 24.0 GiB, held by other processes 4.0, usable 20.0;" \
        in shown.stdout
