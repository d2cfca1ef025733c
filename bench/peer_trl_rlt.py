"""The peer a user would write: the RLT teacher reward as a plain TRL reward function, beside rlt_mono.

A user who reads the method (docs/METHOD.md, "The reward") and knows TRL writes ``rlt_reward(prompts, completions,
completion_ids, question, solution, **kwargs)`` and passes ``reward_funcs=[rlt_reward]`` to ``trl.GRPOTrainer``. Inside
it, for each completion: the explanation is the generated ids before ``<|end_of_explanation|>``; the student chat is
the student's chat template over question, explanation and solution, tokenised by the tokenizer with the generated
explanation ids spliced in; the frozen student and the teacher being trained score it in plain right-padded forward
passes through transformers (full logits, completions in batch order, ``reward.micro_batch_size`` per forward, both
models resident on the run's device), and the reductions, coefficients, clips and KL estimator of the ``reward``
group make r = r_SS - r_KL + match_penalty. Nothing of rlt_mono's reward or trainer is used (``rlt_mono.rewards``,
``rlt_mono.rl``): only its config, data, prompts and model loading (``rlt_mono.config``, ``rlt_mono.data``,
``rlt_mono.placement``), so both sides run the same work. tests/test_peer_trl_rlt_on_cpu.py checks that the peer's
rewards equal rlt_mono's on the embedded pair.

    python bench/peer_trl_rlt.py --config demo_tiny [overrides ...] --steps 4 --out peer.json
    python bench/peer_trl_rlt.py --config teacher_rlt_mono [overrides ...] --pairs 5 --steps 4 --out pairs.json

One run (``--pairs`` 0): the peer for ``--steps`` optimizer steps; the JSON has each step's seconds (wall time from
the trainer's step begin to its end, the GPU synchronised), their median after the first (warm-up) step, each step's
mean reward and their mean. ``--pairs K``: rlt_mono (``rlt_mono.rl.build.build_trainer`` on the same config) and the
peer K times each in this process, alternating which goes first (each trainer released before the next is built),
with each pair's median steps, its ratio peer / rlt_mono (above 1: rlt_mono is faster), their median and a
percentile-bootstrap interval of that median over the pairs. Both sides run the composed settings as given
(``memory=manual``).
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import logging
import math
import os
import socket
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
import trl
from omegaconf import DictConfig, OmegaConf
from transformers import TrainerCallback

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]  # rlt_mono, and the scripts beside this one however it was loaded

from bench_mono import code_commit  # noqa: E402

from rlt_mono.config import ConfigError, compose, instantiate  # noqa: E402
from rlt_mono.data.models import (  # noqa: E402
    dtype_name,
    load_model,
    load_tokenizer,
    model_kwargs,
    model_path,
    stop_token_ids,
)
from rlt_mono.data.prompts import PromptFormat, begin_tag, end_tag  # noqa: E402
from rlt_mono.data.rows import DataConfig, prepare_dataset  # noqa: E402
from rlt_mono.errors import UserError  # noqa: E402
from rlt_mono.placement import Role, resolve_placement_for  # noqa: E402
from rlt_mono.runs.atomic_write import write_json  # noqa: E402
from rlt_mono.study.eval_stats import median_interval  # noqa: E402

logger = logging.getLogger("peer_trl_rlt")

FMT = PromptFormat()


# ---- the reward maths (docs/METHOD.md, "The reward", steps 3 to 7) --------------------------------------------


def reduce(values: torch.Tensor, how: str) -> float:
    """One reduction of a 1-D tensor; NaN for an empty one. ``median`` is the lower median, the quartiles
    interpolate linearly."""
    if values.numel() == 0:
        return math.nan
    if how == "mean":
        return values.mean().item()
    if how == "sum":
        return values.sum().item()
    if how == "min":
        return values.min().item()
    if how == "max":
        return values.max().item()
    if how == "median":
        return values.median().item()
    if how in ("first_quartile", "last_quartile"):
        return torch.quantile(values, 0.25 if how == "first_quartile" else 0.75).item()
    raise ValueError(f"unknown reduction {how!r}")


def normalize(values: torch.Tensor, how: str) -> torch.Tensor:
    if how == "none":
        return values
    if how == "exp":
        return values.exp()
    if how == "exp_norm":
        return 1.0 - (-values).exp()
    raise ValueError(f"unknown normalisation {how!r}")


def weighted(values: torch.Tensor, coefficients: list[float], reductions: list[str], nan_to: float) -> float:
    """``sum_i coefficient_i * reduce_i(values)``, a NaN reduction (empty span) counted as ``nan_to``."""
    total = 0.0
    for coefficient, how in zip(coefficients, reductions, strict=True):
        value = reduce(values, how)
        total += coefficient * (nan_to if math.isnan(value) else value)
    return total


def completion_reward(solution_lp: torch.Tensor, student_explanation_lp: torch.Tensor,
                      teacher_explanation_lp: torch.Tensor | None, matched: bool, cfg: dict) -> float:
    """r = r_SS - r_KL + match_penalty of one completion from its per-token log-probs (``cfg``: the reward group)."""
    penalty = cfg["not_matched_penalty"]
    lp = normalize(solution_lp, cfg["normalize_log_prob_fn"])
    if cfg["clip_log_prob"] is not None:
        lp = lp.clamp(min=-cfg["clip_log_prob"])
    r_ss = weighted(lp, cfg["answer_log_prob_coeff"], cfg["reduction_log_prob_fn"], penalty)
    if cfg["include_teacher_think_entropy"]:
        k = teacher_explanation_lp - student_explanation_lp
        if cfg["use_schulman_kl_estimation"]:
            k = k - 1.0 + (-k).exp()
    else:
        k = -student_explanation_lp
    kl = normalize(k, cfg["normalize_kl_fn"])
    if cfg["clip_kl"] is not None:
        kl = kl.clamp(max=cfg["clip_kl"])
    r_kl = weighted(kl, cfg["kl_penalty_reward_coeff"], cfg["reduction_kl_fn"], -penalty)
    return r_ss - r_kl + (0.0 if matched else penalty)


# ---- the explanation and the student chat (docs/METHOD.md, "Alignment") ------------------------------------------


def split_completion(tokenizer, completion_ids: list[int], stop_ids: set[int]) -> tuple[list[int], str, bool]:
    """``(explanation ids, explanation text, matched)`` of a teacher completion: the whole generated tokens before
    the first closing explanation tag (a token that straddles the tag is left out; its characters stay in the
    text), or every token but trailing end-of-sequence/padding ids when the tag never comes."""
    ids = list(completion_ids)
    while ids and ids[-1] in stop_ids:
        ids.pop()
    text = tokenizer.decode(ids)
    at = text.find(FMT.explanation_end)
    if at < 0:
        return ids, text, False
    low, high = 0, len(ids)  # the most tokens whose text ends at or before the tag
    while low < high:
        middle = (low + high + 1) // 2
        if len(tokenizer.decode(ids[:middle])) <= at:
            low = middle
        else:
            high = middle - 1
    return ids[:low], text[:at], True


def encode_with_offsets(tokenizer, text: str, shift: int = 0) -> tuple[list[int], list[tuple[int, int]]]:
    encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    return encoded["input_ids"], [(a + shift, b + shift) for a, b in encoded["offset_mapping"]]


def student_chat(tokenizer, question: str, solution: str, explanation_ids: list[int],
                 explanation_text: str) -> tuple[list[int], tuple[int, int], tuple[int, int]]:
    """``(student ids, explanation span, solution span)``, spans as ``[start, end)`` token positions.

    The ids are the tokenizer's own for the whole chat text around the explanation, with the generated explanation
    ids in between. Where the tokenizer merges a token across an end of the explanation, that side is encoded on its
    own; where the spliced ids do not decode to the chat (a character cut between tokens), the explanation is encoded
    from its text. The solution tokens are those lying wholly inside the solution text.
    """
    chat = tokenizer.apply_chat_template(FMT.student_messages(question, explanation_text, solution), tokenize=False)
    turn = chat.rindex(FMT.student_completion(explanation_text, solution))
    start = turn + len(begin_tag("thought") + FMT.explanation_prefix)
    solution_start = start + len(explanation_text + end_tag("thought") + FMT.section_delimiter + begin_tag("solution"))
    ids, offsets = encode_with_offsets(tokenizer, chat)
    for retry in (False, True):
        if retry:  # the explanation's ids as its text encodes
            explanation_ids = tokenizer(explanation_text, add_special_tokens=False)["input_ids"]
        end = start + len(tokenizer.decode(explanation_ids))
        head = [i for i, (_, b) in zip(ids, offsets) if b <= start]
        if tokenizer.decode(head) != chat[:start]:
            head = tokenizer(chat[:start], add_special_tokens=False)["input_ids"]
        tail = [(i, (a, b)) for i, (a, b) in zip(ids, offsets) if a >= end]
        if tokenizer.decode([i for i, _ in tail]) != chat[end:]:
            tail = list(zip(*encode_with_offsets(tokenizer, chat[end:], shift=end)))
        student_ids = head + explanation_ids + [i for i, _ in tail]
        if tokenizer.decode(student_ids) == chat:
            break
    first_tail = len(head) + len(explanation_ids)
    inside = [first_tail + k for k, (_, (a, b)) in enumerate(tail)
              if a >= solution_start and b <= solution_start + len(solution)]
    solution_span = (inside[0], inside[-1] + 1) if inside else (first_tail, first_tail)
    return student_ids, (len(head), first_tail), solution_span


# ---- log-probs: plain padded forwards ----------------------------------------------------------------------------


@torch.no_grad()
def span_log_probs(model, sequences: list[list[int]], spans: list[tuple[int, int]], temperature: float,
                   batch_size: int, pad_id: int) -> list[torch.Tensor]:
    """``log p(x_t | x_<t)`` of the tokens in each ``[start, end)`` span, logits divided by ``temperature``: the model's
    own forward over right-padded batches of ``batch_size`` sequences in the order given (float32, CPU)."""
    device = next(model.parameters()).device
    out = []
    for first in range(0, len(sequences), batch_size):
        batch = sequences[first: first + batch_size]
        input_ids = torch.full((len(batch), max(map(len, batch))), pad_id, dtype=torch.long)
        attention_mask = torch.zeros_like(input_ids)
        for row, sequence in enumerate(batch):
            input_ids[row, : len(sequence)] = torch.tensor(sequence)
            attention_mask[row, : len(sequence)] = 1
        input_ids, attention_mask = input_ids.to(device), attention_mask.to(device)
        logits = model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits  # (b, T, V)
        for row, (start, end) in enumerate(spans[first: first + batch_size]):
            # position p predicts token p + 1
            log_probs = (logits[row, start - 1: end - 1].float() / temperature).log_softmax(-1)
            out.append(log_probs.gather(-1, input_ids[row, start:end, None])[:, 0].cpu())
    return out


# ---- the reward function ---------------------------------------------------------------------------------------


def make_rlt_reward(teacher, student, tokenizer, reward_cfg: dict, temperature: float,
                    stop_ids: set[int]) -> Callable[..., list[float]]:
    """The TRL reward function over the teacher being trained and the frozen student (``reward_cfg``: the run's
    ``reward`` group; ``temperature``: the generation temperature)."""
    teacher_temperature = temperature if reward_cfg["unbias_teacher_log_probs"] else 1.0
    batch_size = reward_cfg["micro_batch_size"]
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id

    def rlt_reward(prompts, completions, completion_ids, question, solution, **kwargs) -> list[float]:
        chats, matched, teacher_sequences, teacher_spans = [], [], [], []
        for prompt, ids, q, s in zip(prompts, completion_ids, question, solution, strict=True):
            explanation_ids, explanation_text, closed = split_completion(tokenizer, ids, stop_ids)
            student_ids, explanation_span, solution_span = student_chat(tokenizer, q, s, explanation_ids,
                                                                        explanation_text)
            chats.append((student_ids, explanation_span, solution_span))
            matched.append(closed)
            explanation_ids = student_ids[explanation_span[0]: explanation_span[1]]
            prompt_ids = tokenizer(prompt)["input_ids"]
            teacher_sequences.append(prompt_ids + explanation_ids)
            teacher_spans.append((len(prompt_ids), len(prompt_ids) + len(explanation_ids)))
        # The student scores from the explanation's first token to the solution's last.
        student_lp = span_log_probs(student, [c[0] for c in chats], [(c[1][0], c[2][1]) for c in chats],
                                    reward_cfg["unbias_student_log_probs_temp"], batch_size, pad_id)
        teacher_lp = None
        if reward_cfg["include_teacher_think_entropy"]:
            teacher_lp = span_log_probs(teacher, teacher_sequences, teacher_spans, teacher_temperature, batch_size,
                                        pad_id)
        rewards = []
        for i, ((_, (e0, e1), (s0, s1)), lp) in enumerate(zip(chats, student_lp)):
            rewards.append(completion_reward(lp[s0 - e0: s1 - e0], lp[: e1 - e0],
                                             None if teacher_lp is None else teacher_lp[i], matched[i], reward_cfg))
        return rewards

    return rlt_reward


# ---- the peer's trainer ---------------------------------------------------------------------------------------


def grpo_config(cfg: DictConfig, output_dir: Path, use_vllm: bool) -> trl.GRPOConfig:
    """``trl.GRPOConfig`` of the ``trainer`` group's TRL fields and the run's name, seed and reporting, as rlt_mono
    builds its own (vLLM detokenization as ``trainer.vllm_detokenize`` says; no mixed reference for a LoRA teacher,
    which TRL does not mix)."""
    trainer = OmegaConf.to_container(cfg.trainer, resolve=True)
    fields = {field.name for field in dataclasses.fields(trl.GRPOConfig) if field.init}
    kwargs = {name: value for name, value in trainer.items() if name in fields}
    kwargs.update(output_dir=str(output_dir), run_name=cfg.run_name, seed=cfg.seed,
                  report_to=list(cfg.logging.report_to), use_vllm=use_vllm)
    if use_vllm:
        kwargs["generation_kwargs"] = {"detokenize": trainer.get("vllm_detokenize", False),
                                       **(kwargs.get("generation_kwargs") or {})}
    if cfg.model.lora_r:
        kwargs["sync_ref_model"] = False
    return trl.GRPOConfig(**kwargs)


def lora_config(model_cfg: DictConfig):
    if not model_cfg.lora_r:
        return None
    from peft import LoraConfig

    targets = model_cfg.lora_target_modules
    return LoraConfig(r=model_cfg.lora_r, lora_alpha=model_cfg.lora_alpha, lora_dropout=model_cfg.lora_dropout,
                      target_modules=targets if isinstance(targets, str) else list(targets), task_type="CAUSAL_LM")


def one_process_distributed_env() -> None:
    """TRL's colocated vLLM engine joins a torch.distributed group: a lone process is rank 0 of 1."""
    for key, value in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1"}.items():
        os.environ.setdefault(key, value)
    if "MASTER_PORT" not in os.environ:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            os.environ["MASTER_PORT"] = str(s.getsockname()[1])


def load_peer_models(cfg: DictConfig, student_device: str):
    """``(tokenizer, teacher, student, stop ids)`` of the run's ``model`` and ``student`` groups; the student frozen on
    ``student_device``."""
    if cfg.model.get("load_in_4bit"):
        raise ConfigError("the peer trains a full or LoRA teacher: set model.load_in_4bit=false")
    teacher_path = model_path(cfg.model, cfg.seed, "model")
    student_path = model_path(cfg.student, cfg.seed, "student")
    tokenizer = load_tokenizer(teacher_path, "model.model_name_or_path")
    teacher = load_model(teacher_path, "model.model_name_or_path", **model_kwargs(cfg.model))
    student = load_model(student_path, "student.model_name_or_path", dtype=dtype_name(cfg.student.dtype))
    student = student.eval().requires_grad_(False).to(student_device)
    return tokenizer, teacher, student, stop_token_ids(teacher, tokenizer)


def build_peer(cfg: DictConfig, output_dir: Path) -> trl.GRPOTrainer:
    """A plain ``trl.GRPOTrainer`` with ``reward_funcs=[rlt_reward]`` over the config's teacher, student and data."""
    if cfg.get("memory") != "manual":
        raise ConfigError(f"memory={cfg.get('memory')}: the peer runs the settings as given; set memory=manual so "
                          "that both sides run the same batch sizes")
    placement = resolve_placement_for(cfg.placement, use_cpu=bool(cfg.trainer.get("use_cpu", False)))
    if placement.mode == "dp":
        raise ConfigError("the peer runs in one process: set placement=mono")
    if placement.device(Role.ACTOR).startswith("cuda"):
        one_process_distributed_env()
    args = grpo_config(cfg, output_dir, placement.use_vllm)
    tokenizer, teacher, student, stop_ids = load_peer_models(cfg, placement.device(Role.STUDENT))
    dataset, _ = prepare_dataset(instantiate(DataConfig, cfg.data, "data"), tokenizer, FMT, seed=cfg.seed,
                                 max_prompt_tokens=teacher.config.max_position_embeddings - args.max_completion_length)
    reward = make_rlt_reward(teacher, student, tokenizer, OmegaConf.to_container(cfg.reward, resolve=True),
                             args.temperature, stop_ids)
    return trl.GRPOTrainer(model=teacher, reward_funcs=[reward], args=args, train_dataset=dataset,
                           processing_class=tokenizer, peft_config=lora_config(cfg.model))


def release_peer(trainer: trl.GRPOTrainer) -> None:
    """Drop what the peer's trainer holds (models, optimizer, vLLM engine, the reward with its student), so that
    ``free_memory`` can give it back once the trainer itself is gone."""
    trainer.accelerator.free_memory()
    for name in ("model", "model_wrapped", "ref_model", "optimizer", "lr_scheduler", "vllm_generation"):
        if hasattr(trainer, name):
            setattr(trainer, name, None)
    trainer.reward_funcs = []
    for name in ("model", "optimizer", "lr_scheduler"):
        setattr(trainer.callback_handler, name, None)


def free_memory() -> None:
    """Collect what released trainers left and give the CUDA cache back."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


# ---- timing ---------------------------------------------------------------------------------------------------


class StepSeconds(TrainerCallback):
    """Wall seconds of each optimizer step, from its begin to its end (the GPU synchronised)."""

    def __init__(self):
        self.seconds: list[float] = []
        self._start = 0.0

    @staticmethod
    def _sync() -> None:
        if torch.cuda.is_available():
            torch.cuda.synchronize()

    def on_step_begin(self, args, state, control, **kwargs):
        self._sync()
        self._start = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        self._sync()
        self.seconds.append(time.perf_counter() - self._start)


def after_first(values: list[float]) -> list[float]:
    """All but the first (warm-up) step, unless there is only one."""
    return values[1:] if len(values) > 1 else values


def grpo_fields(args) -> dict:
    """The ``trl.GRPOConfig`` fields of a trainer's arguments (JSON values), less its output folder."""
    names = {field.name for field in dataclasses.fields(trl.GRPOConfig)} - {"output_dir"}
    return {name: value for name, value in args.to_dict().items() if name in names}


def timed_train(trainer) -> dict:
    """Train, and the steps' seconds and rewards (TRL's logged mean reward of each step)."""
    timer = StepSeconds()
    trainer.add_callback(timer)
    trainer.train()
    rewards = [row["reward"] for row in trainer.state.log_history if "reward" in row]
    return {"step_seconds": timer.seconds, "median_step_s": statistics.median(after_first(timer.seconds)),
            "step_rewards": rewards, "mean_reward": statistics.fmean(rewards), "settings": grpo_fields(trainer.args)}


def run_peer(config: str, overrides: list[str], output_dir: Path) -> dict:
    trainer = build_peer(compose(config, [*overrides, f"output_dir={output_dir}"]), output_dir)
    try:
        return timed_train(trainer)
    finally:
        release_peer(trainer)


def run_rlt_mono(config: str, overrides: list[str], output_dir: Path) -> dict:
    # Only this side uses rlt_mono's trainer; the peer above imports nothing of rlt_mono.rl or rlt_mono.rewards.
    from rlt_mono.rl.build import build_trainer, release_trainer

    trainer = build_trainer(compose(config, [*overrides, f"output_dir={output_dir}"]))
    try:
        return timed_train(trainer)
    finally:
        release_trainer(trainer)


# ---- pairs ---------------------------------------------------------------------------------------------------


def setting_differences(first: dict, second: dict) -> list[str]:
    """Names of the settings whose values differ (or that only one side has)."""
    missing = object()
    names = first.keys() | second.keys()
    return sorted(name for name in names if first.get(name, missing) != second.get(name, missing))


def run_pairs(config: str, overrides: list[str], pairs: int, workdir: Path) -> dict:
    """``pairs`` rlt_mono / peer runs, alternating which goes first."""
    sides = {"rlt": run_rlt_mono, "peer": run_peer}
    rows, settings = [], {}
    for index in range(pairs):
        order = ("rlt", "peer") if index % 2 == 0 else ("peer", "rlt")
        result = {}
        for side in order:
            logger.info("pair %d/%d: %s", index + 1, pairs, side)
            result[side] = sides[side](config, overrides, workdir / f"{side}-{index}")
            free_memory()
            settings.setdefault(side, result[side]["settings"])
        rows.append({"order": ",".join(order), "rlt_median_step_s": result["rlt"]["median_step_s"],
                     "peer_median_step_s": result["peer"]["median_step_s"],
                     "ratio": result["peer"]["median_step_s"] / result["rlt"]["median_step_s"],
                     "rlt_step_seconds": result["rlt"]["step_seconds"],
                     "peer_step_seconds": result["peer"]["step_seconds"],
                     "rlt_mean_reward": result["rlt"]["mean_reward"],
                     "peer_mean_reward": result["peer"]["mean_reward"]})
    ratios = [row["ratio"] for row in rows]
    return {"pairs": rows, "ratio": "peer / rlt_mono median step seconds (above 1: rlt_mono is faster)",
            "median_ratio": statistics.median(ratios), "median_ratio_interval": median_interval(ratios),
            "goal": "median ratio >= 1.0", "settings": settings,
            "setting_differences": setting_differences(settings["rlt"], settings["peer"])}


# ---- command line ----------------------------------------------------------------------------------------------


def device_name(cfg: DictConfig) -> str:
    if cfg.trainer.get("use_cpu") or not torch.cuda.is_available():
        return "cpu"
    return torch.cuda.get_device_name()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--config", required=True, help="rlt_mono run config, e.g. demo_tiny or teacher_rlt_mono")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides of the run config (key=value)")
    parser.add_argument("--steps", type=int, required=True, help="optimizer steps of each run (trainer.max_steps)")
    parser.add_argument("--pairs", type=int, default=0, help="alternate rlt_mono and the peer this many times "
                        "(0: the peer alone)")
    parser.add_argument("--out", type=Path, required=True, help="the JSON result")
    parser.add_argument("--workdir", type=Path, help="the runs' output folders (default: a temporary folder)")
    return parser


def main(argv: list[str] | None = None) -> Path:
    parser = build_parser()
    a = parser.parse_intermixed_args(argv)
    if a.steps < 1 or a.pairs < 0:
        parser.error("--steps must be >= 1 and --pairs >= 0")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    overrides = [*a.overrides, f"trainer.max_steps={a.steps}"]
    workdir = a.workdir or Path(tempfile.mkdtemp(prefix="peer_trl_rlt_"))
    try:
        cfg = compose(a.config, overrides)
        given = argv if argv is not None else sys.argv[1:]
        shared = {"commit": code_commit(), "device": device_name(cfg),
                  "command": " ".join(["python", "bench/peer_trl_rlt.py", *given]),
                  "work": f"run config {a.config} with {' '.join(overrides)}: {a.steps} optimizer steps per run"}
        if a.pairs:
            result = {**shared, **run_pairs(a.config, overrides, a.pairs, workdir)}
        else:
            result = {**shared, **run_peer(a.config, overrides, workdir / "peer")}
    except UserError as err:
        parser.error(str(err))
    a.out.parent.mkdir(parents=True, exist_ok=True)
    write_json(a.out, result, indent=1)
    logger.info("wrote %s", a.out)
    return a.out


if __name__ == "__main__":
    main()
