"""Does colocated vLLM give back, each time it sleeps, what it took when it woke? Accounting of its sleep/wake cycles.

vLLM's sleep mode is known to leak device memory over repeated cycles in other projects (one reports ~53 GB): a
run then slows down or stops out of memory hours in, with nothing pointing at vLLM. ``SleepLeakTracker`` records,
per cycle, the device memory this process holds right after vLLM woke (``after_wake``: its weights and KV cache
back) and right after it went back to sleep (``after_sleep``). The cycles right after a warm-up (the first
optimizer step allocates the optimizer state, torch's cache settles) set the baseline, the median of each
reading over them; every later cycle's growth over the baseline is reported, and the first time either reading has
grown by more than the bound one warning is logged.

Pure Python, bytes in and metrics out, so it is tested on CPU with hand-made readings; the trainer feeds it
(``rlt_mono.rl.trainer``: ``trl_vllm.watch_sleep_cycles`` calls it around vLLM's ``wake_up``/``sleep`` with
``device_memory.process_used_reader``'s readings) and logs its ``metrics`` with each step.
"""

from __future__ import annotations

import logging
import statistics
from dataclasses import dataclass

from rlt_mono.memory.model import GIB

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class SleepCycle:
    """One wake -> generate -> sleep cycle: bytes this process holds on the device at each end (or, for a
    growth, the bytes more than the baseline's)."""

    after_wake: int
    after_sleep: int


class SleepLeakTracker:
    """Readings per sleep/wake cycle, their growth over a baseline, and one warning once it exceeds ``warn_bytes``.

    Args:
        warn_bytes: growth of either reading over the baseline (bytes) above which the warning is logged.
        warmup_cycles: the first cycles, left out of the baseline.
        baseline_cycles: the cycles after the warm-up whose median readings are the baseline.
    """

    def __init__(self, warn_bytes: int, warmup_cycles: int = 2, baseline_cycles: int = 3):
        if warn_bytes <= 0:
            raise ValueError(f"warn_bytes must be > 0, got {warn_bytes}")
        if warmup_cycles < 0 or baseline_cycles < 1:
            raise ValueError(f"warmup_cycles must be >= 0 and baseline_cycles >= 1, got {warmup_cycles} and "
                             f"{baseline_cycles}")
        self.warn_bytes, self.warmup_cycles, self.baseline_cycles = warn_bytes, warmup_cycles, baseline_cycles
        self.cycles: list[SleepCycle] = []
        # The cycle (1-based) at which the warning was logged; None while none was.
        self.warned_at: int | None = None
        self._after_wake: int | None = None

    def woke(self, used: int) -> None:
        """vLLM has just woken (weights and KV cache on the device): ``used`` bytes held by this process."""
        self._after_wake = used

    def slept(self, used: int) -> None:
        """vLLM has just gone to sleep: ``used`` bytes held by this process. Closes the cycle the last ``woke``
        opened; a sleep with no wake before it (an engine's first sleep after its start) is no cycle."""
        if self._after_wake is None:
            return
        self.cycles.append(SleepCycle(self._after_wake, used))
        self._after_wake = None
        self._warn_once()

    def baseline(self) -> SleepCycle | None:
        """The median of each reading over the baseline cycles; None until they have all run."""
        end = self.warmup_cycles + self.baseline_cycles
        if len(self.cycles) < end:
            return None
        window = self.cycles[self.warmup_cycles : end]
        return SleepCycle(int(statistics.median(c.after_wake for c in window)),
                          int(statistics.median(c.after_sleep for c in window)))

    def growth(self) -> SleepCycle | None:
        """The latest cycle's readings less the baseline's (bytes; negative where they shrank); None before the
        baseline."""
        baseline = self.baseline()
        if baseline is None:
            return None
        latest = self.cycles[-1]
        return SleepCycle(latest.after_wake - baseline.after_wake, latest.after_sleep - baseline.after_sleep)

    def metrics(self) -> dict[str, float]:
        """The latest cycle's readings (``memory/after_wake_gib``, ``memory/after_sleep_gib``) and, once the
        baseline exists, their growth over it (``memory/after_wake_growth_gib``, ``memory/after_sleep_growth_gib``);
        empty before the first cycle."""
        if not self.cycles:
            return {}
        latest = self.cycles[-1]
        metrics = {"memory/after_wake_gib": latest.after_wake / GIB, "memory/after_sleep_gib": latest.after_sleep / GIB}
        if (growth := self.growth()) is not None:
            metrics["memory/after_wake_growth_gib"] = growth.after_wake / GIB
            metrics["memory/after_sleep_growth_gib"] = growth.after_sleep / GIB
        return metrics

    def _warn_once(self) -> None:
        growth = self.growth()
        if self.warned_at is not None or growth is None or max(growth.after_wake,
                                                               growth.after_sleep) <= self.warn_bytes:
            return
        self.warned_at = len(self.cycles)
        first = self.warmup_cycles + 1
        logger.warning(
            "vLLM sleep/wake: after %d cycles this process holds %.2f GiB more with vLLM asleep (%.2f GiB more awake) "
            "than over cycles %d-%d: vLLM's sleep mode is not giving back all it took, and the run may run out of "
            "memory. Set trainer.vllm_enable_sleep_mode=false (vLLM's pool then stays on the card in every phase) or "
            "a lower trainer.vllm_gpu_memory_utilization; trainer.sleep_leak_warn_gib (%.2f) is this warning's bound",
            self.warned_at, growth.after_sleep / GIB, growth.after_wake / GIB, first,
            first + self.baseline_cycles - 1, self.warn_bytes / GIB)
