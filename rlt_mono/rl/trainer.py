"""``RLTTrainer``: TRL's GRPO trainer with the few hooks RLT needs, each at a TRL override point.

Every private name of TRL or vLLM these hooks rely on is touched through ``rlt_mono.rl.trl_vllm``, checked when the
trainer starts (missing required ones raise; missing optional ones warn with their cost).

- ``_generate`` / ``_generate_and_score_completions`` / ``training_step`` run inside the phases GENERATE,
  SCORE and TRAIN of the ``PhaseTimer`` (timings, memory), whose metrics join TRL's logs.
- ``_get_per_token_logps_and_entropies``: the reference model is swapped onto the GPU (``ModelSwapper``) for
  its pass; the policy's own no-grad pass over the fresh completions (TRL's ``old_per_token_logps``,
  temperature-scaled) is kept so the teacher reward reuses it instead of running the teacher again.
- ``_calculate_rewards`` hands those log-probs to the reward as the ``teacher_log_probs`` column, and counts
  whether it did (``score/teacher_log_probs_reused``) and how often the reward ran the teacher itself
  (``score/reward_teacher_passes``).
- TRL's reference-sync callback is wrapped so that the offloaded reference is swapped in for the mixup; once a
  mixup has happened, checkpoints also hold the reference (``reference/model.safetensors``: in a folder of its own,
  since vLLM loads every ``*.safetensors`` beside a single-file model), restored on resume.
- Checkpoints are verified and atomic (``checkpoints.VerifiedCheckpoints``).
- A LoRA or QLoRA teacher (``peft_config``, ``rlt_mono.rl.lora``): vLLM gets the merged weights at each sync, in
  the teacher's dtype; the reference is the teacher with its adapters disabled (TRL's), not a copy.
- Data parallel (``placement=dp``): each step's log also has the slowest and fastest rank's seconds per phase
  (``dp/*``); the other phase metrics are rank 0's.
- Every role is where the ``Placement`` puts it. When the student has a GPU of its own (placement=student_gpu), the
  student half of the reward starts there right after generation and runs while TRL's policy and reference
  passes run on the actor's GPU (``overlap/*``, ``timeline/*``).
- vLLM colocated and asleep between generations (GPU): the device memory this process holds right after each
  wake-up and each sleep joins each step's log (``memory/after_wake_gib``, ``memory/after_sleep_gib``), and a growth
  over the first cycles beyond ``sleep_leak_warn_gib`` warns once (``rlt_mono.rl.sleep_leak``).
- ``use_liger_kernel`` (transformers' and TRL's option: liger-kernel's fused RMSNorm, SwiGLU and rotary kernels,
  TRL keeping its own fused log-prob head): transformers patches the policy when training starts; the reference and
  the student get the same kernels here.
"""

from __future__ import annotations

import contextlib
import copy
import gc
import logging
import os
import time
from concurrent.futures import Future, ThreadPoolExecutor

import safetensors.torch
import torch
import trl
from accelerate.utils import broadcast
from transformers import TrainerCallback
from transformers.integrations.liger import apply_liger_kernel
from trl.models import get_act_offloading_ctx_manager

from rlt_mono.config import ConfigError
from rlt_mono.memory import device as device_memory
from rlt_mono.memory.model import GIB
from rlt_mono.placement import Placement, Role
from rlt_mono.rewards import TeacherKLReward
from rlt_mono.rl import dynamic_sampling, left_align, lora, trl_vllm
from rlt_mono.rl.one_step_off import OneStepOff, ReadAhead
from rlt_mono.rl.phases import Phase, PhaseTimer, with_throughputs
from rlt_mono.rl.sleep_leak import SleepLeakTracker
from rlt_mono.rl.swapper import ModelSwapper
from rlt_mono.rl.vllm_server import VLLMServer
from rlt_mono.runs import checkpoints
from rlt_mono.runs import lock as run_lock

logger = logging.getLogger(__name__)

REFERENCE_FILE = "reference/model.safetensors"
LEGACY_REFERENCE_FILE = "reference_model.safetensors"  # beside the teacher's weights, as checkpoints kept it before


class RLTTrainer(checkpoints.VerifiedCheckpoints, trl.GRPOTrainer):
    """GRPO trainer for an RLT teacher (see the module docstring).

    Args:
        teacher_reward: the reward TRL optimises (its only reward function).
        placement: where each role lives; the reference is placed by it, and a student with a GPU of its own
            scores on a worker thread as soon as the completions exist.
        timer: phase timing and the per-step metrics.
        swapper: every bulk model move.
        reuse_policy_log_probs: pass TRL's policy log-probs to the reward (valid when the reward divides the
            teacher logits by the generation temperature, as TRL does).
        Everything else goes to ``trl.GRPOTrainer``.
    """

    def __init__(
        self,
        *args,
        teacher_reward: TeacherKLReward,
        placement: Placement,
        timer: PhaseTimer,
        swapper: ModelSwapper,
        reuse_policy_log_probs: bool = True,
        rollout_server: VLLMServer | None = None,
        **kwargs,
    ):
        trl_vllm.check_required()
        self.timer, self.swapper = timer, swapper
        self._last_rewards: torch.Tensor | None = None
        self.teacher_reward = teacher_reward
        # The reward's model_context is where it runs the teacher itself: count those passes.
        teacher_reward.model_context = self._counting_teacher_passes(teacher_reward.model_context)
        overlap = placement.beside_actor(Role.STUDENT)
        self._student_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="student") if overlap else None
        self._batch_inputs: list[dict] | None = None
        self._student_job: Future | None = None
        self._capturing_policy_log_probs = False
        self._policy_log_probs: torch.Tensor | None = None
        self._warned_no_policy_log_probs = False
        quantized = getattr(kwargs.get("model"), "is_loaded_in_4bit", False)
        # TRL starts its colocated vLLM engine in its __init__: one engine start at a time on this machine. Not
        # with several ranks, whose engines start together (collectives across ranks: the lock would deadlock).
        one_rank = int(os.environ.get("WORLD_SIZE", "1")) == 1
        # placement=async: the rollout server on GPU 1 answers before TRL's server mode connects to it (and goes
        # down with a trainer that fails to start).
        self.rollout_server = rollout_server
        self.one_step_off: OneStepOff | None = None
        self.read_ahead = ReadAhead()
        self._next_generation_batch = None
        try:
            if rollout_server is not None:
                with run_lock.engine_start("rollout server"):
                    rollout_server.start()
            with (trl_vllm.vllm_unquantized() if quantized else contextlib.nullcontext()), \
                    (run_lock.engine_start() if one_rank and rollout_server is None else contextlib.nullcontext()):
                super().__init__(*args, reward_funcs=[teacher_reward], **kwargs)
        except BaseException:
            if rollout_server is not None:
                rollout_server.stop()
            raise
        if rollout_server is not None:
            self.one_step_off = OneStepOff(self._rollout, self._push_weights, alive=rollout_server.check_alive)
        self.trl_surface = trl_vllm.inspect_surface(self, reuse_policy_log_probs)
        if self.args.dynamic_sampling_rounds and self.accelerator.num_processes > 1:
            raise ConfigError(f"trainer.dynamic_sampling_rounds={self.args.dynamic_sampling_rounds} needs one rank (a "
                              "GRPO group may span ranks): set it to 0 under placement=dp/split")
        if self.is_fsdp_enabled:  # the reward's teacher passes gather the sharded teacher: every rank runs as many
            teacher_reward.sharded_teacher = self._largest_over_ranks
        if quantized and self.use_vllm and not self.trl_surface.one_call_sync:
            raise trl_vllm.TRLSurfaceError("a 4-bit (QLoRA) teacher gives vLLM its merged weights through the one-call "
                                           "weight sync, unavailable here (see the warning above)")
        if self.args.left_align_padding:
            for model in (self.model, self.ref_model, teacher_reward.student_model):
                if model is not None:
                    left_align.install(model.get_decoder())
        if self.args.use_liger_kernel:
            # transformers patches the policy when training starts; the reference and the student run forward
            # passes too (TRL's reference pass, the reward's student pass): the same kernels for them.
            for model in (self.ref_model, teacher_reward.student_model):
                if model is not None:
                    apply_liger_kernel(model, self.args.liger_kernel_config)
        if self.ref_model is not None:
            # FSDP (placement.strategy=fsdp2) shards TRL's reference like the teacher: its 1/N stays on the GPU.
            swapper.place(self.ref_model, "reference", offload=placement.offloads(Role.REFERENCE)
                          and not self.is_fsdp_enabled, device=placement.device(Role.REFERENCE))
            trl_vllm.wrap_reference_sync(self, swapper)
        self.add_callback(_OptimizerPhaseCallback(timer))
        self.time_limit = None
        if self.args.max_minutes:
            self.time_limit = TimeLimit(self.args.max_minutes, agree=self._rank_zero_decides)
            self.add_callback(self.time_limit)
        # TRL's activation offloading, entered around each training step as TRL's SFTTrainer does; the no-grad
        # generation and scoring inside a step save nothing, so only the training forward's activations move.
        self._activation_offload = (get_act_offloading_ctx_manager(self.model) if self.args.activation_offloading
                                    else contextlib.nullcontext())
        self._train_tokens = torch.zeros((), dtype=torch.long, device=self.accelerator.device)
        self._actor_aside = None
        aside = self.args.offload_actor_in_generation
        if aside and not self.trl_surface.one_call_sync:
            logger.warning("trainer.offload_actor_in_generation needs vLLM colocated with the one-call weight sync, "
                           "which this run does not use: it is off")
        if aside and quantized:
            logger.warning("trainer.offload_actor_in_generation is off for a 4-bit teacher: moving it aside freed no "
                           "GPU memory when measured (docs/PERFORMANCE.md, LoRA and QLoRA)")
            aside = False

        def record_sync(seconds: float) -> None:
            timer.add_metric("generate/weight_sync_seconds", seconds)

        if self.trl_surface.one_call_sync:
            trl_vllm.install_one_call_sync(
                self.vllm_generation, swapper.empty_cache, record_sync,
                after_sync=self._step_actor_aside if aside else None,
                named_params=(lambda: lora.merged_named_params(self.model)) if lora.is_peft(self.model) else None)
        elif self.use_vllm and self.args.vllm_mode == "colocate":
            trl_vllm.time_weight_sync(self.vllm_generation, record_sync)
        # vLLM's sleep/wake cycles, watched for a leak (None: no sleeping colocated engine on a GPU).
        self.sleep_cycles = self._watch_vllm_sleep()
        if self.use_vllm and self.args.vllm_mode == "colocate":
            def record_prefix_cache(prompt_tokens: int, cached_tokens: int) -> None:
                timer.add_metric("generate/prompt_tokens", prompt_tokens)
                timer.add_metric("generate/prefix_cached_tokens", cached_tokens)

            trl_vllm.watch_prefix_cache(self.vllm_generation.llm, record_prefix_cache)

    # ---- phases -------------------------------------------------------------------------------------
    def training_step(self, model, inputs, num_items_in_batch):
        with self.timer.phase(Phase.TRAIN), self._activation_offload:
            return super().training_step(model, inputs, num_items_in_batch)

    def _generate_and_score_completions(self, inputs):
        scored = self._generate_and_score_once(inputs)
        if not self.model.training:
            return scored
        group_size, step = self.num_generations, self.state.global_step
        if self.accelerator.num_processes > 1:  # a group may span ranks: count tied groups only (rewards are global)
            tied = dynamic_sampling.tied_groups(self._last_rewards, group_size)
            self._metrics["train"]["groups/tied_frac"].append(tied.float().mean().item())
            return scored

        def score(rows: list[int]):
            extra = [self.train_dataset[row] for row in rows for _ in range(group_size)]
            return self._generate_and_score_once(extra), self._last_rewards

        def draw(count: int, round_: int) -> list[int]:
            return dynamic_sampling.fresh_prompts(len(self.train_dataset), count, self.args.seed, step, round_)

        scored, stats = dynamic_sampling.refill_tied_groups(
            scored, self._last_rewards, group_size, self.args.dynamic_sampling_rounds, score, draw,
            self.processing_class.pad_token_id)
        for name, value in stats.metrics.items():
            self._metrics["train"][name].append(value)
        return scored

    def _generate_and_score_once(self, inputs):
        """TRL's generation and scoring of one batch of prompts, inside the SCORE phase (GENERATE nests in it)."""
        self._capturing_policy_log_probs = self.trl_surface.reuses_policy_log_probs
        self._batch_inputs = inputs
        try:
            with self.timer.phase(Phase.SCORE):
                return super()._generate_and_score_completions(inputs)
        finally:
            self._capturing_policy_log_probs = False
            self._policy_log_probs = None
            self._batch_inputs = None
            self._student_job = None

    def _generate(self, prompts):
        with self.timer.phase(Phase.GENERATE):
            try:
                output = super()._generate(prompts)
            finally:
                if self._actor_aside is not None:  # offload_actor_in_generation: back before scoring
                    self._actor_aside.restore()
                    self._actor_aside = None
        completion_ids = trl_vllm.completion_ids(output)
        self.timer.add_metric("generate/tokens", sum(len(ids) for ids in completion_ids))
        if self._student_pool is not None and self._batch_inputs is not None:
            rows = self._batch_inputs
            # Alignment uses the tokenizer, which is not thread-safe: done here; only the forward goes to the worker.
            samples = self.teacher_reward.align([r["question"] for r in rows], [r["solution"] for r in rows],
                                                [list(ids) for ids in completion_ids])
            self._student_job = self._student_pool.submit(_timed, self.teacher_reward.student_pass, samples)
            self._actor_scoring_start = time.perf_counter()
        return output

    # ---- one-step-off rollout (placement=async) ------------------------------------------------------------
    def get_batch_samples(self, epoch_iterator, num_batches, device):
        """transformers' read of an optimizer step's micro-batches; under placement=async the next step's are read
        now too (``ReadAhead``), so its prompts can be generated while this step trains."""
        if self.one_step_off is None:
            return super().get_batch_samples(epoch_iterator, num_batches, device)
        batches, self._next_generation_batch = self.read_ahead.take(
            epoch_iterator, num_batches, lambda iterator, n: super(RLTTrainer, self).get_batch_samples(
                iterator, n, device)[0])
        return batches, None  # GRPO's batches hold no labels: transformers counts no items in them

    def _generate_single_turn(self, prompt_ids, images, multimodal_fields, num_generations, *args, **kwargs):
        """Under placement=async, training steps take the completions the server generated one step earlier
        (``OneStepOff``) and start the next step's; an evaluation first waits for what is in flight, then
        generates as TRL does (nothing in flight while the weights move)."""
        if self.one_step_off is None:
            return super()._generate_single_turn(prompt_ids, images, multimodal_fields, num_generations, *args,
                                                 **kwargs)
        if not self.model.training:
            self.one_step_off.drain()
            return super()._generate_single_turn(prompt_ids, images, multimodal_fields, num_generations, *args,
                                                 **kwargs)
        result, metrics = self.one_step_off.step([list(ids) for ids in prompt_ids], self.state.global_step,
                                                 self._next_prompt_ids())
        for name, value in metrics.items():
            self.timer.add_metric(name, value)
        return result

    def _next_prompt_ids(self) -> list[list[int]] | None:
        """The next step's prompt ids (one per completion, as TRL hands a step's), from the batch read ahead; None
        at an epoch's end."""
        batch = self._next_generation_batch
        if batch is None:
            return None
        prompt_ids, _, _ = self._tokenize_prompts(copy.deepcopy([row["prompt"] for row in batch]))
        return [list(ids) for ids in prompt_ids]

    def _rollout(self, prompt_ids: list[list[int]]):
        """One generation on the rollout server: completion ids and the sampled tokens' log-probs (the top-1 of
        each position, as TRL keeps them). ``prompt_ids`` holds each prompt once per completion, as TRL hands a
        step's; the server gets each once with ``n`` completions and TRL's sampling settings. The client is called
        as TRL's server-mode ``generate`` calls it, but not through that method: its gather and broadcast are
        collectives, which on this worker thread would run beside the training thread's own on the same process
        group (placement=async is one process: there is nothing to gather) and queue behind its kernels."""
        self.rollout_server.check_alive()
        generation, n = self.vllm_generation, self.num_generations
        output = generation.vllm_client.generate(
            prompts=prompt_ids[::n], n=n, repetition_penalty=generation.repetition_penalty,
            temperature=generation.temperature, top_p=generation.top_p, top_k=generation.top_k,
            min_p=0.0 if generation.min_p is None else generation.min_p,
            max_tokens=generation.max_completion_length, logprobs=generation.logprobs,
            structured_outputs_regex=generation.structured_outputs_regex,
            generation_kwargs=generation.generation_kwargs)
        return output["completion_ids"], [[lp[0] for lp in seq] for seq in output["logprobs"]]

    def _push_weights(self) -> None:
        """The trainer's weights to the rollout server (TRL's NCCL weight sync), recorded as TRL records its own."""
        if self._last_loaded_step == self.state.global_step:  # an evaluation at this step pushed these weights
            return
        start = time.perf_counter()
        self.vllm_generation.sync_weights()
        self._last_loaded_step = self.state.global_step
        self.timer.add_metric("async/push_seconds", time.perf_counter() - start)

    def _watch_vllm_sleep(self) -> SleepLeakTracker | None:
        """Colocated vLLM asleep between generations on a GPU: a tracker of the device memory this process holds
        right after each wake-up and each sleep (``rlt_mono.rl.sleep_leak``: a leak warns once, the readings join each
        step's log). None otherwise."""
        if not (self.use_vllm and self.args.vllm_mode == "colocate" and self.args.vllm_enable_sleep_mode
                and self.accelerator.device.type == "cuda"):
            return None
        tracker = SleepLeakTracker(warn_bytes=int(self.args.sleep_leak_warn_gib * GIB))
        read = device_memory.process_used_reader(self.accelerator.device)
        trl_vllm.watch_sleep_cycles(self.vllm_generation.llm, lambda: tracker.woke(read()),
                                    lambda: tracker.slept(read()))
        return tracker

    def _step_actor_aside(self) -> None:
        """After the weight sync: vLLM has the weights, so the actor and its optimizer state wait on the CPU."""
        optimizer = getattr(self.optimizer, "optimizer", self.optimizer)  # accelerate's wrapper, or none yet
        self._actor_aside = self.swapper.actor_aside(self.model, optimizer)

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        # Counted on the GPU; read once per log, so no micro-step waits for a device-to-host copy.
        self._train_tokens += inputs["prompt_mask"].sum() + inputs["completion_mask"].sum()
        return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)

    # ---- log-probs ----------------------------------------------------------------------------------
    def _get_per_token_logps_and_entropies(self, model, *args, **kwargs):
        if self.ref_model is not None and model is self.ref_model:
            with self.swapper.resident(self.ref_model):
                return super()._get_per_token_logps_and_entropies(model, *args, **kwargs)
        result = super()._get_per_token_logps_and_entropies(model, *args, **kwargs)
        if (
            self._capturing_policy_log_probs
            and self._policy_log_probs is None
            and trl_vllm.is_policy_no_grad_pass(self, model)
        ):
            self._policy_log_probs = trl_vllm.log_probs_of(result)
        return result

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        if self._policy_log_probs is not None:
            inputs = [
                {**example, "teacher_log_probs": log_probs[: len(ids)].float().cpu()}
                for example, log_probs, ids in zip(inputs, self._policy_log_probs, completion_ids_list, strict=True)
            ]
            self.timer.add_metric("score/teacher_log_probs_reused", 1)
        elif self.trl_surface.expects_policy_log_probs and not self._warned_no_policy_log_probs:
            logger.warning("TRL %s computed no policy log-probs before the reward in this batch, where TRL %s does: "
                           "the reward runs a second teacher forward per batch (score/reward_teacher_passes "
                           "counts them)", trl.__version__, trl_vllm.PINNED["trl"])
            self._warned_no_policy_log_probs = True
        if self._student_job is not None:
            actor_end = time.perf_counter()
            scores, student_start, student_end = self._student_job.result()
            self._record_overlap(self._actor_scoring_start, actor_end, student_start, student_end)
            inputs = [{**example, "student_scores": score} for example, score in zip(inputs, scores, strict=True)]
        rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        # The weighted total TRL normalises per group (NaN where no reward function scored), for tied_groups.
        weighted = (rewards_per_func * self.reward_weights.to(rewards_per_func.device)).nansum(dim=1)
        self._last_rewards = torch.where(torch.isnan(rewards_per_func).all(dim=1), torch.nan, weighted)
        return rewards_per_func

    def _rank_zero_decides(self, over: bool) -> bool:
        """Rank 0's ``over`` on every rank (one process: ``over``)."""
        if self.accelerator.num_processes == 1:
            return over
        return bool(broadcast(torch.tensor([int(over)], device=self.accelerator.device), from_process=0).item())

    def _largest_over_ranks(self, count: int) -> int:
        return int(self.accelerator.gather(torch.tensor([count], device=self.accelerator.device)).max())

    def _counting_teacher_passes(self, model_context):
        """The reward's ``model_context``, counting each time the reward enters it for the teacher."""

        @contextlib.contextmanager
        def counted(model):
            if model is self.teacher_reward.teacher_model:
                self.timer.add_metric("score/reward_teacher_passes", 1)
            with model_context(model) as inner:
                yield inner

        return counted

    def _record_overlap(self, actor_start: float, actor_end: float, student_start: float,
                        student_end: float) -> None:
        """Timeline of the student_gpu SCORE phase, in seconds from the end of generation."""
        overlapped = max(0.0, min(actor_end, student_end) - max(actor_start, student_start))
        student_seconds = student_end - student_start
        for name, value in (("actor_logps_end", actor_end), ("student_start", student_start),
                            ("student_end", student_end)):
            self.timer.add_metric(f"timeline/{name}", value - actor_start)
        self.timer.add_metric("overlap/student_seconds", student_seconds)
        self.timer.add_metric("overlap/overlapped_seconds", overlapped)
        self.timer.add_metric("overlap/fraction", overlapped / student_seconds if student_seconds > 0 else 0.0)

    def release(self) -> None:
        """Free what this trainer holds (student thread, vLLM engine, models, optimizer, pinned copies, CUDA
        cache) so the next build in the same process fits. The trainer is unusable afterwards."""
        if self._student_pool is not None:
            self._student_pool.shutdown(wait=True)
            self._student_pool = None
        try:
            if self.one_step_off is not None:  # waits for the generation in flight
                self.one_step_off.close()
                self.one_step_off = None
        finally:  # the server stops even when that wait is cut short (a second Ctrl-C)
            if self.rollout_server is not None:
                self.rollout_server.stop()
                self.rollout_server = None
        self.accelerator.free_memory()
        for name in ("model", "model_wrapped", "ref_model", "optimizer", "lr_scheduler", "teacher_reward",
                     "vllm_generation"):
            if hasattr(self, name):
                setattr(self, name, None)
        self.reward_funcs = []
        for name in ("model", "optimizer", "lr_scheduler", "train_dataloader", "eval_dataloader"):
            setattr(self.callback_handler, name, None)  # transformers hands them to the callbacks, and keeps them
        for callback in self.callback_handler.callbacks:
            if hasattr(callback, "reward"):  # RunFilesCallback keeps the reward (and so the student) alive
                callback.reward = None
        self.swapper.forget()
        self.timer.close()
        gc.collect()
        self.swapper.empty_cache()

    # ---- checkpoints: the mixed reference --------------------------------------------------------------
    def _reference_is_mixed(self, step: int) -> bool:
        return self.ref_model is not None and self.args.sync_ref_model and step >= self.args.ref_model_sync_steps

    def save_extra_checkpoint_files(self, folder) -> None:
        """Once a mixup has happened, the mixed reference goes into the checkpoint too (TRL saves none). A sharded
        (FSDP) reference is gathered by every rank, whole weights on rank 0, which writes them."""
        if not self._reference_is_mixed(self.state.global_step):
            return
        path = os.path.join(folder, REFERENCE_FILE)
        if self.args.should_save:
            os.makedirs(os.path.dirname(path), exist_ok=True)
        if self.is_fsdp_enabled:
            from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

            state = get_model_state_dict(self.ref_model, options=StateDictOptions(full_state_dict=True,
                                                                                  cpu_offload=True))
            if self.args.should_save:
                safetensors.torch.save_file(unshared(state), path)
        elif self.args.should_save:
            safetensors.torch.save_model(self.ref_model, path)

    def _load_from_checkpoint(self, resume_from_checkpoint, model=None):
        super()._load_from_checkpoint(resume_from_checkpoint, model)
        path = os.path.join(resume_from_checkpoint, REFERENCE_FILE)
        if not os.path.exists(path):  # a checkpoint saved before the reference had a folder of its own
            path = os.path.join(resume_from_checkpoint, LEGACY_REFERENCE_FILE)
        if self.ref_model is not None and os.path.exists(path):
            if self.is_fsdp_enabled:  # every rank reads the whole weights and keeps its shard
                from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

                set_model_state_dict(self.ref_model, safetensors.torch.load_file(path),
                                     options=StateDictOptions(full_state_dict=True))
            else:  # copies into the existing (pinned CPU or GPU) tensors
                safetensors.torch.load_model(self.ref_model, path,
                                             device=str(next(self.ref_model.parameters()).device))
            logger.info("reference model restored from %s", path)
        elif self._reference_is_mixed(checkpoints.saved_step(resume_from_checkpoint)):
            logger.warning("%s has no %s: the reference restarts from the initial weights, not the mixed ones",
                           resume_from_checkpoint, REFERENCE_FILE)

    # ---- logging ------------------------------------------------------------------------------------
    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        if self.model.training:
            if tokens := float(self._train_tokens):  # zero in the end-of-training summary log
                self.timer.add_metric("train/tokens", tokens)
                self._train_tokens.zero_()
            logs.update(with_throughputs(self.timer.pop_metrics(), self._num_parameters, self.timer.device))
            if self.accelerator.num_processes > 1:
                logs.update(self._phase_spread(logs))
            vllm_generation = getattr(self, "vllm_generation", None)
            if vllm_generation is not None and (asleep := trl_vllm.weights_asleep(vllm_generation)) is not None:
                logs["vllm/asleep"] = float(asleep)
            if self.sleep_cycles is not None:
                logs.update(self.sleep_cycles.metrics())
        super().log(logs, start_time)

    def _phase_spread(self, logs: dict[str, float]) -> dict[str, float]:
        """Data parallel: each phase's seconds on the slowest and the fastest rank (``dp/<phase>/seconds_max``,
        ``_min``): a step waits for its slowest rank, so the spread is the time lost to imbalance. Every rank calls
        this at the same log (a collective)."""
        phases = ("generate", "score", "train")
        mine = torch.tensor([logs.get(f"phase/{p}/seconds", 0.0) for p in phases], dtype=torch.float64,
                            device=self.accelerator.device)
        every = self.accelerator.gather(mine).view(-1, len(phases))  # (ranks, phases)
        spread = {"dp/ranks": float(every.shape[0])}
        for i, phase in enumerate(phases):
            spread[f"dp/{phase}/seconds_max"] = every[:, i].max().item()
            spread[f"dp/{phase}/seconds_min"] = every[:, i].min().item()
        return spread

    @property
    def _num_parameters(self) -> int:
        if not hasattr(self, "_cached_num_parameters"):
            self._cached_num_parameters = sum(p.numel() for p in self.model.parameters())
        return self._cached_num_parameters


class _OptimizerPhaseCallback(TrainerCallback):
    """Counts the optimizer step (outside ``training_step`` in transformers' loop) as TRAIN time."""

    def __init__(self, timer: PhaseTimer):
        self.timer = timer

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        self.timer.begin(Phase.TRAIN)

    def on_optimizer_step(self, args, state, control, **kwargs):
        self.timer.end()


class TimeLimit(TrainerCallback):
    """Ends training at the end of the first optimizer step that finishes ``minutes`` after this process's first
    step began (``trainer.max_minutes``), with a held-out evaluation of that step when the run evaluates; the stage
    then saves final/ as at ``max_steps``. ``stopped_at`` holds the step it stopped at (None while it has not).
    ``agree`` turns this rank's verdict into the run's (data parallel: rank 0's, so that every rank stops at the same
    step); ``clock`` returns seconds (``time.monotonic``)."""

    def __init__(self, minutes: float, agree=lambda over: over, clock=time.monotonic):
        self.seconds, self.agree, self.clock = 60.0 * minutes, agree, clock
        self.started: float | None = None
        self.stopped_at: int | None = None

    def on_step_begin(self, args, state, control, **kwargs):
        if self.started is None:
            self.started = self.clock()

    def on_step_end(self, args, state, control, **kwargs):
        if self.started is None or control.should_training_stop:
            return
        elapsed = self.clock() - self.started
        if self.agree(elapsed >= self.seconds) and state.global_step < state.max_steps:
            control.should_training_stop = True
            # the held-out curve ends at the teacher final/ holds (transformers evaluates right after this hook)
            control.should_evaluate = args.eval_strategy != "no"
            self.stopped_at = state.global_step
            logger.info("trainer.max_minutes=%g: stopping after step %d of %d (%.1f minutes of training)",
                        self.seconds / 60, state.global_step, state.max_steps, elapsed / 60)


def _timed(fn, *args):
    """Run ``fn`` and return ``(result, start, end)`` (perf_counter seconds)."""
    start = time.perf_counter()
    result = fn(*args)
    return result, start, time.perf_counter()


def unshared(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``state`` with every tensor owning its memory: a gathered state dict can hold tied weights (the input
    embedding and the LM head) as one tensor under two names, which safetensors refuses to write."""
    seen: set[int] = set()
    out = {}
    for name, tensor in state.items():
        pointer = tensor.untyped_storage().data_ptr()
        out[name] = tensor.clone() if pointer in seen else tensor.contiguous()
        seen.add(pointer)
    return out
