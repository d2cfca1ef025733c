"""Predict the peak GPU memory of each phase of an rlt_mono RL step on one GPU, before any model loads.

The prediction is of the **device-level** peak (what ``nvidia-smi`` shows, ``phase/<p>/device_peak_gib`` in a
run's metrics), the figure a card's size limits. Nothing here imports torch: the inputs are the models'
``config.json`` values and the run's settings, the outputs are bytes. ``rlt_mono.memory.planner`` turns a prediction
into a plan (the settings ``memory=auto`` picks, the advice when nothing fits) and has the command line.

What is modelled: placement ``mono`` (every role on one GPU), vLLM colocated with sleep mode, the reference and
the student kept in CPU memory and swapped in for their pass, TRL 1.16's fused LM head for the policy and
reference log-probs, rlt_mono's own chunked LM head for the reward (``rlt_mono/rewards/log_probs.py``). A step
has three phases, and each phase's bytes are a sum of named terms (``Phase.terms``):

- **GENERATE**: vLLM's pool, ``vllm_gpu_memory_utilization x total``, which holds vLLM's copy of the teacher, its
  activations and the KV cache (vLLM sizes the KV cache to fill the pool); plus what the trainer keeps on the
  GPU throughout: the teacher's weights and, after the first optimizer step, its optimizer state. Gradients are
  not held (transformers' Trainer zeroes them with ``set_to_none`` after each optimizer step). With
  ``offload_actor_in_generation`` the trainer's part waits on the CPU once vLLM has the weights: the phase's
  peak is then the larger of the pool and the moment of the weight sync (trainer + vLLM's weights, no KV cache).
  The phase also begins with what SCORE and TRAIN left in torch's cache (below): the device holds it until the
  weight sync empties the cache, so GENERATE is at least the level SCORE and TRAIN reach.
- **SCORE**: teacher weights and optimizer state, the vLLM pool only if it is not asleep, then the largest of
  the no-grad passes: the reference log-probs (the reference swapped in, TRL's micro-batch
  ``per_device_train_batch_size``), the student's scoring and the reward's teacher pass (``reward.micro_batch_size``
  sequences). The reference mixup at the end of a step holds the same weights plus the reference, and no more.
- **TRAIN**: teacher weights, gradients and optimizer state, the activations of one micro-batch
  (``per_device_train_batch_size`` sequences) kept for the backward pass, with or without gradient
  checkpointing, and the fused LM head's loss buffers; or, when larger, the optimizer step: the gradients and
  the step's temporaries once the backward's buffers are freed (``optimizer_step_bytes``: torch's AdamW makes one
  the size of a state). ``activation_offloading`` (TRL's
  ``get_act_offloading_ctx_manager`` around the training step) is credited with nothing: measured on an H100 it
  did not lower the device-level peak.

**A LoRA or QLoRA teacher** (``lora_r > 0``, ``load_in_4bit``; ``rlt_mono/rl/lora.py``): the trainer's teacher is
its base weights (the linear layers at ``NF4_BYTES_PER_PARAM`` when 4-bit) plus the adapters; gradients and
optimizer state are the adapters' only; there is no reference copy (the reference pass runs the teacher with its
adapters disabled); vLLM still holds the merged teacher in its dtype, and each weight sync builds one merged
layer at a time. A 4-bit teacher's passes also hold the dequantized weights of the layer they are in. The
adapters' own activations (``r`` values per token per layer and target) are left out.

Three terms come from measurements rather than from the models' shapes: they were fitted to measured
device-level peaks (``results/h100_planner.json``), then checked on runs they were not fitted to; the runs, the
fit and its accuracy are in docs/PERFORMANCE.md ("Planner accuracy").

- ``context_gib`` (1.5 GiB), in every phase: what torch does not allocate (the CUDA context, cuBLAS and NCCL
  workspaces).
- ``slack`` (12%) of the trainer's torch-allocated terms, in every phase: the caching allocator's fragmentation
  and the blocks it keeps reserved.
- vLLM beyond its pool during GENERATE, ``VLLM_BEYOND_POOL`` (0.4) x the teacher's weights, at most
  ``VLLM_BEYOND_POOL_MAX_GIB`` (1.5 GiB): what the engine holds outside the ``gpu_memory_utilization`` budget
  (capped because at 7B it did not grow with the weights; docs/PERFORMANCE.md).

Torch keeps what it reserved from one phase to the next, so the device holds the larger of SCORE's and TRAIN's
allocations in both ("allocator cache from ..."), and GENERATE begins with that reserve. With sleep mode the weight
sync empties the cache before vLLM wakes (TRL's ``sync_weights``, ``rlt_mono.rl.trl_vllm``'s one-call sync), so
GENERATE's peak is the larger of that reserve and vLLM's moment; without sleep mode nothing empties it, and it stays
beside the pool for the whole phase. ``memory=speed`` runs, whose small pool leaves TRAIN's level the larger, showed
it (docs/PERFORMANCE.md, "Planner accuracy").

**Sleep mode.** TRL's colocated engine sleeps at level 2 (``trl/generation/vllm_generation.py``: ``llm.sleep(level
=2)`` after generation, ``wake_up(tags=["weights"])`` before the weight sync, ``wake_up(tags=["kv_cache"])`` before
generating): level 2 discards vLLM's weights and frees the KV cache, so outside GENERATE the pool is assumed to
return to the device (``vllm_enable_sleep_mode=false``: it is counted in every phase). The envelope runs of
docs/PERFORMANCE.md capped the pool inside torch's allocator, where a sleeping pool stays counted; on a real card
it does not.

Run it on a config: ``python -m rlt_mono.memory.planner teacher_rlt_mono --gpu-gib 24 [--arch 1.5b] [overrides]``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields

from rlt_mono.errors import UserError

GIB = 1024**3
PHASES = ("GENERATE", "SCORE", "TRAIN")
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
# Optimizer state per parameter. adamw_torch: exp_avg and exp_avg_sq, each like the parameter (8 bytes for
# float32 weights, 4 for bfloat16). adamw_bnb_8bit: two 8-bit states (2 bytes) plus one float32 absmax per
# 256-element block for each (8 / 256 bytes), except the input embedding, whose two states transformers' Trainer
# keeps in float32 (8 bytes; it registers nn.Embedding weights with bitsandbytes as optim_bits=32).
# paged_adamw_8bit: the same states in CUDA managed memory, which the driver may page out to the CPU under
# pressure; counted like adamw_bnb_8bit (as resident: the planner credits paging with nothing).
OPTIMIZERS = ("adamw_torch", "adamw_bnb_8bit", "paged_adamw_8bit")
_BNB_BYTES_PER_PARAM = 2 + 8 / 256
# TRL 1.16's fused LM head (trl/kernels/chunked_logprob.py): tiles of TOKEN_CHUNK_SIZE positions x
# _CHUNKED_LOGPROB_CHUNK_SIZE vocabulary entries.
_FUSED_TOKENS, _FUSED_VOCAB = 4096, 32768
# rlt_mono's reward applies the LM head to this many positions at a time (rlt_mono/rewards/log_probs.py).
_REWARD_HEAD_CHUNK = 1024
# Measured (module docstring): non-torch memory per phase, and the allocator's slack on torch's terms.
CONTEXT_GIB = 1.5
ALLOCATOR_SLACK = 0.12
VLLM_BEYOND_POOL = 0.4
VLLM_BEYOND_POOL_MAX_GIB = 1.5
# What the trainer's process holds besides the weights when vLLM's engine starts (start_bytes).
STARTUP_CONTEXT_GIB = 0.75
# QLoRA's NF4 base weights (bitsandbytes, double quantization): 4 bits per weight, one 8-bit absmax per block of
# 64 weights, and one float32 scale per 256 absmax values.
NF4_BYTES_PER_PARAM = 0.5 + 1 / 64 + 4 / (64 * 256)
# Qwen2.5 architectures (config.json of the public checkpoints), as in bench/bench_mono.py's ARCHS.
QWEN25_ARCHS = {
    "0.5b": dict(hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                 intermediate_size=4864, vocab_size=151936, tie_word_embeddings=True, model_type="qwen2"),
    "1.5b": dict(hidden_size=1536, num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2,
                 intermediate_size=8960, vocab_size=151936, tie_word_embeddings=True, model_type="qwen2"),
    "7b": dict(hidden_size=3584, num_hidden_layers=28, num_attention_heads=28, num_key_value_heads=4,
               intermediate_size=18944, vocab_size=152064, tie_word_embeddings=False, model_type="qwen2"),
}


@dataclass(frozen=True)
class Arch:
    """A decoder-only transformer (Qwen2 / Llama layout: GQA attention, SwiGLU MLP, RMSNorm)."""

    hidden_size: int
    num_hidden_layers: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    vocab_size: int
    tie_word_embeddings: bool
    head_dim: int
    # Biases on q, k, v (Qwen2 always; Llama when attention_bias, which also biases o).
    qkv_bias: bool
    o_bias: bool

    @classmethod
    def from_config(cls, config: dict) -> Arch:
        """From a Hugging Face ``config.json`` dict; a missing key is a ``UserError`` naming it."""
        keys = ("hidden_size", "num_hidden_layers", "intermediate_size", "num_attention_heads", "vocab_size")
        missing = [key for key in keys if key not in config]
        if missing:
            raise UserError(f"model config has no {', '.join(missing)}: the memory planner needs a decoder config "
                            "(Qwen2/Llama config.json)")
        attention_bias = bool(config.get("attention_bias", False))
        return cls(
            hidden_size=config["hidden_size"],
            num_hidden_layers=config["num_hidden_layers"],
            intermediate_size=config["intermediate_size"],
            num_attention_heads=config["num_attention_heads"],
            num_key_value_heads=config.get("num_key_value_heads") or config["num_attention_heads"],
            vocab_size=config["vocab_size"],
            tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
            head_dim=config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"],
            qkv_bias=config.get("model_type") == "qwen2" or attention_bias,
            o_bias=attention_bias,
        )

    @property
    def kv_dim(self) -> int:
        """Width of the k (or v) projection: ``num_key_value_heads x head_dim``."""
        return self.num_key_value_heads * self.head_dim

    @property
    def q_dim(self) -> int:
        return self.num_attention_heads * self.head_dim

    def layer_params(self) -> int:
        """One decoder layer: q ``H x q_dim``, k and v ``H x kv_dim`` each, o ``q_dim x H`` (+ biases), the MLP's
        gate, up and down ``3 x H x I``, two RMSNorm weights ``2H``."""
        h = self.hidden_size
        attention = h * self.q_dim + 2 * h * self.kv_dim + self.q_dim * h
        if self.qkv_bias:
            attention += self.q_dim + 2 * self.kv_dim
        if self.o_bias:
            attention += h
        return attention + 3 * h * self.intermediate_size + 2 * h

    def linear_shapes(self) -> tuple[tuple[int, int], ...]:
        """``(in, out)`` of one layer's linear layers, the ones LoRA's ``all-linear`` targets and QLoRA quantizes:
        q, k, v, o, gate, up, down."""
        h, i = self.hidden_size, self.intermediate_size
        return ((h, self.q_dim), (h, self.kv_dim), (h, self.kv_dim), (self.q_dim, h), (h, i), (h, i), (i, h))

    def linear_params(self) -> int:
        """Weights of every layer's linear layers (no biases): ``L x sum(in x out)``."""
        return self.num_hidden_layers * sum(n * m for n, m in self.linear_shapes())

    def lora_params(self, rank: int) -> int:
        """Rank-``r`` adapters on every linear layer: ``A`` is ``r x in``, ``B`` is ``out x r``, so
        ``L x r x sum(in + out)``."""
        return self.num_hidden_layers * rank * sum(n + m for n, m in self.linear_shapes())

    def params(self) -> int:
        """All parameters, a tied embedding once: embedding ``V x H`` + layers + final norm ``H`` + LM head
        ``V x H`` when not tied."""
        embedding = self.vocab_size * self.hidden_size
        head = 0 if self.tie_word_embeddings else embedding
        return embedding + self.num_hidden_layers * self.layer_params() + self.hidden_size + head

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        """vLLM's KV cache per token: k and v, ``2 x layers x kv_dim x dtype bytes``."""
        return 2 * self.num_hidden_layers * self.kv_dim * dtype_bytes


def setting(key: str):
    """A ``Settings`` field that is a run setting: ``rlt_mono.memory.planner`` reads it from config key ``key``
    (dotted, in a composed run config) and ``memory=auto`` writes it back there. It has no default here (see
    ``Settings``)."""
    return field(metadata={"config": key})


@dataclass(frozen=True, kw_only=True)
class Settings:
    """What the prediction depends on.

    The fields declared with ``setting(key)`` are run settings (``CONFIG_KEYS``). Their only defaults are in the
    composed YAML config (``cfgs/``), not here: the YAML is what users read and override, and Hydra already types
    its values through OmegaConf, so a second default in Python could only drift from it.
    ``rlt_mono.memory.planner.settings_from_config`` fills them from a config, ``memory=auto`` writes its changes
    back through the same keys. The other fields are what no config key holds: the models, the longest prompt, the
    ranks, the card, and the measured constants (module docstring), the only defaults here.
    """

    teacher: Arch
    student: Arch
    # ---- run settings, in the order memory=auto reports what it changed
    # vLLM's pool as a share of the card's total memory.
    vllm_gpu_memory_utilization: float = setting("trainer.vllm_gpu_memory_utilization")
    # Sequences per training micro-batch; micro-batches per optimizer step; micro-batches per generation.
    per_device_train_batch_size: int = setting("trainer.per_device_train_batch_size")
    gradient_accumulation_steps: int = setting("trainer.gradient_accumulation_steps")
    steps_per_generation: int = setting("trainer.steps_per_generation")
    # Sequences per scoring forward.
    reward_micro_batch_size: int = setting("reward.micro_batch_size")
    gradient_checkpointing: bool = setting("trainer.gradient_checkpointing")
    optim: str = setting("trainer.optim")
    # The teacher and its optimizer state wait on the CPU while vLLM generates.
    offload_actor_in_generation: bool = setting("trainer.offload_actor_in_generation")
    # A sequence is prompt_length + max_completion_length.
    max_completion_length: int = setting("trainer.max_completion_length")
    # 0: every weight trained; load_in_4bit: QLoRA (rlt_mono/rl/lora.py).
    lora_r: int = setting("model.lora_r")
    load_in_4bit: bool = setting("model.load_in_4bit")
    # The weights' dtype (the reference is a copy of the teacher).
    teacher_dtype: str = setting("model.dtype")
    student_dtype: str = setting("student.dtype")
    # Autocast of forward and backward. (trainer.activation_offloading is no field: credited with nothing.)
    bf16: bool = setting("trainer.bf16")
    vllm_sleep: bool = setting("trainer.vllm_enable_sleep_mode")
    # Offloaded ones wait in CPU memory; resident ones are counted in every phase.
    offload_reference: bool = setting("placement.offload_reference")
    offload_student: bool = setting("placement.offload_student")
    # ---- what no config key holds
    # The longest prompt in tokens (the config does not bound it).
    prompt_length: int
    # placement=dp: ranks of the run (each plans its own GPU). With more than one, PyTorch DDP's reducer keeps a
    # flat copy of the gradients in its buckets for the whole run (accelerate's default, gradient_as_bucket_view
    # off), counted in every phase; not yet checked against a measured multi-GPU peak.
    data_parallel_ranks: int
    # placement.strategy=fsdp2: the teacher's weights, gradients and optimizer state, and the reference (which then
    # stays on the GPU), are split over the ranks, 1/data_parallel_ranks each; with bf16, accelerate keeps the
    # trained weights (so their gradients and optimizer state) in float32 ("master weights", upcast when it wraps
    # the model); the units FSDP2 all-gathers for a pass are counted whole (fsdp_gathered_bytes). Checked against
    # one rank on an H100 only (docs/PERFORMANCE.md, "fsdp2 on one rank").
    sharded: bool
    # The card's total memory (vLLM's pool is a share of it) and what the run may use: the total less what other
    # live processes hold (rlt_mono.memory.device; None: the total).
    total_gib: float
    free_gib: float | None = None
    # Measured (module docstring): non-torch memory in every phase, and the allocator's slack on torch's terms.
    context_gib: float = CONTEXT_GIB
    slack: float = ALLOCATOR_SLACK
    startup_context_gib: float = STARTUP_CONTEXT_GIB

    def __post_init__(self):
        for name in ("teacher_dtype", "student_dtype"):
            if getattr(self, name) not in DTYPE_BYTES:
                raise UserError(f"{name}={getattr(self, name)!r}: the planner knows {sorted(DTYPE_BYTES)}")
        if self.optim not in OPTIMIZERS:
            raise UserError(f"trainer.optim={self.optim!r}: the memory planner knows {', '.join(OPTIMIZERS)}")
        for name in ("prompt_length", "max_completion_length", "per_device_train_batch_size",
                     "gradient_accumulation_steps", "steps_per_generation", "reward_micro_batch_size"):
            if getattr(self, name) < 1:
                raise UserError(f"{name}={getattr(self, name)} must be >= 1")
        if self.lora_r < 0 or (self.load_in_4bit and self.lora_r == 0):
            raise UserError(f"lora_r={self.lora_r}, load_in_4bit={self.load_in_4bit}: a 4-bit teacher needs lora_r > 0")
        if self.sharded and self.lora_r:
            raise UserError(f"lora_r={self.lora_r} with a sharded teacher (placement.strategy=fsdp2): a LoRA teacher "
                            "is replicated (placement.strategy=ddp)")
        if not 0 < self.vllm_gpu_memory_utilization <= 1:
            raise UserError(f"vllm_gpu_memory_utilization={self.vllm_gpu_memory_utilization} must be in (0, 1]")

    @property
    def free(self) -> float:
        return self.total_gib if self.free_gib is None else self.free_gib

    @property
    def held_by_others_gib(self) -> float:
        """What other processes hold of the card: the total less what the run may use."""
        return self.total_gib - self.free

    @property
    def shards(self) -> int:
        """Into how many parts the teacher's training state is split on each rank: the ranks when sharded, else 1."""
        return self.data_parallel_ranks if self.sharded else 1

    @property
    def sequence_length(self) -> int:
        return self.prompt_length + self.max_completion_length


# Each run setting's config key by field name, in Settings' order: the one mapping between a run config and Settings,
# read from the fields' ``setting(key)`` declarations.
CONFIG_KEYS = {f.name: f.metadata["config"] for f in fields(Settings) if "config" in f.metadata}


@dataclass(frozen=True)
class Phase:
    """One phase's predicted peak: ``terms`` are ``(what, bytes)``, summed in ``bytes``."""

    name: str
    terms: tuple[tuple[str, int], ...]

    @property
    def bytes(self) -> int:
        return sum(nbytes for _, nbytes in self.terms)

    def term(self, prefix: str) -> int:
        """Bytes of the terms whose name starts with ``prefix``."""
        return sum(nbytes for what, nbytes in self.terms if what.startswith(prefix))

    @property
    def gib(self) -> float:
        return self.bytes / GIB


# ---- the arithmetic ---------------------------------------------------------------------------------------
def pool_bytes(s: Settings) -> int:
    """vLLM's pool: ``vllm_gpu_memory_utilization x total`` bytes."""
    return int(s.vllm_gpu_memory_utilization * s.total_gib * GIB)


def weight_bytes(arch: Arch, dtype: str) -> int:
    """``params x dtype bytes``."""
    return arch.params() * DTYPE_BYTES[dtype]


def lora_dtype_bytes(s: Settings) -> int:
    """Bytes per adapter parameter: peft keeps adapters of a 16-bit model in float32 (4); TRL casts a 4-bit
    model's adapters to bfloat16 (2)."""
    return 2 if s.load_in_4bit else 4


def teacher_weight_bytes(s: Settings) -> int:
    """The trainer's teacher: ``params x dtype bytes``; with ``load_in_4bit`` the linear layers' weights at
    ``NF4_BYTES_PER_PARAM`` and the rest (embeddings, LM head, norms, biases) in the dtype; plus LoRA's adapters
    (``lora_params x lora_dtype_bytes``)."""
    arch, dtype = s.teacher, DTYPE_BYTES[s.teacher_dtype]
    if s.load_in_4bit:
        base = math.ceil(arch.linear_params() * NF4_BYTES_PER_PARAM) + (arch.params() - arch.linear_params()) * dtype
    else:
        base = arch.params() * dtype
    return base + arch.lora_params(s.lora_r) * lora_dtype_bytes(s)


def master_dtype(s: Settings) -> str:
    """The dtype of the trained weights, their gradients and optimizer state: the model's, except a sharded teacher
    under bf16, which accelerate upcasts to float32 before FSDP2 shards it (bf16 is then only the compute dtype)."""
    return "float32" if s.sharded and s.bf16 else s.teacher_dtype


def gradient_bytes(s: Settings) -> int:
    """One gradient per trained parameter, like it: the adapters with LoRA, else every weight (in
    ``master_dtype``)."""
    if s.lora_r:
        return s.teacher.lora_params(s.lora_r) * lora_dtype_bytes(s)
    return weight_bytes(s.teacher, master_dtype(s))


def optimizer_bytes(arch: Arch, dtype: str, optim: str, lora: tuple[int, int] | None = None) -> int:
    """adamw_torch: two states like the parameters, ``2 x params x dtype bytes`` (8 bytes/param in float32);
    adamw_bnb_8bit and paged_adamw_8bit: the input embedding ``V x H x 8`` (two float32 states) and the other
    parameters ``x (2 + 8/256)`` (two 8-bit states and their blockwise float32 scales). With LoRA (``lora`` =
    ``(rank, adapter dtype bytes)``) only the adapters have state: ``2 x lora_params x bytes`` or
    ``lora_params x (2 + 8/256)``."""
    if lora is not None:
        trained = arch.lora_params(lora[0])
        return 2 * trained * lora[1] if optim == "adamw_torch" else math.ceil(trained * _BNB_BYTES_PER_PARAM)
    if optim == "adamw_torch":
        return 2 * weight_bytes(arch, dtype)
    embedding = arch.vocab_size * arch.hidden_size
    return embedding * 8 + math.ceil((arch.params() - embedding) * _BNB_BYTES_PER_PARAM)


def teacher_optimizer_bytes(s: Settings) -> int:
    """The optimizer state of what the teacher trains (the adapters with LoRA, else every weight, in
    ``master_dtype``), whole: a sharded rank holds 1/N of it."""
    return optimizer_bytes(s.teacher, master_dtype(s), s.optim, (s.lora_r, lora_dtype_bytes(s)) if s.lora_r else None)


def dequantize_bytes(s: Settings) -> int:
    """A 4-bit teacher's forward and backward dequantize one linear layer's weight at a time into the compute
    dtype: two of the largest (``2 x max(in x out) x 2``), one being freed as the next is made."""
    if not s.load_in_4bit:
        return 0
    return 2 * max(n * m for n, m in s.teacher.linear_shapes()) * 2


def activation_bytes(s: Settings) -> int:
    """Element size of activations: 2 bytes under bf16 autocast or with 16-bit weights, else 4."""
    return 2 if s.bf16 or DTYPE_BYTES[s.teacher_dtype] == 2 else 4


def layer_saved_per_token(arch: Arch, act: int) -> int:
    """Bytes one decoder layer saves for its backward pass, per token (flash/SDPA attention: no ``T x T`` term):
    attention block ``9H + 3 kv_dim`` elements (RMSNorm input in float32 counted as 2H and its output H; q, k, v
    and q, k after RoPE ``2 q_dim + 3 kv_dim``; the attention kernel's q and k, v expanded to all heads and its
    output ``4 q_dim``); MLP block ``3H + 4I`` (RMSNorm ``3H``; gate, up, SiLU(gate), their product ``4I``)."""
    h, i = arch.hidden_size, arch.intermediate_size
    attention = 3 * h + 2 * arch.q_dim + 3 * arch.kv_dim + 4 * arch.q_dim
    return act * (attention + 3 * h + 4 * i)


def inference_peak_per_token(arch: Arch, act: int) -> int:
    """A no-grad forward's live activations per token inside one layer: the residual stream, its norm, the
    attention output and a spare ``4H``, and the MLP's gate, up and their product ``3I``."""
    return act * (4 * arch.hidden_size + 3 * arch.intermediate_size)


def fused_head_bytes(arch: Arch, tokens: int, act: int, backward: bool) -> int:
    """TRL's fused LM head (log-probs without ``(B, T, V)`` logits): a ``min(tokens, 4096) x min(V, 32768)`` tile
    and its matmul buffer in the compute dtype; with ``backward`` also the float32 gradient accumulators of the
    head weight ``V x H x 4`` and of the hidden states ``tokens x H x 4``."""
    tile = min(tokens, _FUSED_TOKENS) * min(arch.vocab_size, _FUSED_VOCAB) * act * 2
    if not backward:
        return tile
    return tile + arch.vocab_size * arch.hidden_size * 4 + tokens * arch.hidden_size * 4


def reward_head_bytes(arch: Arch, length: int, dtype: str) -> int:
    """rlt_mono's reward head on ``min(length, 1024)`` positions at a time: the head output in the weights'
    dtype, its float32 copy divided by the temperature, and the float32 log-softmax, ``(dtype bytes + 8)`` per
    logit."""
    return min(length, _REWARD_HEAD_CHUNK) * arch.vocab_size * (DTYPE_BYTES[dtype] + 8)


def teacher_pass_logits_bytes(s: Settings) -> int:
    """A sharded teacher's reward pass goes through the model's own forward (``range_log_probs(whole_forward=
    True)``, so that FSDP gathers its weights), which returns the logits of every position the micro-batch's
    explanations span, at most the completion: ``reward.micro_batch_size x max_completion_length x V`` in the
    dtype, held while the head's chunks are taken from them."""
    if not s.sharded:
        return 0
    return s.reward_micro_batch_size * s.max_completion_length * s.teacher.vocab_size * DTYPE_BYTES[s.teacher_dtype]


def no_grad_pass_bytes(arch: Arch, dtype: str, batch: int, length: int, act: int, head: int) -> int:
    """A no-grad scoring forward of ``batch`` sequences of ``length`` tokens: the decoder's final hidden states
    ``batch x length x H`` (kept for the head), one layer's live activations
    (``inference_peak_per_token x batch x length``) and the head's ``head`` bytes."""
    tokens = batch * length
    return tokens * arch.hidden_size * act + tokens * inference_peak_per_token(arch, act) + head


def train_activation_bytes(s: Settings) -> int:
    """Activations of one micro-batch, ``b = per_device_train_batch_size`` sequences of ``T`` tokens:
    with gradient checkpointing, each layer's input ``L x b x T x H`` plus one layer recomputed in the backward
    (``layer_saved_per_token x b x T``); without it, every layer's saved tensors ``L x layer_saved_per_token x b x
    T``; plus the final norm's input and output ``2 x b x T x H``. Activation offloading is credited with no
    saving: measured, it did not lower TRAIN's device-level peak (docs/PERFORMANCE.md, "Planner accuracy")."""
    arch, act = s.teacher, activation_bytes(s)
    tokens = s.per_device_train_batch_size * s.sequence_length
    per_layer = layer_saved_per_token(arch, act) * tokens
    layer_input = tokens * arch.hidden_size * act
    if s.gradient_checkpointing:
        kept = arch.num_hidden_layers * layer_input + per_layer
    else:
        kept = arch.num_hidden_layers * per_layer
    return kept + 2 * layer_input


def optimizer_step_bytes(s: Settings) -> int:
    """What the optimizer step allocates beside its state, whole (a sharded rank holds 1/N): torch's AdamW
    (``adamw_torch``, its default multi-tensor ``foreach`` path) computes ``sqrt(exp_avg_sq)`` of every trained
    parameter at once, one temporary like one of its two states (the trained weights in ``master_dtype``, the
    adapters with LoRA). bitsandbytes' 8-bit AdamW updates one parameter at a time in a fused kernel: nothing."""
    return gradient_bytes(s) if s.optim == "adamw_torch" else 0


def beyond_pool_bytes(vllm_weights: int) -> int:
    """vLLM's memory outside its pool while it generates (module docstring): ``min(0.4 x weights, 1.5 GiB)``."""
    return int(min(VLLM_BEYOND_POOL * vllm_weights, VLLM_BEYOND_POOL_MAX_GIB * GIB))


def start_bytes(s: Settings) -> int:
    """What vLLM's engine start needs free: it refuses to start unless ``vllm_gpu_memory_utilization x total`` is free,
    and the trainer's teacher is already on the GPU then (the reference and student are not, and there is no
    optimizer state yet): the pool, the teacher's weights as loaded (no fragmentation yet) and
    ``startup_context_gib`` (``STARTUP_CONTEXT_GIB``, from a measurement beside a 7B pair's weights). TRL loads the
    reference on the CPU in the one-rank distributed run rlt_mono sets up (a ``placement=dp`` rank's too) and moves
    it after vLLM has started (``tests/test_gpu.py`` ``test_vllm_starts_beside_the_teacher_alone``). A sharded
    teacher is still on the CPU then too: transformers leaves a model it trains under FSDP where it is for
    accelerate to shard and move."""
    if s.sharded:
        return pool_bytes(s) + int(s.startup_context_gib * GIB)
    return pool_bytes(s) + teacher_weight_bytes(s) + int(s.startup_context_gib * GIB)


def host_memory_terms(s: Settings) -> list[tuple[str, int]]:
    """What one process holds in CPU memory at once, as far as the models' sizes tell: pinned for the whole run
    (``rlt_mono.rl.swapper``), the offloaded reference (a full fine-tune's copy) and student, and with
    ``offload_actor_in_generation`` the teacher's weights, gradients and optimizer state. A sharded teacher and its
    reference instead wait whole on the CPU until accelerate and TRL shard them (transformers leaves a model it
    trains under FSDP where it is; TRL loads the reference on the CPU): two whole copies while the process loads.
    A lower bound: the libraries and vLLM's process come on top. Every ``placement=dp`` rank holds its own."""
    terms = []
    if s.sharded:
        terms.append(("teacher and reference while loading", 2 * weight_bytes(s.teacher, s.teacher_dtype)))
    elif s.offload_reference and not s.lora_r:
        terms.append(("reference", weight_bytes(s.teacher, s.teacher_dtype)))
    if s.offload_student:
        terms.append(("student", weight_bytes(s.student, s.student_dtype)))
    if s.offload_actor_in_generation and not s.load_in_4bit and not s.sharded:
        terms.append(("teacher aside", teacher_weight_bytes(s) + gradient_bytes(s) + teacher_optimizer_bytes(s)))
    return terms


def merge_buffer_bytes(s: Settings) -> int:
    """A LoRA teacher's weight sync merges one layer at a time (``lora.merged_named_params``): the base weight in
    float32, the adapter's float32 update and the result in the dtype, ``max(in x out) x (4 + 4 + dtype bytes)``."""
    if not s.lora_r:
        return 0
    return max(n * m for n, m in s.teacher.linear_shapes()) * (8 + DTYPE_BYTES[s.teacher_dtype])


def fsdp_gathered_bytes(s: Settings) -> int:
    """What a sharded teacher's pass holds gathered, in the dtype. accelerate's FSDP2 units
    (``fsdp2_prepare_model``, cfgs/accelerate/fsdp2.yaml): each decoder layer; an untied input embedding; and a
    tail, the final norm and LM head (with the embedding when tied), kept gathered from the forward's end to the
    backward's start. A pass holds the tail, the unit it runs and the next, prefetched:
    ``tail + max(layer, untied embedding) + layer`` with ``tail = V x H (+ H)``."""
    arch = s.teacher
    embedding = arch.vocab_size * arch.hidden_size
    tail = embedding + arch.hidden_size
    layer = arch.layer_params()
    return (tail + max(layer, 0 if arch.tie_word_embeddings else embedding) + layer) * DTYPE_BYTES[s.teacher_dtype]


def _shard(nbytes: int, s: Settings) -> int:
    return math.ceil(nbytes / s.shards)


def _total(terms: list[tuple[str, int]]) -> int:
    return sum(nbytes for _, nbytes in terms)


def predict(s: Settings) -> tuple[dict[str, Phase], int]:
    """The three phases' terms, and how many full-length sequences of KV cache vLLM's pool holds."""
    act = activation_bytes(s)
    vllm_weights = weight_bytes(s.teacher, s.teacher_dtype)  # vLLM's copy: the (merged) teacher in its dtype
    # Sharded (no LoRA then): the float32 master weights under bf16, 1/N of them per rank.
    teacher_w = _shard(weight_bytes(s.teacher, master_dtype(s)) if s.sharded else teacher_weight_bytes(s), s)
    # The reference is a copy of the teacher; a LoRA teacher's is itself with adapters disabled (no copy).
    reference_w = 0 if s.lora_r else _shard(vllm_weights, s)
    offload_reference = s.offload_reference and not s.sharded  # a sharded reference stays on the GPU
    student_w = weight_bytes(s.student, s.student_dtype)
    optimizer = _shard(teacher_optimizer_bytes(s), s)
    gradients = _shard(gradient_bytes(s), s)
    pool = pool_bytes(s)
    label = "teacher weights" + (" (NF4 base, adapters)" if s.load_in_4bit else " (adapters too)" if s.lora_r else "")
    if s.sharded:
        label += f" (1/{s.shards} shard)"
    resident = [(label, teacher_w), ("optimizer state", optimizer)]
    if not offload_reference and reference_w:
        resident.append(("reference weights (resident)", reference_w))
    if not s.offload_student:
        resident.append(("student weights (resident)", student_w))
    if s.data_parallel_ranks > 1 and not s.sharded:
        resident.append(("DDP gradient buckets", gradient_bytes(s)))
    gathered = fsdp_gathered_bytes(s) if s.sharded else 0
    # TRL shards the reference as one FSDP2 unit (trl.models.prepare_fsdp): each of its passes gathers it whole.
    reference_gathered = vllm_weights if s.sharded else 0
    asleep_pool = [] if s.vllm_sleep else [("vLLM pool (no sleep mode)", pool)]

    length, completion = s.sequence_length, s.max_completion_length
    train_b, reward_b = s.per_device_train_batch_size, s.reward_micro_batch_size
    passes = {  # name -> (weights swapped in for it, its activations)
        "reference pass": (reference_w if offload_reference else 0, reference_gathered + dequantize_bytes(s)
                           + no_grad_pass_bytes(s.teacher, s.teacher_dtype, train_b, length, act, fused_head_bytes(
                               s.teacher, train_b * completion, act, backward=False))),
        "student pass": (student_w if s.offload_student else 0, no_grad_pass_bytes(
            s.student, s.student_dtype, reward_b, length, act, reward_head_bytes(s.student, completion,
                                                                                s.student_dtype))),
        "teacher pass": (0, gathered + dequantize_bytes(s) + teacher_pass_logits_bytes(s) + no_grad_pass_bytes(
            s.teacher, s.teacher_dtype, reward_b, length, act, reward_head_bytes(s.teacher, completion,
                                                                                s.teacher_dtype))),
    }
    name, (swapped, activations) = max(passes.items(), key=lambda item: sum(item[1]))
    score_terms = list(resident)
    if swapped:
        score_terms.append((f"{name.split()[0]} weights (swapped in)", swapped))
    score_terms.append((f"{name} activations", activations))
    backward = [("activations", train_activation_bytes(s)),
                ("loss head", fused_head_bytes(s.teacher, train_b * completion, act, backward=True))]
    if s.sharded:  # the backward holds a gathered unit and its whole gradient until the reduce-scatter
        backward.append(("FSDP gathered units and their gradients", 2 * gathered))
    if s.load_in_4bit:
        backward.append(("4-bit dequantization", dequantize_bytes(s)))
    train_terms = [*resident, ("gradients", gradients), *backward]
    # The optimizer step (in TRAIN) holds the gradients and its temporaries once the backward's buffers are freed.
    step = _shard(optimizer_step_bytes(s), s)
    if step:
        train_terms.append(("optimizer step beyond the backward", max(0, step - _total(backward))))
    # Torch keeps what it reserved between SCORE and TRAIN: both phases hold the larger allocation.
    score_torch, train_torch = _total(score_terms), _total(train_terms)
    score_terms.append(("allocator cache from TRAIN", max(0, train_torch - score_torch)))
    train_terms.append(("allocator cache from SCORE", max(0, score_torch - train_torch)))
    # A 4-bit teacher moved aside freed no device memory on an H100 (1.5B and 7B QLoRA; docs/PERFORMANCE.md,
    # "LoRA and QLoRA"): credited with nothing.
    # A sharded teacher is synced through TRL's per-tensor path, without the aside (rlt_mono.rl.trainer).
    aside = s.offload_actor_in_generation and not s.load_in_4bit and not s.sharded
    if aside:
        # The actor steps aside after the weight sync: before it does, vLLM holds only its weights (no KV cache
        # yet) beside the trainer; after, the pool alone. The phase's peak is the larger moment.
        sync_moment = int((1 + s.slack) * _total(resident)) + vllm_weights + merge_buffer_bytes(s)
        generate_terms = [("actor during the weight sync, then on the CPU", max(0, sync_moment - pool))]
    else:
        generate_terms = list(resident)

    def measured(torch_terms: list[tuple[str, int]]) -> list[tuple[str, int]]:
        return [("allocator slack", int(s.slack * _total(torch_terms))), ("CUDA context", int(s.context_gib * GIB))]

    generate_measured = ([("CUDA context", int(s.context_gib * GIB))] if aside
                         else measured(generate_terms))
    beyond = beyond_pool_bytes(vllm_weights)
    generate_terms = [("vLLM pool", pool), ("vLLM beyond its pool", beyond), *generate_terms, *generate_measured]
    # GENERATE begins with what SCORE and TRAIN left reserved in torch's cache (the same in both, slack included).
    # With sleep mode the weight sync empties it before vLLM wakes (TRL's sync_weights, trl_vllm's one-call sync),
    # so the phase holds the larger of that moment and the pool's; without, nothing empties it and it stays beside
    # the pool for the whole phase.
    reserve = _total(train_terms) + int(s.slack * _total(train_terms)) + int(s.context_gib * GIB)
    carried = reserve if s.vllm_sleep else reserve + pool + beyond
    generate_terms.append(("allocator cache from SCORE and TRAIN", max(0, carried - _total(generate_terms))))
    phases = {
        "GENERATE": Phase("GENERATE", tuple(generate_terms)),
        "SCORE": Phase("SCORE", (*score_terms, *asleep_pool, *measured(score_terms))),
        "TRAIN": Phase("TRAIN", (*train_terms, *asleep_pool, *measured(train_terms))),
    }
    kv_room = pool - vllm_weights
    kv_sequences = max(0, kv_room // (s.teacher.kv_bytes_per_token(DTYPE_BYTES[s.teacher_dtype]) * length))
    return phases, int(kv_sequences)
