"""The one place that moves whole models between CPU and GPU, and empties the CUDA cache.

The frozen models (reference, student) keep one pinned CPU copy of their weights and are swapped onto the
compute device for the pass that uses them and swapped out after it. Swapping out a frozen model copies nothing
back: the GPU tensors are dropped and the parameters point at the pinned copy again. The reference model, which
``sync_ref_model`` updates in place, is swapped out with ``writeback=True``. Each swap's seconds and GiB count
into the phase timer's metrics (``swap/seconds``, ``swap/gib``).

The actor (the teacher being trained) can also step aside while vLLM generates (``actor_aside``): vLLM holds
its own copy of the weights by then, so the actor's weights, gradients and optimizer state wait in pinned CPU
buffers (allocated once, reused every step) and come back before scoring.

Nothing else in rlt_mono calls ``.to(device)`` on a whole model or empties the CUDA cache.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator

import torch
from torch import nn

from rlt_mono.rl.phases import PhaseTimer
from rlt_mono.runs import lock as run_lock

logger = logging.getLogger(__name__)
_GIB = 1024**3


class ModelSwapper:
    """Puts frozen models where they live between uses and swaps offloaded ones onto ``device`` for a pass.

    Args:
        device: where computation happens (``cuda:N`` or ``cpu``; on the CPU nothing is offloaded or moved).
        timer: the phase timer the swap seconds and GiB count into.
        pin_memory: keep the CPU copies in pinned memory (faster, asynchronous host-to-device copies).
    """

    def __init__(self, device: torch.device | str, timer: PhaseTimer, pin_memory: bool):
        self.device = torch.device(device)
        self.timer = timer
        self.offload = self.device.type == "cuda"
        self.pin_memory = pin_memory and self.offload
        self._cpu_copies: dict[int, dict[str, torch.Tensor]] = {}
        self._aside_buffers: dict[tuple[int, str], torch.Tensor] = {}

    def offload_model(self, model: nn.Module, name: str) -> None:
        """Make ``model`` swappable: its weights move to (pinned) CPU memory until a pass needs them."""
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
        for its pass), or resident on ``device`` (default: the compute device)."""
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

    def actor_aside(self, model: nn.Module, optimizer) -> ActorAside:
        """Move the actor's weights, gradients and optimizer state to pinned CPU memory and free their GPU memory;
        ``.restore()`` on what this returns moves them back. Parameters keep their identity (the optimizer's
        state stays keyed by them); only what they point at moves."""
        start = time.perf_counter()
        moved: list[tuple[object, object, torch.Tensor]] = []  # (holder, key, CPU copy)

        def out(holder, key, tensor: torch.Tensor, tag: str) -> torch.Tensor:
            buffer = self._aside_buffers.get((id(holder), tag))
            if buffer is None or buffer.shape != tensor.shape or buffer.dtype != tensor.dtype:
                buffer = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=self.pin_memory)
                self._aside_buffers[(id(holder), tag)] = buffer
            buffer.copy_(tensor, non_blocking=True)
            moved.append((holder, key, buffer))
            return buffer

        for _, param in _tensors(model):
            if param.device.type == "cuda":
                out(param, "data", param.data, "data")
                if param.grad is not None:
                    out(param, "grad", param.grad, "grad")
        states = getattr(optimizer, "state", {}) if optimizer is not None else {}
        for state in states.values():
            for key, value in state.items():
                if isinstance(value, torch.Tensor) and value.device.type == "cuda":
                    out(state, key, value, f"state:{key}")
        torch.cuda.synchronize(self.device)
        for holder, key, cpu in moved:
            if key == "data":
                holder.data = cpu
            elif key == "grad":
                holder.grad = None
            else:
                holder[key] = cpu
        self.empty_cache()
        nbytes = sum(cpu.numel() * cpu.element_size() for _, _, cpu in moved)
        self._count_swap(start, nbytes)
        return ActorAside(self, moved)

    def is_offloaded(self, model: nn.Module) -> bool:
        return id(model) in self._cpu_copies

    def forget(self) -> None:
        """Drop the pinned CPU copies (the models that used them are being released)."""
        self._cpu_copies.clear()

    def empty_cache(self) -> None:
        """Hand the allocator's cached blocks back to the card, unless another process is starting a vLLM engine
        (``run_lock.engine_starting_elsewhere``): then they stay cached, and the next call hands them back."""
        if self.device.type != "cuda":
            return
        if run_lock.engine_starting_elsewhere():
            logger.debug("cached GPU memory kept: another process is starting a vLLM engine")
            return
        torch.cuda.empty_cache()

    def _count_swap(self, start: float, nbytes: int) -> None:
        self.timer.add_metric("swap/seconds", time.perf_counter() - start)
        self.timer.add_metric("swap/gib", nbytes / _GIB)

    @staticmethod
    def _point_at(model: nn.Module, tensors: dict[str, torch.Tensor]) -> None:
        for key, tensor in _tensors(model):
            tensor.data = tensors[key]


class ActorAside:
    """What ``ModelSwapper.actor_aside`` moved; ``restore`` puts it back on the device (once)."""

    def __init__(self, swapper: ModelSwapper, moved: list):
        self._swapper, self._moved = swapper, moved

    def restore(self) -> None:
        if not self._moved:
            return
        start = time.perf_counter()
        device = self._swapper.device
        for holder, key, cpu in self._moved:
            back = cpu.to(device, non_blocking=True)
            if key == "data":
                holder.data = back
            elif key == "grad":
                holder.grad = back
            else:
                holder[key] = back
        torch.cuda.synchronize(device)
        self._swapper._count_swap(start, sum(cpu.numel() * cpu.element_size() for _, _, cpu in self._moved))
        self._moved = []


def _tensors(model: nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """Parameters and buffers, each shared tensor once (tied embeddings appear once)."""
    seen: set[int] = set()
    for key, tensor in [*model.named_parameters(remove_duplicate=False), *model.named_buffers()]:
        if id(tensor) not in seen:
            seen.add(id(tensor))
            yield key, tensor


def _nbytes(tensors: dict[str, torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors.values())
