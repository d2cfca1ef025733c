"""GPU benchmark of one RLT step against plain TRL and standalone vLLM on one GPU: what the whole step costs
when generation, scoring and training share the card.

Random-weight Qwen2.5 architectures (configs written here, no download), a byte-level BPE tokenizer padded
to Qwen2.5's 151,936 entries, forced completion lengths (``min_tokens = max_tokens``, EOS ignored) so every
run generates the same number of tokens. Each mode runs in its own process (its own vLLM engine):

    python bench/bench_mono.py all --arch 0.5b --completion-length 1024 --steps 8 --out results.json
    python bench/bench_mono.py all --modes rlt,trl --detokenize true --steps 8   # some modes, in this order
    python bench/bench_mono.py rlt|trl|vllm|vllm_inproc|pcie [options]           # one mode, one JSON line
    python bench/bench_mono.py envelope --arch 0.5b --cap-gib 12 --vllm-gib 4 --micro-batches 2,4,8,16
    python bench/bench_mono.py planner --pairs 0.5b:1024,1.5b:4096:2 --steps 2 --out planner.json
    python bench/bench_mono.py scale --arch 1.5b --arms mono:1,dp:2,student_gpu:2,dp:4 --steps 4 --out scale.json
    python bench/bench_mono.py scale --arch 0.5b --arms mono:1,async:2,split:2 --rounds 5 --out async.json
    python bench/bench_mono.py <sub-command> --help                               # the options it takes

Modes: ``rlt`` rlt_mono step (teacher + student of the same architecture, reference and student offloaded);
``trl`` plain ``trl.GRPOTrainer`` colocate step with a constant reward on the same model, data, batch and
lengths; ``vllm`` standalone vLLM generation of the same prompts at the same memory utilisation, with vLLM's
default sampling request (``n`` = completions per prompt) and with TRL's (``n=1`` per repeated prompt,
sampled-token logprobs), with and without detokenization; ``vllm_inproc`` the same with the engine core in
this process, as in colocate mode; ``pcie`` a plain pinned host-to-device copy (the bound for swap time).
Step time is the median of the optimizer steps after the first (wall time between on_step_begin and
on_step_end). ``rlt`` and ``trl`` also time, per step, the engine calls inside generation (``calls/*``: weight
sync, KV-cache wake, vLLM generate, sleep, prompt tokenization).

The two training arms are identical by construction: both compose ``cfgs/run_cfg/teacher_rlt_mono.yaml`` with
the same overrides (``bench_overrides``); ``rlt`` hands it to ``rlt_mono.build_trainer``, ``trl`` gets every
``trl.GRPOConfig`` field of the same settings (``grpo_configs``) and the model and data loaded the same way;
``--cap-gib``/``--vllm-gib`` cap both alike. Each arm reports its trainer's GRPO fields (``grpo_config``), and
``all`` marks the second arm's result an error if they differ from the first's in anything but ``output_dir``.

``envelope``: the largest micro-batch (completions per forward/backward; completions per step =
micro-batch x ``--accumulation``) for which ``--steps`` (default 2) rlt_mono steps fit under a memory cap.
The cap is applied with ``torch.cuda.set_per_process_memory_fraction(cap / total)``; vLLM gets ``--vllm-gib`` of it
(``gpu_memory_utilization = vllm_gib / total``). vLLM's pool goes through torch's allocator and stays counted
while vLLM sleeps, so the trainer's budget is ``cap - vllm_gib`` in every phase (conservative: on a card of
that size, sleeping vLLM returns its memory to the trainer). Micro-batches are tried in increasing order until
one runs out of CUDA memory (``fits: false``); any other failure (a full disk, a bug) stops the search as
``status: error`` with its message, since it says nothing about memory.

``planner``: the memory planner's accuracy. Each ``rlt`` run reports, per phase, the device-level peak it
measured (``device_peak/<phase>``: the largest ``phase/<phase>/device_peak_gib`` over all its steps, every
process and allocator on the GPU included) and the planner's prediction for the same settings
(``predicted/<phase>``, ``rlt_mono.memory.model``, the card's total memory and the data's longest prompt as inputs);
``planner`` runs one such child per ``--pairs`` entry ``arch:completion_length[:micro_batch]`` and adds the
ratio ``predicted / measured`` per phase (an under-prediction is a ratio below 1).

``scale``: throughput over GPUs. One ``rlt`` run per ``--arms`` entry ``arm:gpus`` (``mono:1``, ``student_gpu:2``,
``async:2``, ``dp:<N>``, ``split:2``: the same as dp:2, ``fsdp2:<N>``: dp with the teacher sharded) and round, each
with ``--completions`` per GPU rank (``dp`` generates, scores and trains ``--completions`` on every rank;
``student_gpu`` trains one actor, its student on the second GPU; ``async`` trains on GPU 0 while a vLLM server on
GPU 1 generates the next step). ``--rounds N`` runs the arm list N times, reversed every other round (a,b,c then
c,b,a), so that no arm always runs first or last on a machine warming up. Each result says its ``round`` and
``position`` in it and reports ``completions_per_s`` (completions per step over the median step, rank 0's wall time)
and ``optimizer_steps_per_s`` (1 / the median step). ``--out`` holds the commit, the GPUs, the command line, every
run and a ``summary`` per arm over the rounds: its runs (per-step seconds included), the medians of its figures, and
against the first arm (the baseline) the ratio of optimizer steps and of completions per second in each round both
ran, with the median ratio and its 95% percentile-bootstrap interval over the rounds. Both are logged as Markdown
tables. Each run also says where its time outside the steps went: ``process_seconds`` (the child from start to exit),
``setup/models_s``, ``setup/build_trainer_s`` (vLLM's engine started) and ``setup/to_first_step_s``. A ``dp`` child
is this script under ``accelerate launch`` (``rlt_mono.launch``), one rank per GPU; rank 0 writes its result.

Every child process writes a JSON result with ``status``: ``ok``, ``out_of_memory`` (a CUDA out-of-memory
error) or ``error`` (anything else, with its one-line message in ``error``); its log is under
``<workdir>/logs``. The parent prints each result as one JSON line, writes them all to ``--out``, and exits
with 1 if a mode failed (``envelope``: if the search ended on an error rather than out of memory).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import logging
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]  # rlt_mono, and the scripts beside this one however it was loaded

from roofline import OneLineParser  # noqa: E402

from rlt_mono.runs.atomic_write import write_json  # noqa: E402
from rlt_mono.runs.lock import exclusive  # noqa: E402

logger = logging.getLogger("bench_mono")

ARCHS = {  # Qwen2.5 architectures (config.json of the public checkpoints)
    "0.5b": dict(hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                 intermediate_size=4864, vocab_size=151936, tie_word_embeddings=True),
    "1.5b": dict(hidden_size=1536, num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2,
                 intermediate_size=8960, vocab_size=151936, tie_word_embeddings=True),
    "7b": dict(hidden_size=3584, num_hidden_layers=28, num_attention_heads=28, num_key_value_heads=4,
               intermediate_size=18944, vocab_size=152064, tie_word_embeddings=False),
}
QWEN_VOCAB = 151936
RUN_CONFIG = "teacher_rlt_mono"

# ---- command line: every option once, and which sub-command takes which ------------------------------------

OPTIONS = {
    "--arch": dict(choices=list(ARCHS), default="0.5b", help="Qwen2.5 architecture of the random-weight models"),
    "--models": dict(type=Path, default=Path("/tmp/bench_models"), help="where the random-weight models are built "
                     "(once; reused)"),
    "--workdir": dict(type=Path, default=Path("/tmp/bench_runs"), help="run folders and child logs"),
    "--completion-length": dict(type=int, default=1024, help="tokens per completion (forced: EOS ignored)"),
    "--completions": dict(type=int, default=32, help="completions per optimizer step"),
    "--micro-batch": dict(type=int, default=4, help="completions per forward/backward"),
    "--steps": dict(type=int, default=4, help="optimizer steps (the first is warm-up, left out of medians)"),
    "--optim": dict(help="trainer.optim (default: rlt_mono's config)"),
    "--util": dict(type=float, default=0.3, help="trainer.vllm_gpu_memory_utilization (default 0.3, the share the "
                   "recorded benchmarks ran with, not the run config's)"),
    "--detokenize": dict(choices=["true", "false"], help="trainer.vllm_detokenize, in both training arms "
                         "(default: rlt_mono's config)"),
    "--score-micro-batch": dict(type=int, help="reward.micro_batch_size (default: rlt_mono's config)"),
    "--placement": dict(choices=["mono", "student_gpu", "dp", "async"], default="mono",
                        help="placement (dp: one rank per GPU of --gpus, through accelerate launch; async: the rollout "
                        "one step ahead on a vLLM server on GPU 1)"),
    "--gpus": dict(type=int, default=1, help="GPUs of the run: placement dp runs one rank per GPU, each with "
                   "--completions per step (so the step has completions x gpus)"),
    "--strategy": dict(choices=["ddp", "fsdp2"], help="placement dp: placement.strategy, how the ranks hold the "
                       "teacher (default: rlt_mono's config, ddp)"),
    "--arms": dict(default="mono:1,dp:2,student_gpu:2,dp:4", help="scale: runs, comma-separated placement:gpus "
                   "(split:2: dp over two GPUs; fsdp2:<N>: dp with the teacher sharded); the first is the baseline"),
    "--rounds": dict(type=int, default=1, help="scale: run the arms this many times, the order reversed every other "
                     "round"),
    "--max-minutes": dict(type=float, help="scale: start no run that would end after this many minutes from the "
                          "start, judged by the longest run so far (the rounds left are not run; the log says so)"),
    "--commit": dict(help="scale: the commit of the code run, recorded in --out (default: git rev-parse --short HEAD "
                     "here; give it in a copy of the code without .git)"),
    "--memory": dict(choices=["auto", "speed", "manual"], default="manual", help="memory: auto lets the planner pick "
                     "vLLM's share and the batch sizes (rlt_mono/memory/planner.py), speed also the generation batch "
                     "(rlt_mono/memory/speed_plan.py); manual runs the options as given"),
    "--card-gib": dict(type=float, help="device-level cap: a separate process holds all but this many GiB of the "
                       "GPU for the run, as if the card had only that much free; the measured peaks leave it out"),
    "--activation-offloading": dict(choices=["true", "false"], help="trainer.activation_offloading"),
    "--offload-actor": dict(choices=["true", "false"], help="trainer.offload_actor_in_generation"),
    "--lora-r": dict(type=int, help="model.lora_r: a LoRA teacher of this rank (default: every weight trained)"),
    "--load-in-4bit": dict(choices=["true", "false"], help="model.load_in_4bit: QLoRA (with --lora-r)"),
    "--cap-gib": dict(type=float, help="cap on torch-allocated GPU memory, vLLM's pool included (default: none)"),
    "--vllm-gib": dict(type=float, help="vLLM's share of the GPU in GiB; overrides --util"),
    "--left-align": dict(choices=["true", "false"], help="trainer.left_align_padding (default: rlt_mono's config)"),
    "--liger": dict(choices=["true", "false"], help="trainer.use_liger_kernel: liger-kernel's fused layers in the "
                    "teacher, reference and student (default: rlt_mono's config)"),
    "--profile-step": dict(type=int, help="rlt: profile this optimizer step's score and train phases at the kernel "
                           "level (bench/phase_profile.py) into the result's 'profile'; that step is left out of the "
                           "medians"),
    "--pcie-gib": dict(type=float, default=1.0, help="bytes copied host to device, in GiB"),
    "--modes": dict(default="pcie,vllm,trl,rlt", help="modes to run, comma-separated, in order"),
    "--micro-batches": dict(default="2,4,8,16", help="micro-batches to try, comma-separated, increasing"),
    "--accumulation": dict(type=int, default=8, help="micro-batches per optimizer step"),
    "--pairs": dict(default="0.5b:1024,0.5b:4096,1.5b:1024,1.5b:4096", help="planner runs, comma-separated "
                    "arch:completion_length[:micro_batch]"),
    "--out": dict(type=Path, help="write the list of results here (JSON) after each mode"),
    "--result-file": dict(type=Path, help="write this mode's result here (JSON) instead of printing it"),
}
TRAINING = ["--arch", "--models", "--workdir", "--completion-length", "--completions", "--micro-batch", "--steps",
            "--optim", "--util", "--detokenize", "--cap-gib", "--vllm-gib"]
GENERATION = ["--arch", "--models", "--completion-length", "--completions", "--util"]
MODE_OPTIONS = {  # what each mode's child process takes (besides --result-file)
    "rlt": [*TRAINING, "--score-micro-batch", "--placement", "--gpus", "--strategy", "--memory", "--card-gib",
            "--activation-offloading", "--offload-actor", "--lora-r", "--load-in-4bit", "--profile-step",
            "--left-align", "--liger"],
    "trl": TRAINING,
    "vllm": GENERATION,
    "vllm_inproc": GENERATION,
    "pcie": ["--pcie-gib"],
}
ENVELOPE_SETS = ("--completions", "--micro-batch", "--score-micro-batch")  # envelope sets these per try
PLANNER_SETS = ("--arch", "--completion-length", "--micro-batch")  # planner sets these per pair
SCALE_SETS = ("--placement", "--gpus", "--strategy")  # scale sets these per arm
SUBCOMMANDS = {
    **{mode: [*options, "--result-file"] for mode, options in MODE_OPTIONS.items()},
    "all": [*dict.fromkeys(o for options in MODE_OPTIONS.values() for o in options), "--modes", "--out"],
    "envelope": [*(o for o in MODE_OPTIONS["rlt"] if o not in ENVELOPE_SETS), "--micro-batches", "--accumulation",
                 "--out"],
    "planner": [*(o for o in MODE_OPTIONS["rlt"] if o not in PLANNER_SETS), "--pairs", "--out"],
    "scale": [*(o for o in MODE_OPTIONS["rlt"] if o not in SCALE_SETS), "--arms", "--rounds", "--max-minutes",
              "--commit", "--out"],
}
HELP = {
    "rlt": "one rlt_mono step benchmark", "trl": "one plain TRL GRPOTrainer step benchmark",
    "vllm": "standalone vLLM generation", "vllm_inproc": "standalone vLLM, engine core in this process",
    "pcie": "pinned host-to-device copy", "all": "several modes, each in its own process",
    "envelope": "largest micro-batch that fits a memory cap",
    "planner": "memory planner: predicted vs measured device-level peak per phase",
    "scale": "throughput (optimizer steps and completions per second) of rlt runs on 1, 2, 4 GPUs: mono, dp, split, "
             "student_gpu and async side by side, in rounds of alternating order",
}


def build_parser() -> argparse.ArgumentParser:
    # No abbreviations: envelope would read --micro-batch as --micro-batches. A refusal is one line (OneLineParser);
    # the sub-commands' parsers are of the same class.
    parser = OneLineParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    commands = parser.add_subparsers(dest="command", required=True, metavar="{" + ",".join(SUBCOMMANDS) + "}")
    for name, flags in SUBCOMMANDS.items():
        sub = commands.add_parser(name, help=HELP[name], description=HELP[name], allow_abbrev=False)
        for flag in flags:
            sub.add_argument(flag, **OPTIONS[flag])
    commands.choices["envelope"].set_defaults(steps=2)
    commands.choices["planner"].set_defaults(steps=2)
    return parser


def dest(flag: str) -> str:
    return flag.removeprefix("--").replace("-", "_")


def child_argv(mode: str, options: argparse.Namespace) -> list[str]:
    """The command line of ``mode``'s child: each option it takes, with the parent's value (unset ones left out)."""
    argv = []
    for flag in MODE_OPTIONS[mode]:
        value = getattr(options, dest(flag))
        if value is not None:
            argv += [flag, str(value)]
    return argv


# ---- one configuration for both training arms ----------------------------------------------------------------

# Option -> the teacher_rlt_mono keys it sets ({accumulation} = completions // micro_batch); an option a
# sub-command does not take leaves its keys at the run config's values.
OVERRIDES = {
    "steps": ["trainer.max_steps={steps}"],
    "completion_length": ["trainer.max_completion_length={completion_length}",
                          "++trainer.generation_kwargs.min_tokens={completion_length}"],
    "micro_batch": ["trainer.per_device_train_batch_size={micro_batch}",
                    "trainer.gradient_accumulation_steps={accumulation}",
                    "trainer.steps_per_generation={accumulation}"],
    "optim": ["trainer.optim={optim}"],
    "util": ["trainer.vllm_gpu_memory_utilization={util}"],
    "detokenize": ["trainer.vllm_detokenize={detokenize}"],
    "score_micro_batch": ["reward.micro_batch_size={score_micro_batch}"],
    "placement": ["placement={placement}"],
    "gpus": ["placement.num_processes={gpus}"],
    "strategy": ["placement.strategy={strategy}"],
    "memory": ["memory={memory}"],
    "activation_offloading": ["trainer.activation_offloading={activation_offloading}"],
    "offload_actor": ["trainer.offload_actor_in_generation={offload_actor}"],
    "left_align": ["trainer.left_align_padding={left_align}"],
    "liger": ["trainer.use_liger_kernel={liger}"],
    "lora_r": ["model.lora_r={lora_r}"],
    "load_in_4bit": ["model.load_in_4bit={load_in_4bit}"],
}
# The output folder is each arm's own; every other trl.GRPOConfig field must agree between the arms.
ARM_SPECIFIC = ("output_dir",)


def bench_overrides(options: argparse.Namespace, teacher: Path, student: Path, output_dir: Path | None) -> list[str]:
    """Overrides of ``teacher_rlt_mono`` for a bench run: the random-weight pair, completions forced to full length,
    vLLM rollouts, no checkpoints, plots or W&B, and the values of the options this sub-command takes."""
    values = dict(vars(options))
    if values.get("micro_batch"):
        values["accumulation"] = options.completions // options.micro_batch
    overrides = [f"model.model_name_or_path={teacher}", f"student.model_name_or_path={student}", "logging=local",
                 "memory=manual",
                 "placement.rollout=vllm", "trainer.plot_metrics=false", "+trainer.save_strategy=no",
                 "++trainer.generation_kwargs.ignore_eos=true"]
    if output_dir is not None:
        overrides.append(f"output_dir={output_dir}")
    for name, templates in OVERRIDES.items():
        if values.get(name) is not None:
            overrides += [template.format(**values) for template in templates]
    return overrides


def compose_bench(options: argparse.Namespace, teacher: Path, student: Path, output_dir: Path | None = None):
    """The run config (a ``DictConfig``) every mode of one bench command reads its settings from."""
    from rlt_mono.config import compose

    return compose(RUN_CONFIG, bench_overrides(options, teacher, student, output_dir))


def grpo_configs(cfg, use_vllm: bool = True):
    """``(RLTConfig, trl.GRPOConfig)`` of the rlt and plain-TRL arms, both built from the same settings.

    The TRL arm gets every ``trl.GRPOConfig`` field the settings hold; RLTConfig's own fields have no TRL
    counterpart, and what its ``__post_init__`` folds into a TRL field (``vllm_detokenize`` into
    ``generation_kwargs``) is carried over. Fields TRL derives (``generation_batch_size``) are derived again from
    the same inputs.
    """
    import trl

    from rlt_mono.config import instantiate
    from rlt_mono.rl.build import trainer_kwargs
    from rlt_mono.rl.grpo_config import RLTConfig

    kwargs = trainer_kwargs(cfg, cfg.output_dir, use_vllm)
    rlt_args = instantiate(RLTConfig, kwargs, "trainer")
    trl_names = {field.name for field in dataclasses.fields(trl.GRPOConfig) if field.init}
    trl_kwargs = {name: value for name, value in kwargs.items() if name in trl_names}
    trl_kwargs["generation_kwargs"] = dict(rlt_args.generation_kwargs)
    return rlt_args, trl.GRPOConfig(**trl_kwargs)


def grpo_fields(args) -> dict:
    """The ``trl.GRPOConfig`` fields of a trainer's arguments (JSON values), less the arm-specific ones."""
    import trl

    names = {field.name for field in dataclasses.fields(trl.GRPOConfig)} - set(ARM_SPECIFIC)
    return {name: value for name, value in args.to_dict().items() if name in names}


def config_differences(first: dict, second: dict) -> list[str]:
    """Names of the fields whose values differ (or that only one side has)."""
    missing = object()
    names = first.keys() | second.keys()
    return sorted(name for name in names if first.get(name, missing) != second.get(name, missing))


def prompt_dataset(cfg, tokenizer, context: int):
    """The training prompts, prepared as ``build_trainer`` prepares them."""
    from rlt_mono.config import instantiate
    from rlt_mono.data.prompts import PromptFormat
    from rlt_mono.data.rows import DataConfig, prepare_dataset

    dataset, _ = prepare_dataset(instantiate(DataConfig, cfg.data, "data"), tokenizer, PromptFormat(), seed=cfg.seed,
                                 max_prompt_tokens=context - cfg.trainer.max_completion_length)
    return dataset


# ---- models and timing ---------------------------------------------------------------------------------------


def model_dir(arch: str, role: str, root: Path) -> Path:
    return root / f"{arch}-{role}"


def make_model(arch: str, role: str, root: Path, seed: int) -> Path:
    """A random-weight model of ``arch`` saved (bf16) with a padded local tokenizer; reused if present."""
    path = model_dir(arch, role, root)
    root.mkdir(parents=True, exist_ok=True)
    with exclusive(root / f".{arch}-{role}.lock"):  # the ranks of a dp run: one builds, the others wait and reuse
        if not (path / "config.json").exists():
            _build_model(arch, path, seed)
    return path


def _build_model(arch: str, path: Path, seed: int) -> None:
    import torch
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    from rlt_mono.data.embedded import build_tiny_pair

    tokenizer = AutoTokenizer.from_pretrained(build_tiny_pair().teacher_path)
    tokenizer.add_tokens([f"<|pad_{i}|>" for i in range(QWEN_VOCAB - len(tokenizer))])
    config = Qwen2Config(**ARCHS[arch], max_position_embeddings=32768, rope_theta=1e6, rms_norm_eps=1e-6,
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                         bos_token_id=None, dtype="bfloat16")
    torch.manual_seed(seed)
    with torch.device(f"cuda:{os.environ.get('LOCAL_RANK', '0')}"):  # a dp rank builds on its own GPU
        model = Qwen2ForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)


def after_first(items: list) -> list:
    """All but the first (warm-up) step, unless there is only one."""
    return items[1:] if len(items) > 1 else items


class StepTimer:
    """Wall time of each optimizer step, and the seconds spent in wrapped calls during it."""

    def __init__(self):
        from transformers import TrainerCallback

        timer = self

        class _Callback(TrainerCallback):
            def on_step_begin(self, args, state, control, **kwargs):
                timer.start = time.perf_counter()
                if timer.first_begin is None:
                    timer.first_begin = timer.start
                timer.current = {}

            def on_step_end(self, args, state, control, **kwargs):
                import torch

                torch.cuda.synchronize()
                timer.steps.append(time.perf_counter() - timer.start)
                timer.calls.append(timer.current)

        self.steps: list[float] = []
        self.calls: list[dict[str, float]] = []
        self.first_begin: float | None = None  # perf_counter at the first step's begin
        self.current: dict[str, float] = {}
        self.callback = _Callback()

    def wrap(self, obj, name: str, label: str | None = None) -> None:
        """Time ``obj.name(...)`` (GPU synchronised) into ``calls/<label>`` of the running step."""
        import torch

        fn = getattr(obj, name)

        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                torch.cuda.synchronize()
                key = label or (name if name != "wake_up" else "wake_" + "_".join(kwargs.get("tags") or ["all"]))
                self.current[key] = self.current.get(key, 0.0) + time.perf_counter() - start

        setattr(obj, name, timed)

    def wrap_generation(self, trainer) -> None:
        generation = trainer.vllm_generation
        self.wrap(generation, "sync_weights", "sync_weights (includes wake_weights)")
        if trainer.args.vllm_mode == "colocate":  # a server's engine (placement=async) is another process
            for name in ("generate", "sleep", "wake_up"):
                self.wrap(generation.llm, name)
        self.wrap(trainer, "_tokenize_prompts")

    def summary(self) -> dict:
        calls = after_first(self.calls)
        keys = sorted({k for c in calls for k in c})
        return {"step_seconds": self.steps, "median_step_seconds": statistics.median(after_first(self.steps)),
                **{f"calls/{k}": statistics.median(c.get(k, 0.0) for c in calls) for k in keys}}


# ---- modes (each runs in its own process) --------------------------------------------------------------------


def apply_cap(a) -> None:
    """``--cap-gib``: cap everything this process allocates through torch (vLLM's pool included); vLLM gets
    ``--vllm-gib`` of it."""
    import torch

    total = torch.cuda.get_device_properties(0).total_memory
    if a.cap_gib:
        torch.cuda.set_per_process_memory_fraction(a.cap_gib * 2**30 / total)
    if a.vllm_gib:
        a.util = a.vllm_gib * 2**30 / total


def run_folder(a, mode: str) -> Path:
    """The run's folder; the ranks of a dp run share their launcher's (their parent process's) one."""
    from rlt_mono import runtime

    return a.workdir / f"{mode}-{a.arch}-{os.getppid() if runtime.in_rank() else os.getpid()}"


def run_rlt(a) -> dict:
    apply_cap(a)
    start = time.perf_counter()
    teacher, student = make_model(a.arch, "teacher", a.models, 0), make_model(a.arch, "student", a.models, 1)
    models_s = time.perf_counter() - start
    with card_of(a.card_gib) as held:
        return {**run_rlt_steps(a, teacher, student, held), "setup/models_s": models_s, "card_gib": a.card_gib,
                "others_gib": held}


def run_rlt_steps(a, teacher: Path, student: Path, others_gib: float) -> dict:
    from rlt_mono import build_trainer
    from rlt_mono.runs.outputs import read_metrics

    out = run_folder(a, f"rlt-{a.placement}{a.gpus if a.placement == 'dp' else ''}")
    cfg = compose_bench(a, teacher, student, out)
    start = time.perf_counter()
    trainer = build_trainer(cfg)
    build_s = time.perf_counter() - start
    config = grpo_fields(trainer.args)
    prediction = predicted_peaks(cfg, trainer, a.arch)
    timer = StepTimer()
    trainer.add_callback(timer.callback)
    timer.wrap_generation(trainer)
    profiler = None
    if a.profile_step:
        from phase_profile import PhaseProfiler  # bench/ is on the path: this script runs from it

        profiler = PhaseProfiler(trainer, a.profile_step)
        trainer.add_callback(profiler.callback)  # after the step timer's: the step is timed before the profile is read
    start = time.perf_counter()
    trainer.train()
    to_first_step_s = (timer.first_begin or time.perf_counter()) - start
    if profiler is not None and len(timer.steps) >= a.profile_step:  # its syncs and tracing slow it: not a sample
        del timer.steps[a.profile_step - 1], timer.calls[a.profile_step - 1]
    all_rows = [r for r in read_metrics(out / "metrics.jsonl")
                if "reward" in r and not (profiler is not None and r.get("step") == a.profile_step)]
    rows = after_first(all_rows)
    prefixes = ("phase/", "swap/", "perf/", "vllm/", "overlap/", "timeline/", "generate/", "teacher_reward/total",
                "dp/", "async/")
    keys = sorted({k for r in rows for k in r if k.startswith(prefixes)})
    ranks = trainer.accelerator.num_processes
    completions = a.completions * ranks
    summary = timer.summary()
    return {"mode": "rlt", "placement": a.placement, "gpus": a.gpus, "ranks": ranks,
            "completions_per_step": completions,
            "completions_per_s": completions / summary["median_step_seconds"],
            "setup/build_trainer_s": build_s, "setup/to_first_step_s": to_first_step_s,
            "lora_r": cfg.model.lora_r, "load_in_4bit": cfg.model.load_in_4bit,
            "detokenize": trainer.args.generation_kwargs["detokenize"],
            "left_align_padding": trainer.args.left_align_padding,
            "use_liger_kernel": trainer.args.use_liger_kernel,
            **summary, **{k: statistics.median(r[k] for r in rows if k in r) for k in keys},
            **measured_peaks(all_rows, others_gib), **prediction, "memory": a.memory,
            "chosen": {**{k: v for k, v in vars(trainer.args).items() if k in CHOSEN},
                       "reward_micro_batch_size": cfg.reward.micro_batch_size},
            "student_gib": sum(p.numel() * p.element_size() for p in trainer.teacher_reward.student_model.parameters())
            / 2**30, "grpo_config": config, **({"profile": profiler.table} if profiler is not None else {})}


CHOSEN = ("vllm_gpu_memory_utilization", "per_device_train_batch_size", "gradient_accumulation_steps",
          "steps_per_generation", "activation_offloading", "offload_actor_in_generation")  # reported per rlt run


def measured_peaks(rows: list[dict], others_gib: float = 0.0) -> dict:
    """``device_peak/<phase>``: the largest device-level peak of each phase over every step (the first included:
    it creates the optimizer state), less ``others_gib`` held by other processes (``--card-gib``'s)."""
    peaks = {}
    for row in rows:
        for key, value in row.items():
            if key.startswith("phase/") and key.endswith("/device_peak_gib"):
                name = f"device_peak/{key.split('/')[1]}"
                peaks[name] = max(peaks.get(name, 0.0), value - others_gib)
    return peaks


@contextlib.contextmanager
def card_of(card_gib: float | None):
    """``--card-gib``: a child process allocates all but ``card_gib`` of the GPU's free memory and holds it for
    the block; yields the GiB the blocker holds (with its CUDA context), which the measured peaks leave out."""
    import torch

    if not card_gib:
        yield 0.0
        return
    torch.cuda.empty_cache()  # what building the models left cached goes back to the device first
    from rlt_mono import runtime

    gpu = runtime.local_rank()  # a dp rank's own GPU (0 outside a launch)
    before = torch.cuda.device_memory_used(gpu)
    ready = Path(tempfile.mkdtemp()) / "ready"
    code = ("import sys, time, torch\n"
            f"free, _ = torch.cuda.mem_get_info({gpu})\n"
            f"hold = torch.empty(free - int({card_gib} * 2**30), dtype=torch.uint8, device='cuda:{gpu}')\n"
            f"open({str(ready)!r}, 'w').close()\n"
            "time.sleep(86400)\n")
    blocker = subprocess.Popen([sys.executable, "-c", code])
    try:
        while not ready.exists():
            if blocker.poll() is not None:
                raise RuntimeError(f"the --card-gib blocker exited with code {blocker.returncode}")
            time.sleep(0.2)
        held = (torch.cuda.device_memory_used(gpu) - before) / 2**30
        free, _ = torch.cuda.mem_get_info(gpu)
        logger.info("--card-gib %s: %.2f GiB free for the run, %.2f GiB held by others", card_gib, free / 2**30, held)
        yield held
    finally:
        blocker.kill()
        blocker.wait()


def predicted_peaks(cfg, trainer, arch: str) -> dict:
    """The memory planner's per-phase prediction for this run (``predicted/<phase>`` in GiB, and its table),
    from the card's total memory and the longest prompt of the trainer's data; none for ``student_gpu`` and
    ``async``, which the planner does not cover (two GPUs)."""
    import torch

    from rlt_mono.memory import planner as memory_planner

    if cfg.placement.mode in ("student_gpu", "async"):
        return {}

    prompts = list(trainer.train_dataset["prompt"])
    longest = max(len(ids) for ids in trainer.processing_class(prompts, add_special_tokens=False).input_ids)
    total_gib = torch.cuda.get_device_properties(0).total_memory / 2**30
    settings = memory_planner.settings_from_config(cfg, total_gib=total_gib, arch=arch, prompt_length=longest)
    plan = memory_planner.plan(settings)
    return {**{f"predicted/{name.lower()}": phase.gib for name, phase in plan.phases.items()},
            "predicted_table": plan.table(), "prompt_length": longest}


def run_trl(a) -> dict:
    import torch
    import trl

    from rlt_mono.data.models import load_model, load_tokenizer, model_kwargs

    apply_cap(a)
    teacher = make_model(a.arch, "teacher", a.models, 0)
    cfg = compose_bench(a, teacher, model_dir(a.arch, "student", a.models), run_folder(a, "trl"))
    _, args = grpo_configs(cfg)
    # Model, tokenizer and prompts as build_trainer loads them for the rlt arm.
    tokenizer = load_tokenizer(str(teacher), "model.model_name_or_path")
    model = load_model(str(teacher), "model.model_name_or_path", **model_kwargs(cfg.model))
    dataset = prompt_dataset(cfg, tokenizer, model.config.max_position_embeddings)

    def constant_reward(completions, **_):
        return [0.0] * len(completions)

    timer = StepTimer()
    trainer = trl.GRPOTrainer(model=model, reward_funcs=constant_reward, args=args, train_dataset=dataset,
                              processing_class=tokenizer, callbacks=[timer.callback])
    config = grpo_fields(trainer.args)
    timer.wrap_generation(trainer)
    trainer.train()
    return {"mode": "trl", "detokenize": args.generation_kwargs["detokenize"], **timer.summary(),
            "peak_allocated_gib": torch.cuda.max_memory_allocated() / 2**30, "grpo_config": config}


def run_vllm(a, mode: str = "vllm") -> dict:
    from transformers import AutoConfig
    from vllm import LLM, SamplingParams

    from rlt_mono.data.models import load_tokenizer

    teacher = make_model(a.arch, "teacher", a.models, 0)
    cfg = compose_bench(a, teacher, model_dir(a.arch, "student", a.models))
    tokenizer = load_tokenizer(str(teacher), "model.model_name_or_path")
    dataset = prompt_dataset(cfg, tokenizer, AutoConfig.from_pretrained(teacher).max_position_embeddings)
    group = cfg.trainer.num_generations
    prompts = [dataset[i]["prompt"] for i in range(a.completions // group)]
    token_prompts = [{"prompt_token_ids": tokenizer(p).input_ids} for p in prompts for _ in range(group)]
    # TRL's engine settings (processed logprobs, 4096 batched tokens); the engine core in its own process
    # unless VLLM_ENABLE_V1_MULTIPROCESSING=0 (vllm_inproc).
    llm = LLM(model=str(teacher), gpu_memory_utilization=cfg.trainer.vllm_gpu_memory_utilization,
              max_num_batched_tokens=4096, seed=cfg.seed, logprobs_mode="processed_logprobs")
    length = cfg.trainer.max_completion_length
    forced = dict(temperature=cfg.trainer.temperature, max_tokens=length, min_tokens=length, ignore_eos=True)
    requests = {
        f"n{group}": (prompts, SamplingParams(n=group, **forced)),
        "trl_request": (token_prompts, SamplingParams(n=1, logprobs=0, **forced)),
        "trl_request_no_detokenize": (token_prompts, SamplingParams(n=1, logprobs=0, detokenize=False, **forced)),
    }
    result = {"mode": mode}
    for name, (inputs, params) in requests.items():
        runs = []
        for _ in range(3):
            start = time.perf_counter()
            outputs = llm.generate(inputs, params, use_tqdm=False)
            seconds = time.perf_counter() - start
            runs.append(sum(len(c.token_ids) for o in outputs for c in o.outputs) / seconds)
        result[f"{name}/tokens_per_s_runs"] = runs
        result[f"{name}/median_tokens_per_s"] = statistics.median(runs)
    result["median_tokens_per_s"] = result[f"n{group}/median_tokens_per_s"]
    return result


def run_vllm_inproc(a) -> dict:
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    return run_vllm(a, "vllm_inproc")


def run_pcie(a) -> dict:
    import torch

    n_bytes = int(a.pcie_gib * 2**30)
    host = torch.empty(n_bytes, dtype=torch.uint8).pin_memory()
    device = torch.empty(n_bytes, dtype=torch.uint8, device="cuda")
    runs = []
    for _ in range(5):
        torch.cuda.synchronize()
        start = time.perf_counter()
        device.copy_(host, non_blocking=True)
        torch.cuda.synchronize()
        runs.append(n_bytes / 2**30 / (time.perf_counter() - start))
    return {"mode": "pcie", "h2d_gib_per_s_runs": runs, "h2d_gib_per_s": statistics.median(after_first(runs))}


MODES = {"rlt": run_rlt, "trl": run_trl, "vllm": run_vllm, "vllm_inproc": run_vllm_inproc, "pcie": run_pcie}

# ---- results: a status per mode, written by the child, read by the parent ---------------------------------------

OK, OUT_OF_MEMORY, ERROR = "ok", "out_of_memory", "error"
CUDA_OOM_MESSAGES = ("CUDA out of memory", "CUDA error: out of memory")


def classify_failure(err: BaseException) -> str:
    """``out_of_memory`` if ``err`` or an exception it was raised from is a CUDA out-of-memory error (torch's
    ``OutOfMemoryError``, or a CUDA runtime error saying so); ``error`` for anything else (a full disk included)."""
    import torch

    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if isinstance(err, torch.OutOfMemoryError) or any(m in str(err) for m in CUDA_OOM_MESSAGES):
            return OUT_OF_MEMORY
        err = err.__cause__ or err.__context__
    return ERROR


def one_line(err: BaseException) -> str:
    lines = str(err).strip().splitlines()
    return f"{type(err).__name__}: {lines[0] if lines else ''}"[:500]


def run_mode(mode: str, a: argparse.Namespace) -> dict:
    """Run ``mode`` here; its measurements with ``status: ok``, or the status and message of what stopped it."""
    try:
        outcome = {**MODES[mode](a), "status": OK}
    except Exception as err:  # every failure becomes a status the parent reads
        logger.exception("%s failed", mode)
        outcome = {"status": classify_failure(err), "error": one_line(err)}
    # After the run: --vllm-gib sets util.
    header = {k: v for k, v in vars(a).items() if k in ("arch", "completion_length", "completions", "util")}
    return {"mode": mode, **header, **outcome}


def child_command(mode: str, argv: list[str], result_file: Path, errors_dir: str) -> tuple[list[str], dict]:
    """The command and environment of ``mode``'s child: this script, or for ``rlt --placement dp`` this script
    under ``accelerate launch`` (``rlt_mono.launch``), one rank per GPU of ``--gpus``, rank 0 writing the result."""
    command, env = [__file__, mode, *argv, "--result-file", str(result_file)], dict(os.environ)
    options = dict(zip(argv[::2], argv[1::2], strict=False))
    if mode == "rlt" and options.get("--placement") == "dp":
        from rlt_mono.launch import LaunchPlan, free_port

        gpus = int(options.get("--gpus", 1))
        plan = LaunchPlan(processes=gpus, num_machines=1, machine_rank=0, main_process_ip="127.0.0.1",
                          main_process_port=free_port(), strategy=options.get("--strategy", "ddp"), gpus=gpus)
        return [sys.executable, "-m", "rlt_mono.launch", *plan.accelerate_args(), *command], \
            {**env, **plan.environment(errors_dir),
             "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))}
    return [sys.executable, *command], env


def run_child(mode: str, argv: list[str], log_dir: Path) -> dict:
    """``mode`` in its own process (its own vLLM engine), its output in a log file; the result it wrote."""
    log_dir.mkdir(parents=True, exist_ok=True)
    log_fd, log_path = tempfile.mkstemp(prefix=f"{mode}-{time.strftime('%Y%m%d-%H%M%S')}-", suffix=".log",
                                        dir=log_dir)
    with tempfile.TemporaryDirectory() as tmp, os.fdopen(log_fd, "w") as log:
        result_file = Path(tmp) / "result.json"
        logger.info("%s: running, log %s", mode, log_path)
        command, env = child_command(mode, argv, result_file, tmp)
        start = time.perf_counter()
        proc = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
        process_seconds = time.perf_counter() - start
        if result_file.exists():
            result = json.loads(result_file.read_text())
        else:
            result = {"mode": mode, "status": ERROR,
                      "error": f"the child exited with code {proc.returncode} without writing a result"}
    return {**result, "process_seconds": process_seconds, "log": log_path}


Runner = Callable[[str, list[str]], dict]


def run_all(a: argparse.Namespace, runner: Runner) -> Iterator[dict]:
    """Each of ``--modes`` in turn; the second training arm is an error if its GRPO fields differ from the first's."""
    arms = {}
    for mode in a.modes.split(","):
        result = runner(mode, child_argv(mode, a))
        if result["status"] == OK and mode in ("rlt", "trl"):
            arms[mode] = result
            if len(arms) == 2:
                differences = config_differences(arms["rlt"]["grpo_config"], arms["trl"]["grpo_config"])
                if differences:
                    result.update(status=ERROR, error=f"GRPO config differs from the other arm's in {differences}")
        yield result


def envelope(a: argparse.Namespace, runner: Runner) -> Iterator[dict]:
    """Increasing micro-batches under the cap until one runs out of memory or fails (see the module docstring)."""
    for micro in (int(m) for m in a.micro_batches.split(",")):
        attempt = argparse.Namespace(**vars(a), micro_batch=micro, score_micro_batch=micro,
                                     completions=micro * a.accumulation)
        start = time.perf_counter()
        result = runner("rlt", child_argv("rlt", attempt))
        result.update(micro_batch=micro, completions_per_step=micro * a.accumulation, cap_gib=a.cap_gib,
                      vllm_gib=a.vllm_gib, fits={OK: True, OUT_OF_MEMORY: False}.get(result["status"]),
                      wall_seconds=time.perf_counter() - start)
        yield result
        if result["status"] != OK:
            return


def planner_pairs(text: str) -> list[tuple[str, int, int | None]]:
    """``arch:completion_length[:micro_batch]`` entries, comma-separated."""
    pairs = []
    for entry in text.split(","):
        fields = entry.split(":")
        if len(fields) not in (2, 3) or fields[0] not in ARCHS or not all(f.isdigit() for f in fields[1:]):
            raise ValueError(f"--pairs entry {entry!r}: expected arch:completion_length[:micro_batch], arch one of "
                             f"{','.join(ARCHS)}")
        pairs.append((fields[0], int(fields[1]), int(fields[2]) if len(fields) == 3 else None))
    return pairs


def planner(a: argparse.Namespace, runner: Runner) -> Iterator[dict]:
    """One rlt run per pair; each result gains ``ratio/<phase>`` = predicted / measured device-level peak."""
    for arch, length, micro in planner_pairs(a.pairs):
        attempt = argparse.Namespace(**vars(a), arch=arch, completion_length=length,
                                     micro_batch=micro or OPTIONS["--micro-batch"]["default"])
        result = runner("rlt", child_argv("rlt", attempt))
        result.update(micro_batch=attempt.micro_batch)
        for key in [k for k in result if k.startswith("device_peak/")]:
            phase = key.split("/")[1]
            if result.get(f"predicted/{phase}") and result[key] > 0:
                result[f"ratio/{phase}"] = result[f"predicted/{phase}"] / result[key]
        yield result


GPUS_OF = {"mono": 1, "student_gpu": 2, "split": 2, "async": 2}  # GPUs each placement or arm uses; dp uses --gpus
# A scale arm's name -> (placement, placement.strategy); None: the placement has no strategy. split is
# cfgs/placement/split.yaml: dp over two GPUs.
ARMS = {"mono": ("mono", None), "student_gpu": ("student_gpu", None), "split": ("dp", "ddp"), "dp": ("dp", "ddp"),
        "fsdp2": ("dp", "fsdp2"), "async": ("async", None)}


def scale_arms(text: str) -> list[tuple[str, int]]:
    """``arm:gpus`` entries, comma-separated (``ARMS``; mono takes 1 GPU, student_gpu, split and async 2), each once."""
    arms = []
    for entry in text.split(","):
        arm, _, gpus = entry.partition(":")
        if arm not in ARMS or not gpus.isdigit() or int(gpus) < 1 or int(gpus) != GPUS_OF.get(arm, int(gpus)):
            raise ValueError(f"--arms entry {entry!r}: expected arm:gpus, mono:1, student_gpu:2, split:2, async:2, "
                             "dp:<N> or fsdp2:<N>")
        if (arm, int(gpus)) in arms:
            raise ValueError(f"--arms lists {entry} twice: --rounds runs the arms again")
        arms.append((arm, int(gpus)))
    return arms


def scale_order(arms: list[tuple[str, int]], rounds: int) -> Iterator[tuple[int, int, tuple[str, int]]]:
    """``(round, position, arm)`` of each run, counted from 1: the arms in order in odd rounds, reversed in even
    ones, so that no arm always runs first or last while the machine warms up (clocks, caches, the models' files)."""
    for round_ in range(1, rounds + 1):
        for position, arm in enumerate(arms if round_ % 2 else arms[::-1], 1):
            yield round_, position, arm


def scale(a: argparse.Namespace, runner: Runner) -> Iterator[dict]:
    """One rlt run per arm and round (``scale_order``); each result says its round and position, and an ok one gains
    ``optimizer_steps_per_s`` (one optimizer step per median step). With ``--max-minutes``, a run that would end
    past it (by the longest run so far) is not started, nor any after it."""
    start, longest = time.monotonic(), 0.0
    order = list(scale_order(scale_arms(a.arms), a.rounds))
    for run, (round_, position, (arm, gpus)) in enumerate(order, 1):
        elapsed = time.monotonic() - start
        if a.max_minutes is not None and elapsed + longest > a.max_minutes * 60:
            logger.info("scale: stopped before run %d of %d, %s (%.1f of --max-minutes %g spent; the longest run "
                        "took %.1f min)", run, len(order), arm, elapsed / 60, a.max_minutes, longest / 60)
            return
        placement, strategy = ARMS[arm]
        attempt = argparse.Namespace(**vars(a), placement=placement, gpus=gpus, strategy=strategy)
        result = runner("rlt", child_argv("rlt", attempt))
        longest = max(longest, time.monotonic() - start - elapsed)
        result.update(placement=arm, gpus=gpus, round=round_, position=position)
        if result["status"] == OK:
            result["optimizer_steps_per_s"] = 1 / result["median_step_seconds"]
        yield result


RATIO_FIGURES = ("optimizer_steps_per_s", "completions_per_s")  # each arm against the baseline, round by round
RUN_FIGURES = ("step_seconds", "median_step_seconds", "completions_per_s", "optimizer_steps_per_s")  # kept per run
# Where a run's time outside its steps goes (kept per run where the run reports them): the child process from start to
# exit, building the models, building the trainer (vLLM's engine started), and from train() to the first step.
SETUP_FIGURES = ("process_seconds", "setup/models_s", "setup/build_trainer_s", "setup/to_first_step_s")


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def scale_summary(results: list[dict], arms: list[tuple[str, int]]) -> dict:
    """Each arm over the rounds: its runs, the medians over its ok ones, the rounds it failed, and against the first arm
    (the baseline) the ratio of each of ``RATIO_FIGURES`` in every round both ran ok, with their median and its
    bootstrap interval over those rounds (none from one round). A ratio pairs two runs of one round, minutes apart on
    the same machine, so what drifts between rounds weighs on both sides."""
    from rlt_mono.study.eval_stats import median_interval

    by_arm: dict[str, dict[int, dict]] = {f"{arm}:{gpus}": {} for arm, gpus in arms}
    for r in results:
        by_arm[f"{r['placement']}:{r['gpus']}"][r["round"]] = r
    baseline = next(iter(by_arm))
    entries = []
    for label, runs in by_arm.items():
        ok = [r for r in runs.values() if r["status"] == OK]
        entry = {
            "arm": label, "completions_per_step": next((r["completions_per_step"] for r in ok), None),
            "runs": [{"round": r["round"], "position": r["position"], "status": r["status"],
                      **({k: r[k] for k in RUN_FIGURES} if r["status"] == OK else {"error": r.get("error", "")}),
                      **{k: r[k] for k in SETUP_FIGURES if k in r}}
                     for r in runs.values()],
            "rounds_ok": len(ok), "failed_rounds": [r["round"] for r in runs.values() if r["status"] != OK],
            "median_step_seconds": _median([r["median_step_seconds"] for r in ok]),
            "median_completions_per_s": _median([r["completions_per_s"] for r in ok]),
            "median_optimizer_steps_per_s": _median([r["optimizer_steps_per_s"] for r in ok])}
        if label != baseline:
            base = by_arm[baseline]
            paired = [(r, base[r["round"]]) for r in ok if base.get(r["round"], {}).get("status") == OK]
            ratios = {figure: [r[figure] / b[figure] for r, b in paired] for figure in RATIO_FIGURES}
            entry["vs_baseline"] = {"rounds": [r["round"] for r, _ in paired], **{
                figure: {"per_round": values, "median": _median(values), "interval": median_interval(values)}
                for figure, values in ratios.items()}}
        entries.append(entry)
    return {"baseline": baseline, "arms": entries}


def scale_table(results: list[dict]) -> str:
    """Every run of a ``scale`` command in the order they ran."""
    lines = ["| round | position | placement | GPUs | completions / step | median step | completions / s | "
             "optimizer steps / s | generate / score / train (rank 0) | process: models / trainer / to step 1 |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in results:
        where = f"| {r['round']} | {r['position']} | {r['placement']} | {r['gpus']} |"
        if r["status"] != OK:
            lines.append(f"{where} | {r['status']}: {r.get('error', '')} | | | | |")
            continue
        phases = " / ".join(f"{r.get(f'phase/{p}/seconds', float('nan')):.2f}" for p in ("generate", "score", "train"))
        setup = " / ".join(f"{r.get(k, float('nan')):.0f}" for k in SETUP_FIGURES[1:])
        lines.append(f"{where} {r['completions_per_step']} | {r['median_step_seconds']:.2f} s | "
                     f"{r['completions_per_s']:.2f} | {r['optimizer_steps_per_s']:.3f} | {phases} s | "
                     f"{r.get('process_seconds', float('nan')):.0f} s: {setup} s |")
    return "\n".join(lines)


def _ratio_cell(vs: dict, figure: str) -> str:
    """``median× [low, high]`` and the ratio of each round, or why there is no interval."""
    ratio = vs[figure]
    if not ratio["per_round"]:
        return "no round where both ran"
    interval = ratio["interval"]
    bounds = "one round: no interval" if interval["low"] is None else f"[{interval['low']:.2f}, {interval['high']:.2f}]"
    rounds = ", ".join(f"r{n} {value:.2f}" for n, value in zip(vs["rounds"], ratio["per_round"], strict=True))
    return f"**{ratio['median']:.2f}×** {bounds} ({rounds})"


def scale_summary_table(summary: dict) -> str:
    """The arms over their rounds (``scale_summary``), as docs quote them."""
    base = summary["baseline"]
    lines = [f"| arm | completions / step | rounds ok | median step | completions / s | optimizer steps / s | "
             f"optimizer steps / s vs {base}: median [95% interval] (per round) | completions / s vs {base} | failed |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for e in summary["arms"]:
        failed = "; ".join(f"r{run['round']} {run['status']}: {run['error']}" for run in e["runs"]
                           if run["status"] != OK)
        if not e["rounds_ok"]:
            lines.append(f"| {e['arm']} | | 0 of {len(e['runs'])} | | | | | | {failed} |")
            continue
        vs = ([_ratio_cell(e["vs_baseline"], figure) for figure in RATIO_FIGURES] if "vs_baseline" in e
              else ["baseline", "baseline"])
        lines.append(f"| {e['arm']} | {e['completions_per_step']} | {e['rounds_ok']} of {len(e['runs'])} | "
                     f"{e['median_step_seconds']:.2f} s | {e['median_completions_per_s']:.2f} | "
                     f"{e['median_optimizer_steps_per_s']:.3f} | {vs[0]} | {vs[1]} | {failed} |")
    return "\n".join(lines)


def code_commit(mark_changes: bool = False) -> str:
    """``git rev-parse --short HEAD`` of this checkout, with "+changes" where ``mark_changes`` and tracked files
    differ from it; ``unknown`` in a copy of the code without git."""
    def git(*command: str) -> str:
        return subprocess.run(["git", *command], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()

    try:
        changed = mark_changes and git("status", "--porcelain", "--untracked-files=no")
        return git("rev-parse", "--short", "HEAD") + ("+changes" if changed else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def visible_gpus() -> str:
    """The GPUs this command's runs see, e.g. ``2 x NVIDIA H200``: nvidia-smi's names, only those in
    CUDA_VISIBLE_DEVICES where it is set; ``unknown`` where nvidia-smi does not answer."""
    command = ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"]
    if os.environ.get("CUDA_VISIBLE_DEVICES"):
        command += ["--id", os.environ["CUDA_VISIBLE_DEVICES"]]
    try:
        listing = subprocess.run(command, capture_output=True, text=True, check=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    names = Counter(line.strip() for line in listing.splitlines() if line.strip())
    return ", ".join(f"{count} x {name}" for name, count in names.items()) or "unknown"


def command_line(argv: list[str]) -> str:
    """The command as typed again to repeat it: this script's arguments, and the GPUs it was given."""
    gpus = os.environ.get("CUDA_VISIBLE_DEVICES")
    script = Path(__file__).resolve().relative_to(ROOT)
    return (f"CUDA_VISIBLE_DEVICES={gpus} " if gpus else "") + shlex.join(["python3", str(script), *argv])


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser()
    a = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    if {"completions", "micro_batch"} <= vars(a).keys() and a.completions % a.micro_batch:
        parser.error(f"--completions {a.completions} must be a multiple of --micro-batch {a.micro_batch}")
    if a.command in MODES:
        from rlt_mono import runtime

        if a.command == "rlt" and a.gpus != GPUS_OF.get(a.placement, max(a.gpus, 1)):
            parser.error(f"--gpus {a.gpus} with --placement {a.placement}: mono takes 1, student_gpu and async 2, dp 1 "
                         "or more")
        if a.command == "rlt" and a.strategy is not None and a.placement != "dp":
            parser.error(f"--strategy {a.strategy} is placement dp's (how its ranks hold the teacher): add "
                         "--placement dp")
        result = run_mode(a.command, a)
        if runtime.rank() != 0:  # a dp rank other than the first: rank 0 reports
            return 0 if result["status"] == OK else 1
        if a.result_file:
            write_json(a.result_file, result)
        else:
            print(json.dumps(result), flush=True)
        return 0 if result["status"] == OK else 1
    if a.command == "all":
        unknown = sorted(set(a.modes.split(",")) - MODES.keys())
        if unknown:
            parser.error(f"--modes: unknown {unknown}; modes: {','.join(MODES)}")

    def runner(mode: str, child: list[str]) -> dict:
        return run_child(mode, child, a.workdir / "logs")

    try:
        if a.command == "planner":
            planner_pairs(a.pairs)
        if a.command == "scale":
            scale_arms(a.arms)
    except ValueError as err:
        parser.error(str(err))
    if a.command == "scale" and a.rounds < 1:
        parser.error(f"--rounds {a.rounds}: the arms must run at least once (1 or more)")
    if a.command == "scale" and a.max_minutes is not None and not a.max_minutes > 0:
        parser.error(f"--max-minutes {a.max_minutes}: a time above 0")
    header = None
    if a.command == "scale":
        header = {"commit": a.commit or code_commit(), "device": visible_gpus(), "command": command_line(argv),
                  "rounds": a.rounds, "arms": a.arms}

    def record(results: list[dict]):
        """--out's content: the results, and for scale what ran them and the summary over the rounds."""
        if header is None:
            return results
        return {**header, "results": results, "summary": scale_summary(results, scale_arms(a.arms))}

    runs = {"envelope": envelope, "planner": planner, "scale": scale}.get(a.command, run_all)(a, runner)
    results = []
    for result in runs:
        results.append(result)
        if a.out:
            write_json(a.out, record(results))
        print(json.dumps(result), flush=True)
    if a.command == "envelope":
        fitting = [r["micro_batch"] for r in results if r["fits"]]
        logger.info("largest micro-batch that fits: %s; stopped by: %s", max(fitting, default=None),
                    results[-1]["status"] if results[-1]["status"] != OK else "none (all fit)")
        return 1 if results[-1]["status"] == ERROR else 0
    if a.command == "scale":
        logger.info("throughput, each run:\n%s", scale_table(results))
        logger.info("throughput over %d round(s):\n%s", a.rounds,
                    scale_summary_table(scale_summary(results, scale_arms(a.arms))))
    return 0 if all(r["status"] == OK for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
