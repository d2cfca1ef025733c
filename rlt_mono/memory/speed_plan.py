"""What the planner picks for speed: ``memory=speed``'s generation batch, and the lines of the plan log that say what
``memory=auto`` and ``memory=speed`` decided (``decisions``: gradient checkpointing, the generation batch).

``memory=auto`` keeps the generation batch (``per_device_train_batch_size x steps_per_generation``) as configured.
vLLM's generation rate grows with the sequences it decodes at once: a decode step reads the teacher's weights once
for every sequence in flight, and TRL lets vLLM run the whole generation batch at once (its ``max_num_seqs``). So a
step's generation costs least when one generation makes the completions of several optimizer steps. ``memory=speed``
(``rlt_mono.memory.planner.choose(s, speed=True)``) tries the generation batches of ``generation_batches`` largest
first, each with its whole KV cache in vLLM's pool, the trainer beside it or, failing that, moved aside while vLLM
generates; the first that fits is the run's. Then, like ``memory=auto``, the largest micro-batch and
``reward.micro_batch_size`` that fit, without gradient checkpointing when that fits.

What stays as configured: the completions per optimizer step (micro-batch x gradient accumulation), so the prompts
and groups per step, the loss, the learning rate and ``max_steps``. What changes, said in the plan log
(``speed_notes``): one generation now feeds several optimizer steps, and each step after the first trains on
completions the policy of a few steps before sampled. TRL computes the log-probs of every completion when it is
generated (``old_per_token_logps``) and weighs each token by the clipped ratio to them (PPO's clipped objective with
``epsilon``). The caps bound that: ``MAX_STEPS_PER_GENERATION`` optimizer steps per generation,
``MAX_SEQUENCES_IN_FLIGHT`` sequences.
"""

from __future__ import annotations

import dataclasses
import math

from rlt_mono.memory.model import Settings, predict

# The most optimizer steps one generation feeds: the last of them trains on completions this many steps old, less one.
MAX_STEPS_PER_GENERATION = 8
# The most sequences vLLM decodes at once that memory=speed asks for.
MAX_SEQUENCES_IN_FLIGHT = 512


def completions_per_step(s: Settings) -> int:
    """Completions per optimizer step: ``per_device_train_batch_size x gradient_accumulation_steps``."""
    return s.per_device_train_batch_size * s.gradient_accumulation_steps


def generation_batch(s: Settings) -> int:
    """Completions per generation: ``per_device_train_batch_size x steps_per_generation``."""
    return s.per_device_train_batch_size * s.steps_per_generation


def generation_batches(s: Settings) -> list[int]:
    """The generation batches ``memory=speed`` tries, largest first: the multiples of the least common multiple of
    the completions per step and the configured generation batch (so that each generation feeds whole optimizer
    steps and stays a multiple of ``num_generations``, as the configured one is), up to the larger of that
    multiple and ``min(MAX_SEQUENCES_IN_FLIGHT, MAX_STEPS_PER_GENERATION x completions per step)``."""
    unit = math.lcm(completions_per_step(s), generation_batch(s))
    cap = max(unit, min(MAX_SEQUENCES_IN_FLIGHT, MAX_STEPS_PER_GENERATION * completions_per_step(s)))
    return list(range(cap // unit * unit, 0, -unit))


def least_trainer(s: Settings, batch: int, checkpointing: bool) -> Settings:
    """``s`` with the least the trainer needs beside a generation of ``batch`` completions: micro-batch 1 (the
    accumulation and steps per generation that keep the completions per step and per generation), reward micro-batch
    1, gradient checkpointing as given."""
    return dataclasses.replace(s, per_device_train_batch_size=1, gradient_accumulation_steps=completions_per_step(s),
                               steps_per_generation=batch, reward_micro_batch_size=1,
                               gradient_checkpointing=checkpointing)


def speed_notes(before: Settings, after: Settings) -> list[str]:
    """What ``memory=speed`` changed of the algorithm, in plain lines for the plan log."""
    step, generation = completions_per_step(after), generation_batch(after)
    steps = generation // step
    lines = [f"memory=speed: generation batch {generation_batch(before)} -> {generation} sequences in flight; "
             f"{step} completions per optimizer step, as configured"]
    if steps > 1:
        lines.append(f"memory=speed: one generation feeds {steps} optimizer steps, so steps 2 to {steps} of each "
                     "train on completions sampled by the policy 1 to "
                     f"{steps - 1} optimizer steps earlier (off-policy); TRL weighs each token by its clipped ratio "
                     "to the log-prob at generation time (TRL's epsilon)")
    return lines


def checkpointing_reason(s: Settings) -> str:
    """Why ``choose`` turned gradient checkpointing on or off in its choice ``s``, in one line."""
    if not s.gradient_checkpointing:
        return (f"gradient checkpointing off: micro-batch {s.per_device_train_batch_size} trains without recomputing "
                f"activations (TRAIN {predict(s)[0]['TRAIN'].gib:.1f} GiB, the run may use {s.free:.1f})")
    without = least_trainer(s, generation_batch(s), checkpointing=False)
    return (f"gradient checkpointing on: without it TRAIN needs {predict(without)[0]['TRAIN'].gib:.1f} GiB even at "
            f"micro-batch 1, the run may use {s.free:.1f}")


def decisions(before: Settings, chosen: Settings, speed: bool) -> list[str]:
    """The plan log's lines on what ``choose`` decided beyond the table: gradient checkpointing and, with
    ``speed``, what changed of the generation (``speed_notes``)."""
    return [checkpointing_reason(chosen), *(speed_notes(before, chosen) if speed else [])]
