# stage <folder> <log name> <command...>: one run of a study (bench/study_fair.sh sources this), into <folder>, its
# output in <root>/logs/<log name>.log; skipped when <folder> holds what a finished run leaves (eval.json, final/).
# Runs share GPUs, so a run can fail only because another one holds the card's memory at that moment: a run that
# stopped for want of GPU memory (vLLM's engine found too little free memory; training ran out of it) is tried again
# after STUDY_RETRY_SECONDS (default 60) plus a random part of as much again, up to STUDY_MEMORY_TRIES times (default
# 10): two runs that ran out together on one card would otherwise start together again, and run out together, every
# time (seen: two 1.5B students, ten tries each, the card idle between); any other failure once more,
# STUDY_RETRY_SECONDS / 2 later; a run whose weights went non-finite (rlt_mono.runs.diverged) not at all, as it would
# only diverge again. A run resumes from its newest whole checkpoint (one with rlt_mono.runs.checkpoints' manifest)
# when its folder holds one, the first try included; tried again without one, it starts in an empty folder, except
# a distill, which continues from the explanations it wrote (distill.jsonl). Needs root and check (1: compose and
# check the command only: launch_mono.sh --check).
GPU_MEMORY_FAILURE='less than desired GPU memory utilization|out of GPU memory|CUDA out of memory'
CHECKPOINT_MANIFEST=rlt_mono_checkpoint.json  # rlt_mono.runs.checkpoints.MANIFEST: written last, when a save is whole

# <folder>: the override that resumes it, when it holds a whole checkpoint
resume_override() {
  if compgen -G "$1/checkpoint-*/$CHECKPOINT_MANIFEST" > /dev/null; then echo resume_from_checkpoint=true; fi
}

stage() {
  local folder=$1 log=$2; shift 2
  local file=$root/logs/$log.log
  if [ "$check" = 1 ]; then  # as on a GPU host: where no GPU is named, the config is checked as for one
    echo "bench/study_stage.sh: CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0} $* output_dir=$folder --check" >> "$file"
    CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0} "$@" output_dir="$folder" --check >> "$file" 2>&1
    return
  fi
  if [ -f "$folder/eval.json" ] || [ -d "$folder/final" ]; then return 0; fi
  # the command, first in its log: the rows a student read and the GPU it ran on stay there
  echo "bench/study_stage.sh: CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-} $* output_dir=$folder" >> "$file"
  local pause=${STUDY_RETRY_SECONDS:-60} memory_tries=${STUDY_MEMORY_TRIES:-10} tries=0 others=0
  local lines start resume wait_s
  resume=$(resume_override "$folder")
  start=$(stat -c %s "$file" 2>/dev/null || echo 0)  # bytes: this attempt's output starts after them
  until "$@" output_dir="$folder" $resume >> "$file" 2>&1; do
    lines=$(tail -c "+$((start + 1))" "$file")
    if grep -q "made the weights non-finite" <<< "$lines"; then return 1; fi
    if grep -Eq "$GPU_MEMORY_FAILURE" <<< "$lines"; then
      tries=$((tries + 1))
      [ "$tries" -le "$memory_tries" ] || return 1
      wait_s=$((pause + RANDOM % (pause + 1)))  # the random part sets apart runs that failed together
      echo "bench/study_stage.sh: $log stopped for want of GPU memory; trying again in $wait_s s" \
        "($tries of $memory_tries)" >> "$file"
      sleep "$wait_s"
    else
      others=$((others + 1))
      [ "$others" -le 1 ] || return 1
      echo "bench/study_stage.sh: $log failed; trying again in $((pause / 2)) s" >> "$file"
      sleep $((pause / 2))
    fi
    resume=$(resume_override "$folder")
    [ -n "$resume" ] || [ -f "$folder/distill.jsonl" ] || rm -rf "$folder"
    start=$(stat -c %s "$file")
  done
}
