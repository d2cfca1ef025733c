#!/usr/bin/env bash
# The speed benchmarks of docs/PERFORMANCE.md ("Speed") on a GPU host, random-weight Qwen2.5 pairs
# (bench/bench_mono.py), in the background so that they outlive the shell command that starts them (a host reached
# through commands of limited length); run from the repository root once the GPU stack is installed
# (offline_host/gpu_pipeline.sh stash):
#   bash offline_host/speed.sh start 05b [pairs, default 5] [steps per arm, default 5] [speed arms, default speed]
#                                 [the pairs' rlt score micro-batch, default rlt_mono's config]
#       0.5B pair, 32 completions x 1,024 forced tokens per optimizer step:
#       1. rlt_mono at memory=speed (one run, 17 steps: two whole generations, each feeding up to 8 steps); the speed
#          arm noliger is the same with trainer.use_liger_kernel=false (the default needs liger-kernel's wheel
#          carried in .whl); "none" runs neither;
#       2. <pairs> pairs of rlt_mono vs plain TRL on the same work, the order alternating (rlt,trl then trl,rlt).
#   bash offline_host/speed.sh start 7b [steps, default 5] [arms, default manual,auto] [profiled step, default none]
#       7B teacher + 7B student, 32 completions x 4,096 forced tokens, full fine-tuning, 8-bit Adam: the
#       manual settings (micro-batch 2, score micro-batch 2, vLLM at 0.3), then the same at memory=auto; the arm
#       noalign is manual with trainer.left_align_padding=false (the masked attention kernel), for a side-by-side;
#       noliger is manual with trainer.use_liger_kernel=false (the default, liger-kernel's fused layers, needs its
#       wheel carried in .whl);
#       speed is memory=speed (one generation feeds several optimizer steps: give it 2 x those steps + 1). With a
#       profiled step, each arm also profiles that step's score and train phases (bench/phase_profile.py) and leaves
#       it out of its medians: give one step more.
#   bash offline_host/speed.sh start '05b 5 5 speed,noliger' '7b 5 manual,noliger'   several, one quoted argument each
#   bash offline_host/speed.sh wait <seconds>   wait for it (at most <seconds>), then bring the JSON and logs back
#       ($OUT/speed_results.tgz)
# With SPEED_TESTS=<pytest -k expression, or all> set at start, the GPU tests (tests/test_gpu.py) run after the
# benchmarks, never beside them, in the same background script: gpu_tests.log and gpu_tests_leak.json (the leak
# test's readings); SPEED_TESTS_FIRST=<expression> runs those first of all (gpu_tests_first.log, .._first_leak.json).
# With SPEED_LAYERS=1, bench/fused_layers.py runs before the benchmarks (7B and 0.5B layers, liger's kernels against
# plain ones).
# Each run writes its JSON after every arm, in $OFFLINE_HOST_ROOT/speed, so a run stopped early keeps the arms that
# finished.
# python bench/speed_summary.py turns the JSON into results/speed_05b/{pairs,speed}.json or results/speed_7b/step.json.
set -euo pipefail
# OFFLINE_HOST_ROOT, and the install of the offline GPU stack and of the carried wheels beside it.
source offline_host/gpu_host.sh
OUT=${OUT:-$PWD/gpu_out}  # what comes back from the host (results, logs)
mkdir -p "$OUT"
root=$OFFLINE_HOST_ROOT/speed
usage="usage: bash offline_host/speed.sh start 05b [pairs] [steps] [speed arms] [score micro-batch] | start 7b [steps] \
[arms] [profiled step] | start '05b ...' '7b ...' | wait <seconds>"
case "${1:-}" in
  start)
    bench="python3 bench/bench_mono.py all"
    runs=""
    # One benchmark unquoted (start 7b 9 speed), or several, one argument each (start '05b 5' '7b 5', or 05b '7b 5').
    specs=("${*:2}")
    for arg in "${@:2}"; do [[ "$arg" != *" "* ]] || specs=("${@:2}"); done
    for spec in "${specs[@]}"; do
      read -r target a3 a4 a5 a6 <<< "$spec"
      case "$target" in
        05b)
          for n in "${a3:-5}" "${a4:-5}" "${a6:-1}"; do
            [[ "$n" =~ ^[0-9]+$ ]] || { echo "speed.sh: '$spec': pairs, steps and the score micro-batch are whole \
numbers, got '$n' (usage: 05b [pairs] [steps] [speed arms] [score micro-batch])" >&2; exit 2; }
          done
          pairs=${a3:-5} steps=${a4:-5} modes=rlt,trl
          for ((i = 1; i < pairs; i++)); do
            if [ $((i % 2)) -eq 1 ]; then modes+=,trl,rlt; else modes+=,rlt,trl; fi
          done
          speed="$bench --modes rlt --memory speed --arch 0.5b --completion-length 1024 --steps 17"
          [[ ",${a5:-speed}," != *,speed,* ]] || runs+="$speed --workdir /tmp/bench_speed --out $root/speed_raw.json \
> $root/speed.log 2>&1
"
          [[ ",${a5:-speed}," != *,noliger,* ]] || runs+="$speed --liger false --workdir /tmp/bench_speed_noliger \
--out $root/speed_noliger_raw.json > $root/speed_noliger.log 2>&1
"
          # reward.micro_batch_size of the rlt arms (the TRL arms have no reward pass)
          [ "$pairs" -eq 0 ] || runs+="$bench --modes $modes --arch 0.5b --completion-length 1024 --steps $steps \
--workdir /tmp/bench_pairs${a6:+ --score-micro-batch $a6} --out $root/pairs_raw.json > $root/pairs.log 2>&1
" ;;
        7b)
          steps=${a3:-5} arms=${a4:-manual,auto} same="--arch 7b --completion-length 4096 --optim adamw_bnb_8bit"
          same+=" --workdir /tmp/bench_7b${a5:+ --profile-step $a5}"
          manual="$bench --modes rlt $same --steps $steps --micro-batch 2 --score-micro-batch 2 --util 0.3"
          [[ ",$arms," != *,manual,* ]] || runs+="$manual --out $root/step_manual.json > $root/step_manual.log 2>&1
"
          [[ ",$arms," != *,noalign,* ]] || runs+="$manual --left-align false --out $root/step_noalign.json \
> $root/step_noalign.log 2>&1
"
          [[ ",$arms," != *,noliger,* ]] || runs+="$manual --liger false --out $root/step_noliger.json \
> $root/step_noliger.log 2>&1
"
          [[ ",$arms," != *,auto,* ]] || runs+="$bench --modes rlt $same --steps $steps --memory auto \
--out $root/step_auto.json > $root/step_auto.log 2>&1
"
          [[ ",$arms," != *,speed,* ]] || runs+="$bench --modes rlt $same --steps $steps --memory speed \
--out $root/step_speed.json > $root/step_speed.log 2>&1
" ;;
        *) echo "$usage" >&2; exit 2 ;;
      esac
    done
    # The specs are whole: install the stack and the wheels carried in .whl (liger-kernel for
    # trainer.use_liger_kernel) beside it; the background script exports both.
    stack=$(install_gpu_stack "$OUT/install.log")
    install_carried_wheels
    stack+="; export PYTHONPATH=$CARRIED_SITE:\$PYTHONPATH"
    mkdir -p "$root"
    # With SPEED_LAYERS set, bench/fused_layers.py before the benchmarks: the 7B and 0.5B layers with and without
    # liger's kernels.
    if [ -n "${SPEED_LAYERS:-}" ]; then
      runs="python3 bench/fused_layers.py --arch 7b --out $root/fused_layers_7b.json > $root/fused_layers.log 2>&1
python3 bench/fused_layers.py --arch 0.5b --layers 24 --rows 16 --tokens 1156 --out $root/fused_layers_05b.json \
>> $root/fused_layers.log 2>&1
$runs"
    fi
    tests() {  # the GPU tests matching $1 (or all), logged to $root/$2.log (the leak test's readings: $2_leak.json)
      local filter=""; [ "$1" = all ] || filter="-k '$1'"
      echo "RLT_MONO_SLEEP_LEAK_READINGS=$root/$2_leak.json python3 -m pytest -v -rs tests/test_gpu.py $filter \
> $root/$2.log 2>&1 || echo 'GPU tests failed' >> $root/$2.log"
    }
    [ -z "${SPEED_TESTS_FIRST:-}" ] || runs="$(tests "$SPEED_TESTS_FIRST" gpu_tests_first)
$runs"
    [ -z "${SPEED_TESTS:-}" ] || runs+="$(tests "$SPEED_TESTS" gpu_tests)
"
    # The runs use a copy of this tree: a later command may replace the working tree under them.
    rm -rf "$root/code" && mkdir -p "$root/code" && tar cf - --exclude=./.gpu-stack --exclude=./.parts . \
      | tar xf - -C "$root/code"
    printf '%s\nexport PYTHONUNBUFFERED=1\ncd %s/code\n%s\necho done > %s/DONE\n' "$stack" "$root" "$runs" "$root" \
      > "$root/run.sh"
    rm -f "$root/DONE"
    setsid nohup bash "$root/run.sh" > "$root/run.log" 2>&1 < /dev/null &
    sleep 2; cat "$root/run.sh" | tail -n +2 ;;
  wait)
    [[ "${2:-}" =~ ^[0-9]+$ ]] || { echo "$usage" >&2; exit 2; }
    end=$((SECONDS + $2))
    while [ ! -f "$root/DONE" ] && [ $SECONDS -lt $end ]; do sleep 10; done
    # One archive (at most 8 files come back from the host): every JSON and log the runs wrote so far.
    (cd "$root" && tar czf "$OUT/speed_results.tgz" $(ls *.json *.log 2>/dev/null)) || true
    tail -n 3 "$root"/gpu_tests*.log 2>/dev/null || true
    grep -h '"mode"' "$root"/*.log 2>/dev/null | cut -c1-200 | tail -12 || true  # none yet is no failure
    nvidia-smi --query-gpu=memory.used,utilization.gpu --format=csv ;;
  *) echo "$usage" >&2; exit 2 ;;
esac
