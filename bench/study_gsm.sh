#!/usr/bin/env bash
# The "Does it teach?" study on GSM-Symbolic (cfgs/run_cfg/study_gsm_symbolic.yaml) over several seeds on one GPU,
# resumable: run it again on the same <root> and every finished stage is skipped (rlt_mono.pipeline).
#   bash bench/study_gsm.sh <root> <seeds, e.g. 0,1,2>
# 1. One teacher SFT (the first seed's; a seed covers the RL run, distill sampling and student SFT), shared by
#    every seed's folder through a link.
# 2. One study pipeline per seed, side by side (each vLLM at 0.15 of the GPU: three fit on one H100/H200).
# 3. python -m rlt_mono.study aggregate: study.json, study_table.md and the curves in <root>/aggregate.
# Logs in <root>/logs; <root>/DONE holds the exit codes when it ends. bench/gpu_pipeline.sh study|wait drive it on
# the GPU machine.
set -uo pipefail
root=$1 seeds=${2//,/ }
mkdir -p "$root/logs"
config=cfgs/run_cfg/study_gsm_symbolic.yaml
first=${seeds%% *}
after_sft=teacher_rlt,distill,student_sft,eval_teacher,eval_student,distill_sft_teacher,student_sft_sft_teacher
after_sft+=,student_sft_raw_traces,eval_sft_teacher,eval_student_sft_teacher,eval_student_raw_traces
start=$SECONDS
./launch_mono.sh "$config" seed="$first" output_dir="$root/seed$first" "+steps=[teacher_sft]" \
  > "$root/logs/teacher_sft.log" 2>&1
sft=$?
echo "teacher_sft exit $sft after $((SECONDS - start)) s"
codes=()
if [ $sft -eq 0 ]; then
  pids=()
  for seed in $seeds; do
    mkdir -p "$root/seed$seed"
    [ "$seed" = "$first" ] || ln -sfn "$root/seed$first/1_teacher_sft" "$root/seed$seed/1_teacher_sft"
    ./launch_mono.sh "$config" seed="$seed" output_dir="$root/seed$seed" "+steps=[$after_sft]" \
      > "$root/logs/seed$seed.log" 2>&1 &
    pids+=($!)
    sleep 40  # one vLLM start at a time: a start profiles device memory, which another start would change
  done
  for pid in "${pids[@]}"; do wait "$pid"; codes+=($?); done
  echo "seeds $seeds exit ${codes[*]} after $((SECONDS - start)) s"
fi
folders=()
for seed in $seeds; do folders+=("$root/seed$seed"); done
python3 -m rlt_mono.study aggregate "${folders[@]}" --out "$root/aggregate" > "$root/logs/aggregate.log" 2>&1
echo "teacher_sft=$sft seeds=${codes[*]} aggregate=$? seconds=$((SECONDS - start))" > "$root/DONE"
