"""The memory planner (rlt_mono/memory/model.py) never under-predicts a measured phase: every bench run on a GPU that
recorded the planner's prediction beside the measured device-level peak (results/planner_vs_measured.json, one entry
per run) is predicted again from its settings with the current planner, and each phase's prediction must be at least
0.95 of what the device measured. Also by hand, on the tiny pair: the two terms those runs showed missing (torch's
cache carried into GENERATE; the AdamW step's temporary in TRAIN)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from rlt_mono.memory.model import GIB, PHASES, QWEN25_ARCHS, Arch, Settings, pool_bytes, predict
from rlt_mono.memory.planner import plan
from tests.test_memory_on_cpu import tiny_settings

RESULTS = Path(__file__).resolve().parent.parent / "results"
SUMMARY = RESULTS / "planner_vs_measured.json"
RUNS = json.loads(SUMMARY.read_text())["runs"]
# The least predicted / measured a phase may have.
LEAST_RATIO = 0.95


def settings(run: dict) -> Settings:
    arch = Arch.from_config(QWEN25_ARCHS[run["arch"]])
    return Settings(teacher=arch, student=arch, **run["settings"])


def saturated(run: dict, phase: str) -> bool:
    """Whether the run held all the memory its card left it (bench_mono.py --card-gib) in ``phase``: torch's
    allocator keeps cached blocks until the card is full and frees them when an allocation needs the room, so the
    device reading is then the card's size, not what the phase needed."""
    return run["card_gib"] is not None and run["measured_gib"][phase] >= run["card_gib"]


@pytest.mark.parametrize("run, phase", [(run, phase) for run in RUNS for phase in PHASES],
                         ids=[f"{run['id']}-{phase}" for run in RUNS for phase in PHASES])
def test_the_planner_predicts_at_least_the_measured_peak(run, phase):
    s = settings(run)
    predicted = predict(s)[0][phase]
    if not saturated(run, phase):
        ratio = predicted.gib / run["measured_gib"][phase]
        assert ratio >= LEAST_RATIO, (f"{run['id']} {phase}: predicted {predicted.gib:.2f} GiB, measured "
                                      f"{run['measured_gib'][phase]:.2f} ({ratio:.3f})")
        return
    # A full card's reading says nothing of the need: compare what torch allocated instead. Its counter keeps
    # vLLM's pool while vLLM sleeps (SCORE, TRAIN); the prediction's torch part leaves out the allocator's slack and
    # cache and the CUDA context.
    allocated = run["torch_allocated_gib"][phase] - (0 if phase == "GENERATE" else pool_bytes(s) / GIB)
    torch_part = (predicted.bytes - predicted.term("allocator") - predicted.term("CUDA context")) / GIB
    ratio = torch_part / allocated
    assert ratio >= LEAST_RATIO, (f"{run['id']} {phase} (the card full): predicted allocations {torch_part:.2f} GiB, "
                                  f"torch allocated {allocated:.2f} ({ratio:.3f})")


def test_the_summary_holds_the_memory_speed_runs_and_the_capped_ones():
    # the four runs before the planner counted the allocator cache in GENERATE, and the one after (82adaf8)
    assert sorted(run["id"] for run in RUNS if run["memory"] == "speed") == [
        "speed_05b/82adaf8/speed_raw.json#0", "speed_05b/dc24aa4/speed_raw.json#0",
        "speed_05b/fd61d14/speed_liger_raw.json#0", "speed_05b/fd61d14/speed_raw.json#0",
        "speed_05b/speed_raw.json#0"]
    # Five phases of three runs on simulated small cards filled them: h100_planner.json#3's TRAIN (16 GiB),
    # h100_qlora.json#0's three (12 GiB), h100_qlora.json#1's TRAIN (28 GiB).
    assert [(run["id"], phase) for run in RUNS for phase in PHASES if saturated(run, phase)] == [
        ("h100_planner.json#3", "TRAIN"), ("h100_qlora.json#0", "GENERATE"), ("h100_qlora.json#0", "SCORE"),
        ("h100_qlora.json#0", "TRAIN"), ("h100_qlora.json#1", "TRAIN")]


def _recorded_runs(value, path: str):
    """``(where, run)`` for every dict under ``value`` that holds both a prediction and a measured peak."""
    if isinstance(value, dict):
        if "predicted/generate" in value and "device_peak/generate" in value:
            yield path, value
        for key, item in value.items():
            yield from _recorded_runs(item, f"{path}/{key}")
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _recorded_runs(item, f"{path}/{index}")


def test_every_committed_run_with_a_prediction_and_a_measurement_is_in_the_summary():
    summarised = {(run["id"].split("#")[0], tuple(run["measured_gib"][p] for p in PHASES)) for run in RUNS}
    summarised |= {(other.split("#")[0], tuple(run["measured_gib"][p] for p in PHASES))
                   for run in RUNS for other in run.get("also_in", [])}
    missing = []
    for path in sorted(RESULTS.rglob("*.json")):
        if path == SUMMARY:
            continue
        name = path.relative_to(RESULTS).as_posix()
        for where, recorded in _recorded_runs(json.loads(path.read_text()), name):
            measured = tuple(round(recorded[f"device_peak/{p.lower()}"], 3) for p in PHASES)
            if (name, measured) not in summarised:
                missing.append(where)
    assert not missing, f"add these runs to {SUMMARY.name}: {missing}"


# ---- the two terms, by hand on the tiny pair (tests/test_memory_on_cpu.py's tiny_settings: float32, adamw_torch,
# no slack or context, a 1 GiB card; TRAIN is 77,696 bytes there)
def test_generate_holds_the_cache_score_and_train_left_until_the_weight_sync_empties_it():
    # A pool too small for the cache: with sleep mode the phase holds the larger of TRAIN's level and vLLM's moment.
    small = tiny_settings(vllm_gpu_memory_utilization=1e-5)  # pool int(1e-5 x GiB) = 10,737 bytes
    phases = plan(small).phases
    moment = 10737 + int(0.4 * 5920) + 5920 + 2 * 5920  # pool, vLLM beyond it, teacher weights, Adam states
    assert phases["GENERATE"].term("vLLM pool") == 10737
    assert dict(phases["GENERATE"].terms)["allocator cache from SCORE and TRAIN"] == 77696 - moment
    assert phases["GENERATE"].bytes == phases["TRAIN"].bytes == 77696
    # Nothing empties it without sleep mode: it stays beside the pool and vLLM's own memory for the whole phase.
    awake = plan(dataclasses.replace(small, vllm_sleep=False)).phases
    assert awake["TRAIN"].bytes == 77696 + 10737
    assert awake["GENERATE"].bytes == 77696 + 10737 + int(0.4 * 5920)
    # A pool larger than TRAIN's level: the moment is the peak, no cache term (as before).
    assert dict(plan(tiny_settings()).phases["GENERATE"].terms)["allocator cache from SCORE and TRAIN"] == 0


def test_torch_adamw_s_step_holds_one_state_sized_temporary_beyond_the_backward():
    # The tiny pair's backward buffers (activations 46,080 + loss head 7,936) exceed one Adam state (5,920 bytes):
    # nothing more. With a micro-batch whose backward is smaller, the step's temporary is the larger moment.
    assert dict(plan(tiny_settings()).phases["TRAIN"].terms)["optimizer step beyond the backward"] == 0
    short = tiny_settings(prompt_length=1, max_completion_length=1, per_device_train_batch_size=1,
                          gradient_accumulation_steps=8, steps_per_generation=8)  # 2 tokens
    terms = dict(plan(short).phases["TRAIN"].terms)
    backward = terms["activations"] + terms["loss head"]
    assert backward < 5920
    assert terms["optimizer step beyond the backward"] == 5920 - backward
    # bitsandbytes' 8-bit AdamW updates one parameter at a time: no such term.
    assert "optimizer step beyond the backward" not in dict(plan(tiny_settings(optim="adamw_bnb_8bit"))
                                                              .phases["TRAIN"].terms)
