"""How much of an optimizer step a model's weights keep in bfloat16: the share of its weights that a step of each
size changes once written in bfloat16 (``rlt_mono.runs.precision.update_share``, every trainable tensor read at up
to 4,096 evenly spaced elements). An Adam step is about the learning rate in size, so at a share of 10% the other
90% of each step is lost. The weights are the model's own (their magnitudes set the share); no GPU needed.

    python bench/update_share.py <model folder> --steps 1e-6 5e-6 1e-5 1e-4 --out results/<file>.json
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]  # rlt_mono, and the scripts beside this one however it was loaded

from bench_mono import code_commit  # noqa: E402

from rlt_mono.data.models import load_model  # noqa: E402
from rlt_mono.runs.atomic_write import write_json  # noqa: E402
from rlt_mono.runs.precision import update_share  # noqa: E402

logger = logging.getLogger("bench.update_share")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", help="a model folder (or id) transformers loads")
    parser.add_argument("--steps", type=float, nargs="+", default=[1e-6, 5e-6, 1e-5, 1e-4])
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    start = time.time()
    model = load_model(args.model, "model", dtype=torch.bfloat16)
    shares = {f"{step:g}": round(update_share(model, step), 4) for step in args.steps}
    for step, share in shares.items():
        logger.info("a step of %s changes %.1f%% of the weights in bfloat16", step, 100 * share)
    write_json(args.out, {"model": Path(args.model).name, "parameters": sum(p.numel() for p in model.parameters()),
                          "dtype": "bfloat16", "share_changed": shares, "commit": code_commit(),
                          "device": "CPU (x86_64)", "command": "python bench/update_share.py " + " ".join(
                              sys.argv[1:] if argv is None else argv),
                          "seconds": round(time.time() - start, 1)})
    return 0


if __name__ == "__main__":
    sys.exit(main())
