#!/usr/bin/env bash
# The "Does it teach?" study on GSM-Symbolic (cfgs/run_cfg/study_gsm_symbolic.yaml) over several seeds on one GPU,
# resumable: run it again on the same <root> and every finished stage is skipped (rlt_mono.stages.pipeline).
#   bash bench/study_gsm.sh <root> <seeds, e.g. 0,1,2> [control workers, default 2; 0: the RL chains only]
# Environment:
#   STUDY_CONFIG     another pipeline run config (the tests run it on the embedded tiny pair)
#   STUDY_OVERRIDES  overrides for every pipeline (words, no spaces inside one)
#   STUDY_CONTROLS   the control steps a worker runs for each of its seeds (comma-separated; default below; empty:
#                    none, e.g. when an earlier run measured them)
#   STUDY_ALSO_SELECTION  a second distill selection (e.g. best_correct): each seed's RL teacher and the SFT teacher
#                    are distilled that way too, and a student is trained and evaluated on each, in
#                    <root>/seed<N>-<selection> (the SFT teacher's in the control workers, in
#                    <root>/seed<N>-<selection>ctl, linked in at the end); aggregated apart
# 1. One teacher SFT (the first seed's; a seed covers the RL run, distill sampling and student SFT), shared by
#    every seed's folder through a link.
# 2. Side by side on the GPU: one RL chain per seed in <root>/seed<N>, and the controls of every seed in
#    <root>/seed<N>ctl (the SFT teacher's distill and student, the raw-traces student; the SFT teacher's own eval
#    for the first seed only: every seed shares that teacher), shared out over a few control workers, each running
#    its seeds one after another. Once a seed's RL ends, three pipelines run at once: distill -> student SFT -> eval
#    of the student in seed<N>, the RL teacher's eval in seed<N>ev, and the second selection's distill -> student
#    SFT -> eval in seed<N>-<selection> (each folder links the teachers it reads). vLLM engines start one at a
#    time (rlt_mono.runs.lock.engine_start).
# 3. The other folders' steps are linked into their seed's folder, then python -m rlt_mono.study aggregate writes
#    study.json, study_table.md and the curves in <root>/aggregate (and <root>/aggregate-<selection>).
# A pipeline that fails is run once more, 30 s later (it continues from the failed stage).
# Logs in <root>/logs; <root>/DONE holds the exit codes when it ends. offline_host/gpu_pipeline.sh study|wait drive
# it on a GPU host without network access.
set -uo pipefail
root=$1 seeds=${2//,/ } workers=${3:-2}
mkdir -p "$root/logs"
config=${STUDY_CONFIG:-cfgs/run_cfg/study_gsm_symbolic.yaml}
read -ra extra <<< "${STUDY_OVERRIDES:-}"
also=${STUDY_ALSO_SELECTION:-}
first=${seeds%% *}
controls=${STUDY_CONTROLS-distill_sft_teacher,student_sft_sft_teacher,eval_student_sft_teacher,student_sft_raw_traces,eval_student_raw_traces}
# the second selection's steps: distill, train and evaluate a student (its RL teacher's eval is the main one's)
also_steps=distill,student_sft,eval_student
also_controls=distill_sft_teacher,student_sft_sft_teacher,eval_student_sft_teacher
start=$SECONDS
pipeline() {  # <folder> <seed> <steps> [overrides]: a second attempt continues from a stage that failed
  local folder=$1 seed=$2 steps=$3; shift 3
  ./launch_mono.sh "$config" seed="$seed" output_dir="$folder" "steps=[$steps]" "${extra[@]}" "$@" && return 0
  # a vLLM start that failed on another process's memory moves (study run 7, docs/STUDY.md) is likelier to pass a
  # little later
  echo "pipeline $folder failed: one more attempt from the stage that failed, in 30 s"
  sleep 30
  ./launch_mono.sh "$config" seed="$seed" output_dir="$folder" "steps=[$steps]" "${extra[@]}" "$@"
}
selection() {  # <folder> <seed> <steps>: a pipeline whose distill keeps $also
  pipeline "$@" "+pipeline.distill.extra_overrides=['distill.selection=$also']"
}
link() {  # <folder> <from folder> <step folder names...>: link each that exists there and not here
  local to=$1 from=$2 step; shift 2
  for step in "$@"; do
    [ -e "$from/$step" ] && [ ! -e "$to/$step" ] && ln -sn "$(readlink -f "$from/$step")" "$to/$step"
  done
  return 0
}
link_steps() {  # <folder> <from folder>: link every step folder that ran there (not a link itself) into <folder>
  local step
  for step in "$2"/[0-9]*_*; do
    [ -d "$step" ] && [ ! -L "$step" ] && link "$1" "$2" "$(basename "$step")"
  done
  return 0
}
pipeline "$root/seed$first" "$first" teacher_sft > "$root/logs/teacher_sft.log" 2>&1
sft=$?
echo "teacher_sft exit $sft after $((SECONDS - start)) s"
[ $sft -eq 0 ] || { echo "teacher_sft=$sft" > "$root/DONE"; exit 1; }

control() {  # <worker index>: the control steps of every workers-th seed, one seed after another
  local i=0 code=0 seed steps
  for seed in $seeds; do
    if [ $((i % workers)) -eq "$1" ]; then
      steps=$controls
      [ "$seed" = "$first" ] && steps+=${steps:+,}eval_sft_teacher
      if [ -n "$controls" ]; then
        pipeline "$root/seed${seed}ctl" "$seed" "$steps" > "$root/logs/seed${seed}ctl.log" 2>&1 || code=1
      fi
      if [ -n "$also" ]; then
        selection "$root/seed$seed-${also}ctl" "$seed" "$also_controls" \
          > "$root/logs/seed$seed-${also}ctl.log" 2>&1 || code=1
      fi
    fi
    i=$((i + 1))
  done
  return $code
}
chain() {  # <seed>: RL, then the student, the teacher's eval and the second selection at once
  local seed=$1 code=0 pids=() pid
  pipeline "$root/seed$seed" "$seed" teacher_rlt || return 1
  link "$root/seed${seed}ev" "$root/seed$seed" 1_teacher_sft 2_teacher_rlt
  pipeline "$root/seed$seed" "$seed" distill,student_sft,eval_student > "$root/logs/seed$seed-student.log" 2>&1 &
  pids+=($!)
  pipeline "$root/seed${seed}ev" "$seed" eval_teacher > "$root/logs/seed${seed}ev.log" 2>&1 &
  pids+=($!)
  if [ -n "$also" ]; then
    link "$root/seed$seed-$also" "$root/seed$seed" 2_teacher_rlt
    selection "$root/seed$seed-$also" "$seed" "$also_steps" > "$root/logs/seed$seed-$also.log" 2>&1 &
    pids+=($!)
  fi
  for pid in "${pids[@]}"; do wait "$pid" || code=1; done
  return $code
}
pids=() names=()
for seed in $seeds; do
  folders=("seed$seed" "seed${seed}ctl" "seed${seed}ev")
  [ -n "$also" ] && folders+=("seed$seed-$also" "seed$seed-${also}ctl")
  for folder in "${folders[@]}"; do
    mkdir -p "$root/$folder"
    [ "$folder" = "seed$first" ] || link "$root/$folder" "$root/seed$first" 1_teacher_sft
  done
  chain "$seed" > "$root/logs/seed$seed.log" 2>&1 &
  pids+=($!) names+=("seed$seed")
done
for ((w = 0; w < workers; w++)); do
  control "$w" &
  pids+=($!) names+=("control$w")
done
codes=()
for i in "${!pids[@]}"; do wait "${pids[$i]}"; codes+=("${names[$i]}=$?"); done
echo "${codes[*]} after $((SECONDS - start)) s"

folders=() also_folders=()
for seed in $seeds; do
  link_steps "$root/seed$seed" "$root/seed${seed}ctl"
  link_steps "$root/seed$seed" "$root/seed${seed}ev"
  folders+=("$root/seed$seed")
  if [ -n "$also" ]; then  # the teachers' evals are the same under either selection
    link_steps "$root/seed$seed-$also" "$root/seed$seed-${also}ctl"
    link "$root/seed$seed-$also" "$root/seed$seed" 5_eval_teacher 10_eval_sft_teacher
    also_folders+=("$root/seed$seed-$also")
  fi
done
python3 -m rlt_mono.study aggregate "${folders[@]}" --out "$root/aggregate" > "$root/logs/aggregate.log" 2>&1
aggregated=$?
if [ -n "$also" ]; then
  python3 -m rlt_mono.study aggregate "${also_folders[@]}" --out "$root/aggregate-$also" \
    > "$root/logs/aggregate-$also.log" 2>&1 || aggregated=$?
fi
echo "teacher_sft=$sft ${codes[*]} aggregate=$aggregated seconds=$((SECONDS - start))" > "$root/DONE"
