#!/usr/bin/env bash
# The "Does it teach?" study on GSM-Symbolic (cfgs/run_cfg/study_gsm_symbolic.yaml) over several seeds on one GPU,
# resumable: run it again on the same <root> and every finished stage is skipped (rlt_mono.pipeline).
#   bash bench/study_gsm.sh <root> <seeds, e.g. 0,1,2> [control workers, default 2; 0: the RL chains only]
# STUDY_CONFIG names another pipeline run config, STUDY_OVERRIDES adds overrides (words, no spaces inside one):
# the tests run it on the embedded tiny pair that way.
# 1. One teacher SFT (the first seed's; a seed covers the RL run, distill sampling and student SFT), shared by
#    every seed's folder through a link.
# 2. Side by side on the GPU: one RL chain per seed in <root>/seed<N> (RL, distill, student SFT, both evals), and
#    the controls of every seed in <root>/seed<N>ctl (the SFT teacher's distill and student, the raw-traces
#    student; the SFT teacher's own eval for the first seed only: every seed shares that teacher), shared out over
#    a few control workers, each running its seeds one after another. vLLM engines start one at a time
#    (rlt_mono.run_lock.engine_start).
# 3. The control folders are linked into their seed's folder, then python -m rlt_mono.study aggregate writes
#    study.json, study_table.md and the curves in <root>/aggregate.
# A pipeline that fails is run once more (it continues from the failed stage).
# Logs in <root>/logs; <root>/DONE holds the exit codes when it ends. bench/gpu_pipeline.sh study|wait drive it on
# the GPU machine.
set -uo pipefail
root=$1 seeds=${2//,/ } workers=${3:-2}
mkdir -p "$root/logs"
config=${STUDY_CONFIG:-cfgs/run_cfg/study_gsm_symbolic.yaml}
read -ra extra <<< "${STUDY_OVERRIDES:-}"
first=${seeds%% *}
rl_steps=teacher_rlt,distill,student_sft,eval_teacher,eval_student
control_steps=distill_sft_teacher,student_sft_sft_teacher,eval_student_sft_teacher,student_sft_raw_traces
control_steps+=,eval_student_raw_traces
start=$SECONDS
pipeline() {  # <folder> <seed> <steps>: a second attempt continues from a stage that failed (e.g. a vLLM start)
  ./launch_mono.sh "$config" seed="$2" output_dir="$1" "+steps=[$3]" "${extra[@]}" && return 0
  echo "pipeline $1 failed: one more attempt from the stage that failed"
  ./launch_mono.sh "$config" seed="$2" output_dir="$1" "+steps=[$3]" "${extra[@]}"
}
pipeline "$root/seed$first" "$first" teacher_sft > "$root/logs/teacher_sft.log" 2>&1
sft=$?
echo "teacher_sft exit $sft after $((SECONDS - start)) s"
[ $sft -eq 0 ] || { echo "teacher_sft=$sft" > "$root/DONE"; exit 1; }

control() {  # <worker index>: the control steps of every workers-th seed, one seed after another
  local i=0 code=0 seed steps
  for seed in $seeds; do
    if [ $((i % workers)) -eq "$1" ]; then
      steps=$control_steps
      [ "$seed" = "$first" ] && steps+=,eval_sft_teacher
      pipeline "$root/seed${seed}ctl" "$seed" "$steps" > "$root/logs/seed${seed}ctl.log" 2>&1 || code=1
    fi
    i=$((i + 1))
  done
  return $code
}
pids=() names=()
for seed in $seeds; do
  for folder in "seed$seed" "seed${seed}ctl"; do
    mkdir -p "$root/$folder"
    [ "$folder" = "seed$first" ] || ln -sfn "$root/seed$first/1_teacher_sft" "$root/$folder/1_teacher_sft"
  done
  pipeline "$root/seed$seed" "$seed" "$rl_steps" > "$root/logs/seed$seed.log" 2>&1 &
  pids+=($!) names+=("seed$seed")
done
for ((w = 0; w < workers; w++)); do
  control "$w" &
  pids+=($!) names+=("control$w")
done
codes=()
for i in "${!pids[@]}"; do wait "${pids[$i]}"; codes+=("${names[$i]}=$?"); done
echo "${codes[*]} after $((SECONDS - start)) s"

folders=()
for seed in $seeds; do
  for step in "$root/seed${seed}ctl"/[0-9]*_*; do
    [ -d "$step" ] && [ ! -L "$step" ] && ln -sfn "$step" "$root/seed$seed/$(basename "$step")"
  done
  folders+=("$root/seed$seed")
done
python3 -m rlt_mono.study aggregate "${folders[@]}" --out "$root/aggregate" > "$root/logs/aggregate.log" 2>&1
echo "teacher_sft=$sft ${codes[*]} aggregate=$? seconds=$((SECONDS - start))" > "$root/DONE"
