"""Where a phase's GPU time goes: a kernel-level profile of one rlt_mono step (``bench_mono.py rlt --profile-step``).

``PhaseProfiler`` runs ``torch.profiler`` (CPU and CUDA activity) over one optimizer step, from the moment its
generation ends to the step's end: the score and train phases. Generation is left out (a 4,096-token generation
replays millions of decode kernels; its time is vLLM's ``generate`` call, which ``calls/generate`` measures). Each
phase entry and exit is synchronised with the device and marked (``record_function``), so every kernel runs inside
the window of the phase that launched it.

``phase_table`` turns the windows and the kernels into one entry per phase: wall seconds (a phase that runs several
times, as train does per micro-batch, sums its windows, less the windows nested in them), busy seconds (the union
of its kernels' intervals: the GPU was doing something), idle seconds (wall - busy: the GPU waited on the CPU,
a copy or a synchronisation), seconds per kernel category and the top kernels by time. It is a pure function of
``(name, start, end)`` triples, tested on the CPU.
"""

from __future__ import annotations

import time
from collections import defaultdict

# Kernel name fragments (lower case) -> category; the first match wins, "other" when none does.
CATEGORIES = (
    ("attention", ("flash", "fmha", "attention", "attn")),
    ("gemm", ("gemm", "cutlass", "nvjet", "xmma", "cublas", "sm90_", "sm80_", "splitk")),
    ("log-prob (TRL fused)", ("_forward_kernel", "_backward_kernel")),
    ("optimizer", ("adam", "optimizer", "multi_tensor")),
    ("copy", ("memcpy", "memset", "copy_kernel")),
    ("norm / activation", ("rms", "norm", "silu", "swiglu", "act_and_mul", "rotary")),
)


def category(kernel: str) -> str:
    """The category of a kernel name (``CATEGORIES``)."""
    lowered = kernel.lower()
    for name, fragments in CATEGORIES:
        if any(f in lowered for f in fragments):
            return name
    return "other"


def _union_seconds(intervals: list[tuple[float, float]]) -> float:
    """Seconds covered by the union of ``(start, end)`` intervals in microseconds."""
    covered, reach = 0.0, float("-inf")
    for start, end in sorted(intervals):
        if end <= reach:
            continue
        covered += end - max(start, reach)
        reach = end
    return covered / 1e6


def phase_table(windows: list[tuple[str, float, float]], kernels: list[tuple[str, float, float]],
                top: int = 8) -> dict[str, dict]:
    """Per phase: ``wall_s``, ``busy_s``, ``idle_s``, ``busy_frac``, ``categories`` (seconds of kernel time per
    category) and ``top_kernels``. ``windows`` and ``kernels`` are ``(name, start_us, end_us)``; a kernel belongs to
    the innermost window holding its start (none: left out)."""
    windows = sorted(windows, key=lambda w: (w[1], -w[2]))
    nested = defaultdict(float)  # window index -> microseconds of windows directly inside it
    for i, (_, start, end) in enumerate(windows):
        parents = [j for j, (_, s, e) in enumerate(windows) if j != i and s <= start and end <= e]
        if parents:
            nested[max(parents, key=lambda j: windows[j][1])] += end - start
    spans: dict[str, list[tuple[float, float]]] = defaultdict(list)
    kernel_time: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for name, start, end in kernels:
        holding = [j for j, (_, s, e) in enumerate(windows) if s <= start <= e]
        if not holding:
            continue
        phase = windows[max(holding, key=lambda j: windows[j][1])][0]
        spans[phase].append((start, end))
        kernel_time[phase][name].append((end - start) / 1e6)
    table = {}
    for phase in dict.fromkeys(name for name, _, _ in windows):
        wall = sum(end - start - nested[i] for i, (name, start, end) in enumerate(windows) if name == phase) / 1e6
        busy = _union_seconds(spans[phase])
        categories: dict[str, float] = defaultdict(float)
        for name, times in kernel_time[phase].items():
            categories[category(name)] += sum(times)
        ranked = sorted(kernel_time[phase].items(), key=lambda kv: -sum(kv[1]))[:top]
        table[phase] = {
            "wall_s": wall, "busy_s": busy, "idle_s": max(wall - busy, 0.0),
            "busy_frac": busy / wall if wall > 0 else None,
            "categories": dict(sorted(categories.items(), key=lambda kv: -kv[1])),
            "top_kernels": [{"name": name[:160], "category": category(name), "calls": len(times),
                             "seconds": sum(times)} for name, times in ranked],
        }
    return table


class PhaseProfiler:
    """Profiles step ``step`` (1-based optimizer step) of an ``RLTTrainer`` from the end of its generation; after
    training, ``table`` holds ``phase_table``'s result (None if that step never ran)."""

    def __init__(self, trainer, step: int):
        from transformers import TrainerCallback

        self.step, self.table = step, None
        self._armed, self._profile, self._marks = False, None, []
        self._timer = trainer.timer
        begin, end = self._timer.begin, self._timer.end
        phases: list = []  # the phases open now, outermost first
        profiler = self

        def traced_begin(phase):
            if profiler._profile is not None:
                profiler._mark_enter(phase.value)
            phases.append(phase)
            begin(phase)

        def traced_end():
            phase = phases.pop()
            end()
            if profiler._profile is not None:
                profiler._mark_exit()
            elif profiler._armed and phase.value == "generate":  # generation done: profile the rest of the step
                profiler._start([p.value for p in phases])

        self._timer.begin, self._timer.end = traced_begin, traced_end

        class _Callback(TrainerCallback):
            def on_step_begin(self, args, state, control, **kwargs):
                profiler._armed = state.global_step + 1 == profiler.step

            def on_step_end(self, args, state, control, **kwargs):
                if profiler._profile is not None:
                    profiler._stop()

        self.callback = _Callback()

    def _mark_enter(self, name: str) -> None:
        import torch

        _synchronize()
        mark = torch.profiler.record_function(name)
        mark.__enter__()
        self._marks.append(mark)

    def _mark_exit(self) -> None:
        _synchronize()
        self._marks.pop().__exit__(None, None, None)

    def _start(self, open_phases: list[str]) -> None:
        import torch

        _synchronize()
        activities = [torch.profiler.ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        self._profile = torch.profiler.profile(activities=activities)
        self._profile.__enter__()
        self._started = time.perf_counter()
        for name in open_phases:
            self._mark_enter(name)

    def _stop(self) -> None:
        from torch.autograd import DeviceType

        while self._marks:
            self._mark_exit()
        profile, self._profile, self._armed = self._profile, None, False
        profile.__exit__(None, None, None)
        names = {"score", "train", "generate"}
        windows, kernels = [], []
        for event in profile.events():
            start, end = event.time_range.start, event.time_range.end
            if event.name in names and event.device_type == DeviceType.CPU:
                windows.append((event.name, start, end))
            elif event.device_type == DeviceType.CUDA and event.name not in names:
                kernels.append((event.name, start, end))
        self.table = {"step": self.step, "profiled_seconds": time.perf_counter() - self._started,
                      "kernels": len(kernels), "phases": phase_table(windows, kernels)}


def _synchronize() -> None:
    """Wait for the GPU's queued kernels (nothing to wait for on a CPU run)."""
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def markdown(table: dict) -> str:
    """``PhaseProfiler.table`` as two Markdown tables: per phase, then its top kernels."""
    lines = ["| phase | wall s | GPU busy s (share) | idle s | " + " | ".join(c for c, _ in CATEGORIES) + " | other |",
             "| --- " * (5 + len(CATEGORIES)) + "|"]
    for phase, row in table["phases"].items():
        cats = [f"{row['categories'].get(c, 0.0):.2f}" for c, _ in CATEGORIES] + [
            f"{row['categories'].get('other', 0.0):.2f}"]
        lines.append(f"| {phase} | {row['wall_s']:.2f} | {row['busy_s']:.2f} ({row['busy_frac']:.0%}) | "
                     f"{row['idle_s']:.2f} | " + " | ".join(cats) + " |")
    lines += ["", "| phase | kernel | category | calls | s | ms per call |", "| --- | --- | --- | --- | --- | --- |"]
    for phase, row in table["phases"].items():
        lines += [f"| {phase} | `{k['name'][:70]}` | {k['category']} | {k['calls']} | {k['seconds']:.2f} | "
                  f"{1e3 * k['seconds'] / k['calls']:.2f} |" for k in row["top_kernels"]]
    return "\n".join(lines) + "\n"


def main() -> None:
    import argparse
    import json
    from pathlib import Path

    from rlt_mono.runs.atomic_write import write_json, write_text

    parser = argparse.ArgumentParser(description="The kernel profile of a bench_mono.py rlt result (--profile-step) "
                                     "as JSON (with where it was measured) and Markdown")
    parser.add_argument("result", type=Path, help="bench_mono.py's --out file (a list of results, or scale's record "
                        "of them) or one result")
    parser.add_argument("--out", type=Path, required=True, help="<name>.json; <name>.md is written beside it")
    parser.add_argument("--commit", required=True)
    parser.add_argument("--device", required=True)
    parser.add_argument("--command", required=True)
    args = parser.parse_args()
    results = json.loads(args.result.read_text())
    if isinstance(results, dict):
        results = results.get("results", [results])
    result = next(r for r in results if r.get("profile"))
    summary = {"commit": args.commit, "device": args.device, "command": args.command,
               "work": {k: result.get(k) for k in ("arch", "completion_length", "completions", "util")},
               "settings": result.get("chosen"), **result["profile"]}
    write_json(args.out, summary, indent=1)
    write_text(args.out.with_suffix(".md"), markdown(result["profile"]))


if __name__ == "__main__":
    main()
