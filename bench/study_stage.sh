# stage <folder> <log name> <command...>: one run of a study (bench/study_fair.sh sources this), into <folder>, its
# output in <root>/logs/<log name>.log; skipped when <folder> holds what a finished run leaves (eval.json, final/).
# Runs share GPUs, so a run can fail only because another one holds the card's memory at that moment: a run that
# stopped for want of GPU memory (vLLM's engine found too little free memory; training ran out of it) is tried again
# every STUDY_RETRY_SECONDS (default 60) up to STUDY_MEMORY_TRIES times (default 10); any other failure once more,
# STUDY_RETRY_SECONDS / 2 later; a run whose weights went non-finite (rlt_mono.runs.diverged) not at all, as it would
# only diverge again. A run tried again starts in an empty folder if it left no checkpoint, else resumes from its
# newest one. Needs root and check (1: compose and check the command only: launch_mono.sh --check).
GPU_MEMORY_FAILURE='less than desired GPU memory utilization|out of GPU memory|CUDA out of memory'

stage() {
  local folder=$1 log=$2; shift 2
  local file=$root/logs/$log.log
  if [ "$check" = 1 ]; then  # as on a GPU host: where no GPU is named, the config is checked as for one
    CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0} "$@" output_dir="$folder" --check >> "$file" 2>&1
    return
  fi
  if [ -f "$folder/eval.json" ] || [ -d "$folder/final" ]; then return 0; fi
  local pause=${STUDY_RETRY_SECONDS:-60} memory_tries=${STUDY_MEMORY_TRIES:-10} tries=0 others=0 again=() lines
  local start=0
  [ -f "$file" ] && start=$(wc -l < "$file")
  until "$@" output_dir="$folder" "${again[@]}" >> "$file" 2>&1; do
    lines=$(tail -n "+$((start + 1))" "$file")  # this attempt's output alone
    if grep -q "made the weights non-finite" <<< "$lines"; then return 1; fi
    if grep -Eq "$GPU_MEMORY_FAILURE" <<< "$lines"; then
      tries=$((tries + 1))
      [ "$tries" -le "$memory_tries" ] || return 1
      echo "bench/study_stage.sh: $log stopped for want of GPU memory; trying again in $pause s" \
        "($tries of $memory_tries)" >> "$file"
      sleep "$pause"
    else
      others=$((others + 1))
      [ "$others" -le 1 ] || return 1
      echo "bench/study_stage.sh: $log failed; trying again in $((pause / 2)) s" >> "$file"
      sleep $((pause / 2))
    fi
    start=$(wc -l < "$file") again=()
    if compgen -G "$folder/checkpoint-*" > /dev/null; then again=(resume_from_checkpoint=true); else rm -rf "$folder"; fi
  done
}
