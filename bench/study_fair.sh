#!/usr/bin/env bash
# "Does it teach?", the fair test on GSM-Symbolic (docs/STUDY.md): one part of the study per call, resumable (a
# finished run folder, one with eval.json or final/, is skipped), runs side by side on one GPU.
#   bash bench/study_fair.sh <part> <root> [seeds, e.g. 0,1,2]
# Parts:
#   control   the positive control: the untrained students (the student chat and a plain step-by-step prompt) and
#             students trained on the dataset's own worked solutions (sft.explanation_column=none), for each seed;
#             every student evaluated on both held-out sets (1,000 questions each).
#   traces    the larger-model traces: Qwen2.5-Coder-1.5B-Instruct answers every training question with the plain
#             prompt (eval.split=train, at most 768 tokens) in <root>/traces/eval; its right, uncut answers become
#             <root>/traces/traces.jsonl (bench/study_fair.py traces; column trace). Seeds are not used.
# Environment:
#   STUDY_STUDENTS   students, comma-separated config names (default qwen2.5_coder_0.5b_instruct)
#   STUDY_SFT        extra student SFT overrides (words, no spaces inside one)
#   STUDY_TINY       1: the embedded tiny pair on CPU (what the tests run)
#   STUDY_UNTRAINED  0: leave out the untrained students (when their evals are in the study already)
# Each run writes <root>/<student>/<arm>[_s<seed>]/{sft,eval}; logs in <root>/logs; <root>/DONE holds the exit codes.
# bench/study_fair.py summarize <root> writes study.json (arms, intervals, differences) from the eval folders.
set -uo pipefail
part=${1:?usage: bash bench/study_fair.sh <part: control|traces> <root> [seeds]}
root=${2:?usage: bash bench/study_fair.sh <part: control|traces> <root> [seeds]}
seeds=${3:-0,1,2}
seeds=${seeds//,/ }
students=${STUDY_STUDENTS:-qwen2.5_coder_0.5b_instruct}
students=${students//,/ }
read -ra sft_extra <<< "${STUDY_SFT:-}"
case "$part" in
  control|traces) ;;
  *) echo "bench/study_fair.sh: unknown part '$part' (parts: control, traces)" >&2; exit 2 ;;
esac
mkdir -p "$root/logs"
start=$SECONDS

if [ "${STUDY_TINY:-0}" = 1 ]; then
  size=(size=tiny data.source=embedded data.embedded_rows=60 data.eval_rows=8 data.gsm_items_per_template=1
        "data.heldout_templates=[]" data.heldout_template_rows=null)
  sft_size=(sft.max_steps=2)
  eval_size=(eval.student_max_new_tokens=16)
  traces_eval=(student=tiny eval.student_max_new_tokens=16)
else
  size=(data=gsm_symbolic)
  # Every training question (5,242), two passes, 16 rows a step (656 steps), full fine-tune, no checkpoint but
  # final/. lr 2e-6: at the RLT student's 1e-5 the worked-solution students reach 0.79 on held-out instances but
  # fall to 0.04-0.08 on held-out templates (from the untrained 0.18-0.22: they copy the training templates' steps);
  # at 2e-6, 0.83 and 0.18; at 5e-7, 0.74 and 0.14 (docs/STUDY.md, one seed each for 2e-6 and 5e-7).
  sft_size=(sft.num_train_epochs=2 sft.max_steps=-1 sft.per_device_train_batch_size=16
            sft.gradient_accumulation_steps=1 sft.per_device_eval_batch_size=64 sft.learning_rate=2.0e-6
            sft.max_length=1024 sft.optim=adamw_torch sft.gradient_checkpointing=false sft.save_steps=100000
            sft.eval_strategy=epoch logging=local)
  # Greedy answers of at most 512 tokens; a fixed 3 GiB KV cache (runs side by side); vLLM at 0.08 of the card.
  eval_size=(eval.student_max_new_tokens=512 eval.vllm_gpu_memory_utilization=0.08 eval.vllm_kv_cache_gib=3)
  # The larger model alone on the card, vLLM at half of it; answers of at most 768 tokens (the plain prompt cut
  # 1.9-5.1% of the 0.5B's answers at 512).
  traces_eval=(student=qwen2.5_coder_1.5b_instruct eval.student_max_new_tokens=768
               eval.vllm_gpu_memory_utilization=0.5)
fi

# <folder> <log name> <command...>: run unless <folder> holds what the stage leaves when it ends
stage() {
  local folder=$1 log=$2; shift 2
  if [ -f "$folder/eval.json" ] || [ -d "$folder/final" ]; then return 0; fi
  "$@" output_dir="$folder" >> "$root/logs/$log.log" 2>&1
}
evaluate() {  # <folder> <prompt> <seed> [student overrides]: the student answers each held-out question alone
  local folder=$1 prompt=$2 seed=$3; shift 3
  local log=${folder#"$root"/}
  stage "$folder" "${log//\//_}" ./launch_mono.sh eval "${size[@]}" "${eval_size[@]}" \
    model.model_name_or_path=null "student=$student_cfg" "eval.student_prompt=$prompt" "seed=$seed" "$@"
}
worked() {  # <seed>: a student trained on the worked solutions, then evaluated
  local dir=$root/$student/worked_s$1
  stage "$dir/sft" "${student}_worked_s$1_sft" ./launch_mono.sh student_sft "${size[@]}" "${sft_size[@]}" \
    "${sft_extra[@]}" "student=$student_cfg" student.dtype=float32 data.source="${size_source}" \
    sft.explanation_column=none "seed=$1" || return 1
  evaluate "$dir/eval" student "$1" "student.model_name_or_path=$dir/sft/final" student.gguf_file=null
}

if [ "$part" = traces ]; then  # one run: the eval on the training split, then its right answers as traces
  dir=$root/traces
  stage "$dir/eval" traces_eval ./launch_mono.sh eval "${size[@]}" "${traces_eval[@]}" model.model_name_or_path=null \
    eval.split=train eval.student_prompt=plain seed=0 \
    && { PYTHONPATH=".${PYTHONPATH:+:$PYTHONPATH}" "${PYTHON:-python3}" bench/study_fair.py traces "$dir/eval" \
         --out "$dir/traces.jsonl" 2>&1 | tee -a "$root/logs/traces.log"; }
  status=$?
  echo "traces=$status seconds=$((SECONDS - start))" | tee "$root/DONE"
  exit "$status"
fi

pids=() names=()
for student in $students; do
  student_cfg=$student
  [ "${STUDY_TINY:-0}" = 1 ] && student_cfg=tiny
  size_source=gsm_symbolic
  [ "${STUDY_TINY:-0}" = 1 ] && size_source=embedded
  if [ "${STUDY_UNTRAINED:-1}" != 0 ]; then
    evaluate "$root/$student/untrained/eval" student 0 & pids+=($!) names+=("$student/untrained")
    evaluate "$root/$student/untrained_plain/eval" plain 0 & pids+=($!) names+=("$student/untrained_plain")
  fi
  for seed in $seeds; do
    worked "$seed" & pids+=($!) names+=("$student/worked_s$seed")
  done
done
codes=()
for i in "${!pids[@]}"; do wait "${pids[$i]}"; codes+=("${names[$i]}=$?"); done
echo "${codes[*]} seconds=$((SECONDS - start))" | tee "$root/DONE"
