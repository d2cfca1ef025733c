#!/usr/bin/env bash
# Run a stage of rlt_mono (training the RLT teacher on one GPU, or the embedded demo on CPU).
#   ./launch_mono.sh cfgs/run_cfg/teacher_rlt_mono.yaml [hydra overrides ...]
#   ./launch_mono.sh demo_tiny trainer.max_steps=3
#   ./launch_mono.sh --help            (run configs, config groups and options, how to list keys)
# One process; placement=dp starts one rank per GPU through accelerate launch (rlt_mono/launch.py). rlt_mono.cli
# picks the GPUs from the composed placement (mono 1, split/auto up to 2, dp one per rank) unless
# CUDA_VISIBLE_DEVICES is set, and logs the resolved placement table. Exit code: the run's (2: a user error).
# RLT_MONO_PROG: this script's name as typed, which the help and hints repeat.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export PYTHONPATH="$here${PYTHONPATH:+:$PYTHONPATH}"
RLT_MONO_PROG="$0" exec "${PYTHON:-python3}" -m rlt_mono "$@"
