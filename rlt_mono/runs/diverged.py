"""A training run whose update went non-finite stops, loudly, at that step.

transformers keeps training after a step whose gradient norm is NaN or infinite: the optimizer writes the
non-finite update into the weights, every later loss is non-finite too, and its logger shows those losses as 0
(``logging_nan_inf_filter``). Such a run ends "successfully" with a model that writes garbage. ``StopOnNonFinite``
checks each logged step instead and raises ``TrainingDiverged`` before that step's checkpoint is written, naming
the step, the values and what to change; the last checkpoint written before it is whole, and resuming from it is
what ``how_to_continue`` says.
"""

from __future__ import annotations

import math
from pathlib import Path

from transformers import TrainerCallback

from rlt_mono.errors import UserError
from rlt_mono.runs.checkpoints import how_to_continue

# The logged values whose non-finite value means the weights went (or are about to go) non-finite.
WATCHED = ("grad_norm", "loss")


class TrainingDiverged(UserError):
    """A training step's gradient norm or loss was NaN or infinite; the message names the step and the fix."""


class StopOnNonFinite(TrainerCallback):
    """Raise ``TrainingDiverged`` at the first logged step with a non-finite ``grad_norm`` or ``loss``.

    ``hint`` is what to change, for the message (the settings that stage's user controls); ``output_dir`` is the run
    folder, for the resume line. transformers logs before it saves a step's checkpoint, and every step that saves is
    logged (``on_step_end``), so a step's non-finite weights are never saved."""

    def __init__(self, output_dir: str | Path, hint: str):
        self.output_dir, self.hint = Path(output_dir), hint

    def on_step_end(self, args, state, control, **kwargs):
        # A step that saves (a checkpoint, or the last step's final model) is logged too, so that its values are
        # checked before its weights are written, whatever logging_steps is (transformers' flow logs only every
        # logging_steps steps; this callback runs after its flow callback has decided).
        if control.should_save or control.should_training_stop or state.global_step >= state.max_steps:
            control.should_log = True

    def on_log(self, args, state, control, logs=None, **kwargs):
        bad = {key: logs[key] for key in WATCHED if _non_finite((logs or {}).get(key))}
        if not bad:
            return
        values = ", ".join(f"{key} {value}" for key, value in bad.items())
        raise TrainingDiverged(f"step {state.global_step}: {values}: the update made the weights non-finite, so the "
                               f"run stops without a final model; {self.hint}; then "
                               f"{how_to_continue(self.output_dir)}")


def divergence_hint(args_group: str, args, dtype, model_group: str) -> str:
    """What to change when a step of a trainer configured by the ``args_group`` keys (``args``: its
    TrainingArguments) on ``model_group``'s weights (``dtype``) goes non-finite: bfloat16 autocast over float32
    weights first (a 0.5B student SFT under it had NaN gradients from the pretrained weights, float32 throughout did
    not: docs/STUDY.md), else the learning rate."""
    lower = f"lower {args_group}.learning_rate (it is {args.learning_rate:g})"
    if args.bf16 and str(dtype) == "torch.float32":
        return (f"{model_group}.dtype=float32 weights trained under {args_group}.bf16=true (bfloat16 autocast): set "
                f"{args_group}.bf16=false to train in float32 throughout, or {lower}")
    return lower


def _non_finite(value) -> bool:
    return isinstance(value, float) and not math.isfinite(value)
