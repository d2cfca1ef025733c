"""A teacher explains rows, with vLLM or ``transformers``, and the RLT reward scores each explanation.

The half that the distill stage (``rlt_mono.stages.distill``) and the eval stage (``rlt_mono.stages.eval``) share:

- ``load_stage_models``: the student, and the teacher with its ``TeacherKLReward``, where the resolved
  ``Placement`` puts them (on a GPU both wait in CPU memory and are swapped in for their passes by the
  ``ModelSwapper``, leaving the GPU to vLLM);
- ``open_generator``: sampling with vLLM (``VLLMGenerator``, one engine per model, asleep between calls) or
  ``transformers`` ``generate`` (``TransformersGenerator``: CPU, or a GPU without vLLM), by the placement's
  rollout engine; both take and return token ids, so the reward scores exactly the generated ids, and both seed
  each prompt's samples from the run's seed and the prompt alone (``prompt_seed``), so a resumed run samples the
  questions it has left as the uninterrupted run would have (up to the last digits that the padding of a batch moves
  the logits by, which can flip a near-tie);
- ``explain``: ``n`` explanations of each row from the RL stage's teacher prompt
  (``rlt_mono.data.rows.render_prompts``), scored by the reward in one batched call;
- the stages' shared conventions: their rows (``stage_rows``, each question + solution once), their run folder
  (``stage_output_dir``) and the check that a folder being resumed was written by the same stage and settings
  (``check_resume_matches``).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf
from torch import nn
from transformers import LogitsProcessor, LogitsProcessorList, PreTrainedTokenizerBase
from transformers.utils import SAFE_WEIGHTS_INDEX_NAME

from rlt_mono.config import ConfigError, instantiate
from rlt_mono.data.models import (
    dtype_name,
    load_config,
    load_model,
    load_tokenizer,
    model_kwargs,
    model_path,
    stop_token_ids,
)
from rlt_mono.data.prompts import PromptFormat
from rlt_mono.data.rows import DataConfig, PromptBudget, load_split, render_prompts
from rlt_mono.errors import UserError
from rlt_mono.memory.model import GIB
from rlt_mono.placement import Role, resolve_placement_for, warn_unused_options
from rlt_mono.rewards import TeacherKLReward, TeacherRewardConfig
from rlt_mono.rl import left_align, lora
from rlt_mono.rl.phases import Phase, PhaseTimer
from rlt_mono.rl.swapper import ModelSwapper
from rlt_mono.runs import checkpoints
from rlt_mono.runs import lock as run_lock
from rlt_mono.stages import STAGES
from rlt_mono.stages.sampling_options import SamplingOptions

logger = logging.getLogger(__name__)


# ---- models and generation --------------------------------------------------------------------------------
@dataclass
class StageModels:
    """The models of a distill or eval run. ``teacher`` and ``reward`` are None when no teacher is configured;
    ``tokenizer`` is then the student's (teacher and student share one vocabulary, checked by the reward)."""

    tokenizer: PreTrainedTokenizerBase
    student_tokenizer: PreTrainedTokenizerBase
    student: nn.Module
    student_path: str
    teacher: nn.Module | None
    teacher_path: str | None
    reward: TeacherKLReward | None
    phases: PhaseTimer
    swapper: ModelSwapper
    use_vllm: bool
    prompt_format: PromptFormat


def load_stage_models(cfg: DictConfig, reward_config: TeacherRewardConfig, teacher_temperature: float,
                      *, left_align_padding: bool, with_teacher: bool = True) -> StageModels:
    """Load the student (and the teacher with its reward) where the placement puts them: on a GPU both live in
    CPU memory and are swapped in for their passes, leaving the GPU to vLLM while it generates. With
    ``left_align_padding`` their padded scoring passes run left-aligned without a mask (``rlt_mono.rl.left_align``, as
    ``trainer.left_align_padding`` does for the RL stage's models); generation with a cache is left alone."""
    placement_cfg = cfg.placement
    if placement_cfg.mode == "async":  # the RL stage's one-step-off rollout: sampling here runs on one GPU
        logger.warning("placement=async is ignored: it runs the RL stage's rollout one step ahead on a second GPU; "
                       "%s samples and scores on one GPU (placement=mono)", cfg.stage)
        placement_cfg = OmegaConf.merge(placement_cfg, {"mode": "mono"})
    placement = resolve_placement_for(placement_cfg)
    stage = STAGES[cfg.stage]
    warn_unused_options(cfg, placement, plans_memory=stage.plans_memory, sampling_group=stage.sampling_group)
    phases = PhaseTimer(placement.device(Role.ACTOR))
    swapper = ModelSwapper(placement.device(Role.ACTOR), phases, pin_memory=cfg.placement.pin_memory)
    # Both paths first: a wrong one stops the run before any model loads (a GGUF file is dequantized once, here).
    teacher_path = model_path(cfg.model, cfg.seed, "model") if with_teacher else None
    student_path = model_path(cfg.student, cfg.seed, "student")
    if with_teacher and lora.lora_rank(cfg.model):
        logger.warning("model.lora_r=%s is ignored: %s only generates with the teacher (LoRA adapters are trained "
                       "by teacher_rlt alone)", cfg.model.lora_r, cfg.stage)
    student_tokenizer = load_tokenizer(student_path, "student.model_name_or_path")
    student = load_model(student_path, "student.model_name_or_path", dtype=dtype_name(cfg.student.dtype)).eval()
    student.requires_grad_(False)
    if left_align_padding:
        left_align.install(student.get_decoder())
    swapper.place(student, "student", offload=placement.offloads(Role.STUDENT), device=placement.device(Role.STUDENT))
    prompt_format = PromptFormat()
    if not with_teacher:
        return StageModels(student_tokenizer, student_tokenizer, student, student_path, None, None, None, phases,
                           swapper, placement.use_vllm, prompt_format)
    tokenizer = load_tokenizer(teacher_path, "model.model_name_or_path")
    teacher = load_model(teacher_path, "model.model_name_or_path", **model_kwargs(cfg.model)).eval()
    teacher.requires_grad_(False)
    if left_align_padding:
        left_align.install(teacher.get_decoder())
    # The teacher (the actor role) only scores here (vLLM holds its own copy for generation): CPU memory between
    # passes, on the actor's device for them.
    swapper.place(teacher, "teacher", offload=True, device=placement.device(Role.ACTOR))
    try:
        reward = TeacherKLReward(
            student, tokenizer, reward_config,
            teacher_model=teacher,
            teacher_temperature=teacher_temperature,
            prompt_format=prompt_format,
            student_tokenizer=student_tokenizer,
            model_context=swapper.resident,
            stop_token_ids=stop_token_ids(teacher, tokenizer),
            names=(teacher_path, student_path),
        )
    except ValueError as err:
        raise ConfigError(str(err)) from err
    return StageModels(tokenizer, student_tokenizer, student, student_path, teacher, teacher_path, reward, phases,
                       swapper, placement.use_vllm, prompt_format)


def prompt_seed(seed: int, prompt_ids: list[int]) -> int:
    """The sampling seed of one prompt: a hash of the run's ``seed`` and the prompt's token ids (stable across
    processes, unlike ``hash``), so the prompt's samples do not depend on the batch or the run that generates it.
    A stage's prompts are its rows' (question, solution) rendered by one teacher tokenizer, so this is a seed per
    question. 56 bits: vLLM seeds the i-th of ``n`` samples with ``seed + i``, and a torch generator takes 64."""
    digest = hashlib.sha256(json.dumps([seed, prompt_ids]).encode()).digest()
    return int.from_bytes(digest[:7], "big")


class SeededSampling(LogitsProcessor):
    """Sampling in which every row of a batch draws from its own random stream: a logits processor that samples each
    row's next token (``temperature``, then top-p) and leaves it the one finite logit, so that ``generate`` without
    sampling (greedy) takes it. Row ``r``'s stream is a generator seeded with ``seeds[r]`` that gives one uniform draw
    per step, turned into a token by inverse CDF over the tokens sorted by probability: the rows beside it do not
    change which draws it gets."""

    def __init__(self, seeds: list[int], temperature: float, top_p: float):
        self.generators = [torch.Generator().manual_seed(seed) for seed in seeds]
        self.temperature, self.top_p = temperature, top_p

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        """``scores`` (B, V) -> (B, V): 0 at each row's sampled token, -inf elsewhere."""
        probs = torch.softmax(scores.float() / self.temperature, dim=-1)  # (B, V)
        sorted_probs, order = probs.sort(dim=-1, descending=True, stable=True)  # (B, V)
        cdf = sorted_probs.cumsum(dim=-1)  # (B, V)
        # Top-p keeps the smallest prefix whose mass reaches top_p: the tokens with less than top_p before them.
        kept = ((cdf - sorted_probs) < self.top_p).sum(dim=-1, keepdim=True)  # (B, 1), >= 1
        draws = torch.cat([torch.rand(1, generator=g, dtype=torch.float64) for g in self.generators])  # (B,)
        target = draws.to(cdf).unsqueeze(-1) * cdf.gather(-1, kept - 1)  # (B, 1), within the kept mass
        # A draw just under 1 can round up to the whole kept mass: the last kept token, not one past it.
        position = torch.minimum(torch.searchsorted(cdf, target, right=True), kept - 1)  # (B, 1)
        return torch.full_like(scores, -math.inf).scatter(-1, order.gather(-1, position), 0.0)


class TransformersGenerator:
    """Sampling with ``model.generate`` (CPU, or a GPU without vLLM), ``batch_size`` prompts a call, each prompt
    repeated ``n`` times in left-padded rows.

    A sample is drawn by ``SeededSampling`` (temperature and top-p, no top-k, as vLLM samples a request) from a
    stream seeded by ``prompt_seed`` of the run's seed and its prompt, plus its index among the prompt's ``n`` (as
    vLLM seeds a request's samples). So it depends on the seed, the prompt's ids, its index and the model, not on
    the prompts beside it, except through the padding to the batch's longest prompt, which moves the logits in their
    last digits and can flip a near-tie of the sampled token. A rerun of the same config pads the same batches: the
    same samples, bit for bit. ``temperature`` 0 is greedy decoding."""

    def __init__(self, model: nn.Module, tokenizer: PreTrainedTokenizerBase, swapper: ModelSwapper, *,
                 max_new_tokens: int, stop_strings: tuple[str, ...] = (), top_p: float, batch_size: int, seed: int):
        self.model, self.tokenizer, self.swapper = model, tokenizer, swapper
        self.max_new_tokens, self.stop_strings, self.top_p = max_new_tokens, stop_strings, top_p
        self.batch_size, self.seed = batch_size, seed
        self.stop_ids = sorted(stop_token_ids(model, tokenizer))

    @torch.no_grad()
    def generate(self, prompt_ids: list[list[int]], n: int, temperature: float) -> list[list[list[int]]]:
        """``n`` completions (token ids, trailing padding removed) per prompt; ``temperature`` 0 is greedy."""
        pad = self.tokenizer.pad_token_id
        # Greedy: SeededSampling, when sampling, picks each token and leaves generate nothing to draw.
        options = dict(max_new_tokens=self.max_new_tokens, pad_token_id=pad, eos_token_id=self.stop_ids,
                       do_sample=False)
        if self.stop_strings:
            options.update(stop_strings=list(self.stop_strings), tokenizer=self.tokenizer)
        completions: list[list[list[int]]] = []
        for first in range(0, len(prompt_ids), self.batch_size):
            chunk = prompt_ids[first : first + self.batch_size]
            rows = [ids for ids in chunk for _ in range(n)]  # each prompt n times, its samples side by side
            width = max(len(ids) for ids in rows)
            input_ids = torch.full((len(rows), width), pad, dtype=torch.long)  # (b*n, P), left-padded
            attention_mask = torch.zeros((len(rows), width), dtype=torch.long)  # (b*n, P)
            for row, ids in enumerate(rows):
                input_ids[row, width - len(ids) :] = torch.tensor(ids)
                attention_mask[row, width - len(ids) :] = 1
            if temperature > 0:
                seeds = [prompt_seed(self.seed, ids) + index for ids in chunk for index in range(n)]
                options["logits_processor"] = LogitsProcessorList([SeededSampling(seeds, temperature, self.top_p)])
            with self.swapper.resident(self.model):
                device = next(self.model.parameters()).device
                sequences = self.model.generate(input_ids=input_ids.to(device),
                                                attention_mask=attention_mask.to(device), **options)  # (b*n, P+L)
            new_tokens = sequences[:, width:].tolist()
            for row in range(len(chunk)):
                completions.append([_strip_trailing(ids, pad) for ids in new_tokens[row * n : (row + 1) * n]])
        return completions

    def close(self) -> None:
        """Nothing to release: the model belongs to ``StageModels``."""


def check_one_model_in_folder(model_path: str) -> None:
    """Raise ``UserError`` where vLLM would read two models' weights as one. Without a shard index
    (``model.safetensors.index.json``) vLLM loads every ``*.safetensors`` file at the top of a model folder, a
    later file's tensors replacing an earlier one's of the same name: a second model there (a checkpoint of an older
    rlt_mono kept its mixed reference as ``reference_model.safetensors``) would silently be what generates. A model
    name that is not a folder is left to vLLM."""
    folder = Path(model_path)
    if not folder.is_dir() or (folder / SAFE_WEIGHTS_INDEX_NAME).is_file():
        return
    files = sorted(path.name for path in folder.glob("*.safetensors"))
    if len(files) > 1:
        raise UserError(f"{folder}: {len(files)} weight files ({', '.join(files)}) and no "
                        "model.safetensors.index.json: vLLM would load them all as one model, the later file's "
                        "tensors replacing the earlier one's. Give it a copy of the folder without the files that are "
                        "not the model's (a checkpoint of an older rlt_mono keeps its reference model as "
                        "reference_model.safetensors: leave the checkpoint as it is, its resume reads that file)")


class VLLMGenerator:
    """A vLLM engine for one model, asleep between calls (level 1: weights in CPU memory, KV cache freed) so that
    the scoring models can use the GPU; prompts go in as token ids, so they are the ids the reward scores. Each
    prompt is a request seeded by ``prompt_seed`` (vLLM gives such a request its own random generator)."""

    def __init__(self, model_path: str, *, dtype: str, max_new_tokens: int, max_prompt_tokens: int,
                 stop_strings: tuple[str, ...] = (), top_p: float, gpu_memory_utilization: float, seed: int,
                 enforce_eager: bool, kv_cache_gib: float | None):
        check_one_model_in_folder(model_path)
        from vllm import LLM

        # This process has touched CUDA (pinned copies of the scoring models) without torch marking it initialised,
        # so vLLM would fork its engine process, whose CUDA init then fails: make it spawn (vLLM's own switch). A
        # script that runs a stage therefore needs an `if __name__ == "__main__":` guard. The engine core cannot
        # run in this process instead: a second sleep-mode engine there (eval's student) failed in vLLM 0.25.1's
        # CuMem allocator ("invalid argument", then out of memory with 78 of 79 GiB free).
        os.environ["VLLM_WORKER_MULTIPROC_METHOD"] = "spawn"
        self.max_new_tokens, self.stop_strings, self.top_p, self.seed = max_new_tokens, stop_strings, top_p, seed
        # A set KV cache size skips vLLM's memory profiling, which stops the start ("Error in memory profiling")
        # when another process on the GPU frees memory meanwhile, as processes side by side do (bench/study_gsm.sh).
        kv_cache = {"kv_cache_memory_bytes": int(kv_cache_gib * GIB)} if kv_cache_gib else {}
        with run_lock.engine_start():
            self.llm = LLM(model=model_path, dtype=dtype, seed=seed, gpu_memory_utilization=gpu_memory_utilization,
                           max_model_len=max_prompt_tokens + max_new_tokens, enable_sleep_mode=True,
                           enforce_eager=enforce_eager, **kv_cache)
            self.llm.sleep(level=1)

    def generate(self, prompt_ids: list[list[int]], n: int, temperature: float) -> list[list[list[int]]]:
        from vllm import SamplingParams

        # Stop strings are matched on detokenized text; without them the ids are all that is read.
        params = [SamplingParams(n=n, temperature=temperature, top_p=self.top_p, max_tokens=self.max_new_tokens,
                                 stop=list(self.stop_strings) or None, include_stop_str_in_output=True,
                                 detokenize=bool(self.stop_strings), seed=prompt_seed(self.seed, ids))
                  for ids in prompt_ids]
        self.llm.wake_up()
        try:
            outputs = self.llm.generate([{"prompt_token_ids": ids} for ids in prompt_ids], params, use_tqdm=False)
        finally:
            self.llm.sleep(level=1)
        return [[list(c.token_ids) for c in out.outputs] for out in outputs]

    def close(self) -> None:
        """Stop the engine's process (its GPU memory goes with it), so that another engine can start."""
        self.llm.llm_engine.engine_core.shutdown()
        del self.llm


def open_generator(models: StageModels, role: str, options: SamplingOptions, cfg: DictConfig, *,
                   max_new_tokens: int, max_prompt_tokens: int, stop_strings: tuple[str, ...] = ()):
    """A generator for ``role`` ("teacher" or "student"): vLLM when ``models.use_vllm``, else transformers."""
    if role == "teacher":
        model, path, tokenizer = models.teacher, models.teacher_path, models.tokenizer
    else:
        model, path, tokenizer = models.student, models.student_path, models.student_tokenizer
    if not models.use_vllm:
        return TransformersGenerator(model, tokenizer, models.swapper, max_new_tokens=max_new_tokens,
                                     stop_strings=stop_strings, top_p=options.top_p,
                                     batch_size=options.rows_per_batch, seed=cfg.seed)
    dtype = cfg.model.dtype if role == "teacher" else cfg.student.dtype
    return VLLMGenerator(path, dtype=dtype, max_new_tokens=max_new_tokens, max_prompt_tokens=max_prompt_tokens,
                         stop_strings=stop_strings, top_p=options.top_p, seed=cfg.seed,
                         gpu_memory_utilization=options.vllm_gpu_memory_utilization,
                         enforce_eager=options.vllm_enforce_eager, kv_cache_gib=options.vllm_kv_cache_gib)


def teacher_prompts(models: StageModels, rows: list[dict]) -> tuple[list[str], list[list[int]]]:
    """The RL stage's teacher prompts (text, and the token ids both generation and the reward read)."""
    prompts = render_prompts(rows, models.tokenizer, models.prompt_format)
    return prompts, [models.tokenizer(p)["input_ids"] for p in prompts]


def explain(models: StageModels, generator, rows: list[dict], n: int, temperature: float) -> list[list[dict]]:
    """``n`` explanations of each row by the teacher, each scored by the RLT reward in one batched call.

    Returns, per row, ``n`` dicts: the reward's ``last_scores`` entry (``explanation``, ``r_ss``, ``r_kl``,
    ``match_penalty``, ``total``, ``unmatched``, ...) plus ``sample_index`` and ``completion_ids``.
    """
    prompts, prompt_ids = teacher_prompts(models, rows)
    with models.phases.phase(Phase.GENERATE):
        completions = generator.generate(prompt_ids, n, temperature)  # (rows, n) lists of ids
    flat_ids = [ids for per_row in completions for ids in per_row]
    with models.phases.phase(Phase.SCORE):
        models.reward(
            prompts=[p for p in prompts for _ in range(n)],
            completions=models.tokenizer.batch_decode(flat_ids),
            completion_ids=flat_ids,
            question=[r["question"] for r in rows for _ in range(n)],
            solution=[r["solution"] for r in rows for _ in range(n)],
        )
    scores = [dict(s, sample_index=i % n, completion_ids=ids)
              for i, (s, ids) in enumerate(zip(models.reward.last_scores, flat_ids, strict=True))]
    return [scores[i * n : (i + 1) * n] for i in range(len(rows))]


def _strip_trailing(ids: list[int], pad_id: int) -> list[int]:
    end = len(ids)
    while end and ids[end - 1] == pad_id:
        end -= 1
    return ids[:end]


# ---- rows and run folders ---------------------------------------------------------------------------------
def row_key(row: dict) -> tuple[str, str]:
    """What identifies a row across runs (a question may appear with two solutions)."""
    return row["question"], row["solution"]


def stage_rows(cfg: DictConfig, split: str, budgets: Sequence[PromptBudget] = ()) -> tuple[list[dict], str]:
    """The rows of ``split`` ("train": distill's, "eval": the held-out questions; ``rlt_mono.data.rows.load_split``),
    each question + solution once, those over a prompt budget (``prompt_budget``) refused or dropped by
    ``data.on_long_row``, and a description of where they came from."""
    data_config = instantiate(DataConfig, cfg.data, "data")
    rows = load_split(data_config, cfg.seed, split, budgets)
    unique = list({row_key(r): r for r in rows}.values())
    if len(unique) < len(rows):
        logger.info("data: dropped %d repeated question+solution rows", len(rows) - len(unique))
    if not unique:
        raise UserError(f"data.source={data_config.source}: no {split} rows (data.eval_rows / data.eval_fraction "
                        "set how many questions are held out)")
    return unique, f"{data_config.source}, {split} split, {len(unique)} rows"


def prompt_budget(cfg: DictConfig, group: str, name: str, max_new_tokens_key: str,
                  render: Callable[[PreTrainedTokenizerBase, list[dict]], list[str]]) -> PromptBudget:
    """The budget of the ``name`` prompts that ``render(tokenizer, rows)`` writes for the model of config group
    ``group`` ("model": the teacher, or "student"): its context less the tokens generated after them
    (``max_new_tokens_key``), as the RL stage budgets its teacher prompts. Reads the tokenizer and the model's
    config, no weights, so a row over it stops the stage before any model loads."""
    role = "teacher" if group == "model" else "student"
    key = f"{group}.model_name_or_path"
    path = model_path(cfg[group], cfg.seed, group)
    tokenizer = load_tokenizer(path, key)
    context = load_config(path, key).max_position_embeddings
    max_new_tokens = OmegaConf.select(cfg, max_new_tokens_key)
    if max_new_tokens >= context:
        raise ConfigError(f"{max_new_tokens_key}={max_new_tokens} leaves no room for a prompt in the {role}'s "
                          f"{context}-token context (max_position_embeddings): lower it")
    return PromptBudget(name, lambda rows: render(tokenizer, rows), tokenizer, context - max_new_tokens,
                        f"the {role}'s {context:,}-token context less {max_new_tokens_key}={max_new_tokens}")


def teacher_budget(cfg: DictConfig, max_new_tokens_key: str) -> PromptBudget:
    """``prompt_budget`` of the RL stage's teacher prompt (``rlt_mono.data.rows.render_prompts``), which distill and
    eval explain from."""
    prompt_format = PromptFormat()
    return prompt_budget(cfg, "model", "teacher prompt", max_new_tokens_key,
                         lambda tokenizer, rows: render_prompts(rows, tokenizer, prompt_format))


def stage_output_dir(cfg: DictConfig) -> Path:
    """``output_dir`` as given (created if missing), or a new ``outputs/<run_name>/<time>``."""
    if cfg.output_dir is None:
        return checkpoints.new_run_dir(cfg.run_dir)
    return checkpoints.ensure_output_dir(cfg.output_dir)


def check_resume_matches(output_dir: Path, cfg: DictConfig, keys: tuple[str, ...]) -> None:
    """Refuse a folder that another stage wrote, or (``keys``) that this stage wrote under other settings, as
    recorded in the earlier run's ``config.yaml``. Two paths of one existing file or folder are the same setting: a
    pipeline of an earlier rlt_mono recorded absolute what it now hands on relative to its folder."""
    saved_path = output_dir / "config.yaml"
    if not saved_path.exists():
        return
    saved = OmegaConf.load(saved_path)
    for key in ("stage", *keys):
        before, now = OmegaConf.select(saved, key), OmegaConf.select(cfg, key)
        if before != now and not _same_path(before, now):
            raise UserError(f"output_dir={output_dir} was written with {key}={_short(before)}, not {_short(now)}: "
                            f"set {key} back to resume it, or choose a new output_dir")


def _same_path(before, now) -> bool:
    return (isinstance(before, str) and isinstance(now, str) and os.path.exists(before) and os.path.exists(now)
            and os.path.samefile(before, now))


def _short(value) -> str:
    return json.dumps(OmegaConf.to_container(value, resolve=True) if isinstance(value, DictConfig) else value)
