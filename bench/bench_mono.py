"""GPU benchmark of one RLT step against plain TRL and standalone vLLM (issue: "One GPU for real").

Random-weight Qwen2.5 architectures (configs written here, no download), a byte-level BPE tokenizer padded
to Qwen2.5's 151,936 entries, forced completion lengths (``min_tokens = max_tokens``, EOS ignored) so every
run generates the same number of tokens. Each mode runs in its own process (its own vLLM engine):

    python bench/bench_mono.py all --arch 0.5b --completion-length 1024 --steps 4 --out results.json
    python bench/bench_mono.py rlt|trl|vllm|pcie ...   # one mode, prints one JSON line

Modes: ``rlt`` rlt_mono step (teacher + student of the same architecture, reference and student offloaded);
``trl`` plain ``trl.GRPOTrainer`` colocate step with a constant reward on the same model, batch and lengths;
``vllm`` standalone vLLM generation of the same prompts at the same memory utilisation; ``pcie`` a plain
pinned host-to-device copy of the student's bytes (the bound for swap time). Step time is the median of the
optimizer steps after the first (wall time between on_step_begin and on_step_end).
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


class StepTimer:
    """Wall time of each optimizer step."""

    def __init__(self):
        from transformers import TrainerCallback

        timer = self

        class _Callback(TrainerCallback):
            def on_step_begin(self, args, state, control, **kwargs):
                timer.start = time.perf_counter()

            def on_step_end(self, args, state, control, **kwargs):
                import torch

                torch.cuda.synchronize()
                timer.steps.append(time.perf_counter() - timer.start)

        self.steps: list[float] = []
        self.callback = _Callback()

    def median_after_first(self) -> float:
        return statistics.median(self.steps[1:] if len(self.steps) > 1 else self.steps)


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


def run_rlt(a) -> dict:
    from rlt_mono import build_trainer, compose
    from rlt_mono.outputs import read_metrics

    teacher, student = make_model(a.arch, "teacher", a.models, 0), make_model(a.arch, "student", a.models, 1)
    out = Path(a.workdir) / f"rlt-{a.arch}-{a.placement}"
    g = common_args(a)
    overrides = [f"output_dir={out}", f"model.model_name_or_path={teacher}", f"student.model_name_or_path={student}",
                 "logging=local", "trainer.plot_metrics=false", "+trainer.save_strategy=no",
                 f"+trainer.generation_kwargs={{min_tokens:{a.completion_length},ignore_eos:true}}",
                 f"reward.micro_batch_size={a.score_micro_batch}", f"placement={a.placement}"]
    overrides += [f"trainer.{k}={v}" for k, v in g.items() if k in (
        "max_steps", "per_device_train_batch_size", "gradient_accumulation_steps", "steps_per_generation",
        "max_completion_length", "optim", "vllm_gpu_memory_utilization")]
    trainer = build_trainer(compose("teacher_rlt_mono", overrides))
    timer = StepTimer()
    trainer.add_callback(timer.callback)
    trainer.train()
    rows = [r for r in read_metrics(out / "metrics.jsonl") if "reward" in r]
    rows = rows[1:] if len(rows) > 1 else rows
    prefixes = ("phase/", "swap/", "perf/", "vllm/", "overlap/", "timeline/", "teacher_reward/total")
    keys = sorted({k for r in rows for k in r if k.startswith(prefixes)})
    return {"mode": "rlt", "placement": a.placement, "step_seconds": timer.steps,
            "median_step_seconds": timer.median_after_first(),
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
    timer = StepTimer()
    trainer = trl.GRPOTrainer(model=str(teacher), reward_funcs=constant_reward, args=args, train_dataset=dataset,
                              processing_class=tokenizer, callbacks=[timer.callback])
    trainer.train()
    return {"mode": "trl", "step_seconds": timer.steps, "median_step_seconds": timer.median_after_first(),
            "peak_allocated_gib": torch.cuda.max_memory_allocated() / 2**30}


def run_vllm(a) -> dict:
    from transformers import AutoTokenizer
    from vllm import LLM, SamplingParams

    from rlt_mono.data import DataConfig, prepare_dataset
    from rlt_mono.prompts import PromptFormat

    teacher = make_model(a.arch, "teacher", a.models, 0)
    tokenizer = AutoTokenizer.from_pretrained(teacher)
    dataset, _ = prepare_dataset(DataConfig(embedded_rows=512), tokenizer, PromptFormat())
    prompts = [dataset[i]["prompt"] for i in range(a.completions // 8)]
    llm = LLM(model=str(teacher), gpu_memory_utilization=a.util, max_num_batched_tokens=4096, seed=0)
    params = SamplingParams(n=8, temperature=0.7, max_tokens=a.completion_length, min_tokens=a.completion_length,
                            ignore_eos=True)
    runs = []
    for _ in range(3):
        start = time.perf_counter()
        outputs = llm.generate(prompts, params, use_tqdm=False)
        seconds = time.perf_counter() - start
        runs.append(sum(len(c.token_ids) for o in outputs for c in o.outputs) / seconds)
    return {"mode": "vllm", "tokens_per_s_runs": runs, "median_tokens_per_s": statistics.median(runs)}


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
    return {"mode": "pcie", "h2d_gib_per_s_runs": runs, "h2d_gib_per_s": statistics.median(runs[1:])}


MODES = {"rlt": run_rlt, "trl": run_trl, "vllm": run_vllm, "pcie": run_pcie}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("mode", choices=[*MODES, "all"])
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
    p.add_argument("--out", type=Path)
    a = p.parse_args()
    if a.mode != "all":
        result = {"arch": a.arch, "completion_length": a.completion_length, "completions": a.completions,
                  "util": a.util, **MODES[a.mode](a)}
        print("RESULT " + json.dumps(result), flush=True)
        return
    results = []
    for mode in a.modes.split(","):
        cmd = [sys.executable, __file__, mode, *[x for x in sys.argv[2:]]]
        proc = subprocess.run(cmd, capture_output=True, text=True, env=os.environ)
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
        results.append(json.loads(lines[-1][7:]) if lines else {"mode": mode, "error": proc.stderr[-3000:]})
        if a.out:
            a.out.write_text(json.dumps(results, indent=1))
        print(json.dumps(results[-1])[:2000], flush=True)


if __name__ == "__main__":
    main()
