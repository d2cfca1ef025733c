"""``RLTConfig``: TRL's ``GRPOConfig`` plus RLT's few fields, with the checks a user's values get before any
model loads (kept apart from ``rlt_mono.config`` so composing a config does not import TRL)."""

from __future__ import annotations

from dataclasses import dataclass, field

import trl
from transformers.utils import is_liger_kernel_available

from rlt_mono.config import config_group


@config_group("trainer")
@dataclass
class RLTConfig(trl.GRPOConfig):
    """``trl.GRPOConfig`` with the fields RLT adds; every GRPO setting keeps TRL's name and meaning.

    The RLT run's GRPO settings map onto TRL as: ``loss_type="grpo"``, ``scale_rewards="group"``, ``beta=0.04``,
    ``temperature=0.7``, ``sync_ref_model=True`` with ``ref_model_mixup_alpha=0.9`` every
    ``ref_model_sync_steps``, and generate-once-train-many through ``steps_per_generation`` (docs/METHOD.md).
    """

    explanation_samples_per_step: int = field(
        default=4,
        metadata={"help": "Teacher explanations (with their reward breakdown) appended to samples.jsonl per step."},
    )
    plot_metrics: bool = field(
        default=True,
        metadata={"help": "Write reward_components.png (reward components and phase timings over steps)."},
    )
    eval_questions: int = field(
        default=32,
        metadata={
            "help": "Held-out questions (the data's eval split, first N) whose mean reward TRL's evaluation measures "
            "every eval_steps when eval_strategy is 'steps' (the held-out learning curve: eval_reward in "
            "metrics.jsonl). 0: all of them."
        },
    )
    activation_offloading: bool = field(
        default=False,
        metadata={
            "help": "Move the activations the training forward saves for its backward to pinned CPU memory (TRL's "
            "get_act_offloading_ctx_manager, as SFTConfig.activation_offloading does): less GPU memory in TRAIN, "
            "for the time of the copies. GPU only."
        },
    )
    offload_actor_in_generation: bool = field(
        default=False,
        metadata={
            "help": "While vLLM generates (it holds its own copy of the weights by then), move the teacher's "
            "weights, gradients and optimizer state to pinned CPU memory and back before scoring: vLLM's KV cache "
            "gets their GPU memory, for two copies a step. Needs vLLM colocated with the one-call weight sync."
        },
    )
    max_minutes: float = field(
        default=0.0,
        metadata={
            "help": "Stop training once this many minutes have passed since this process's first step, at the end "
            "of an optimizer step, and save final/ as at max_steps (for a GPU held for a fixed time); the step "
            "reached is logged. A resumed run counts its own minutes. 0: no limit, max_steps alone ends the run."
        },
    )
    dynamic_sampling_rounds: int = field(
        default=0,
        metadata={
            "help": "DAPO-style dynamic sampling (rlt_mono.rl.dynamic_sampling): after a generation batch is scored, "
            "its groups whose rewards all tie (zero advantages) are replaced by untied groups of fresh prompts, in at "
            "most this many extra generations per batch. 0: off (tied groups are still counted, groups/tied_frac). "
            "One rank only."
        },
    )
    sleep_leak_warn_gib: float = field(
        default=1.0,
        metadata={
            "help": "With vLLM colocated and asleep between generations on a GPU: one warning once the device memory "
            "this process holds right after vLLM sleeps (or wakes) has grown by more than this many GiB over the "
            "cycles after the warm-up, i.e. vLLM's sleep mode is not giving back what it took "
            "(rlt_mono.rl.sleep_leak; the readings are logged as memory/after_sleep_gib, memory/after_wake_gib)."
        },
    )
    left_align_padding: bool = field(
        default=True,
        metadata={
            "help": "Run the teacher's, the reference's and the student's padded passes without an attention mask, "
            "each row left-aligned (rlt_mono.rl.left_align): PyTorch's attention then takes its flash kernel instead "
            "of the memory-efficient one. The same log-probs, to float rounding, for models with rotary positions "
            "(others are left as they are)."
        },
    )
    vllm_detokenize: bool = field(
        default=False,
        metadata={
            "help": "Let vLLM detokenize completions. TRL reads only their token ids, so rlt_mono turns it off "
            "(vLLM's SamplingParams.detokenize); stop strings in generation_kwargs need it on."
        },
    )

    def __post_init__(self) -> None:
        self._check_ranges()
        super().__post_init__()
        if self.use_vllm:
            self.generation_kwargs = {"detokenize": self.vllm_detokenize, **(self.generation_kwargs or {})}
            if self.generation_kwargs.get("stop") and not self.generation_kwargs["detokenize"]:
                raise ValueError(
                    "generation_kwargs.stop holds stop strings, which vLLM matches on detokenized text: set "
                    "trainer.vllm_detokenize=true (or stop on token ids with generation_kwargs.stop_token_ids)"
                )

    def _check_ranges(self) -> None:
        """Values TRL or transformers accept but that make a silently wrong run (e.g. ``max_steps=-1`` falls
        back to epochs: 1,500 steps of the embedded set; ``beta<0`` rewards drifting from the reference)."""
        numeric = ("max_steps", "per_device_train_batch_size", "gradient_accumulation_steps", "max_completion_length",
                   "logging_steps", "save_steps", "ref_model_sync_steps", "num_generations", "steps_per_generation",
                   "beta", "learning_rate", "explanation_samples_per_step", "temperature", "ref_model_mixup_alpha",
                   "eval_questions", "dynamic_sampling_rounds", "sleep_leak_warn_gib", "max_minutes")
        for name in numeric:
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
                raise ValueError(f"{name} must be a number, got {value!r}")
        positive = ("max_steps", "per_device_train_batch_size", "gradient_accumulation_steps",
                    "max_completion_length", "logging_steps", "save_steps", "ref_model_sync_steps",
                    "sleep_leak_warn_gib")
        for name in positive:
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ValueError(f"{name} must be > 0, got {value}")
        if self.num_generations is not None and self.num_generations < 2:
            raise ValueError(f"num_generations must be >= 2 (GRPO compares completions of one prompt), "
                             f"got {self.num_generations}")
        if self.steps_per_generation is not None and self.steps_per_generation < 1:
            raise ValueError(f"steps_per_generation must be >= 1 or null, got {self.steps_per_generation}")
        for name in ("beta", "learning_rate", "explanation_samples_per_step", "eval_questions",
                     "dynamic_sampling_rounds", "max_minutes"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.temperature <= 0:
            raise ValueError(f"temperature must be > 0, got {self.temperature}")
        for name in ("plot_metrics", "vllm_detokenize", "activation_offloading", "offload_actor_in_generation",
                     "left_align_padding", "use_liger_kernel"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be true or false, got {getattr(self, name)!r}")
        if self.use_liger_kernel:
            self._check_liger()
        if self.activation_offloading and self.use_cpu:
            raise ValueError("activation_offloading moves activations from a GPU to the CPU: it needs a GPU run")
        if not 0.0 <= self.ref_model_mixup_alpha <= 1.0:
            raise ValueError(f"ref_model_mixup_alpha must be in [0, 1], got {self.ref_model_mixup_alpha}")

    def _check_liger(self) -> None:
        """``use_liger_kernel`` needs liger-kernel, whose kernels are Triton GPU kernels, and its layer kernels only:
        TRL's fused log-prob head replaces the LM head's output, which liger's fused linear cross-entropy would
        bypass (TRL refuses it too, when the trainer starts, and turns it off otherwise)."""
        if self.use_cpu:
            raise ValueError("use_liger_kernel runs liger-kernel's Triton kernels, which need a GPU: set "
                             "use_liger_kernel=false for a CPU run")
        if not is_liger_kernel_available():
            raise ValueError("use_liger_kernel=true needs the liger-kernel package: pip install -e '.[gpu]' (or "
                             "pip install liger-kernel), or set use_liger_kernel=false")
        if (self.liger_kernel_config or {}).get("fused_linear_cross_entropy"):
            raise ValueError("liger_kernel_config.fused_linear_cross_entropy=true replaces the model's forward, "
                             "which TRL's fused log-prob head needs: leave it out (TRL turns it off)")
