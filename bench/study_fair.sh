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
#   STUDY_GPUS       GPUs to spread the runs over, comma-separated (default: every GPU nvidia-smi lists; none on CPU):
#                    the traces and the untrained evals go to the first, seed i's student to GPU (i+1) mod count
#   STUDY_SERIAL     1: each GPU's students one after another (a 1.5B student SFT takes about 50 GB: one per H100)
# Each run writes <root>/<student>/<arm>[_s<seed>]/{sft,eval}; logs in <root>/logs; <root>/DONE holds the exit codes.
# bench/study_fair.py summarize <root> writes study.json (arms, intervals, differences) from the eval folders.
set -uo pipefail
part=${1:?usage: bash bench/study_fair.sh <part: control|traces, or both: control,traces> <root> [seeds]}
root=${2:?usage: bash bench/study_fair.sh <part: control|traces> <root> [seeds]}
seeds=${3:-0,1,2}
seeds=${seeds//,/ }
students=${STUDY_STUDENTS:-qwen2.5_coder_0.5b_instruct}
students=${students//,/ }
read -ra sft_extra <<< "${STUDY_SFT:-}"
parts=${part//,/ }
for one in $parts; do
  case "$one" in
    control|traces) ;;
    *) echo "bench/study_fair.sh: unknown part '$one' (parts: control, traces)" >&2; exit 2 ;;
  esac
done
if [ -n "${STUDY_GPUS:-}" ]; then gpus=(${STUDY_GPUS//,/ })
elif command -v nvidia-smi > /dev/null; then mapfile -t gpus < <(nvidia-smi -L | awk '{sub(":", "", $2); print $2}')
else gpus=(); fi
on_gpu() {  # <lane> <command...>: the command with CUDA_VISIBLE_DEVICES set to that lane's GPU (as is on CPU)
  local lane=$1; shift
  if [ ${#gpus[@]} -eq 0 ]; then "$@"; else CUDA_VISIBLE_DEVICES=${gpus[$((lane % ${#gpus[@]}))]} "$@"; fi
}
mkdir -p "$root/logs"
start=$SECONDS

if [ "${STUDY_TINY:-0}" = 1 ]; then
  size=(size=tiny data.source=embedded data.embedded_rows=60 data.eval_rows=8 data.gsm_items_per_template=1
        "data.heldout_templates=[]" data.heldout_template_rows=null)
  sft_size=(sft.max_steps=2)
  eval_size=(eval.student_max_new_tokens=16)
  untrained_size=()
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
  # The untrained students write longer answers: at 512 tokens the plain prompt cut 5.1% of the 0.5B's answers on
  # held-out templates (the study's bar is 5%), so they get 768.
  untrained_size=(eval.student_max_new_tokens=768)
  # The larger model, a fixed 12 GiB KV cache (other runs may share the card); answers of at most 768 tokens (the
  # plain prompt cut 1.9-5.1% of the 0.5B's answers at 512).
  traces_eval=(student=qwen2.5_coder_1.5b_instruct eval.student_max_new_tokens=768
               eval.vllm_gpu_memory_utilization=0.2 eval.vllm_kv_cache_gib=12)
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

traces() {  # the eval on the training split, then its right answers as traces
  local dir=$root/traces
  stage "$dir/eval" traces_eval ./launch_mono.sh eval "${size[@]}" "${traces_eval[@]}" model.model_name_or_path=null \
    eval.split=train eval.student_prompt=plain seed=0 \
    && { PYTHONPATH=".${PYTHONPATH:+:$PYTHONPATH}" "${PYTHON:-python3}" bench/study_fair.py traces "$dir/eval" \
         --out "$dir/traces.jsonl" >> "$root/logs/traces.log" 2>&1; }
}
worked_chain() {  # <seed...>: each seed's worked student, one after another
  local seed status=0
  for seed in "$@"; do worked "$seed" || status=1; done
  return $status
}

pids=() names=()
for one in $parts; do
  if [ "$one" = traces ]; then
    on_gpu 0 traces & pids+=($!) names+=(traces)
    continue
  fi
  for student in $students; do
    student_cfg=$student
    [ "${STUDY_TINY:-0}" = 1 ] && student_cfg=tiny
    size_source=gsm_symbolic
    [ "${STUDY_TINY:-0}" = 1 ] && size_source=embedded
    if [ "${STUDY_UNTRAINED:-1}" != 0 ]; then
      on_gpu 0 evaluate "$root/$student/untrained/eval" student 0 "${untrained_size[@]}" &
      pids+=($!) names+=("$student/untrained")
      on_gpu 0 evaluate "$root/$student/untrained_plain/eval" plain 0 "${untrained_size[@]}" &
      pids+=($!) names+=("$student/untrained_plain")
    fi
    lane=1
    if [ "${STUDY_SERIAL:-0}" = 1 ]; then  # one chain per GPU
      for ((g = 0; g < (${#gpus[@]} > 0 ? ${#gpus[@]} : 1); g++)); do
        chain=() i=0
        for seed in $seeds; do [ $(((i + 1) % (${#gpus[@]} > 0 ? ${#gpus[@]} : 1))) -eq "$g" ] && chain+=("$seed"); i=$((i + 1)); done
        [ ${#chain[@]} -gt 0 ] || continue
        on_gpu "$g" worked_chain "${chain[@]}" & pids+=($!) names+=("$student/worked_s${chain[*]// /,}")
      done
    else
      for seed in $seeds; do
        on_gpu "$lane" worked "$seed" & pids+=($!) names+=("$student/worked_s$seed")
        lane=$((lane + 1))
      done
    fi
  done
done
codes=()
for i in "${!pids[@]}"; do wait "${pids[$i]}"; codes+=("${names[$i]}=$?"); done
echo "${codes[*]} seconds=$((SECONDS - start))" | tee "$root/DONE"
