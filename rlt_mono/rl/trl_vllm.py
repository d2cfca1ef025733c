"""Every private name of TRL, vLLM and transformers that rlt_mono relies on, behind one adapter.

``RLTTrainer`` extends TRL's ``GRPOTrainer`` at its override points; some of those, and a few engine internals,
are not TRL's public API. They are all touched here, checked when the trainer starts against the pinned
versions (``PINNED``: pyproject.toml's dependencies and its ``gpu`` extra), and exposed as small named functions:

Required (missing: ``TRLSurfaceError`` at start-up, naming what changed and the pinned versions):

- ``GRPOTrainer`` override points and their parameters: ``_generate(prompts)`` (completion ids second in what
  it returns), ``_generate_and_score_completions(inputs)``, ``_get_per_token_logps_and_entropies(model,
  input_ids, attention_mask, logits_to_keep, ...)`` (log-probs first), ``_calculate_rewards(inputs, prompts,
  completions, completion_ids_list)``; transformers' ``Trainer._load_from_checkpoint(resume_from_checkpoint,
  model)``;
- ``trl.trainer.callbacks.SyncRefModelCallback`` (TRL's reference mixup), found among the trainer's callbacks
  and wrapped so that the offloaded reference is swapped in around it.

Optional (missing: a warning with its cost, and the feature is off):

- policy log-prob reuse: in ``_generate_and_score_completions`` the first policy pass after generation is
  TRL's ``old_per_token_logps`` (no grad, temperature-scaled), computed before ``_calculate_rewards`` when
  generation and optimizer steps are misaligned or vLLM importance sampling is on. The trainer hands it to the
  reward; without it the reward runs one more teacher forward per generation batch. At run time the trainer
  also counts what happened (``score/teacher_log_probs_reused``, ``score/reward_teacher_passes``) and warns
  once if TRL computed no such pass where this version does.
- one-call weight sync (vLLM colocated, the whole teacher in this process: one process or DDP ranks):
  ``VLLMGeneration._iter_named_params``, ``enable_sleep_mode``, ``_llm_weights_sleeping`` and vLLM's
  ``llm.llm_engine.model_executor.driver_worker.model_runner.model.load_weights``; without them TRL's
  per-tensor sync runs, one ``load_weights`` call per tensor instead of one call. ``_llm_weights_sleeping`` also
  gives the ``vllm/asleep`` metric.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
import transformers
import trl
import trl.trainer.callbacks
from transformers import TrainerCallback

from rlt_mono.rl.lora import adapters_enabled

logger = logging.getLogger(__name__)

PINNED = {"trl": "1.16.0", "vllm": "0.25.1", "transformers": "5.17.0"}

# Override points and the leading parameters rlt_mono passes or reads, by class.
_REQUIRED_METHODS = {
    "_generate": ["self", "prompts"],
    "_generate_and_score_completions": ["self", "inputs"],
    "_get_per_token_logps_and_entropies": ["self", "model", "input_ids", "attention_mask", "logits_to_keep"],
    "_calculate_rewards": ["self", "inputs", "prompts", "completions", "completion_ids_list"],
    # placement=async (one-step-off rollout): the generation of one step's prompt ids, and their tokenization
    "_generate_single_turn": ["self", "prompt_ids", "images", "multimodal_fields", "num_generations"],
    "_tokenize_prompts": ["self", "prompts"],
}
_REQUIRED_TRANSFORMERS_METHODS = {"_load_from_checkpoint": ["self", "resume_from_checkpoint", "model"],
                                  # placement=async reads each step's micro-batches one step early
                                  "get_batch_samples": ["self", "epoch_iterator", "num_batches", "device"]}
# The first policy pass after generation is assigned to old_per_token_logps ...
_OLD_LOG_PROBS_PASS = re.compile(r"old_per_token_logps\s*,[^=\n]*=\s*self\._get_per_token_logps_and_entropies\(\s*"
                                 r"self\.model\b")
# ... under this condition (what ``computes_old_log_probs`` evaluates).
_OLD_LOG_PROBS_CONDITION = ("self.args.gradient_accumulation_steps % generate_every != 0",
                            "self.use_vllm and self.vllm_importance_sampling_correction")


class TRLSurfaceError(RuntimeError):
    """A private name of TRL/transformers that rlt_mono needs is missing or changed (another version installed)."""


@dataclass(frozen=True)
class Surface:
    """What start-up found. ``reuses_policy_log_probs``: TRL's policy log-probs are captured for the reward;
    ``expects_policy_log_probs``: with these settings TRL computes them before the reward in every generation
    batch; ``one_call_sync``: the one-call vLLM weight sync is installed."""

    reuses_policy_log_probs: bool
    expects_policy_log_probs: bool
    one_call_sync: bool


# ---- start-up checks ---------------------------------------------------------------------------------------
def _pins() -> str:
    return f"rlt_mono is pinned to trl=={PINNED['trl']}, transformers=={PINNED['transformers']} (pyproject.toml)"


def check_required(trainer_cls: type = trl.GRPOTrainer, base_cls: type = transformers.Trainer) -> None:
    """Raise ``TRLSurfaceError`` unless every required private name is there with the parameters rlt_mono uses."""
    problems = []
    for cls, methods in ((trainer_cls, _REQUIRED_METHODS), (base_cls, _REQUIRED_TRANSFORMERS_METHODS)):
        for name, params in methods.items():
            method = getattr(cls, name, None)
            if method is None:
                problems.append(f"{cls.__name__}.{name} is gone")
                continue
            found = list(inspect.signature(method).parameters)[: len(params)]
            if found != params:
                problems.append(f"{cls.__name__}.{name} takes ({', '.join(found)}), not ({', '.join(params)})")
    if not re.search(r"return prompt_ids, completion_ids\b", _source(getattr(trainer_cls, "_generate", None))):
        problems.append(f"{trainer_cls.__name__}._generate no longer returns the completion ids second")
    if not isinstance(getattr(trl.trainer.callbacks, "SyncRefModelCallback", None), type):
        problems.append("trl.trainer.callbacks.SyncRefModelCallback is gone")
    if problems:
        raise TRLSurfaceError(f"TRL {trl.__version__} / transformers {transformers.__version__} changed what "
                              f"RLTTrainer relies on: {'; '.join(problems)}. {_pins()}")


def call_order_problem(trainer_cls: type = trl.GRPOTrainer) -> str | None:
    """Why TRL's policy log-probs cannot be reused (None: ``_generate_and_score_completions`` computes
    ``old_per_token_logps`` as its first policy pass after generation, under the known condition, before the
    rewards)."""
    source = _source(getattr(trainer_cls, "_generate_and_score_completions", None))
    generated = source.find("self._generate(")
    first_pass = source.find("self._get_per_token_logps_and_entropies(", max(generated, 0))
    old_pass = _OLD_LOG_PROBS_PASS.search(source, max(generated, 0))
    rewards = source.find("self._calculate_rewards(")
    if generated < 0 or old_pass is None or not old_pass.start() < first_pass < old_pass.end():
        return "its first policy pass after generation is not old_per_token_logps"
    if not 0 <= old_pass.start() < rewards:
        return "old_per_token_logps is no longer computed before _calculate_rewards"
    if not all(condition in source for condition in _OLD_LOG_PROBS_CONDITION):
        return "the condition under which it computes old_per_token_logps changed"
    return None


def one_call_sync_problem(generation) -> str | None:
    """Why the one-call weight sync cannot replace TRL's on this ``VLLMGeneration`` (None: it can)."""
    missing = [name for name in ("_iter_named_params", "enable_sleep_mode", "llm")
               if not hasattr(generation, name)]
    if not missing and generation.enable_sleep_mode and not hasattr(generation, "_llm_weights_sleeping"):
        missing.append("_llm_weights_sleeping")
    if missing:
        return f"VLLMGeneration has no {', '.join(missing)}"
    model = generation.llm
    for name in ("llm_engine", "model_executor", "driver_worker", "model_runner", "model"):
        if not hasattr(model, name):
            return f"vLLM has no llm.llm_engine.model_executor.driver_worker.model_runner.model (stops at {name})"
        model = getattr(model, name)
    if not callable(getattr(model, "load_weights", None)):
        return "vLLM's model runner model has no load_weights"
    return None


def inspect_surface(trainer, reuse_policy_log_probs: bool) -> Surface:
    """Check the optional private names on a constructed trainer; log a warning with the cost of each one that
    is missing. Call after ``GRPOTrainer.__init__`` (the vLLM engine exists by then)."""
    if trl.__version__ != PINNED["trl"]:
        logger.warning("TRL %s is installed; %s: the private names it uses are checked now", trl.__version__,
                       _pins())
    reuse = reuse_policy_log_probs
    if reuse and (problem := call_order_problem()):
        logger.warning("the reward cannot reuse TRL's policy log-probs (TRL %s: %s): it runs its own teacher "
                       "forward over every generation batch, one more no-grad teacher pass per batch. %s",
                       trl.__version__, problem, _pins())
        reuse = False
    expects = reuse and computes_old_log_probs(trainer)
    if reuse and not expects:
        logger.info("the reward runs its own teacher pass each batch: TRL computes no policy log-probs when "
                    "generation and optimizer steps are aligned and vLLM importance sampling is off")
    one_call = False
    if trainer.use_vllm and trainer.args.vllm_mode == "colocate" and holds_whole_model(trainer.accelerator):
        problem = one_call_sync_problem(trainer.vllm_generation)
        if problem is None:
            one_call = True
        else:
            tensors = sum(1 for _ in trainer.model.named_parameters())
            logger.warning("one-call weight sync unavailable (%s): TRL's per-tensor sync is used, %d vLLM "
                           "load_weights calls per sync instead of 1. Installed vllm %s; rlt_mono is pinned to "
                           "vllm==%s (pyproject.toml, extra gpu)", problem, tensors, _version("vllm"), PINNED["vllm"])
    return Surface(reuse, expects, one_call)


def holds_whole_model(accelerator) -> bool:
    """Whether this process holds every weight of the teacher: one process, or data parallel with the teacher
    replicated (DDP); not when it is sharded (FSDP, DeepSpeed, even on one rank: the same path as on N), where TRL
    gathers each weight collectively."""
    from accelerate.utils import DistributedType

    if accelerator.distributed_type in (DistributedType.FSDP, DistributedType.DEEPSPEED):
        return False
    return accelerator.num_processes == 1 or accelerator.distributed_type in (DistributedType.MULTI_GPU,
                                                                              DistributedType.MULTI_CPU)


def time_weight_sync(generation, record_seconds: Callable[[float], None]) -> None:
    """Time TRL's own weight sync (where the one-call sync is not installed): ``record_seconds`` receives each
    sync's duration, as ``install_one_call_sync`` reports its own."""
    trl_sync = generation.sync_weights

    def sync_weights() -> None:
        start = time.perf_counter()
        trl_sync()
        torch.cuda.synchronize()
        record_seconds(time.perf_counter() - start)

    generation.sync_weights = sync_weights


def _source(function) -> str:
    try:
        return inspect.getsource(function) if function is not None else ""
    except (OSError, TypeError):  # no source shipped: the checks that read it report a change
        return ""


def _version(package: str) -> str:
    try:
        return __import__(package).__version__
    except ImportError:
        return "(not installed)"


# ---- what the trainer calls ---------------------------------------------------------------------------------
def completion_ids(generate_output: tuple) -> list[list[int]]:
    """The completion token ids in what ``GRPOTrainer._generate`` returns (one list of ids per completion)."""
    ids = generate_output[1]
    if not isinstance(ids, list) or not all(isinstance(row, list) for row in ids):
        raise TRLSurfaceError(f"GRPOTrainer._generate returned {type(ids).__name__} second, not the completion "
                              f"ids (lists of ints). {_pins()}")
    return ids


def computes_old_log_probs(trainer) -> bool:
    """Whether TRL computes ``old_per_token_logps`` in every generation batch (TRL 1.16's condition: generation
    and optimizer steps misaligned, or vLLM importance sampling on)."""
    generate_every = trainer.args.steps_per_generation * trainer.num_iterations
    return trainer.args.gradient_accumulation_steps % generate_every != 0 or (
        trainer.use_vllm and trainer.vllm_importance_sampling_correction)


def is_policy_no_grad_pass(trainer, model) -> bool:
    """Whether a ``_get_per_token_logps_and_entropies`` call is a no-grad pass of the policy: within a
    generation batch the first one is ``old_per_token_logps``. A LoRA teacher's reference pass also runs the
    policy, with its adapters disabled: that one is not."""
    return model is trainer.model and not torch.is_grad_enabled() and adapters_enabled(trainer.model)


def log_probs_of(result: tuple) -> torch.Tensor:
    """The per-token log-probs ``(B, T)`` in what ``_get_per_token_logps_and_entropies`` returns."""
    log_probs = result[0]
    if not isinstance(log_probs, torch.Tensor) or log_probs.dim() != 2:
        raise TRLSurfaceError("GRPOTrainer._get_per_token_logps_and_entropies no longer returns (B, T) log-probs "
                              f"first. {_pins()}")
    return log_probs


def weights_asleep(generation) -> bool | None:
    """Whether colocated vLLM's weights are asleep (None where TRL does not track it)."""
    return getattr(generation, "_llm_weights_sleeping", None)


def watch_sleep_cycles(llm, awake: Callable[[], None], asleep: Callable[[], None]) -> None:
    """Call ``awake`` each time vLLM's engine ``llm`` has woken its KV cache (the second of TRL's two wake-ups, after
    the weights', or a wake-up of everything) and ``asleep`` each time it has gone to sleep: vLLM's ``LLM.wake_up
    (tags)`` and ``LLM.sleep(level)`` wrapped on this instance, so TRL's calls and rlt_mono's go through them."""
    wake_up, sleep = llm.wake_up, llm.sleep

    def watched_wake_up(tags: list[str] | None = None) -> None:
        wake_up(tags=tags)
        if tags is None or "kv_cache" in tags:
            awake()

    def watched_sleep(*args, **kwargs) -> None:
        sleep(*args, **kwargs)
        asleep()

    llm.wake_up, llm.sleep = watched_wake_up, watched_sleep


def watch_prefix_cache(llm, record: Callable[[int, int], None]) -> None:
    """Call ``record(prompt_tokens, cached_tokens)`` after each ``llm.generate`` with the batch's prompt tokens and
    those vLLM's prefix cache served (``RequestOutput.num_cached_tokens``; vLLM turns prefix caching on by default,
    and TRL resets the cache after each weight sync, so hits come from the group's repeated prompt within one
    call). An output without the count (an older vLLM) adds nothing."""
    generate = llm.generate

    def watched_generate(*args, **kwargs):
        outputs = generate(*args, **kwargs)
        counted = [o for o in outputs if getattr(o, "num_cached_tokens", None) is not None]
        if counted:
            record(sum(len(o.prompt_token_ids or ()) for o in counted), sum(o.num_cached_tokens for o in counted))
        return outputs

    llm.generate = watched_generate


def install_one_call_sync(generation, empty_cache: Callable[[], None], record_seconds: Callable[[float], None],
                          after_sync: Callable[[], None] | None = None,
                          named_params: Callable[[], Iterator[tuple[str, torch.Tensor]]] | None = None):
    """Replace TRL's colocated weight sync (wake the weights, load the teacher's, reset the prefix cache) by the
    same steps with every tensor handed to vLLM's ``load_weights`` in one call instead of one call per tensor
    (drop when TRL batches the call). ``record_seconds`` receives each sync's duration; ``after_sync`` runs
    once vLLM has the weights, before it wakes its KV cache and generates; ``named_params`` yields the weights
    to load (default: TRL's ``_iter_named_params``; a LoRA teacher's merged weights: ``lora.merged_named_params``)."""
    named_params = named_params or generation._iter_named_params

    def sync_weights() -> None:
        start = time.perf_counter()
        if generation.enable_sleep_mode:
            empty_cache()
            generation.llm.wake_up(tags=["weights"])
            generation._llm_weights_sleeping = False
        vllm_model = generation.llm.llm_engine.model_executor.driver_worker.model_runner.model
        vllm_model.load_weights(named_params())
        generation.llm.reset_prefix_cache()
        torch.cuda.synchronize()
        record_seconds(time.perf_counter() - start)
        if after_sync is not None:
            after_sync()

    generation.sync_weights = sync_weights


@contextlib.contextmanager
def vllm_unquantized() -> Iterator[None]:
    """While ``GRPOTrainer.__init__`` runs: TRL 1.16 starts the colocated vLLM engine in bitsandbytes 4-bit when
    the policy has 4-bit layers (``trl.generation.vllm_generation``, which asks transformers'
    ``is_bitsandbytes_available``); a QLoRA teacher's vLLM engine instead holds the merged weights in the teacher's
    dtype (``rlt_mono.rl.lora``), so the check is told bitsandbytes is absent. Where TRL no longer asks, nothing is
    changed."""
    import trl.generation.vllm_generation as generation_module

    original = getattr(generation_module, "is_bitsandbytes_available", None)
    if original is None:
        yield
        return
    generation_module.is_bitsandbytes_available = lambda: False
    try:
        yield
    finally:
        generation_module.is_bitsandbytes_available = original


def wrap_reference_sync(trainer, swapper) -> None:
    """Wrap TRL's reference-mixup callback so that ``swapper`` (a ``ModelSwapper``) makes the reference resident,
    and writes it back, around the mixup."""
    sync_type = trl.trainer.callbacks.SyncRefModelCallback
    found = [c for c in trainer.callback_handler.callbacks if isinstance(c, sync_type)]
    if trainer.args.sync_ref_model and not found:
        raise TRLSurfaceError(f"sync_ref_model is on but TRL {trl.__version__} added no SyncRefModelCallback: the "
                              f"offloaded reference cannot be swapped in for its mixup. {_pins()}")
    for callback in found:
        if getattr(callback, "ref_model", None) is not trainer.ref_model:
            raise TRLSurfaceError(f"TRL {trl.__version__}'s SyncRefModelCallback does not hold the reference as "
                                  f".ref_model. {_pins()}")
        trainer.callback_handler.remove_callback(callback)
        trainer.add_callback(_ResidentRefSync(callback, swapper))


class _ResidentRefSync(TrainerCallback):
    """TRL's reference mixup, with the offloaded reference swapped in (and written back) around it."""

    def __init__(self, trl_callback, swapper):
        self.trl_callback, self.swapper = trl_callback, swapper

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step % args.ref_model_sync_steps != 0:  # TRL's own test: no swap on the other steps
            return
        with self.swapper.resident(self.trl_callback.ref_model, writeback=True):
            self.trl_callback.on_step_end(args, state, control, **kwargs)
