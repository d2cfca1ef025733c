#!/usr/bin/env bash
# Train an RLT teacher on one GPU (or the embedded demo on CPU).
#   ./launch_mono.sh cfgs/run_cfg/teacher_rlt_mono.yaml [hydra overrides ...]
#   ./launch_mono.sh demo_tiny trainer.max_steps=3
# One process. Unless you set CUDA_VISIBLE_DEVICES yourself, it exposes one GPU (GPU 0), or two when the
# placement asks for them (placement=split). Exit code: the run's.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
if [ $# -lt 1 ] || [ "$1" = "-h" ] || [ "$1" = "--help" ]; then
  echo "usage: $0 cfgs/run_cfg/<name>.yaml [key=value ...]   (configs: $(cd "$here/cfgs/run_cfg" && ls *.yaml | tr '\n' ' '))" >&2
  exit 2
fi
config=$1; shift
case "$config" in
  *.yaml|*.yml) [ -f "$config" ] || { echo "error: config file $config does not exist (configs are in $here/cfgs/run_cfg/)" >&2; exit 2; } ;;
esac
gpus_needed=1
for arg in "$@"; do
  case "$arg" in placement=split) gpus_needed=2 ;; esac
done
if [ -z "${CUDA_VISIBLE_DEVICES+x}" ] && command -v nvidia-smi >/dev/null 2>&1; then
  export CUDA_VISIBLE_DEVICES=$(seq -s, 0 $((gpus_needed - 1)))
fi
export PYTHONPATH="$here${PYTHONPATH:+:$PYTHONPATH}"
exec "${PYTHON:-python3}" -m rlt_mono.train "$config" "$@"
