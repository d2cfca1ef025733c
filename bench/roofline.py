"""The roofline of an RLT step: the least time each phase could take on a device, by the bytes it must move or the
FLOPs it must do, beside the measured time (docs/PERFORMANCE.md).

- generate: ``completion_length`` decode steps; each reads the teacher's weights once and the KV cache of every
  sequence in flight (mean context: the prompt and half the completion), and does ``2 x params`` FLOPs per sequence.
  A step takes the longer of the two: ``max(bytes / bandwidth, flops / peak)``.
- score: ``forwards`` forward passes (``2 x params`` FLOPs per token) over every prompt + completion token: the
  student's pass and the teacher's (or reference's) for the KL term, and one more for the policy's log-probabilities.
- train: ``2 x params`` per token forward, ``4 x params`` backward, and one more forward when activations are
  recomputed (gradient checkpointing): ``8 x`` or ``6 x params`` per token.

The device figures are achievable rates, not data-sheet peaks: for the H100 800 TFLOP/s bf16 and 3 TB/s,
and for the H200 the same compute with the bandwidth scaled by its data sheet (4.8 / 3.35 TB/s).

    python bench/roofline.py --arch 7b --completions 32 --completion-length 4096 --device H100 \\
        [--prompt-length 0] [--no-recompute] [--measured generate=33.7,score=16.2,train=19.8]
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import NoReturn

from rlt_mono.memory.model import QWEN25_ARCHS, Arch

# kind -> (achievable bf16 FLOP/s, achievable memory bandwidth in bytes/s)
DEVICES = {"H100": (800e12, 3.0e12), "H200": (800e12, 3.0e12 * 4.8 / 3.35)}
PHASES = ("generate", "score", "train")


@dataclass(frozen=True)
class Work:
    """One step's work: ``completions`` sequences of ``prompt_length + completion_length`` tokens."""

    arch: Arch
    completions: int
    completion_length: int
    prompt_length: int = 0
    dtype_bytes: int = 2
    score_forwards: int = 3
    recompute: bool = True

    @property
    def tokens(self) -> int:
        return self.completions * (self.prompt_length + self.completion_length)


def roofline(work: Work, flops_per_s: float, bytes_per_s: float) -> dict[str, float]:
    """Seconds per phase at the device's rates (see the module docstring)."""
    params = work.arch.params()
    context = work.prompt_length + work.completion_length / 2
    step_bytes = params * work.dtype_bytes + work.completions * context * work.arch.kv_bytes_per_token(work.dtype_bytes)
    step_flops = 2 * params * work.completions
    decode = work.completion_length * max(step_bytes / bytes_per_s, step_flops / flops_per_s)
    score = work.score_forwards * 2 * params * work.tokens / flops_per_s
    train = (8 if work.recompute else 6) * params * work.tokens / flops_per_s
    return {"generate": decode, "score": score, "train": train}


class OneLineParser(argparse.ArgumentParser):
    """argparse whose refusals are one line on stderr (``<prog>: error: <what>``) and exit code 2, without the usage
    block: the user reads what to fix, ``--help`` gives the usage."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def measured_seconds(text: str) -> dict[str, float]:
    """``--measured``'s ``phase=seconds,...`` as ``{phase: seconds}``; a phase must be one of ``PHASES``."""
    measured = {}
    for item in text.split(","):
        phase, _, seconds = item.partition("=")
        if phase not in PHASES:
            raise argparse.ArgumentTypeError(f"unknown phase {phase!r} in {item!r}; the phases are {', '.join(PHASES)}")
        try:
            measured[phase] = float(seconds)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{item!r}: the seconds must be a number, as in {phase}=19.8") from None
    return measured


def table(bound: dict[str, float], measured: dict[str, float] | None = None) -> str:
    """A markdown table: each phase's roofline, and with ``measured`` its time and the ratio."""
    lines = ["| phase | roofline s | measured s | measured / roofline |", "| --- | --- | --- | --- |"]
    rows = [*PHASES, "step"]
    bound = {**bound, "step": sum(bound.values())}
    if measured:
        measured = {**measured, "step": sum(measured.get(p, 0.0) for p in PHASES)}
    for phase in rows:
        seen = measured.get(phase) if measured else None
        lines.append(f"| {phase} | {bound[phase]:.2f} | {'—' if seen is None else f'{seen:.2f}'} | "
                     f"{'—' if seen is None else f'{seen / bound[phase]:.2f}'} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> str:
    parser = OneLineParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", choices=list(QWEN25_ARCHS), required=True)
    parser.add_argument("--completions", type=int, required=True)
    parser.add_argument("--completion-length", type=int, required=True)
    parser.add_argument("--prompt-length", type=int, default=0)
    parser.add_argument("--device", choices=list(DEVICES), required=True)
    parser.add_argument("--no-recompute", action="store_true", help="training without gradient checkpointing")
    parser.add_argument("--measured", type=measured_seconds, help="phase=seconds,... to set beside the roofline")
    a = parser.parse_args(argv)
    work = Work(Arch.from_config(QWEN25_ARCHS[a.arch]), a.completions, a.completion_length, a.prompt_length,
                recompute=not a.no_recompute)
    return table(roofline(work, *DEVICES[a.device]), a.measured)


if __name__ == "__main__":
    print(main())
