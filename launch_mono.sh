#!/usr/bin/env bash
# Train an RLT teacher on one GPU (or the embedded demo on CPU).
#   ./launch_mono.sh cfgs/run_cfg/teacher_rlt_mono.yaml [hydra overrides ...]
#   ./launch_mono.sh demo_tiny trainer.max_steps=3
# One process. Unless you set CUDA_VISIBLE_DEVICES yourself, it exposes one GPU (GPU 0) for placement=mono,
# two for placement=split or auto. The resolved placement table is logged at start-up. Exit code: the run's.
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
# The placement (cfgs/placement/<mode>.yaml) decides how many GPUs to expose: mono 1, split and auto 2.
case "$config" in *.yaml|*.yml) config_file=$config ;; *) config_file=$here/cfgs/run_cfg/${config#run_cfg/}.yaml ;; esac
placement=$(sed -n 's|^ *- /placement: *\([a-z_]*\).*|\1|p' "$config_file" 2>/dev/null | head -1)
for arg in "$@"; do
  case "$arg" in placement=*) placement=${arg#placement=} ;; placement.mode=*) placement=${arg#placement.mode=} ;; esac
done
if [ -z "${CUDA_VISIBLE_DEVICES+x}" ] && command -v nvidia-smi >/dev/null 2>&1; then
  gpus=$(nvidia-smi -L | wc -l)
  case "${placement:-mono}" in split|auto) wanted=2 ;; *) wanted=1 ;; esac
  [ "$gpus" -lt "$wanted" ] && wanted=$gpus
  [ "$wanted" -ge 1 ] && export CUDA_VISIBLE_DEVICES=$(seq -s, 0 $((wanted - 1)))
  echo "launch_mono.sh: placement=${placement:-mono}, CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-}" >&2
fi
export PYTHONPATH="$here${PYTHONPATH:+:$PYTHONPATH}"
exec "${PYTHON:-python3}" -m rlt_mono.train "$config" "$@"
