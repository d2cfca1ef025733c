"""Phases of an RLT step and the one place that moves whole models between CPU and GPU.

A step runs GENERATE (rollouts) -> SCORE (reference log-probs, teacher log-probs for the KL, student
scoring) -> TRAIN (the teacher update). ``PhaseController`` times each phase, records peak GPU memory per
phase, and owns every bulk model move: the frozen models (reference, student) keep one pinned CPU copy of
their weights and are swapped in for their phase and swapped out after it. Swapping out a frozen model
copies nothing back: the GPU tensors are dropped and the parameters point at the pinned copy again.
The reference model, which ``sync_ref_model`` updates in place, is swapped out with ``writeback=True``.

Nothing else in rlt_mono calls ``.to(device)`` on a whole model or empties the CUDA cache.
"""

from __future__ import annotations

import contextlib
import enum
import logging
import time
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import nn

logger = logging.getLogger(__name__)
_GIB = 1024**3


class Phase(enum.Enum):
    GENERATE = "generate"
    SCORE = "score"
    TRAIN = "train"


class PhaseController:
    """Times phases and swaps frozen models onto ``device`` for the phases that use them.

    Args:
        device: where computation happens (``cuda:N`` or ``cpu``).
        offload: keep swappable models on CPU outside their phase. With ``device='cpu'`` nothing moves.
        pin_memory: keep the CPU copies in pinned memory (faster, asynchronous host-to-device copies).
    """

    def __init__(self, device: torch.device | str, offload: bool = True, pin_memory: bool = True):
        self.device = torch.device(device)
        self.offload = offload and self.device.type == "cuda"
        self.pin_memory = pin_memory and self.device.type == "cuda"
        self._cpu_copies: dict[int, dict[str, torch.Tensor]] = {}
        self._metrics: dict[str, float] = defaultdict(float)
        self._stack: list[_Frame] = []

    # ---- phases ---------------------------------------------------------------------------------
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

    def _peak_gib(self) -> float:
        return torch.cuda.max_memory_allocated(self.device) / _GIB if self.device.type == "cuda" else 0.0

    def _reset_peak(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)

    # ---- model placement ------------------------------------------------------------------------
    def offload_model(self, model: nn.Module, name: str) -> None:
        """Make ``model`` swappable: its weights move to (pinned) CPU memory until a phase needs them."""
        if not self.offload:
            return
        copies = {}
        for key, tensor in _tensors(model):  # one tensor at a time: at most one extra copy alive
            cpu = tensor.detach().to("cpu")
            copies[key] = cpu.pin_memory() if self.pin_memory else cpu
            tensor.data = copies[key]
        self._cpu_copies[id(model)] = copies
        self.empty_cache()
        logger.info("%s offloaded to %s CPU memory (%.2f GiB)", name, "pinned" if self.pin_memory else "pageable",
                    _nbytes(copies) / _GIB)

    def place(self, model: nn.Module, name: str, offload: bool, device: torch.device | str | None = None) -> None:
        """Put a frozen model where it lives between uses: offloaded to CPU (swapped onto the compute device
        for its phase), or resident on ``device`` (default: the compute device)."""
        if offload and self.offload:
            self.offload_model(model, name)
        else:
            device = torch.device(device) if device is not None else self.device
            model.to(device)
            logger.info("%s resident on %s", name, device)

    @contextlib.contextmanager
    def resident(self, model: nn.Module, writeback: bool = False) -> Iterator[nn.Module]:
        """Keep ``model`` on the compute device for the block; swap it back to CPU afterwards."""
        copies = self._cpu_copies.get(id(model))
        if copies is None:  # not offloaded: already where it computes
            yield model
            return
        start = time.perf_counter()
        self._point_at(model, {k: v.to(self.device, non_blocking=self.pin_memory) for k, v in copies.items()})
        torch.cuda.synchronize(self.device)
        self._count_swap(start, _nbytes(copies))
        try:
            yield model
        finally:
            start, nbytes = time.perf_counter(), 0
            if writeback:
                for key, tensor in _tensors(model):
                    copies[key].copy_(tensor, non_blocking=True)
                torch.cuda.synchronize(self.device)
                nbytes = _nbytes(copies)
            self._point_at(model, copies)
            self._count_swap(start, nbytes)

    def forget(self) -> None:
        """Drop the pinned CPU copies (the models that used them are being released)."""
        self._cpu_copies.clear()

    def empty_cache(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def is_offloaded(self, model: nn.Module) -> bool:
        return id(model) in self._cpu_copies

    # ---- metrics --------------------------------------------------------------------------------
    def pop_metrics(self) -> dict[str, float]:
        """Metrics accumulated since the last call (seconds add up; memory figures are maxima)."""
        metrics, self._metrics = dict(self._metrics), defaultdict(float)
        return metrics

    def _count_swap(self, start: float, nbytes: int) -> None:
        self._metrics["swap/seconds"] += time.perf_counter() - start
        self._metrics["swap/gib"] += nbytes / _GIB

    @staticmethod
    def _point_at(model: nn.Module, tensors: dict[str, torch.Tensor]) -> None:
        for key, tensor in _tensors(model):
            tensor.data = tensors[key]


@dataclass
class _Frame:
    phase: Phase
    start: float
    child_seconds: float = 0.0
    peak_gib: float = 0.0


def _tensors(model: nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """Parameters and buffers, each shared tensor once (tied embeddings appear once)."""
    seen: set[int] = set()
    for key, tensor in [*model.named_parameters(remove_duplicate=False), *model.named_buffers()]:
        if id(tensor) not in seen:
            seen.add(id(tensor))
            yield key, tensor


def _nbytes(tensors: dict[str, torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors.values())
