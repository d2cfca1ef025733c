"""Build (once) and cache a tiny teacher/student pair for CPU tests and smoke runs.

``build_tiny_pair()`` trains a byte-level BPE tokenizer on the embedded dataset, creates two tiny
``Qwen2ForCausalLM`` models that share it (different init seeds), and warms each one up with a short
supervised loop on CPU: the teacher on the teacher chat (question + solution -> explanation), the
student on the student chat (question -> thought + solution). The result is cached under
``$RLT_MONO_CACHE`` (default ``~/.cache/rlt_mono``) in a folder named by a hash of the recipe, so a
changed recipe rebuilds and an unchanged one returns at once.

What it simplifies: the models have ~120k parameters (hidden 64, 2 layers, 705-token vocabulary) and
learn the formats and the surface of the arithmetic, not the arithmetic itself. They exist to exercise
the real code paths (chat templates, tag handling, log-prob alignment, generation stops), not to
produce good explanations. The build is bitwise reproducible (its time: docs/PERFORMANCE.md).

torch and transformers are imported by the functions that build, not at the top: the ``embedded:`` model paths
(``rlt_mono.data.models``) are resolved by the data-parallel launcher, whose module ``python -m rlt_mono.cli`` imports
before it has checked the config (and a built pair is found without either).

Usage::

    pair = build_tiny_pair()
    teacher = AutoModelForCausalLM.from_pretrained(pair.teacher_path)
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import logging
import math
import re
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from tokenizers import Tokenizer, models, pre_tokenizers, trainers

from rlt_mono.config import default_cache_dir
from rlt_mono.data.embedded.dataset import generate_rows, write_jsonl
from rlt_mono.data.prompts import ALL_TAGS, PromptFormat
from rlt_mono.runs.atomic_write import publish
from rlt_mono.runs.lock import exclusive

if TYPE_CHECKING:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM, Qwen2Tokenizer

logger = logging.getLogger(__name__)

# Bump when the recipe changes in a way the hashed sizes below do not capture.
FORMAT_VERSION = 2
NUM_ROWS = 2000
VOCAB_SIZE = 1024
PAD_TOKEN, CHAT_START, CHAT_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
# One 64-wide head: vLLM's Hopper attention kernels (FlashAttention 3) take head sizes of 64 and up.
MODEL_SIZES = {
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 1,
    "num_key_value_heads": 1,
    "intermediate_size": 128,
    "max_position_embeddings": 2048,
}
BATCH_SIZE = 8
LEARNING_RATE = 6e-3

# ChatML as in Qwen, minus tools and the default system prompt. Contents render verbatim (no strip),
# which is what ``continue_final_message=True`` needs to find and cut the last assistant message.
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


@dataclass(frozen=True)
class TinyPair:
    """Paths of a built tiny pair; both model folders hold the same tokenizer."""

    teacher_path: Path
    student_path: Path
    # JSON lines of the embedded rows ("question", "solution", "reasoning_trace").
    data_path: Path


def _recipe_hash(seed: int, warmup_steps: int) -> str:
    """Short hash of everything that determines the built files."""
    recipe = {
        "format_version": FORMAT_VERSION,
        "seed": seed,
        "warmup_steps": warmup_steps,
        "num_rows": NUM_ROWS,
        "vocab_size": VOCAB_SIZE,
        "model": MODEL_SIZES,
        "batch_size": BATCH_SIZE,
        "learning_rate": LEARNING_RATE,
        # A new tokenizers/transformers may rebuild the tokenizer pipeline differently on reload.
        "tokenizers": importlib.metadata.version("tokenizers"),
        "transformers": importlib.metadata.version("transformers"),
    }
    return hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:12]


def _warm_up_chats(rows: list[dict[str, str]], prompts: PromptFormat) -> dict[str, list[list[dict[str, str]]]]:
    """The full chats each model is warmed up on, by role.

    teacher: the prefilled teacher turn continued by the trace and the closing explanation tag;
    student: the trace as the thought, then the solution.
    """
    chats: dict[str, list[list[dict[str, str]]]] = {"teacher": [], "student": []}
    for row in rows:
        teacher = prompts.teacher_messages(row["question"], row["solution"])
        teacher[-1]["content"] += row["reasoning_trace"] + prompts.explanation_end
        chats["teacher"].append(teacher)
        chats["student"].append(prompts.student_messages(row["question"], row["reasoning_trace"], row["solution"]))
    return chats


def train_tokenizer(rows: list[dict[str, str]], prompts: PromptFormat) -> Qwen2Tokenizer:
    """Train a byte-level BPE on the rows in both chat formats; tags become single added tokens."""
    from transformers import Qwen2Tokenizer  # here: see the module docstring

    specials = [PAD_TOKEN, CHAT_START, CHAT_END]
    # An untrained Qwen2Tokenizer renders the chats and lends its normalizer and pre-tokenizer:
    # transformers 5 reloads a Qwen2Tokenizer by extracting vocab + merges from tokenizer.json and
    # rebuilding *its own* pipeline around them, so training with any other pipeline would change
    # the ids after a reload.
    template = Qwen2Tokenizer(chat_template=CHAT_TEMPLATE)
    backend = Tokenizer(models.BPE())
    backend.normalizer = template.backend_tokenizer.normalizer
    backend.pre_tokenizer = template.backend_tokenizer.pre_tokenizer
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    # Cut the rendered chats at the special tokens and tags so that no merge spans them.
    splitter = re.compile("|".join(re.escape(token) for token in [*specials, *ALL_TAGS]))
    texts = [
        template.apply_chat_template(chat, tokenize=False)
        for chats in _warm_up_chats(rows, prompts).values()
        for chat in chats
    ]
    backend.train_from_iterator([piece for text in texts for piece in splitter.split(text) if piece], trainer=trainer)

    model_state = json.loads(backend.to_str())["model"]
    tokenizer = Qwen2Tokenizer(
        vocab=model_state["vocab"],
        merges=[tuple(merge) for merge in model_state["merges"]],
        unk_token=None,
        eos_token=CHAT_END,
        pad_token=PAD_TOKEN,
        chat_template=CHAT_TEMPLATE,
        model_max_length=MODEL_SIZES["max_position_embeddings"],
    )
    tokenizer.add_special_tokens({"additional_special_tokens": [CHAT_START, CHAT_END]})
    # Non-special so that decode(..., skip_special_tokens=True) keeps them.
    tokenizer.add_tokens(list(ALL_TAGS), special_tokens=False)
    return tokenizer


def _encode_chats(tokenizer: Qwen2Tokenizer, chats: list[list[dict[str, str]]]) -> list[tuple[list[int], int, int]]:
    """Token ids of each full chat with the span that gets a loss: the assistant turn up to ``<|im_end|>``.

    Returns ``(input_ids, loss_start, loss_end)`` per chat, ``input_ids[loss_start:loss_end]`` being the
    assistant content plus its closing ``<|im_end|>``.
    """
    full_texts = [tokenizer.apply_chat_template(chat, tokenize=False) for chat in chats]
    prompt_texts = [
        tokenizer.apply_chat_template(chat[:-1], tokenize=False, add_generation_prompt=True) for chat in chats
    ]
    full_ids = tokenizer(full_texts, add_special_tokens=False)["input_ids"]
    prompt_ids = tokenizer(prompt_texts, add_special_tokens=False)["input_ids"]
    end_id = tokenizer.convert_tokens_to_ids(CHAT_END)
    encoded = []
    for ids, prompt in zip(full_ids, prompt_ids, strict=True):
        # The assistant turn starts with an added token (a tag), so the prompt tokenizes as a prefix.
        if ids[: len(prompt)] != prompt:
            raise RuntimeError("chat prompt does not tokenize as a prefix of the full chat")
        encoded.append((ids, len(prompt), len(ids) - ids[::-1].index(end_id)))
    return encoded


def _collate(examples: list[tuple[list[int], int, int]], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-pad a batch; labels are -100 outside each example's loss span."""
    import torch  # here: see the module docstring

    length = max(len(ids) for ids, _, _ in examples)
    input_ids = torch.full((len(examples), length), pad_id)  # (B, T)
    labels = torch.full((len(examples), length), -100)  # (B, T)
    attention_mask = torch.zeros((len(examples), length), dtype=torch.long)  # (B, T)
    for row, (ids, start, end) in enumerate(examples):
        input_ids[row, : len(ids)] = torch.tensor(ids)
        labels[row, start:end] = input_ids[row, start:end]
        attention_mask[row, : len(ids)] = 1
    return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}


def warm_up(
    model: Qwen2ForCausalLM, examples: list[tuple[list[int], int, int]], pad_id: int, steps: int, seed: int
) -> float:
    """Supervised warm-up: AdamW, linear warmup then cosine decay, random batches. Returns the last loss."""
    import torch  # here: see the module docstring

    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE, betas=(0.9, 0.95), weight_decay=0.0)
    ramp = max(1, steps // 10)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: min((step + 1) / ramp, 0.5 * (1 + math.cos(math.pi * step / steps)))
    )
    model.train()
    loss = torch.tensor(float("nan"))
    for step in range(steps):
        picks = torch.randint(len(examples), (BATCH_SIZE,), generator=generator)  # (B,)
        loss = model(**_collate([examples[i] for i in picks.tolist()], pad_id)).loss
        loss.backward()
        optimizer.step()
        schedule.step()
        optimizer.zero_grad(set_to_none=True)
        if step % 100 == 0 or step == steps - 1:
            logger.info("warm-up step %d/%d: loss %.3f", step + 1, steps, loss.item())
    model.eval()
    return loss.item()


def tiny_config(tokenizer: Qwen2Tokenizer) -> Qwen2Config:
    """The tiny Qwen2 config shared by teacher and student (vocabulary = the tokenizer's)."""
    from transformers import Qwen2Config  # here: see the module docstring

    return Qwen2Config(
        vocab_size=len(tokenizer),
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=tokenizer.convert_tokens_to_ids(CHAT_END),
        pad_token_id=tokenizer.pad_token_id,
        **MODEL_SIZES,
    )


def _build_into(folder: Path, seed: int, warmup_steps: int) -> None:
    """Build the whole pair into ``folder`` (tokenizer, both models, data); deterministic in ``seed``."""
    import torch  # here: see the module docstring
    from transformers import GenerationConfig, Qwen2ForCausalLM

    prompts = PromptFormat()
    rows = generate_rows(NUM_ROWS, seed=seed)
    write_jsonl(rows, folder / "data.jsonl")
    tokenizer = train_tokenizer(rows, prompts)
    logger.info("trained tokenizer: %d tokens", len(tokenizer))

    chats = _warm_up_chats(rows, prompts)
    config = tiny_config(tokenizer)
    generation_config = GenerationConfig(
        eos_token_id=config.eos_token_id, pad_token_id=config.pad_token_id, do_sample=False, max_new_tokens=256
    )
    for role, init_seed in (("teacher", 2 * seed + 1), ("student", 2 * seed + 2)):
        # Seed the global RNG (module init draws from it) without leaking that into the caller's state.
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(init_seed)
            model = Qwen2ForCausalLM(config)
        started = time.perf_counter()
        loss = warm_up(model, _encode_chats(tokenizer, chats[role]), config.pad_token_id, warmup_steps, seed=init_seed)
        logger.info(
            "%s warm-up: %d steps in %.1fs, final loss %.3f", role, warmup_steps, time.perf_counter() - started, loss
        )
        model.generation_config = generation_config
        model.save_pretrained(folder / role)
        tokenizer.save_pretrained(folder / role)


def build_tiny_pair(cache_dir: str | Path | None = None, seed: int = 0, warmup_steps: int = 200) -> TinyPair:
    """Return the cached tiny teacher/student pair, building it first if needed (once per recipe).

    The pair lives in ``cache_dir / f"tiny-pair-{hash}"``, the hash covering the recipe. A build goes into
    a temporary sibling folder that is renamed into place when complete, under a file lock, so a crash
    leaves no half-written pair and concurrent callers build it once.
    """
    if warmup_steps < 0:
        raise ValueError(f"warmup_steps must be >= 0, got {warmup_steps}")
    cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    final = cache_dir / f"tiny-pair-{_recipe_hash(seed, warmup_steps)}"
    pair = TinyPair(final / "teacher", final / "student", final / "data.jsonl")
    if (final / "COMPLETE").is_file():
        return pair

    cache_dir.mkdir(parents=True, exist_ok=True)
    with exclusive(cache_dir / f"{final.name}.lock"):
        if (final / "COMPLETE").is_file():  # another process built it while we waited
            return pair
        if final.exists():  # only reachable if the folder was tampered with; never trust it
            shutil.rmtree(final)
        logger.info("building tiny pair in %s (seed %d, %d warm-up steps)", final, seed, warmup_steps)
        started = time.perf_counter()
        staging = Path(tempfile.mkdtemp(prefix=f".{final.name}-", dir=cache_dir))
        import torch  # here: see the module docstring

        threads = torch.get_num_threads()
        # One thread: at these sizes OpenMP sync costs more than it saves, and on a shared 2-core
        # machine oversubscription made each step many times slower (docs/PERFORMANCE.md).
        torch.set_num_threads(1)
        try:
            _build_into(staging, seed, warmup_steps)
            (staging / "COMPLETE").write_text(json.dumps({"format_version": FORMAT_VERSION, "seed": seed}))
            staging.chmod(0o755)  # mkdtemp makes it owner-only
            publish(staging, final)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        finally:
            torch.set_num_threads(threads)
        logger.info("built tiny pair in %.1fs", time.perf_counter() - started)
    return pair
