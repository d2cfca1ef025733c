"""What a GPU offers a run: the card's total memory less what other live processes hold.

The memory planner (``rlt_mono.memory.planner``) plans against this, not against the memory free at one instant. Memory
that a process which has just exited still holds comes back to the device within seconds; counted as taken, it
made ``memory=auto`` refuse runs that fit the card when run by hand. So the rule is:

- **usable = card total - what other live processes hold**, by NVML's list of the processes on the device (pid
  and bytes each). This process's own memory is not subtracted: the plan's terms count it (``CUDA context``).
- Memory in use that no live process holds (a process that has exited, or one in another container or pid
  namespace that NVML names by a pid this process cannot see) is **not** subtracted; the reading waits a few
  seconds for it to come back and warns if it does not.
- A live process whose usage NVML does not report (``usedGpuMemory`` unavailable) may hold all the memory in use
  that nothing else explains: that much is subtracted.
- Without NVML's list (no ``pynvml``, or NVML cannot list this device, e.g. a MIG instance): the memory free once
  it has stopped growing.

``capacity`` is the rule, pure (bytes and pids in, a ``Capacity`` out); ``read_capacity`` reads the device
(``torch.cuda.mem_get_info`` for the card's total and free memory, ``pynvml`` for its processes) and logs one
warning line per thing that holds memory besides this process.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from rlt_mono.memory.model import GIB

logger = logging.getLogger(__name__)

# Memory in use that no live process explains, below which nothing is waited for or warned about: this process's
# CUDA context before NVML lists it, rounding between NVML's and CUDA's counts.
RELEASE_NOISE = GIB
# How long read_capacity waits for memory that looks like it is still being released, and how often it looks.
RELEASE_WAIT_S = 10.0
RELEASE_POLL_S = 1.0


@dataclass(frozen=True)
class ProcessMemory:
    """One process with a context on the device, as NVML lists it."""

    pid: int
    # Bytes it holds on the device; None where NVML does not say (no permission, some containers).
    used: int | None
    # Whether the process still runs, as this process sees it (``os.kill(pid, 0)``).
    alive: bool


@dataclass(frozen=True)
class Capacity:
    """What the card offers a run, in bytes (``capacity``'s rule)."""

    total: int
    # Subtracted from the total: what other live processes hold (without NVML's list: everything not free).
    held_by_others: int
    # The other live processes NVML listed.
    others: tuple[ProcessMemory, ...]
    # Listed processes that have exited, and the memory in use that no live process holds (not subtracted).
    exited: tuple[ProcessMemory, ...]
    unattributed: int
    # Whether NVML listed the device's processes.
    listed: bool

    @property
    def usable(self) -> int:
        return self.total - self.held_by_others

    def releasing(self, before: Capacity | None) -> bool:
        """Whether memory looks like it is still being released, worth another look: memory in use by no live
        process; without NVML's list, memory taken that shrank since ``before`` (or a first look at some)."""
        if self.listed:
            return self.unattributed > RELEASE_NOISE
        shrinking = before is None or before.held_by_others - self.held_by_others > RELEASE_NOISE
        return self.held_by_others > RELEASE_NOISE and shrinking

    def warnings(self, device: str, waited_s: float) -> list[str]:
        """One line for each thing besides this run that holds memory on ``device``: other live processes (what
        the plan subtracts), memory of no live process (not subtracted), or NVML's missing list."""
        lines = []
        if not self.listed:
            lines.append(f"NVML lists no processes on {device}: the plan uses what is free after {waited_s:.0f} s, "
                         f"{gib(self.usable)} of the card's {gib(self.total)} GiB ({gib(self.held_by_others)} GiB "
                         "held by other processes or not yet released)")
            return lines
        if self.others:
            holders = ", ".join(f"pid {p.pid} {'usage unknown' if p.used is None else gib(p.used) + ' GiB'}"
                                for p in self.others)
            lines.append(f"other processes hold {gib(self.held_by_others)} GiB of {device} ({holders}): the plan "
                         f"uses the {gib(self.usable)} GiB left of the card's {gib(self.total)}")
        if self.unattributed > RELEASE_NOISE:
            gone = f"; NVML's pid {', '.join(str(p.pid) for p in self.exited)} not running here" if self.exited else ""
            lines.append(f"{gib(self.unattributed)} GiB of {device} is in use by no live process this one can see "
                         f"(still after {waited_s:.0f} s{gone}): not subtracted from the card's {gib(self.total)} "
                         "GiB; if it is still held when vLLM starts, vLLM refuses to start")
        return lines


def gib(nbytes: int) -> str:
    return f"{nbytes / GIB:.1f}"


def capacity(total: int, free: int, processes: Sequence[ProcessMemory] | None, own_pid: int) -> Capacity:
    """The card's ``total`` less what other live processes hold (the module docstring's rule), from the device's
    ``total`` and ``free`` bytes and NVML's ``processes`` (None: NVML could not list them)."""
    in_use = total - free
    if processes is None:
        return Capacity(total, in_use, (), (), 0, listed=False)
    others = tuple(p for p in processes if p.alive and p.pid != own_pid)
    exited = tuple(p for p in processes if not p.alive and p.pid != own_pid)
    known = sum(p.used or 0 for p in others)
    own = sum(p.used or 0 for p in processes if p.pid == own_pid)
    unexplained = max(0, in_use - own - known)
    if any(p.used is None for p in others):  # a live process of unknown size may hold what nothing else explains
        return Capacity(total, min(total, known + unexplained), others, exited, 0, listed=True)
    return Capacity(total, min(total, known), others, exited, unexplained, listed=True)


def read_capacity(device) -> Capacity:
    """``capacity`` of CUDA ``device`` (a ``torch.device``): looked at again every ``RELEASE_POLL_S`` for up to
    ``RELEASE_WAIT_S`` while memory looks like it is still being released; each ``Capacity.warnings`` line is
    logged."""
    import torch

    free, total = torch.cuda.mem_get_info(device)
    found = capacity(total, free, _processes(device), os.getpid())
    before, waited = None, 0.0
    while found.releasing(before) and waited < RELEASE_WAIT_S:
        time.sleep(RELEASE_POLL_S)
        waited += RELEASE_POLL_S
        free, total = torch.cuda.mem_get_info(device)
        before, found = found, capacity(total, free, _processes(device), os.getpid())
    for line in found.warnings(str(device), waited):
        logger.warning("GPU memory: %s", line)
    return found


def process_used_reader(device) -> Callable[[], int]:
    """A reading of the bytes this process holds on CUDA ``device`` as the device counts them (torch's own counters
    do not show what vLLM's sleep mode maps and unmaps): NVML's figure for this process where NVML lists it with its
    usage, which other processes on the card leave unchanged; otherwise (no NVML list, or this process not in it:
    another pid namespace) the memory in use on the whole device, ``total - free``. The source is chosen at this
    call; a later reading that NVML cannot give falls back to the whole device's."""
    import torch

    own = os.getpid()

    def device_used() -> int:
        free, total = torch.cuda.mem_get_info(device)
        return total - free

    def listed_used() -> int | None:
        return next((p.used for p in _processes(device) or () if p.pid == own and p.used is not None), None)

    if listed_used() is None:
        logger.info("GPU memory: NVML gives no usage of this process on %s: its readings are the memory in use on "
                    "the whole device, other processes' included", device)
        return device_used

    def process_used() -> int:
        used = listed_used()
        return device_used() if used is None else used

    return process_used


def _processes(device) -> list[ProcessMemory] | None:
    """The processes NVML lists on ``device`` (found by its UUID, so ``CUDA_VISIBLE_DEVICES`` needs no mapping),
    or None, logged, where NVML cannot list them."""
    import torch

    try:
        import pynvml  # nvidia-ml-py, a dependency of vLLM
    except ImportError as err:
        logger.info("GPU memory: no pynvml (%s): the processes on %s are not listed", err, device)
        return None
    uuid = str(torch.cuda.get_device_properties(device).uuid)
    try:
        pynvml.nvmlInit()
        try:
            handle = pynvml.nvmlDeviceGetHandleByUUID(uuid if uuid.startswith(("GPU-", "MIG-")) else f"GPU-{uuid}")
            listed = pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
        finally:
            pynvml.nvmlShutdown()
    except pynvml.NVMLError as err:
        logger.info("GPU memory: NVML cannot list the processes on %s (%s)", device, err)
        return None
    return [ProcessMemory(p.pid, p.usedGpuMemory, _alive(p.pid)) for p in listed]


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs, as this process sees it (a pid of another pid namespace looks exited)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # it runs, as another user
        return True
    return True
