#!/usr/bin/env bash
# The 0.5B speed benchmarks of docs/PERFORMANCE.md on the GPU machine (random-weight Qwen2.5-0.5B pair, 32
# completions x 1,024 forced tokens per optimizer step, bench/bench_mono.py), in the background so that they outlive
# a device call (at most 10 minutes each); run from the repository root after the GPU stack is stashed
# (bench/gpu_pipeline.sh stash):
#   bash bench/speed_05b.sh start [pairs, default 5] [steps per arm, default 5]
#       1. rlt_mono at memory=speed (one run, 2 generations' worth of steps: its generation feeds up to 8 steps);
#       2. <pairs> pairs of rlt_mono vs plain TRL on the same work, the order alternating (rlt,trl then trl,rlt);
#       each writes its JSON after every arm, so a lease that ends early keeps the arms that finished.
#   bash bench/speed_05b.sh wait <seconds>   wait for it (at most <seconds>), then copy the JSON and logs to $OUT
# python bench/speed_summary.py turns the JSON into results/speed_05b/{pairs,speed}.json.
set -euo pipefail
root=/root/speed_05b
case "$1" in
  start)
    pairs=${2:-5} steps=${3:-5}
    mkdir -p "$root"
    stack=$(bash /root/parts/install_gpu_stack.sh /root/parts | tail -1)
    modes=rlt,trl
    for ((i = 1; i < pairs; i++)); do
      if [ $((i % 2)) -eq 1 ]; then modes+=,trl,rlt; else modes+=,rlt,trl; fi
    done
    cat > "$root/run.sh" <<SCRIPT
$stack
export PYTHONUNBUFFERED=1
python3 bench/bench_mono.py all --modes rlt --memory speed --arch 0.5b --completion-length 1024 --steps 17 \
  --workdir /tmp/bench_speed --out $root/speed.json > $root/speed.log 2>&1
python3 bench/bench_mono.py all --modes $modes --arch 0.5b --completion-length 1024 --steps $steps \
  --workdir /tmp/bench_pairs --out $root/pairs_raw.json > $root/pairs.log 2>&1
echo done > $root/DONE
SCRIPT
    setsid nohup bash "$root/run.sh" > "$root/run.log" 2>&1 < /dev/null &
    sleep 2; echo "started: speed arm, then modes $modes, $steps steps each" ;;
  wait)
    end=$((SECONDS + $2))
    while [ ! -f "$root/DONE" ] && [ $SECONDS -lt $end ]; do sleep 10; done
    cp "$root"/*.json "$root"/*.log "$OUT"/ 2>/dev/null || true
    grep -h '"mode"' "$root"/*.log 2>/dev/null | cut -c1-200 | tail -12
    nvidia-smi --query-gpu=memory.used,utilization.gpu --format=csv ;;
  *) echo "usage: bash bench/speed_05b.sh start [pairs] [steps] | wait <seconds>" >&2; exit 2 ;;
esac
