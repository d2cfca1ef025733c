"""The decoder layers of a Qwen2.5 shape with and without liger-kernel's fused RMSNorm, SwiGLU and rotary kernels
(``trainer.use_liger_kernel``), side by side in one process on one GPU: the passes the score phase runs (no-grad
forward) and the train phase runs (forward and backward, recomputing activations as the 7B step does).

    python bench/fused_layers.py --arch 7b --layers 4 --rows 2 --tokens 4296 --out fused_layers_7b.json

Random bf16 weights, no LM head (its kernels are TRL's and unchanged), no mask (the left-aligned passes run
causal-only). Each figure is the median of ``--repeats`` timed passes after two warm-up passes; the plain layers run
first, since liger's rotary kernel replaces transformers' module-level function for every model after it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from rlt_mono.memory.model import QWEN25_ARCHS  # noqa: E402
from rlt_mono.runs.atomic_write import write_text  # noqa: E402


def timed(fn, repeats: int) -> list[float]:
    import torch

    for _ in range(2):
        fn()
    seconds = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        seconds.append(time.perf_counter() - start)
    return seconds


def passes(model, rows: int, tokens: int, repeats: int) -> dict:
    """Seconds of a no-grad forward and of a forward + backward with recomputation, over ``rows x tokens``."""
    import torch

    hidden = torch.randn(rows, tokens, model.config.hidden_size, dtype=torch.bfloat16, device="cuda")

    def forward():
        with torch.no_grad():
            model(inputs_embeds=hidden, use_cache=False)

    def train():
        model(inputs_embeds=hidden.requires_grad_(True), use_cache=False).last_hidden_state.float().mean().backward()

    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    return {"score_forward_s": statistics.median(timed(forward, repeats)),
            "train_forward_backward_s": statistics.median(timed(train, repeats))}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arch", choices=list(QWEN25_ARCHS), default="7b")
    parser.add_argument("--layers", type=int, default=4, help="decoder layers (the step has the arch's count)")
    parser.add_argument("--rows", type=int, default=2, help="sequences per pass (the micro-batch)")
    parser.add_argument("--tokens", type=int, default=4296, help="tokens per sequence")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path)
    a = parser.parse_args(argv)

    import torch
    from transformers import Qwen2Config, Qwen2Model
    from transformers.integrations.liger import apply_liger_kernel

    shape = {k: v for k, v in QWEN25_ARCHS[a.arch].items() if k != "model_type"}
    config = Qwen2Config(**{**shape, "num_hidden_layers": a.layers}, max_position_embeddings=32768, rope_theta=1e6,
                         rms_norm_eps=1e-6, attn_implementation="sdpa", dtype="bfloat16")
    result = {"arch": a.arch, "layers": a.layers, "rows": a.rows, "tokens": a.tokens, "repeats": a.repeats,
              "device": torch.cuda.get_device_name(),
              "command": " ".join(["python bench/fused_layers.py", *sys.argv[1:]])}
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = Qwen2Model(config).to(torch.bfloat16)
    result["plain"] = passes(model, a.rows, a.tokens, a.repeats)
    apply_liger_kernel(model, {"fused_linear_cross_entropy": False})  # the same weights, liger's kernels
    result["liger"] = passes(model, a.rows, a.tokens, a.repeats)
    result["ratio_liger_over_plain"] = {k: result["liger"][k] / result["plain"][k] for k in result["plain"]}
    text = json.dumps(result, indent=2)
    if a.out:
        write_text(a.out, text + "\n")
    sys.stdout.write(text + "\n")
    return result


if __name__ == "__main__":
    main()
