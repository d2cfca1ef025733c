#!/usr/bin/env bash
# Scaling runs and GPU tests on a host with several GPUs (two or four H200s were measured). The
# tests run after the arms, never beside them: a test on other GPUs of the same host would share its CPUs and PCIe
# with the arms being timed. Run from the repository root on the GPU host, once the GPU stack is installed
# (docs/PERFORMANCE.md, "Not run yet, and how to run it", lists the commands):
#   bash offline_host/multi_gpu.sh <arms> [<pytest -k expression>]
#       <arms>   scale arms, e.g. mono:1,dp:2 (bench_mono.py scale --arms); "none" runs no arm
#       <expr>   then run the GPU tests matching it; "all" runs every GPU test
# Writes $OUT/scale_<arch>_<arms>[_r<rounds>].json and .log (and _logs.tgz: each run's own log), $OUT/gpu_tests_<n>.log (n: GPUs the tests saw), each
# failed test's report as it ends ($OUT/gpu_test_failures.txt) and the sleep/wake leak test's readings,
# $OUT/sleep_leak_readings.json. Where pytest-timeout is installed a test is stopped after GPU_TEST_TIMEOUT seconds
# (default 420). All the tests took over 9 minutes on one H200: run them as two commands, 'not fsdp2' then fsdp2.
# Commands may run side by side on one host, each given its own GPUs (CUDA_VISIBLE_DEVICES) and its own OUT or
# MULTI_GPU_ROOT; they unpack the stack in turn. SCALE_ARCH picks the random-weight pair of the arms (default
# 1.5b; 0.5b, 7b: bench_mono.py --arch). SCALE_ROUNDS runs the arms that many times, the order reversed every other
# round (bench_mono.py --rounds; default 1; above 1 the file names end in _r<rounds>): the JSON's summary sets each
# arm against the first round by round. SCALE_COMMIT is the commit the JSON records, for code carried without .git
# (bench_mono.py --commit; default: git rev-parse --short HEAD). SCALE_MINUTES starts no arm run that would end past
# that many minutes (bench_mono.py --max-minutes), so that what follows in a chain still runs.
# In the background, for runs longer than one remote command may last (each entry one command as above, one after
# another, from a copy of the code, into MULTI_GPU_ROOT, default $OFFLINE_HOST_ROOT/multi_gpu):
#   bash offline_host/multi_gpu.sh start '<arms>[|<pytest -k expression>]' ...   e.g. 'none|async' mono:1,async:2
#       An entry may name its GPUs, '<gpus>@<arms>[|<expr>]', and hold several commands joined by '+', which run side
#       by side, each on its GPUs, writing into <root>/lane-<gpus>; the entry ends when all of them have, e.g.
#       '0@none|not fsdp2+1@none|fsdp2' '0,1@mono:1,async:2' (the tests on one GPU each, then the arms on both)
#   bash offline_host/multi_gpu.sh wait <seconds>   waits for them (at most <seconds>), shows the end of their log
#       and copies what they wrote (JSON, logs, failures; a lane's files as lane-<gpus>_<name>) into $OUT;
#       <root>/DONE holds each entry's exit code once all ran (side-by-side commands' codes joined by '+')
set -euo pipefail
# OFFLINE_HOST_ROOT, and the install of the offline GPU stack and of the carried wheels beside it.
source offline_host/gpu_host.sh
root=${MULTI_GPU_ROOT:-$OFFLINE_HOST_ROOT/multi_gpu}
case "${1:-}" in
  start)
    shift
    if [ $# -eq 0 ]; then
      echo "usage: bash offline_host/multi_gpu.sh start '<arms>[|<pytest -k expression>]' ..." >&2; exit 2
    fi
    if pgrep -f "[o]ffline_host/multi_gpu.sh chain $root " > /dev/null; then
      echo "offline_host/multi_gpu.sh: runs started earlier are still going ($root/chain.log): wait for them" >&2
      exit 2
    fi
    mkdir -p "$root" && rm -f "$root/DONE"
    code=$root/code-$(date +%s%N) && mkdir -p "$code"
    tar cf - --exclude=./.gpu-stack --exclude=./.parts --exclude=./gpu_out . | tar xf - -C "$code"
    (cd "$code" && setsid nohup bash offline_host/multi_gpu.sh chain "$root" "$@" >> "$root/chain.log" 2>&1 \
      < /dev/null &)
    sleep 1  # so that a wait right after finds it running
    echo "offline_host/multi_gpu.sh: $# command(s) started, from $code; log $root/chain.log"
    exit 0 ;;
  chain)  # start's background job: chain <root> <entry>...
    shift 2
    # one command of an entry: [<gpus>@]<arms>[|<expr>]; with GPUs named, on those GPUs, into <root>/lane-<gpus>
    one() {
      local spec=$1 gpus="" out=$root
      if [[ "$spec" == *@* ]]; then
        gpus=${spec%%@*} spec=${spec#*@} out=$root/lane-${gpus//,/_}
        mkdir -p "$out"
      fi
      local command=("${spec%%|*}")
      [[ "$spec" != *"|"* ]] || command+=("${spec#*|}")
      echo "== $(date -u +%H:%M:%S) ${gpus:+CUDA_VISIBLE_DEVICES=$gpus }bash offline_host/multi_gpu.sh ${command[*]}"
      if [ -n "$gpus" ]; then
        CUDA_VISIBLE_DEVICES=$gpus VLLM_CACHE_ROOT=$out/vllm-cache OUT=$out bash offline_host/multi_gpu.sh \
          "${command[@]}"
      else
        OUT=$out bash offline_host/multi_gpu.sh "${command[@]}"
      fi
    }
    codes=()
    for entry in "$@"; do
      IFS=+ read -ra side <<< "$entry"
      pids=()
      for spec in "${side[@]}"; do one "$spec" & pids+=($!); done
      statuses=()
      for pid in "${pids[@]}"; do status=0; wait "$pid" || status=$?; statuses+=("$status"); done
      codes+=("$(IFS=+; echo "${statuses[*]}")")
    done
    echo "${codes[*]}" > "$root/DONE"
    exit 0 ;;
  wait)
    end=$((SECONDS + ${2:?usage: bash offline_host/multi_gpu.sh wait <seconds>}))
    while [ ! -f "$root/DONE" ] && [ $SECONDS -lt $end ]; do
      if ! pgrep -f "[o]ffline_host/multi_gpu.sh chain $root " > /dev/null; then
        echo "offline_host/multi_gpu.sh wait: nothing runs and none has ended here (no $root/DONE): its start failed," \
             "or this host is a new one" >&2
        exit 1
      fi
      sleep 5
    done
    tail -n 8 "$root/chain.log"
    OUT=${OUT:-$PWD/gpu_out} && mkdir -p "$OUT"
    for f in "$root"/*.json "$root"/*.txt "$root"/*.log "$root"/*.tgz; do [ ! -f "$f" ] || cp "$f" "$OUT"/; done
    for lane in "$root"/lane-*/; do
      [ -d "$lane" ] || continue
      for f in "$lane"*.json "$lane"*.txt "$lane"*.log "$lane"*.tgz; do
        [ ! -f "$f" ] || cp "$f" "$OUT/$(basename "$lane")_$(basename "$f")"
      done
    done
    if [ -f "$root/DONE" ]; then echo "DONE, exit codes: $(cat "$root/DONE")"; else echo "still running"; fi
    exit 0 ;;
esac
arms=${1:?usage: bash offline_host/multi_gpu.sh <arms, e.g. mono:1,dp:2, or none> [<pytest -k expression> | all]}
tests=${2:-}
OUT=${OUT:-$PWD/gpu_out}  # what the runs write (JSON, logs)
mkdir -p "$OUT"
stack=$(install_gpu_stack "$OUT/install.log")  # stops here (set -e) if the install fails
eval "$stack"
install_carried_wheels
export PYTHONUNBUFFERED=1
gpus=$(visible_gpus)
arch=${SCALE_ARCH:-1.5b}
rounds=${SCALE_ROUNDS:-1}
name=${arch}_${arms//[:,]/_}
[ "$rounds" = 1 ] || name=${name}_r$rounds
commit=()
[ -z "${SCALE_COMMIT:-}" ] || commit=(--commit "$SCALE_COMMIT")
minutes=()
[ -z "${SCALE_MINUTES:-}" ] || minutes=(--max-minutes "$SCALE_MINUTES")
optim=()  # fsdp2 cannot step bitsandbytes' optimizers: every arm of such a command takes plain AdamW
[[ "$arms" != *fsdp2* ]] || optim=(--optim adamw_torch)

run_tests() {
  local filter=() timeout=()
  [ "$tests" = all ] || filter=(-k "$tests")
  ! python3 -c "import pytest_timeout" 2> /dev/null || timeout=(--timeout "${GPU_TEST_TIMEOUT:-420}")
  # -v names each test as it finishes, so a log cut by a timeout still says which passed; the leak test writes its
  # per-cycle memory readings beside the log.
  # A failed test's report goes to gpu_test_failures.txt as it ends (tests/conftest.py): a command cut by its
  # time limit still says why; pytest-timeout stops a test that hangs, with its stack.
  RLT_MONO_SLEEP_LEAK_READINGS="$OUT/sleep_leak_readings.json" RLT_MONO_TEST_FAILURES="$OUT/gpu_test_failures.txt" \
    python3 -m pytest -v -rs "${timeout[@]}" tests/test_gpu.py "${filter[@]}" \
    > "$OUT/gpu_tests_$gpus.log" 2>&1 \
    || echo "GPU tests failed: $OUT/gpu_tests_$gpus.log"
  tail -n 5 "$OUT/gpu_tests_$gpus.log"
}

if [ "$arms" != none ]; then
  python3 bench/bench_mono.py scale --arch "$arch" --completion-length 1024 --steps 4 "${optim[@]}" --arms "$arms" \
    --rounds "$rounds" "${minutes[@]}" "${commit[@]}" --out "$OUT/scale_$name.json" > "$OUT/scale_$name.log" 2>&1 \
    || echo "scale failed: $OUT/scale_$name.log"
  tail -n 12 "$OUT/scale_$name.log"
  # Each run's own log (the JSON names them), in one archive beside the JSON: where a run's minutes went.
  if [ -f "$OUT/scale_$name.json" ]; then
    python3 -c 'import json, sys; print("\n".join(r["log"] for r in json.load(open(sys.argv[1]))["results"] if "log" in r))' \
      "$OUT/scale_$name.json" | tar czf "$OUT/scale_${name}_logs.tgz" --files-from=- --transform='s|.*/||' \
      2> /dev/null || echo "the runs' logs were not archived: $OUT/scale_${name}_logs.tgz"
  fi
fi
[ -z "$tests" ] || run_tests
