"""Seconds per student-SFT optimizer step in each float precision a float32 student can train under, on one GPU.

The study's students train with float32 weights; under bfloat16 autocast 8 of 11 had a non-finite gradient
(docs/STUDY.md), and in plain float32 their steps are slow. This times one full fine-tune step (forward, backward,
AdamW) of a model of Qwen2.5-0.5B's shape at the study's batch (16 rows) in three modes side by side:

- ``float32``: float32 matmuls (``torch.backends.cuda.matmul.allow_tf32 = False``), the study's setting;
- ``tf32``: float32 weights and activations, matmul inputs rounded to TensorFloat-32 (``sft.tf32``, TrainingArguments'
  switch; set it with ``+sft.tf32=true``);
- ``bf16_autocast``: bfloat16 autocast over float32 weights (``sft.bf16=true``).

The weights are random (the shapes, not the values, set the speed), so a mode's finite gradients here say nothing
of the pretrained model's. Writes one JSON (median and every step's seconds, peak memory) to ``--out``.

    python bench/sft_precision.py --out results/sft_precision/h200.json
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import statistics
import sys
import time
from pathlib import Path

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from rlt_mono.runs.atomic_write import write_json  # noqa: E402

logger = logging.getLogger("bench.sft_precision")

# Qwen2.5-0.5B's shape (its config.json).
SHAPE = dict(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
             num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=32768, tie_word_embeddings=True)
MODES = ("float32", "tf32", "bf16_autocast")


def time_mode(mode: str, rows: int, tokens: int, steps: int, warmup: int, seed: int) -> dict:
    """Seconds of each of ``steps`` optimizer steps after ``warmup`` untimed ones, and the peak GPU memory."""
    torch.manual_seed(seed)
    torch.backends.cuda.matmul.allow_tf32 = mode == "tf32"
    torch.backends.cudnn.allow_tf32 = mode == "tf32"
    model = Qwen2ForCausalLM(Qwen2Config(**SHAPE, attn_implementation="sdpa")).cuda().train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-6, betas=(0.9, 0.95), weight_decay=1e-4)
    ids = torch.randint(0, SHAPE["vocab_size"], (rows, tokens), device="cuda")
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if mode == "bf16_autocast" else contextlib.nullcontext()
    torch.cuda.reset_peak_memory_stats()
    seconds, finite = [], True
    for step in range(warmup + steps):
        torch.cuda.synchronize()
        start = time.perf_counter()
        with autocast:
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        finite = finite and bool(torch.isfinite(norm))
        if step >= warmup:
            seconds.append(time.perf_counter() - start)
    peak = torch.cuda.max_memory_allocated() / 2**30
    del model, optimizer
    torch.cuda.empty_cache()
    return {"median_s_per_step": statistics.median(seconds), "s_per_step": seconds, "peak_gib": round(peak, 2),
            "finite_grad_norms": finite}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="JSON file to write")
    parser.add_argument("--rows", type=int, default=16, help="rows per step (the study's batch)")
    parser.add_argument("--tokens", type=int, default=384, help="tokens per row")
    parser.add_argument("--steps", type=int, default=8, help="timed steps per mode")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps first")
    parser.add_argument("--modes", default=",".join(MODES), help=f"comma-separated, of {', '.join(MODES)}")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    modes = args.modes.split(",")
    unknown = sorted(set(modes) - set(MODES))
    if unknown:
        parser.error(f"unknown mode {', '.join(unknown)} (modes: {', '.join(MODES)})")
    if not torch.cuda.is_available():
        parser.error("needs a CUDA GPU")
    results = {}
    for mode in modes:
        results[mode] = time_mode(mode, args.rows, args.tokens, args.steps, args.warmup, seed=0)
        logger.info("%s: %.3f s/step (median of %d), peak %.1f GiB", mode, results[mode]["median_s_per_step"],
                    args.steps, results[mode]["peak_gib"])
    base = results.get("float32", {}).get("median_s_per_step")
    summary = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
               "shape": "Qwen2.5-0.5B (random weights)",
               "rows": args.rows, "tokens": args.tokens, "modes": results,
               "speedup_over_float32": {m: round(base / r["median_s_per_step"], 2) for m, r in results.items()}
               if base else {}}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_json(args.out, summary, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
