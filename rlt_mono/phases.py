"""Phases of an RLT step, timed: seconds, peak GPU memory, per-step counters and the throughput/MFU maths.

A step runs GENERATE (rollouts) -> SCORE (reference log-probs, teacher log-probs for the KL, student
scoring) -> TRAIN (the teacher update). ``PhaseTimer`` times each phase (phases nest; a parent's time excludes
its children's), records peak GPU memory per phase and accumulates the per-step counters other parts add
(``generate/tokens``, ``swap/*`` from ``rlt_mono.swapper.ModelSwapper``, ...) until the trainer logs them;
``with_throughputs`` turns those into tokens/s and MFU.
"""

from __future__ import annotations

import contextlib
import enum
import time
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass

import torch

_GIB = 1024**3

# Dense bf16 peak FLOP/s (no sparsity) by device name, for MFU.
PEAK_BF16_FLOPS = {"H100": 989.4e12, "H200": 989.4e12, "A100": 312e12, "L40S": 362e12, "A10": 125e12}


class Phase(enum.Enum):
    GENERATE = "generate"
    SCORE = "score"
    TRAIN = "train"


class PhaseTimer:
    """Times phases and records their peak memory on ``device`` (``cuda:N`` or ``cpu``: no memory figures)."""

    def __init__(self, device: torch.device | str):
        self.device = torch.device(device)
        self._metrics: dict[str, float] = defaultdict(float)
        self._stack: list[_Frame] = []

    def begin(self, phase: Phase) -> None:
        """Enter ``phase``. Phases nest (TRL scores inside its training step): a parent's time and peak
        memory exclude its children's, so the per-phase seconds add up to the step's wall time."""
        now = time.perf_counter()
        if self._stack:
            self._stack[-1].peak_gib = max(self._stack[-1].peak_gib, self._peak_gib())
        self._reset_peak()
        self._stack.append(_Frame(phase, now))

    def end(self) -> None:
        """Leave the innermost phase and record its metrics."""
        frame = self._stack.pop()
        elapsed = time.perf_counter() - frame.start
        key = f"phase/{frame.phase.value}"
        self._metrics[f"{key}/seconds"] += elapsed - frame.child_seconds
        if self.device.type == "cuda":
            peak = max(frame.peak_gib, self._peak_gib())
            free, total = torch.cuda.mem_get_info(self.device)
            self._metrics[f"{key}/peak_allocated_gib"] = max(self._metrics[f"{key}/peak_allocated_gib"], peak)
            self._metrics[f"{key}/device_used_gib"] = max(self._metrics[f"{key}/device_used_gib"],
                                                          (total - free) / _GIB)
        self._reset_peak()
        if self._stack:
            self._stack[-1].child_seconds += elapsed

    @contextlib.contextmanager
    def phase(self, phase: Phase) -> Iterator[None]:
        """Run a block as ``phase``; see ``begin``."""
        self.begin(phase)
        try:
            yield
        finally:
            self.end()

    def add_metric(self, name: str, value: float) -> None:
        """Accumulate a per-step quantity (e.g. generated tokens) reported with the phase metrics."""
        self._metrics[name] += value

    def pop_metrics(self) -> dict[str, float]:
        """Metrics accumulated since the last call (seconds add up; memory figures are maxima)."""
        metrics, self._metrics = dict(self._metrics), defaultdict(float)
        return metrics

    def _peak_gib(self) -> float:
        return torch.cuda.max_memory_allocated(self.device) / _GIB if self.device.type == "cuda" else 0.0

    def _reset_peak(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)


@dataclass
class _Frame:
    phase: Phase
    start: float
    child_seconds: float = 0.0
    peak_gib: float = 0.0


def with_throughputs(metrics: dict[str, float], num_parameters: int, device: torch.device) -> dict[str, float]:
    """Add generation and training tokens/s, and training MFU, to the phase metrics.

    MFU = 6 * N * training tokens / (TRAIN seconds * peak bf16 FLOP/s): the 6N per token of a forward and
    backward pass (attention FLOPs and gradient-checkpointing recomputation not counted), against the dense
    bf16 peak of the GPU in ``PEAK_BF16_FLOPS`` (absent for other devices).
    """
    generate_seconds = metrics.get("phase/generate/seconds", 0.0)
    if generate_seconds > 0 and "generate/tokens" in metrics:
        metrics["perf/generation_tokens_per_s"] = metrics["generate/tokens"] / generate_seconds
    train_seconds = metrics.get("phase/train/seconds", 0.0)
    if train_seconds > 0 and "train/tokens" in metrics:
        metrics["perf/train_tokens_per_s"] = metrics["train/tokens"] / train_seconds
        if device.type == "cuda":
            name = torch.cuda.get_device_name(device)
            peak = next((flops for key, flops in PEAK_BF16_FLOPS.items() if key in name), None)
            if peak is not None:
                metrics["perf/mfu"] = 6 * num_parameters * metrics["train/tokens"] / (train_seconds * peak)
    return metrics
