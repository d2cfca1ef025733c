"""Placement as data: which device each role of an RLT step lives on, validated before any model loads.

Roles (verl's split placement, brought to one host): ACTOR (the teacher being trained), ROLLOUT (vLLM),
REFERENCE (the GRPO reference) and CRITIC (in RLT the frozen student that scores explanations; an extra
reward model would join it). Modes:

- ``mono``: every role on GPU 0; reference and critic kept in CPU memory between uses (``offload_*``).
- ``split``: actor, rollout and reference on GPU 0; the critic resident on GPU 1, scoring while GPU 0
  computes the reference and teacher log-probs.
- ``auto``: ``split`` when two GPUs are visible, else ``mono``.

With no GPU every role is on the CPU (the embedded demo).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Role(enum.Enum):
    ACTOR = "actor"
    ROLLOUT = "rollout"
    REFERENCE = "reference"
    CRITIC = "critic"


MODES = ("mono", "split", "auto")


class PlacementError(ValueError):
    """The placement asked for cannot be had on this machine; the message says what is missing."""


@dataclass(frozen=True)
class Placement:
    """A resolved placement: ``devices[role]`` is where the role computes (``cuda:N`` or ``cpu``);
    roles in ``offloaded`` live in pinned CPU memory between their uses."""

    mode: str
    devices: dict[Role, str]
    offloaded: frozenset[Role]

    def device(self, role: Role) -> str:
        return self.devices[role]

    def table(self) -> str:
        """The table printed at start-up."""
        lines = [f"placement: {self.mode}", f"  {'role':<10} {'device':<8} between uses"]
        for role in Role:
            where = "CPU (pinned)" if role in self.offloaded else "resident"
            lines.append(f"  {role.value:<10} {self.devices[role]:<8} {where}")
        return "\n".join(lines)


def resolve_placement(
    mode: str, gpu_count: int, *, offload_reference: bool = True, offload_critic: bool = True
) -> Placement:
    """Resolve ``mode`` for ``gpu_count`` visible GPUs.

    Raises:
        PlacementError: unknown mode, or ``split`` with fewer than two GPUs.
    """
    if mode not in MODES:
        raise PlacementError(f"placement.mode must be one of {MODES}, got {mode!r}")
    if mode == "split" and gpu_count < 2:
        raise PlacementError(
            f"placement=split needs 2 visible GPUs (critic on the second), found {gpu_count}; "
            "use placement=mono or placement=auto, or make a second GPU visible (CUDA_VISIBLE_DEVICES=0,1)"
        )
    if gpu_count == 0:
        return Placement("mono", {role: "cpu" for role in Role}, frozenset())
    resolved = "split" if mode == "split" or (mode == "auto" and gpu_count >= 2) else "mono"
    devices = {role: "cuda:0" for role in Role}
    offloaded = {Role.REFERENCE} if offload_reference else set()
    if resolved == "split":
        devices[Role.CRITIC] = "cuda:1"
    elif offload_critic:
        offloaded.add(Role.CRITIC)
    return Placement(resolved, devices, frozenset(offloaded))


def gpus_to_expose(mode: str, gpus_present: int) -> int:
    """How many GPUs a placement mode uses (0 on a machine without GPUs): mono 1, split and auto up to 2."""
    if mode not in MODES:
        raise PlacementError(f"placement.mode must be one of {MODES}, got {mode!r}")
    return min(gpus_present, 1 if mode == "mono" else 2)
