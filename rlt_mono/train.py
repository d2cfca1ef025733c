"""Command-line entry: ``python -m rlt_mono.train <run config> [hydra overrides ...]``.

``launch_mono.sh`` calls this. It composes the config, builds the trainer, trains (resuming when asked),
and saves the final teacher in ``<output_dir>/final``. A configuration or data problem ends the process
with one line on stderr saying what to fix, and exit code 2.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

logger = logging.getLogger("rlt_mono")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="launch_mono.sh", description=__doc__.splitlines()[0])
    parser.add_argument("config", help="run config: cfgs/run_cfg/<name>.yaml or <name>")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. trainer.max_steps=3 placement=mono")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    from rlt_mono.build import build_trainer
    from rlt_mono.config import ConfigError, compose
    from rlt_mono.data import BadRowError

    try:
        cfg = compose(args.config, args.overrides)
        trainer = build_trainer(cfg)
    except (ConfigError, BadRowError, FileNotFoundError) as err:
        sys.stderr.write(f"error: {err}\n")
        return 2
    trainer.train(resume_from_checkpoint=cfg.resume_from_checkpoint)
    final_dir = Path(trainer.args.output_dir) / "final"
    trainer.save_model(str(final_dir))
    logger.info("final teacher saved to %s", final_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
