"""Phases of an RLT step, timed: seconds, peak GPU memory, per-step counters and the throughput/MFU maths.

A step runs GENERATE (rollouts) -> SCORE (reference log-probs, teacher log-probs for the KL, student
scoring) -> TRAIN (the teacher update). ``PhaseTimer`` times each phase (phases nest; a parent's time excludes
its children's), records peak GPU memory per phase and accumulates the per-step counters other parts add
(``generate/tokens``, ``swap/*`` from ``rlt_mono.rl.swapper.ModelSwapper``, ...) until the trainer logs them;
``with_throughputs`` turns those into tokens/s and MFU.

Two memory figures per phase: ``peak_allocated_gib``, torch's allocator peak (it counts vLLM's pool even while
vLLM sleeps, so it can exceed the card), and ``device_peak_gib``, the device-level peak in use (what
``nvidia-smi`` shows, every process and allocator included) sampled by ``DevicePeak`` every 5 ms. The second
is the one a card's size limits, and the one ``rlt_mono.memory.model`` predicts.
"""

from __future__ import annotations

import contextlib
import enum
import functools
import logging
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

_GIB = 1024**3
logger = logging.getLogger(__name__)

# Dense bf16 peak FLOP/s (no sparsity) by device name, for MFU.
PEAK_BF16_FLOPS = {"H100": 989.4e12, "H200": 989.4e12, "A100": 312e12, "L40S": 362e12, "A10": 125e12}


class Phase(enum.Enum):
    GENERATE = "generate"
    SCORE = "score"
    TRAIN = "train"


class DevicePeak:
    """The peak of ``read()`` (bytes in use on a device) since the last ``reset``, sampled every ``interval``
    seconds by a daemon thread. Exact for memory that stays in use for longer than ``interval``: torch's caching
    allocator keeps what it reserved until ``empty_cache``, and vLLM's pool lives for the whole GENERATE phase."""

    def __init__(self, read, interval: float = 0.005):
        self._read = read
        self._interval = interval
        self._lock = threading.Lock()
        self._peak = read()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rlt-device-peak", daemon=True)
        self._thread.start()

    @classmethod
    def for_device(cls, device: torch.device) -> DevicePeak:
        """Sampling NVML's used memory (``torch.cuda.device_memory_used``: no CUDA call, no stream sync), or
        ``total - free`` from ``torch.cuda.mem_get_info`` where NVML is not available."""
        try:
            torch.cuda.device_memory_used(device)
            return cls(lambda: torch.cuda.device_memory_used(device))
        except Exception as err:  # pynvml missing or NVML unusable: the CUDA runtime's figure instead
            logger.debug("NVML unavailable (%s): sampling torch.cuda.mem_get_info", err)

            def used() -> int:
                free, total = torch.cuda.mem_get_info(device)
                return total - free

            return cls(used)

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            value = self._read()
            with self._lock:
                self._peak = max(self._peak, value)

    def peak(self) -> int:
        """Bytes: the largest sample since the last reset, the current reading included."""
        value = self._read()
        with self._lock:
            self._peak = max(self._peak, value)
            return self._peak

    def reset(self) -> None:
        """Start a new window at the current reading."""
        value = self._read()
        with self._lock:
            self._peak = value

    def close(self) -> None:
        self._stop.set()
        self._thread.join()


class PhaseTimer:
    """Times phases and records their peak memory on ``device`` (``cuda:N`` or ``cpu``: no memory figures).
    ``device_peak`` overrides how the device-level peak is sampled (tests pass a ``DevicePeak`` over a fake
    reading; by default a CUDA device gets ``DevicePeak.for_device``, a CPU none).

    Each phase edge first waits for the work queued on the device (``synchronize``; by default
    ``torch.cuda.synchronize`` on a CUDA device, nothing on a CPU), so a phase's seconds end when its kernels do, not
    when the CPU has queued them: without it, the 7B step's train phase read 18.8 s in the log against 22.2 s in a
    profile synchronised at the same edges, its queued kernels billed to the next phase."""

    def __init__(self, device: torch.device | str, device_peak: DevicePeak | None = None,
                 synchronize: Callable[[], None] | None = None):
        self.device = torch.device(device)
        self._metrics: dict[str, float] = defaultdict(float)
        self._stack: list[_Frame] = []
        self._device_peak = device_peak
        if device_peak is None and self.device.type == "cuda":
            self._device_peak = DevicePeak.for_device(self.device)
        self._synchronize = synchronize
        if synchronize is None and self.device.type == "cuda":
            self._synchronize = functools.partial(torch.cuda.synchronize, self.device)

    def begin(self, phase: Phase) -> None:
        """Enter ``phase``. Phases nest (TRL scores inside its training step): a parent's time and peak
        memory exclude its children's, so the per-phase seconds add up to the step's wall time."""
        self._wait_for_device()
        now = time.perf_counter()
        if self._stack:
            parent = self._stack[-1]
            parent.peak_gib = max(parent.peak_gib, self._peak_gib())
            parent.device_peak_gib = max(parent.device_peak_gib, self._device_peak_gib())
        self._reset_peak()
        self._stack.append(_Frame(phase, now))

    def end(self) -> None:
        """Leave the innermost phase and record its metrics."""
        self._wait_for_device()
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
        if self._device_peak is not None:
            device_peak = max(frame.device_peak_gib, self._device_peak_gib())
            self._metrics[f"{key}/device_peak_gib"] = max(self._metrics[f"{key}/device_peak_gib"], device_peak)
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

    def _wait_for_device(self) -> None:
        if self._synchronize is not None:
            self._synchronize()

    def _peak_gib(self) -> float:
        return torch.cuda.max_memory_allocated(self.device) / _GIB if self.device.type == "cuda" else 0.0

    def _device_peak_gib(self) -> float:
        return self._device_peak.peak() / _GIB if self._device_peak is not None else 0.0

    def _reset_peak(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        if self._device_peak is not None:
            self._device_peak.reset()

    def close(self) -> None:
        """Stop the device-peak sampler (a trainer's ``release`` calls this)."""
        if self._device_peak is not None:
            self._device_peak.close()
            self._device_peak = None


@dataclass
class _Frame:
    phase: Phase
    start: float
    child_seconds: float = 0.0
    peak_gib: float = 0.0
    device_peak_gib: float = 0.0


def with_throughputs(metrics: dict[str, float], num_parameters: int, device: torch.device) -> dict[str, float]:
    """Add generation and training tokens/s, training MFU and the share of prompt tokens vLLM's prefix cache served
    (``generate/prefix_cached_frac``) to the phase metrics.

    MFU = 6 * N * training tokens / (TRAIN seconds * peak bf16 FLOP/s): the 6N per token of a forward and
    backward pass (attention FLOPs and gradient-checkpointing recomputation not counted), against the dense
    bf16 peak of the GPU in ``PEAK_BF16_FLOPS`` (absent for other devices).
    """
    generate_seconds = metrics.get("phase/generate/seconds", 0.0)
    if generate_seconds > 0 and "generate/tokens" in metrics:
        metrics["perf/generation_tokens_per_s"] = metrics["generate/tokens"] / generate_seconds
    prompt_tokens = metrics.get("generate/prompt_tokens", 0)
    if prompt_tokens > 0:
        metrics["generate/prefix_cached_frac"] = metrics["generate/prefix_cached_tokens"] / prompt_tokens
    train_seconds = metrics.get("phase/train/seconds", 0.0)
    if train_seconds > 0 and "train/tokens" in metrics:
        metrics["perf/train_tokens_per_s"] = metrics["train/tokens"] / train_seconds
        if device.type == "cuda":
            name = torch.cuda.get_device_name(device)
            peak = next((flops for key, flops in PEAK_BF16_FLOPS.items() if key in name), None)
            if peak is not None:
                metrics["perf/mfu"] = 6 * num_parameters * metrics["train/tokens"] / (train_seconds * peak)
    return metrics
