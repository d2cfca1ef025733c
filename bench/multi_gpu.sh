#!/usr/bin/env bash
# Scaling runs and GPU tests on a machine with several GPUs (nvidia-h200-x2 / -x4), in as few device calls as the
# session's budget allows: while a scale arm that needs at most two GPUs runs on GPUs 0,1, the GPU tests run on
# GPUs 2,3 (x4 only). Run from the repository root on the GPU machine, after stashing the GPU stack (the
# README's "Data parallel" section lists the calls):
#   bash bench/multi_gpu.sh <arms> [<pytest -k expression>]
#       <arms>   scale arms, e.g. mono:1,dp:2 (bench_mono.py scale --arms); "none" runs no arm
#       <expr>   run the GPU tests matching it beside the arms (GPUs 2,3 on a 4-GPU machine, after the arms on
#                fewer); "all" runs every GPU test
# Writes $OUT/scale_<arms>.json, $OUT/scale_<arms>.log and $OUT/gpu_tests_<n>.log (n: GPUs the tests saw).
set -euo pipefail
arms=$1 tests=${2:-}
stack=$(bash .gpu-stack/call-3/install_gpu_stack.sh | tail -1)  # stops here (set -e) if the install fails
eval "$stack"
export PYTHONUNBUFFERED=1
gpus=$(nvidia-smi --list-gpus | wc -l)
name=${arms//[:,]/_}
optim=()  # fsdp2 cannot step bitsandbytes' optimizers: every arm of such a call takes plain AdamW
[[ "$arms" != *fsdp2* ]] || optim=(--optim adamw_torch)

run_tests() {  # $1: the GPUs the tests may use
  local filter=() n
  n=$(tr ',' '\n' <<< "$1" | wc -l)
  [ "$tests" = all ] || filter=(-k "$tests")
  CUDA_VISIBLE_DEVICES=$1 python3 -m pytest -q -rs tests/test_gpu.py "${filter[@]}" > "$OUT/gpu_tests_$n.log" 2>&1 \
    || echo "GPU tests failed: $OUT/gpu_tests_$n.log"
}

pid=""
if [ -n "$tests" ] && [ "$gpus" -ge 4 ] && [[ ! "$arms" =~ :([3-9]|[1-9][0-9]) ]]; then
  run_tests 2,3 & pid=$!  # the arms below use GPUs 0,1
  arm_gpus=0,1
else
  arm_gpus=$(seq -s, 0 $((gpus - 1)))
fi
if [ "$arms" != none ]; then
  CUDA_VISIBLE_DEVICES=$arm_gpus python3 bench/bench_mono.py scale --arch 1.5b --completion-length 1024 --steps 4 \
    "${optim[@]}" --arms "$arms" --out "$OUT/scale_$name.json" > "$OUT/scale_$name.log" 2>&1 || echo "scale failed: $OUT/scale_$name.log"
  tail -n 12 "$OUT/scale_$name.log"
fi
if [ -n "$pid" ]; then
  wait "$pid"
elif [ -n "$tests" ]; then
  run_tests "$arm_gpus"
fi
[ -z "$tests" ] || tail -n 5 "$OUT"/gpu_tests_*.log
