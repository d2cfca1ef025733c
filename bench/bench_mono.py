"""GPU benchmark of one RLT step against plain TRL and standalone vLLM (issue: "One GPU for real").

Random-weight Qwen2.5 architectures (configs written here, no download), a byte-level BPE tokenizer padded
to Qwen2.5's 151,936 entries, forced completion lengths (``min_tokens = max_tokens``, EOS ignored) so every
run generates the same number of tokens. Each mode runs in its own process (its own vLLM engine):

    python bench/bench_mono.py all --arch 0.5b --completion-length 1024 --steps 8 --out results.json
    python bench/bench_mono.py rlt|trl|vllm|vllm_inproc|pcie ...   # one mode, prints one JSON line
    python bench/bench_mono.py envelope --arch 0.5b --cap-gib 12 --vllm-gib 4 --micro-batches 2,4,8,16

Modes: ``rlt`` rlt_mono step (teacher + student of the same architecture, reference and student offloaded);
``trl`` plain ``trl.GRPOTrainer`` colocate step with a constant reward on the same model, batch and lengths;
``vllm`` standalone vLLM generation of the same prompts at the same memory utilisation, with vLLM's default
sampling request (``n=8``) and with TRL's (``n=1`` per repeated prompt, sampled-token logprobs), with and
without detokenization; ``vllm_inproc`` the same with the engine core in this process, as in colocate mode;
``pcie`` a plain pinned host-to-device copy (the bound for swap time). Step time is the median of the
optimizer steps after the first (wall time between on_step_begin and on_step_end). ``rlt`` and ``trl`` also
time, per step, the engine calls inside generation (``calls/*``: weight sync, KV-cache wake, vLLM generate,
sleep, prompt tokenization).

``envelope``: the largest micro-batch (completions per forward/backward; completions per step =
micro-batch x ``--accumulation``) for which two rlt_mono steps fit under a memory cap. The cap is applied with
``torch.cuda.set_per_process_memory_fraction(cap / total)``; vLLM gets ``--vllm-gib`` of it
(``gpu_memory_utilization = vllm_gib / total``). vLLM's pool goes through torch's allocator and stays counted
while vLLM sleeps, so the trainer's budget is ``cap - vllm_gib`` in every phase (conservative: on a card of
that size, sleeping vLLM returns its memory to the trainer). Micro-batches are tried in increasing order until
one fails.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

ARCHS = {  # Qwen2.5 architectures (config.json of the public checkpoints)
    "0.5b": dict(hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                 intermediate_size=4864, vocab_size=151936, tie_word_embeddings=True),
    "1.5b": dict(hidden_size=1536, num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2,
                 intermediate_size=8960, vocab_size=151936, tie_word_embeddings=True),
    "7b": dict(hidden_size=3584, num_hidden_layers=28, num_attention_heads=28, num_key_value_heads=4,
               intermediate_size=18944, vocab_size=152064, tie_word_embeddings=False),
}
QWEN_VOCAB = 151936


def make_model(arch: str, role: str, root: Path, seed: int) -> Path:
    """A random-weight model of ``arch`` saved (bf16) with a padded local tokenizer; reused if present."""
    import torch
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    from rlt_mono.embedded import build_tiny_pair

    path = root / f"{arch}-{role}"
    if (path / "config.json").exists():
        return path
    tokenizer = AutoTokenizer.from_pretrained(build_tiny_pair().teacher_path)
    tokenizer.add_tokens([f"<|pad_{i}|>" for i in range(QWEN_VOCAB - len(tokenizer))])
    config = Qwen2Config(**ARCHS[arch], max_position_embeddings=32768, rope_theta=1e6, rms_norm_eps=1e-6,
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                         bos_token_id=None, dtype="bfloat16")
    torch.manual_seed(seed)
    with torch.device("cuda"):
        model = Qwen2ForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


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
                timer.current = {}

            def on_step_end(self, args, state, control, **kwargs):
                import torch

                torch.cuda.synchronize()
                timer.steps.append(time.perf_counter() - timer.start)
                timer.calls.append(timer.current)

        self.steps: list[float] = []
        self.calls: list[dict[str, float]] = []
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
        for name in ("generate", "sleep", "wake_up"):
            self.wrap(generation.llm, name)
        self.wrap(trainer, "_tokenize_prompts")

    def summary(self) -> dict:
        calls = after_first(self.calls)
        keys = sorted({k for c in calls for k in c})
        return {"step_seconds": self.steps, "median_step_seconds": statistics.median(after_first(self.steps)),
                **{f"calls/{k}": statistics.median(c.get(k, 0.0) for c in calls) for k in keys}}


def common_args(a) -> dict:
    return dict(
        max_steps=a.steps, per_device_train_batch_size=a.micro_batch,
        gradient_accumulation_steps=a.completions // a.micro_batch, steps_per_generation=a.completions // a.micro_batch,
        num_generations=8, max_completion_length=a.completion_length, temperature=0.7, beta=0.04,
        loss_type="grpo", learning_rate=1e-6, bf16=True, gradient_checkpointing=True, optim=a.optim,
        use_vllm=True, vllm_mode="colocate", vllm_gpu_memory_utilization=a.util, vllm_enable_sleep_mode=True,
        generation_kwargs={"min_tokens": a.completion_length, "ignore_eos": True},
        logging_steps=1, save_strategy="no", report_to=[], seed=0,
    )


def apply_cap(a) -> None:
    """``--cap-gib``: cap everything this process allocates through torch (vLLM's pool included); vLLM gets
    ``--vllm-gib`` of it."""
    import torch

    total = torch.cuda.get_device_properties(0).total_memory
    if a.cap_gib:
        torch.cuda.set_per_process_memory_fraction(a.cap_gib * 2**30 / total)
    if a.vllm_gib:
        a.util = a.vllm_gib * 2**30 / total


def run_rlt(a) -> dict:
    from rlt_mono import build_trainer, compose
    from rlt_mono.outputs import read_metrics

    apply_cap(a)
    teacher, student = make_model(a.arch, "teacher", a.models, 0), make_model(a.arch, "student", a.models, 1)
    out = Path(a.workdir) / f"rlt-{a.arch}-{a.placement}-{os.getpid()}"
    g = common_args(a)
    overrides = [f"output_dir={out}", f"model.model_name_or_path={teacher}", f"student.model_name_or_path={student}",
                 "logging=local", "trainer.plot_metrics=false", "+trainer.save_strategy=no",
                 f"++trainer.generation_kwargs.min_tokens={a.completion_length}",
                 "++trainer.generation_kwargs.ignore_eos=true",
                 f"reward.micro_batch_size={a.score_micro_batch}", f"placement={a.placement}"]
    if a.detokenize is not None:
        overrides.append(f"trainer.vllm_detokenize={a.detokenize}")
    overrides += [f"trainer.{k}={v}" for k, v in g.items() if k in (
        "max_steps", "per_device_train_batch_size", "gradient_accumulation_steps", "steps_per_generation",
        "max_completion_length", "optim", "vllm_gpu_memory_utilization")]
    trainer = build_trainer(compose("teacher_rlt_mono", overrides))
    timer = StepTimer()
    trainer.add_callback(timer.callback)
    timer.wrap_generation(trainer)
    trainer.train()
    rows = after_first([r for r in read_metrics(out / "metrics.jsonl") if "reward" in r])
    prefixes = ("phase/", "swap/", "perf/", "vllm/", "overlap/", "timeline/", "generate/", "teacher_reward/total")
    keys = sorted({k for r in rows for k in r if k.startswith(prefixes)})
    return {"mode": "rlt", "placement": a.placement, "detokenize": a.detokenize, **timer.summary(),
            **{k: statistics.median(r[k] for r in rows if k in r) for k in keys},
            "student_gib": sum(p.numel() * p.element_size() for p in trainer.teacher_reward.student_model.parameters())
            / 2**30}


def run_trl(a) -> dict:
    import torch
    import trl

    from rlt_mono.data import DataConfig, prepare_dataset
    from rlt_mono.prompts import PromptFormat

    teacher = make_model(a.arch, "teacher", a.models, 0)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(teacher)
    dataset, _ = prepare_dataset(DataConfig(embedded_rows=512), tokenizer, PromptFormat())

    def constant_reward(completions, **_):
        return [0.0] * len(completions)

    args = trl.GRPOConfig(output_dir=str(Path(a.workdir) / f"trl-{a.arch}"), model_init_kwargs={"dtype": "bfloat16"},
                          **common_args(a))
    if a.detokenize is not None:
        args.generation_kwargs["detokenize"] = a.detokenize == "true"
    timer = StepTimer()
    trainer = trl.GRPOTrainer(model=str(teacher), reward_funcs=constant_reward, args=args, train_dataset=dataset,
                              processing_class=tokenizer, callbacks=[timer.callback])
    timer.wrap_generation(trainer)
    trainer.train()
    return {"mode": "trl", "detokenize": a.detokenize, **timer.summary(),
            "peak_allocated_gib": torch.cuda.max_memory_allocated() / 2**30}


def run_vllm(a, mode: str = "vllm") -> dict:
    from transformers import AutoTokenizer
    from vllm import LLM, SamplingParams

    from rlt_mono.data import DataConfig, prepare_dataset
    from rlt_mono.prompts import PromptFormat

    teacher = make_model(a.arch, "teacher", a.models, 0)
    tokenizer = AutoTokenizer.from_pretrained(teacher)
    dataset, _ = prepare_dataset(DataConfig(embedded_rows=512), tokenizer, PromptFormat())
    prompts = [dataset[i]["prompt"] for i in range(a.completions // 8)]
    token_prompts = [{"prompt_token_ids": tokenizer(p).input_ids} for p in prompts for _ in range(8)]
    # TRL's engine settings (processed logprobs, 4096 batched tokens); the engine core in its own process
    # unless VLLM_ENABLE_V1_MULTIPROCESSING=0 (vllm_inproc).
    llm = LLM(model=str(teacher), gpu_memory_utilization=a.util, max_num_batched_tokens=4096, seed=0,
              logprobs_mode="processed_logprobs")
    forced = dict(temperature=0.7, max_tokens=a.completion_length, min_tokens=a.completion_length, ignore_eos=True)
    requests = {
        "n8": (prompts, SamplingParams(n=8, **forced)),
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
    result["median_tokens_per_s"] = result["n8/median_tokens_per_s"]
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


def run_child(mode: str, argv: list[str]) -> dict:
    """One mode in its own process (its own vLLM engine); its RESULT line, or the error it died of."""
    proc = subprocess.run([sys.executable, __file__, mode, *argv], capture_output=True, text=True, env=os.environ)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if lines:
        return json.loads(lines[-1][7:])
    errors = [ln for ln in proc.stderr.splitlines() if "Error" in ln or "error" in ln]
    return {"mode": mode, "returncode": proc.returncode, "error": errors[-1][-500:] if errors else "",
            "stderr_tail": proc.stderr[-3000:]}


def envelope(a, argv: list[str]):
    """Increasing micro-batches under the cap until one fails (see the module docstring)."""
    for micro in (int(m) for m in a.micro_batches.split(",")):
        child = [*argv, "--micro-batch", str(micro), "--score-micro-batch", str(micro),
                 "--completions", str(micro * a.accumulation), "--steps", str(a.steps)]
        start = time.perf_counter()
        result = run_child("rlt", child)
        result.update(micro_batch=micro, completions_per_step=micro * a.accumulation, cap_gib=a.cap_gib,
                      vllm_gib=a.vllm_gib, fits="error" not in result, wall_seconds=time.perf_counter() - start)
        yield result
        if not result["fits"]:
            return


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("mode", choices=[*MODES, "all", "envelope"])
    p.add_argument("--arch", choices=list(ARCHS), default="0.5b")
    p.add_argument("--completion-length", type=int, default=1024)
    p.add_argument("--completions", type=int, default=32, help="completions per optimizer step")
    p.add_argument("--micro-batch", type=int, default=4)
    p.add_argument("--score-micro-batch", type=int, default=4)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--util", type=float, default=0.3)
    p.add_argument("--optim", default="adamw_bnb_8bit")
    p.add_argument("--pcie-gib", type=float, default=1.0)
    p.add_argument("--placement", choices=["mono", "split"], default="mono", help="rlt mode: placement")
    p.add_argument("--models", type=Path, default=Path("/tmp/bench_models"))
    p.add_argument("--workdir", default="/tmp/bench_runs")
    p.add_argument("--modes", default="pcie,vllm,trl,rlt", help="for 'all': which, in order")
    p.add_argument("--detokenize", choices=["true", "false"],
                   help="rlt, trl: vLLM detokenization (default: rlt_mono's config; TRL's default)")
    p.add_argument("--cap-gib", type=float, help="rlt mode: cap on torch-allocated GPU memory (vLLM's included)")
    p.add_argument("--vllm-gib", type=float, help="rlt mode: vLLM's share; overrides --util")
    p.add_argument("--micro-batches", default="2,4,8,16", help="envelope: micro-batches to try, increasing")
    p.add_argument("--accumulation", type=int, default=8, help="envelope: micro-batches per optimizer step")
    p.add_argument("--out", type=Path)
    a = p.parse_args()
    if a.mode in MODES:
        measured = MODES[a.mode](a)  # may set a.util from --vllm-gib
        result = {"arch": a.arch, "completion_length": a.completion_length, "completions": a.completions,
                  "util": a.util, **measured}
        print("RESULT " + json.dumps(result), flush=True)
        return
    argv = sys.argv[2:]
    runs = envelope(a, argv) if a.mode == "envelope" else (run_child(mode, argv) for mode in a.modes.split(","))
    results = []
    for result in runs:
        results.append(result)
        if a.out:
            a.out.write_text(json.dumps(results, indent=1))
        print(json.dumps({k: v for k, v in result.items() if k != "stderr_tail"})[:3000], flush=True)


if __name__ == "__main__":
    main()
