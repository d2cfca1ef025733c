"""``RLTTrainer``: TRL's GRPO trainer with the few hooks RLT needs, each at a TRL override point.

- ``_generate`` / ``_generate_and_score_completions`` / ``training_step`` run inside the phases GENERATE,
  SCORE and TRAIN of the ``PhaseController`` (timings, memory, swaps), whose metrics join TRL's logs.
- ``_get_per_token_logps_and_entropies``: the reference model is swapped onto the GPU for its pass; the
  policy's own no-grad pass over the fresh completions (TRL's ``old_per_token_logps``, temperature-scaled)
  is kept so the teacher reward reuses it instead of running the teacher again.
- ``_calculate_rewards`` hands those log-probs to the reward as the ``teacher_log_probs`` column.
- TRL's reference-sync callback is replaced by one that swaps the offloaded reference in for the mixup; once a
  mixup has happened, checkpoints also hold the reference (``reference_model.safetensors``), restored on resume.
- Checkpoints are verified and atomic (``checkpoints.VerifiedCheckpoints``).
- Split placement: the student half of the reward starts on the critic's GPU right after generation and
  runs while TRL's policy and reference passes run on the actor's GPU (``overlap/*``, ``timeline/*``).
"""

from __future__ import annotations

import gc
import logging
import os
import time
from concurrent.futures import Future, ThreadPoolExecutor

import safetensors.torch
import torch
import trl
from transformers import TrainerCallback
from trl.trainer.callbacks import SyncRefModelCallback

from rlt_mono import checkpoints
from rlt_mono.phases import Phase, PhaseController
from rlt_mono.rewards import TeacherKLReward

logger = logging.getLogger(__name__)

REFERENCE_FILE = "reference_model.safetensors"


class RLTTrainer(checkpoints.VerifiedCheckpoints, trl.GRPOTrainer):
    """GRPO trainer for an RLT teacher (see the module docstring).

    Args:
        phases: owns phase timing and every bulk model move.
        offload_reference: keep TRL's reference model on CPU between its passes.
        reuse_policy_log_probs: pass TRL's policy log-probs to the reward (valid when the reward divides the
            teacher logits by the generation temperature, as TRL does).
        critic_reward: the ``TeacherKLReward`` whose student has its own GPU (split placement): its student pass
            starts on a worker thread as soon as the completions exist.
        Everything else goes to ``trl.GRPOTrainer``.
    """

    def __init__(
        self,
        *args,
        phases: PhaseController,
        offload_reference: bool = True,
        reuse_policy_log_probs: bool = True,
        critic_reward: TeacherKLReward | None = None,
        **kwargs,
    ):
        self.phases = phases
        self.reuse_policy_log_probs = reuse_policy_log_probs
        # Split placement: the student half of the reward, started on the critic's GPU as soon as the
        # completions exist, overlapping TRL's policy and reference passes on the actor's GPU.
        self.critic_reward = critic_reward
        self._critic_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="critic") if critic_reward else None
        self._batch_inputs: list[dict] | None = None
        self._critic_job: Future | None = None
        self._capturing_policy_log_probs = False
        self._policy_log_probs: torch.Tensor | None = None
        super().__init__(*args, **kwargs)
        if self.ref_model is not None:
            phases.place(self.ref_model, "reference", offload=offload_reference)
            self._replace_ref_sync_callback()
        self.add_callback(_OptimizerPhaseCallback(phases))
        self._train_tokens = torch.zeros((), dtype=torch.long, device=self.accelerator.device)
        # TRL 1.16's colocated sync hands vLLM one tensor per load_weights call; replace it where its internals
        # are the ones this was written against (drop when TRL batches the call).
        if (
            self.use_vllm
            and self.args.vllm_mode == "colocate"
            and self.accelerator.num_processes == 1
            and hasattr(self.vllm_generation, "_iter_named_params")
        ):
            self.vllm_generation.sync_weights = self._sync_weights_in_one_call

    # ---- phases -------------------------------------------------------------------------------------
    def training_step(self, model, inputs, num_items_in_batch):
        with self.phases.phase(Phase.TRAIN):
            return super().training_step(model, inputs, num_items_in_batch)

    def _generate_and_score_completions(self, inputs):
        self._capturing_policy_log_probs = self.reuse_policy_log_probs
        self._batch_inputs = inputs
        try:
            with self.phases.phase(Phase.SCORE):
                return super()._generate_and_score_completions(inputs)
        finally:
            self._capturing_policy_log_probs = False
            self._policy_log_probs = None
            self._batch_inputs = None
            self._critic_job = None

    def _generate(self, prompts):
        with self.phases.phase(Phase.GENERATE):
            output = super()._generate(prompts)
        completion_ids = output[1]
        self.phases.add_metric("generate/tokens", sum(len(ids) for ids in completion_ids))
        if self._critic_pool is not None and self._batch_inputs is not None:
            rows = self._batch_inputs
            # Alignment uses the tokenizer, which is not thread-safe: done here; only the forward goes to the worker.
            samples = self.critic_reward.align([r["question"] for r in rows], [r["solution"] for r in rows],
                                               [list(ids) for ids in completion_ids])
            self._critic_job = self._critic_pool.submit(_timed, self.critic_reward.student_pass, samples)
            self._actor_scoring_start = time.perf_counter()
        return output

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        # Counted on the GPU; read once per log, so no micro-step waits for a device-to-host copy.
        self._train_tokens += inputs["prompt_mask"].sum() + inputs["completion_mask"].sum()
        return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)

    def _sync_weights_in_one_call(self) -> None:
        """TRL's colocated weight sync (wake the weights, load the teacher's, reset the prefix cache), with all
        tensors handed to vLLM's ``load_weights`` in one call instead of one call per tensor. Timed."""
        generation = self.vllm_generation
        start = time.perf_counter()
        if generation.enable_sleep_mode:
            self.phases.empty_cache()
            generation.llm.wake_up(tags=["weights"])
            generation._llm_weights_sleeping = False
        vllm_model = generation.llm.llm_engine.model_executor.driver_worker.model_runner.model
        vllm_model.load_weights(generation._iter_named_params())
        generation.llm.reset_prefix_cache()
        torch.cuda.synchronize()
        self.phases.add_metric("generate/weight_sync_seconds", time.perf_counter() - start)

    # ---- log-probs ----------------------------------------------------------------------------------
    def _get_per_token_logps_and_entropies(self, model, *args, **kwargs):
        if self.ref_model is not None and model is self.ref_model:
            with self.phases.resident(self.ref_model):
                return super()._get_per_token_logps_and_entropies(model, *args, **kwargs)
        result = super()._get_per_token_logps_and_entropies(model, *args, **kwargs)
        # The first no-grad policy pass of a generation batch is TRL's old_per_token_logps (computed by TRL 1.16
        # with vLLM importance sampling, or when generation and optimizer steps are misaligned; otherwise the
        # reward runs the teacher itself). rlt_mono never trains PEFT adapters, whose reference pass would also
        # run self.model.
        if (
            self._capturing_policy_log_probs
            and self._policy_log_probs is None
            and model is self.model
            and not torch.is_grad_enabled()
        ):
            self._policy_log_probs = result[0]
        return result

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        if self._policy_log_probs is not None:
            inputs = [
                {**example, "teacher_log_probs": log_probs[: len(ids)].float().cpu()}
                for example, log_probs, ids in zip(inputs, self._policy_log_probs, completion_ids_list, strict=True)
            ]
        if self._critic_job is not None:
            actor_end = time.perf_counter()
            scores, critic_start, critic_end = self._critic_job.result()
            self._record_overlap(self._actor_scoring_start, actor_end, critic_start, critic_end)
            inputs = [{**example, "student_scores": score} for example, score in zip(inputs, scores, strict=True)]
        return super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)

    def _record_overlap(self, actor_start: float, actor_end: float, critic_start: float, critic_end: float) -> None:
        """Timeline of the split SCORE phase, in seconds from the end of generation."""
        overlapped = max(0.0, min(actor_end, critic_end) - max(actor_start, critic_start))
        critic_seconds = critic_end - critic_start
        for name, value in (("actor_logps_end", actor_end), ("critic_start", critic_start),
                            ("critic_end", critic_end)):
            self.phases.add_metric(f"timeline/{name}", value - actor_start)
        self.phases.add_metric("overlap/critic_seconds", critic_seconds)
        self.phases.add_metric("overlap/overlapped_seconds", overlapped)
        self.phases.add_metric("overlap/fraction", overlapped / critic_seconds if critic_seconds > 0 else 0.0)

    def release(self) -> None:
        """Free what this trainer holds (critic thread, vLLM engine, models, optimizer, pinned copies, CUDA
        cache) so the next build in the same process fits. The trainer is unusable afterwards."""
        if self._critic_pool is not None:
            self._critic_pool.shutdown(wait=True)
            self._critic_pool = None
        self.accelerator.free_memory()
        for name in ("model", "model_wrapped", "ref_model", "optimizer", "lr_scheduler", "teacher_reward",
                     "vllm_generation", "critic_reward"):
            if hasattr(self, name):
                setattr(self, name, None)
        self.reward_funcs = []
        for callback in self.callback_handler.callbacks:
            if hasattr(callback, "reward"):  # RunFilesCallback keeps the reward (and so the student) alive
                callback.reward = None
        self.phases.forget()
        gc.collect()
        self.phases.empty_cache()

    # ---- checkpoints: the mixed reference --------------------------------------------------------------
    def _reference_is_mixed(self, step: int) -> bool:
        return self.ref_model is not None and self.args.sync_ref_model and step >= self.args.ref_model_sync_steps

    def save_extra_checkpoint_files(self, folder) -> None:
        """Once a mixup has happened, the mixed reference goes into the checkpoint too (TRL saves none)."""
        if self._reference_is_mixed(self.state.global_step):
            safetensors.torch.save_model(self.ref_model, os.path.join(folder, REFERENCE_FILE))

    def _load_from_checkpoint(self, resume_from_checkpoint, model=None):
        super()._load_from_checkpoint(resume_from_checkpoint, model)
        path = os.path.join(resume_from_checkpoint, REFERENCE_FILE)
        if self.ref_model is not None and os.path.exists(path):
            # Copies into the existing (pinned CPU or GPU) tensors.
            safetensors.torch.load_model(self.ref_model, path, device=str(next(self.ref_model.parameters()).device))
            logger.info("reference model restored from %s", path)
        elif self._reference_is_mixed(checkpoints.saved_step(resume_from_checkpoint)):
            logger.warning("%s has no %s: the reference restarts from the initial weights, not the mixed ones",
                           resume_from_checkpoint, REFERENCE_FILE)

    # ---- logging ------------------------------------------------------------------------------------
    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        if self.model.training:
            if tokens := float(self._train_tokens):  # zero in the end-of-training summary log
                self.phases.add_metric("train/tokens", tokens)
                self._train_tokens.zero_()
            logs.update(with_throughputs(self.phases.pop_metrics(), self._num_parameters, self.phases.device))
            vllm_generation = getattr(self, "vllm_generation", None)
            if vllm_generation is not None:
                logs["vllm/asleep"] = float(bool(getattr(vllm_generation, "_llm_weights_sleeping", False)))
        super().log(logs, start_time)

    @property
    def _num_parameters(self) -> int:
        if not hasattr(self, "_cached_num_parameters"):
            self._cached_num_parameters = sum(p.numel() for p in self.model.parameters())
        return self._cached_num_parameters

    def _replace_ref_sync_callback(self) -> None:
        for callback in list(self.callback_handler.callbacks):
            if isinstance(callback, SyncRefModelCallback):
                self.callback_handler.remove_callback(callback)
                self.add_callback(_ResidentRefSyncCallback(self.phases, self.ref_model, self.accelerator))


class _ResidentRefSyncCallback(SyncRefModelCallback):
    """TRL's reference mixup, with the offloaded reference swapped in (and written back) around it."""

    def __init__(self, phases: PhaseController, ref_model, accelerator):
        super().__init__(ref_model=ref_model, accelerator=accelerator)
        self.phases = phases

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step % args.ref_model_sync_steps != 0:
            return
        with self.phases.resident(self.ref_model, writeback=True):
            super().on_step_end(args, state, control, **kwargs)


class _OptimizerPhaseCallback(TrainerCallback):
    """Counts the optimizer step (outside ``training_step`` in transformers' loop) as TRAIN time."""

    def __init__(self, phases: PhaseController):
        self.phases = phases

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        self.phases.begin(Phase.TRAIN)

    def on_optimizer_step(self, args, state, control, **kwargs):
        self.phases.end()


# Dense bf16 peak FLOP/s (no sparsity) by device name, for MFU.
PEAK_BF16_FLOPS = {"H100": 989.4e12, "H200": 989.4e12, "A100": 312e12, "L40S": 362e12, "A10": 125e12}


def _timed(fn, *args):
    """Run ``fn`` and return ``(result, start, end)`` (perf_counter seconds)."""
    start = time.perf_counter()
    result = fn(*args)
    return result, start, time.perf_counter()


def with_throughputs(metrics: dict[str, float], num_parameters: int, device: torch.device) -> dict[str, float]:
    """Add generation and training tokens/s, and training MFU, to the phase metrics.

    MFU = 6 * N * training tokens / (TRAIN seconds * peak bf16 FLOP/s): the 6N per token of a forward and
    backward pass (attention FLOPs and gradient-checkpointing recomputation not counted), against the dense
    bf16 peak of the GPU in ``PEAK_BF16_FLOPS`` (absent for other devices).
    """
    generate_seconds = metrics.get("phase/generate/seconds", 0.0)
    if generate_seconds > 0 and "generate/tokens" in metrics:
        metrics["perf/generation_tokens_per_s"] = metrics["generate/tokens"] / generate_seconds
    train_seconds = metrics.get("phase/train/seconds", 0.0)
    if train_seconds > 0 and "train/tokens" in metrics:
        metrics["perf/train_tokens_per_s"] = metrics["train/tokens"] / train_seconds
        if device.type == "cuda":
            name = torch.cuda.get_device_name(device)
            peak = next((flops for key, flops in PEAK_BF16_FLOPS.items() if key in name), None)
            if peak is not None:
                metrics["perf/mfu"] = 6 * num_parameters * metrics["train/tokens"] / (train_seconds * peak)
    return metrics
