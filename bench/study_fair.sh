#!/usr/bin/env bash
# "Does it teach?", the fair test on GSM-Symbolic (docs/STUDY.md): one part of the study per command, resumable (a
# finished run folder, one with eval.json, final/ or distill.jsonl's DONE mark, is skipped), runs side by side on
# the GPUs there are.
#   bash bench/study_fair.sh <part[,part...]> <root> [seeds, e.g. 0,1,2]     (parts in a list run side by side)
# Parts:
#   control   the positive control: the untrained students (the student chat and a plain step-by-step prompt) and
#             students trained on the dataset's own worked solutions (sft.explanation_column=none), for each seed;
#             every student evaluated on both held-out sets (1,000 questions each).
#   traces    the larger-model traces: Qwen2.5-Coder-1.5B-Instruct answers every training question with the plain
#             prompt (eval.split=train, at most 768 tokens) in <root>/traces/eval; its right, uncut answers become
#             <root>/traces/traces.jsonl (bench/study_fair.py traces; column trace). Seeds are not used.
#   teachers  the teachers: SFT warm-up of the 0.5B teacher on <root>/traces/traces.jsonl (written from
#             study_data/gsm_symbolic_v2/traces.jsonl.gz when absent), then GRPO with the worked-solution reward
#             for each seed and with the answer-only reward (seed 0), then each teacher (and seed 0's checkpoints)
#             explains every training question: <root>/distilled/<teacher>.jsonl.
#   students  students trained on each arm's explanations + solutions (STUDY_ARMS), for each seed, then evaluated:
#             traces (the 1.5B's traces), sft_teacher, rl_teacher (seed s: the RL teacher of seed s),
#             rl_teacher_answer_only, rl_teacher_step<N> (seed 0's RL checkpoint N, for each seed), worked_common (the
#             worked solutions alone, of the questions the SFT teacher's file holds: the teachers' arms' questions when
#             the files hold the questions every teacher explained, bench/study_fair.py common). The distilled files
#             (sft, rl_s<seed>, rl_answer_s0, rl_step<N>) come from <root>/distilled or STUDY_DISTILLED; where that
#             holds none, from the explanations the repository keeps (STUDY_EXPLANATIONS). The
#             control's arms run here too, so that every arm runs at one commit on one machine: untrained and
#             untrained_plain (the two untrained evals, once each) and worked (every training question's worked
#             solution).
# Environment:
#   STUDY_STUDENTS   students, comma-separated config names (default qwen2.5_coder_0.5b_instruct)
#   STUDY_ARMS       the students part's arms (default traces,sft_teacher,rl_teacher,rl_teacher_answer_only,
#                    worked_common)
#   STUDY_DISTILLED  folder of <teacher>.jsonl[.gz] for the students part (default <root>/distilled)
#   STUDY_EXPLANATIONS  the teachers' explanations kept in the repository (bench/study_fair.py keep's folder; default
#                    study_data/gsm_symbolic_v2/explanations, none with STUDY_TINY=1; empty: none): when
#                    STUDY_DISTILLED holds no <teacher>.jsonl[.gz], the students part writes them there from it
#                    (bench/study_fair.py restore)
#   STUDY_RL_STEPS   RL optimizer steps of 256 completions (default 188: 48,128 completions a seed)
#   STUDY_EXPLANATION_TOKENS  the longest explanation a teacher writes, in RL and in distill (default 256; the
#                    SFT teacher's trace-style explanations overran 256 on half the questions, so RL learned mostly
#                    to close within it: docs/STUDY.md, "What is left")
#   STUDY_RL_GPUS    GPUs each RL teacher trains on (1, 2, 4 or 8; default 1): placement=dp over that many, the same
#                    256 completions a step; teacher i's from GPU i x STUDY_RL_GPUS on (a 0.5B teacher's 188 steps
#                    take about 23 minutes on one GPU)
#   STUDY_RL_MINUTES stop each RL run after this many minutes of training (trainer.max_minutes; a GPU held for a
#                    fixed time); its held-out curve and teachers.json say the step it reached
#   STUDY_DISTILL_ROWS     training questions each teacher explains (data.max_rows: a seeded sample covering
#                          every template; default all 5,242)
#   STUDY_DISTILL_SAMPLES  explanations per question, the best by the RLT reward kept (default 4)
#   STUDY_SFT        extra student SFT overrides (words, no spaces inside one)
#   STUDY_RL         extra overrides of the teachers' RL runs, after the study's own (words, no spaces inside one;
#                    e.g. memory=speed trainer.vllm_gpu_memory_utilization=0.5: a teacher alone on its GPU)
#   STUDY_ANSWER_ONLY  0: the teachers part leaves out the answer-only RL teacher (the ablation arm); only: it
#                    trains that one alone (the SFT teacher, then the answer-only teacher; the seeds argument unused)
#   STUDY_SFT_SEEDS  teachers part: the SFT teacher also explains every question with these distill seeds (e.g.
#                    1,2; none by default), into distilled/sft_s<seed>.jsonl, beside its own distill (seed 0): the
#                    sft_teacher students of seed s read sft_s<s> where it exists, so that the SFT arm, like the RL
#                    arm (one teacher a seed), holds the spread of the teacher's samples
#   STUDY_SFT_DISTILL  teachers part: when the SFT teacher explains: beside (default; beside the RL runs) or after
#                    (once they end: on one GPU the RL run then has the card alone, and its memory plan, read at
#                    its start, is not undercut by a distill starting beside it)
#   STUDY_TINY       1: the embedded tiny pair on CPU (what the tests run)
#   STUDY_CHECK      1: run nothing; compose and check every command the parts would run (launch_mono.sh --check,
#                    each into its log; exit codes in DONE), on any machine: a typo costs seconds here, not a GPU
#                    host's start
#   STUDY_UNTRAINED  0: leave out the untrained students (when their evals are in the study already)
#   STUDY_GPUS       GPUs to spread the runs over, comma-separated (default: every GPU nvidia-smi lists; none on CPU):
#                    the traces and the control part's untrained evals go to the first, its seed i's student to
#                    GPU (i+1) mod count; the students part deals its runs to STUDY_SLOTS lanes a GPU
#   STUDY_SLOTS      students part: students side by side on a GPU (default 2, and 1 where a student is the 1.5B:
#                    one 1.5B student SFT, 16 rows of <= 1,024 tokens in float32, held 106 GiB of an H200 by
#                    nvidia-smi); the students are dealt round-robin to the slots, each slot's one after another
#   STUDY_ANSWERS    students part: a folder of exported answers (bench/study_fair.py export's --out, e.g. the
#                    committed study_data/gsm_symbolic_v2/answers): a run whose file is there, exported at this
#                    study's commit (<root>/commit, when there is one), is not run again
#   STUDY_MINUTES    students part: a slot starts no run that would end past this many minutes from the part's
#                    start, judged by the slot's longest run so far (a part fits a GPU held for a fixed time: the
#                    runs left out are named, the slot ends with code 3, and a later part runs them)
#   STUDY_SERIAL     1: each GPU's students one after another (STUDY_SLOTS=1)
#   STUDY_ROUNDED_TEACHERS 1: students part: also teach from kept teachers that trained full bfloat16 or float16
#                    weights (bench/study_fair.py rounded); by default their students are not run
#   STUDY_KEEP_STUDENTS 1: keep each trained student's weights (<run>/sft/final) after its eval; by default they
#                    are deleted once it is evaluated (answers, metrics and configs stay)
# Each student writes <root>/<student>/<arm>[_s<seed>]/{sft,eval}; each teacher <root>/teachers/<teacher>/{sft,rl,
# distill...}; logs in <root>/logs; <root>/DONE holds the exit codes.
# bench/study_fair.py summarize <root> writes study.json (arms, intervals, differences) from the eval folders.
set -uo pipefail
part=${1:?usage: bash bench/study_fair.sh <part[,part...]: control|traces|teachers|students> <root> [seeds]}
root=${2:?usage: bash bench/study_fair.sh <part[,part...]: control|traces|teachers|students> <root> [seeds]}
seeds=${3:-0,1,2}
seeds=${seeds//,/ }
students=${STUDY_STUDENTS:-qwen2.5_coder_0.5b_instruct}
students=${students//,/ }
read -ra sft_extra <<< "${STUDY_SFT:-}"
read -ra rl_extra <<< "${STUDY_RL:-}"
arms=${STUDY_ARMS:-traces,sft_teacher,rl_teacher,rl_teacher_answer_only,worked_common}
arms=${arms//,/ }
distilled=${STUDY_DISTILLED:-$root/distilled}
kept_explanations=study_data/gsm_symbolic_v2/explanations
[ "${STUDY_TINY:-0}" = 1 ] && kept_explanations=
kept_explanations=${STUDY_EXPLANATIONS-$kept_explanations}
rl_steps=${STUDY_RL_STEPS:-188}
explanation_tokens=${STUDY_EXPLANATION_TOKENS:-256}
rl_gpus=${STUDY_RL_GPUS:-1}
[[ $rl_gpus == [1248] ]] || { echo "bench/study_fair.sh: STUDY_RL_GPUS=$rl_gpus: 1, 2, 4 or 8" >&2; exit 2; }
# An RL teacher on several GPUs: placement=dp, each rank a share of the 256 completions of a step (8 / GPUs micro-
# batches of 32 a rank), so a step is the same work as on one GPU.
rl_dp=()
[ "$rl_gpus" = 1 ] || rl_dp=(placement=dp "placement.num_processes=$rl_gpus"
                             "trainer.gradient_accumulation_steps=$((8 / rl_gpus))"
                             "trainer.steps_per_generation=$((8 / rl_gpus))")
[[ $explanation_tokens =~ ^[1-9][0-9]*$ ]] \
  || { echo "bench/study_fair.sh: STUDY_EXPLANATION_TOKENS=$explanation_tokens: a whole number >= 1" >&2; exit 2; }
for arm in $arms; do
  case "$arm" in
    untrained|untrained_plain|worked|traces|sft_teacher|rl_teacher|rl_teacher_answer_only|rl_teacher_step[0-9]*|worked_common) ;;
    *) echo "bench/study_fair.sh: unknown arm '$arm' (arms: untrained, untrained_plain, worked, traces, sft_teacher," \
            "rl_teacher, rl_teacher_answer_only, rl_teacher_step<N>, worked_common)" >&2; exit 2 ;;
  esac
done
parts=${part//,/ }
for one in $parts; do
  case "$one" in
    control|traces|teachers|students) ;;
    *) echo "bench/study_fair.sh: unknown part '$one' (parts: control, traces, teachers, students)" >&2; exit 2 ;;
  esac
done
if [ -n "${STUDY_GPUS:-}" ]; then gpus=(${STUDY_GPUS//,/ })
elif command -v nvidia-smi > /dev/null; then mapfile -t gpus < <(nvidia-smi -L | awk '{sub(":", "", $2); print $2}')
else gpus=(); fi
# <lane> <command...>: the command with CUDA_VISIBLE_DEVICES set to that lane's GPU (as is on CPU), and that GPU's
# own engine-start lock (vLLM starts wait for each other only where they share a card).
on_gpu() {
  local lane=$1 gpu; shift
  if [ ${#gpus[@]} -eq 0 ]; then "$@"; return; fi
  gpu=${gpus[$((lane % ${#gpus[@]}))]}
  CUDA_VISIBLE_DEVICES=$gpu RLT_MONO_ENGINE_LOCK=${TMPDIR:-/tmp}/rlt_mono-engine-gpu$gpu.lock "$@"
}
# <lane> <count> <command...>: the command on <count> GPUs from the lane's own on (CUDA_VISIBLE_DEVICES a list), the
# first one's engine-start lock; one GPU (or none) as on_gpu.
on_gpus() {
  local lane=$1 count=$2 list=() i; shift 2
  if [ ${#gpus[@]} -eq 0 ] || [ "$count" = 1 ]; then on_gpu "$lane" "$@"; return; fi
  for ((i = 0; i < count; i++)); do list+=("${gpus[$(((lane + i) % ${#gpus[@]}))]}"); done
  CUDA_VISIBLE_DEVICES=$(IFS=,; echo "${list[*]}") RLT_MONO_ENGINE_LOCK=${TMPDIR:-/tmp}/rlt_mono-engine-gpu${list[0]}.lock "$@"
}
mkdir -p "$root/logs"
start=$SECONDS
# How this study was started (<root>/command, written by offline_host/gpu_pipeline.sh fair), read now: each eval
# keeps it (<eval folder>/command), as a later command on the same root writes that file again.
study_command=$(cat "$root/command" 2> /dev/null || true)

if [ "${STUDY_TINY:-0}" = 1 ]; then
  size=(size=tiny data.source=embedded data.embedded_rows=60 data.eval_rows=8
        "data.heldout_templates=[]" data.heldout_template_rows=null)
  sft_size=(sft.max_steps=2)
  eval_size=(eval.student_max_new_tokens=16)
  traces_eval=(student=tiny eval.student_max_new_tokens=16)
  teacher_sft_size=(size=tiny sft.max_steps=2 data.eval_rows=2)
  rl_run=demo_tiny rl_size=(trainer.max_steps=2 trainer.eval_strategy=no) rl_checkpoints=(trainer.save_steps=1)
  distill_size=(size=tiny distill.max_new_tokens=8 distill.samples_per_question=2 data.max_rows=4)
  custom_sft=(size=tiny)
else
  size=(data=gsm_symbolic)
  # Every training question (5,242), two passes, 16 rows a step (656 steps), full fine-tune, no checkpoint but
  # final/. lr 2e-6: at the RLT student's 1e-5 the worked-solution students reach 0.79 on held-out instances but
  # fall to 0.04-0.08 on held-out templates (from the untrained 0.18-0.22: they copy the training templates' steps);
  # at 2e-6, 0.83 and 0.18; at 5e-7, 0.74 and 0.14 (docs/STUDY.md, one seed each for 2e-6 and 5e-7).
  # Float32 throughout (sft.bf16=false): under bfloat16 autocast over the float32 weights 8 of 11 students had a
  # NaN gradient at a random step (one at step 2, from the pretrained weights; the loss before it finite), and
  # the run trained on to a model that wrote one token over and over (docs/STUDY.md, "The students"). Matmuls in
  # TensorFloat-32 (float32 range, 10-bit mantissa inputs, float32 sums): a 0.5B-shaped step 0.151 s against 0.475 s
  # in float32 on an H200 (bench/sft_precision.py, results/sft_precision/h200.json). Rows of up to 1,152 tokens:
  # at 1,024, 1-21 of each kept teacher's 3,000 rows were cut (the SFT teacher's 15, the RL seeds' 1, 16, 21) and 2
  # of the 2,876 traces; the longest row is 1,086 tokens (rlt_mono.stages.sft.build_sft_dataset over the kept files
  # with the Qwen2.5 tokenizer, which the 1.5B shares), so every arm trains on whole rows.
  sft_size=(sft.num_train_epochs=2 sft.max_steps=-1 sft.per_device_train_batch_size=16
            sft.gradient_accumulation_steps=1 sft.per_device_eval_batch_size=64 sft.learning_rate=2.0e-6
            sft.max_length=1152 sft.optim=adamw_torch sft.gradient_checkpointing=false sft.save_steps=100000
            sft.eval_strategy=epoch sft.bf16=false +sft.tf32=true logging=local)
  # Greedy answers of at most 1,024 tokens, every arm's (the untrained's too); a fixed 3 GiB KV cache (runs side by
  # side); vLLM at 0.08 of the card. At 512 tokens the students taught by explanations had 2-31% of their answers
  # cut (thought + solution is long; on held-out instances few of them loop) and a cut answer is mostly
  # wrong; the untrained plain prompt was cut on 5.1% (docs/STUDY.md, "The students at one commit").
  eval_size=(eval.student_max_new_tokens=1024 eval.vllm_gpu_memory_utilization=0.08 eval.vllm_kv_cache_gib=3)
  # The larger model, a fixed 12 GiB KV cache (other runs may share the card); answers of at most 768 tokens (the
  # plain prompt cut 1.9-5.1% of the 0.5B's answers at 512).
  traces_eval=(student=qwen2.5_coder_1.5b_instruct eval.student_max_new_tokens=768
               eval.vllm_gpu_memory_utilization=0.2 eval.vllm_kv_cache_gib=12)
  # The teacher's SFT warm-up on the larger model's traces (question + worked solution -> trace), as the first
  # study's: 16 rows a step, lr 1e-5, the held-out loss (5% of the traces) every 20 steps, stopping after 2 without
  # improvement (the best checkpoint becomes final/), at most one pass.
  teacher_sft_size=(model=qwen2.5_coder_0.5b_instruct model.dtype=float32 logging=local sft.num_train_epochs=1
                    sft.max_steps=-1 sft.per_device_train_batch_size=16 sft.gradient_accumulation_steps=1
                    sft.per_device_eval_batch_size=64 sft.learning_rate=1.0e-5 sft.max_length=1024 sft.optim=adamw_torch
                    sft.gradient_checkpointing=false sft.eval_strategy=steps sft.eval_steps=20 sft.save_steps=20
                    sft.save_total_limit=1 sft.early_stopping_patience=2)
  # GRPO, one optimizer step per 256 completions (16 questions x 16 explanations; the paper: 1,024 = 16 x 64),
  # explanations of at most 256 tokens, lr 5e-6 (the first study's, under which the held-out reward rose for 500
  # steps of 32 completions; the paper's 1e-6 is for a 7B teacher), 188 steps = 48,128 completions a seed (the
  # first study: 16,000), DAPO refill of tied groups; the held-out reward every 47 steps on 128 held-out questions.
  # The student and reference stay on the GPU, vLLM awake (runs side by side), a 2,048-token context. The teacher's
  # weights in float32 under bfloat16 autocast, as the teacher SFT's: in bfloat16 a step of 5e-6 moves 10% of them
  # and the rest of it rounds away (rlt_mono/runs/precision.py; the teachers before 2026-11-29 trained so).
  rl_run=teacher_rlt_mono
  rl_size=(model.dtype=float32 student=qwen2.5_coder_0.5b_instruct student.dtype=bfloat16 logging=local memory=manual
           "trainer.max_steps=$rl_steps" "trainer.max_completion_length=$explanation_tokens" trainer.num_generations=16
           trainer.per_device_train_batch_size=32 trainer.gradient_accumulation_steps=8 trainer.steps_per_generation=8
           reward.micro_batch_size=32 trainer.learning_rate=5.0e-6 trainer.optim=adamw_torch trainer.save_steps=100000
           trainer.gradient_checkpointing=false trainer.eval_strategy=steps trainer.eval_steps=47
           trainer.eval_on_start=true trainer.eval_questions=128 trainer.dynamic_sampling_rounds=1
           placement.offload_student=false placement.offload_reference=false trainer.vllm_enable_sleep_mode=false
           trainer.vllm_gpu_memory_utilization=0.1 +trainer.vllm_max_model_length=2048
           ${STUDY_RL_MINUTES:+"trainer.max_minutes=$STUDY_RL_MINUTES"})
  # Seed 0 keeps a checkpoint every 30 steps (a 10-minute run reaches 71-85 on one H200), up to 4 (the default 2
  # would delete one before it explains): each explains the training questions and teaches its own student (the
  # teacher-reward <-> student-accuracy correlation).
  rl_checkpoints=(trainer.save_steps=30 trainer.save_total_limit=4)
  # Every training question, 4 explanations each, the best by the RLT reward kept. 512 questions a batch, a fixed
  # 12 GiB KV cache (1,024 sequences of <= 947 tokens at 12 KiB a token): at 64 a batch (6 GiB), 2 explanations of
  # <= 512 tokens, two distills side by side on an H200, a batch took 9-15 s (median 12; 1,600 questions in 6
  # minutes, docs/STUDY.md), the decoding's per-step cost (vLLM eager) paid for 128 sequences at a time.
  distill_size=(student=qwen2.5_coder_0.5b_instruct student.dtype=bfloat16 "distill.max_new_tokens=$explanation_tokens"
                "distill.samples_per_question=${STUDY_DISTILL_SAMPLES:-4}" distill.vllm_gpu_memory_utilization=0.1
                distill.rows_per_batch=512 distill.vllm_kv_cache_gib=12 reward.micro_batch_size=32
                ${STUDY_DISTILL_ROWS:+"data.max_rows=$STUDY_DISTILL_ROWS"})
  custom_sft=()
fi

size_source=gsm_symbolic  # the worked-solution students' data
[ "${STUDY_TINY:-0}" = 1 ] && size_source=embedded

check=${STUDY_CHECK:-0}
sft_distill=${STUDY_SFT_DISTILL:-beside}
[[ $sft_distill == beside || $sft_distill == after ]] \
  || { echo "bench/study_fair.sh: STUDY_SFT_DISTILL=$sft_distill: beside or after" >&2; exit 2; }
sft_seeds=${STUDY_SFT_SEEDS:-}
[[ -z $sft_seeds || $sft_seeds =~ ^[1-9][0-9]*(,[1-9][0-9]*)*$ ]] \
  || { echo "bench/study_fair.sh: STUDY_SFT_SEEDS=$sft_seeds: seeds >= 1, comma-separated" >&2; exit 2; }
sft_seeds=${sft_seeds//,/ }
[ "$(tr ' ' '\n' <<< "$sft_seeds" | sort | uniq -d)" = "" ] \
  || { echo "bench/study_fair.sh: STUDY_SFT_SEEDS=${STUDY_SFT_SEEDS}: each seed once" >&2; exit 2; }
answer_only=${STUDY_ANSWER_ONLY:-1}
[[ $answer_only == [01] || $answer_only == only ]] \
  || { echo "bench/study_fair.sh: STUDY_ANSWER_ONLY=$answer_only: 0, 1 or only" >&2; exit 2; }
source bench/study_stage.sh  # stage: one run, skipped when finished, tried again when it fails
for knob in STUDY_RETRY_SECONDS STUDY_MEMORY_TRIES; do  # stage's waits and tries: whole numbers, said at once
  [[ ${!knob:-0} =~ ^[0-9]+$ ]] || { echo "bench/study_fair.sh: $knob=${!knob}: a whole number" >&2; exit 2; }
done
budget_s=
if [ -n "${STUDY_MINUTES:-}" ]; then
  [[ $STUDY_MINUTES =~ ^[0-9]+([.][0-9]+)?$ ]] && [[ ! $STUDY_MINUTES =~ ^0+([.]0*)?$ ]] \
    || { echo "bench/study_fair.sh: STUDY_MINUTES=$STUDY_MINUTES: a number of minutes > 0" >&2; exit 2; }
  budget_s=$(awk -v m="$STUDY_MINUTES" 'BEGIN { printf "%d", m * 60 }')
fi
evaluate() {  # <folder> <prompt> <seed> [student overrides]: the student answers each held-out question alone
  local folder=$1 prompt=$2 seed=$3; shift 3
  local log=${folder#"$root"/}
  local ran_before=0
  [ -f "$folder/eval.json" ] && ran_before=1
  stage "$folder" "${log//\//_}" ./launch_mono.sh eval "${size[@]}" "${eval_size[@]}" \
    model.model_name_or_path=null "student=$student_cfg" "eval.student_prompt=$prompt" "seed=$seed" "$@" || return
  # the command that started this study, beside the eval it ran now (one that finished before keeps its own, or
  # none: a later command on the same root writes <root>/command again)
  [ "$check" = 1 ] || [ "$ran_before" = 1 ] || [ -z "$study_command" ] \
    || printf '%s\n' "$study_command" > "$folder/command"
}
# <run folder> <seed> <student_sft overrides...>: a student trained (<run>/sft), then evaluated (<run>/eval), then
# its weights (sft/final) deleted unless STUDY_KEEP_STUDENTS=1: the answers, metrics and configs are what the study
# keeps, and a 1.5B student is 6 GB in float32 (a host's disk filled with four of them and the caches). An
# evaluated run is never trained again.
trained_student() {
  local dir=$1 seed=$2; shift 2
  local log=${dir#"$root"/}
  [ -f "$dir/eval/eval.json" ] && return 0
  stage "$dir/sft" "${log//\//_}_sft" ./launch_mono.sh student_sft "$@" "seed=$seed" || return 1
  evaluate "$dir/eval" student "$seed" "student.model_name_or_path=$dir/sft/final" student.gguf_file=null || return
  [ "$check" = 1 ] || [ "${STUDY_KEEP_STUDENTS:-0}" = 1 ] || rm -rf "$dir/sft/final"
}
worked() {  # <seed>: a student trained on the worked solutions, then evaluated
  trained_student "$root/$student/worked_s$1" "$1" "${size[@]}" "${sft_size[@]}" "${sft_extra[@]}" \
    "student=$student_cfg" student.dtype=float32 data.source="${size_source}" sft.explanation_column=none
}

traces() {  # the eval on the training split, then its right answers as traces
  local dir=$root/traces
  stage "$dir/eval" traces_eval ./launch_mono.sh eval "${size[@]}" "${traces_eval[@]}" model.model_name_or_path=null \
    eval.split=train eval.student_prompt=plain seed=0 || return 1
  [ "$check" != 1 ] || return 0
  PYTHONPATH=".${PYTHONPATH:+:$PYTHONPATH}" "${PYTHON:-python3}" bench/study_fair.py traces "$dir/eval" \
    --out "$dir/traces.jsonl" >> "$root/logs/traces.log" 2>&1
}
worked_chain() {  # <seed...>: each seed's worked student, one after another
  local seed status=0
  for seed in "$@"; do worked "$seed" || status=1; done
  return $status
}

teacher_chain() {  # <lane> <seed> <reward: worked|answer>: RL from the SFT teacher (on STUDY_RL_GPUS GPUs from the
  # lane's), then its distills (the final teacher's on the lane's GPU)
  local lane=$1 seed=$2 reward=$3 name dir data=() keep=() step last
  name=rl_s$seed
  [ "$reward" = answer ] && name=rl_answer_s$seed data=(data.gsm_solution=answer)
  [ "$seed" = 0 ] && [ "$reward" = worked ] && keep=("${rl_checkpoints[@]}")
  dir=$root/teachers/$name
  local rl_status=0
  on_gpus "$lane" "$rl_gpus" stage "$dir/rl" "${name}_rl" ./launch_mono.sh "$rl_run" "${size[@]}" "${rl_size[@]}" \
    "${rl_dp[@]}" "${data[@]}" "${keep[@]}" "${rl_extra[@]}" "model.model_name_or_path=$root/teachers/sft/final" \
    "seed=$seed" || rl_status=1
  # STUDY_SFT_DISTILL=after waits for this, whatever the RL run's end (a check runs nothing and writes nothing)
  [ "$check" = 1 ] || { mkdir -p "$dir" && : > "$dir/rl_ended"; }
  [ $rl_status = 0 ] || return 1
  # Seed 0's checkpoints explain the training questions on the other lanes' GPUs (they are still training or
  # explaining: side by side), while its final teacher explains on its own. (A check has no checkpoints: their
  # distills are the final teacher's command, checked below.)
  local pids=() status=0 other=1 final_step
  if [ ${#keep[@]} -gt 0 ] && [ "$check" != 1 ]; then
    final_step=$(grep -o '"step": [0-9]*' "$dir/rl/metrics.jsonl" | tail -1 | grep -o '[0-9]*$')
    for step in $(find "$dir/rl" -maxdepth 1 -name 'checkpoint-*' | sed 's/.*-//' | sort -n); do
      [ "$step" -ge "${final_step:-0}" ] && continue  # the last step's teacher is final/
      on_gpu $other distill "$dir/rl/checkpoint-$step" "rl_step$step" & pids+=($!)
      other=$((other + 1))
    done
  fi
  on_gpu "$lane" distill "$dir/rl/final" "$name" "${data[@]}" || status=1
  for pid in "${pids[@]}"; do wait "$pid" || status=1; done
  return $status
}
distill() {  # <teacher folder> <name> [seed=<s>] [data override]: every training question explained (sampled with
  # seed s, default 0), into distilled/<name>.jsonl
  local teacher=$1 name=$2 seed=0; shift 2
  if [[ ${1:-} == seed=* ]]; then seed=${1#seed=}; shift; fi
  [ -f "$distilled/$name.jsonl" ] && return 0
  # data.seed=0: the rows (their draw, the held-out split, the cap's sample) are the same whatever seed samples the
  # explanations, so that every distill explains the same questions
  stage "$root/teachers/distill_$name" "distill_$name" ./launch_mono.sh distill "${size[@]}" "${distill_size[@]}" "$@" \
    "model.model_name_or_path=$teacher" "seed=$seed" data.seed=0 || return 1
  [ "$check" != 1 ] || return 0
  mkdir -p "$distilled" && cp "$root/teachers/distill_$name/distill.jsonl" "$distilled/$name.jsonl"
}
distilled_are_kept() {  # [--own <root>/teachers]: a file in $distilled named as a kept teacher holds its kept
  # rows, or (given --own: a teachers part run again on its root) is that root's own distill (else nothing runs)
  [ -n "$kept_explanations" ] && [ -f "$kept_explanations/manifest.json" ] && [ -d "$distilled" ] || return 0
  PYTHONPATH=".${PYTHONPATH:+:$PYTHONPATH}" "${PYTHON:-python3}" bench/study_fair.py check-distilled \
    "$kept_explanations" "$distilled" "$@"
}
unpack_traces() {  # <root>/traces/traces.jsonl from the committed traces, unless the traces part wrote it
  [ -s "$root/traces/traces.jsonl" ] && return 0
  mkdir -p "$root/traces" && gzip -dc study_data/gsm_symbolic_v2/traces.jsonl.gz > "$root/traces/traces.jsonl"
}
teachers() {  # the SFT teacher on the traces, then the RL teachers side by side (one per GPU where there are several)
  local traces=$root/traces/traces.jsonl lane=0 seed pids=() status=0 rl_seeds=$seeds
  [ "$answer_only" != only ] || rl_seeds=
  unpack_traces || return 1
  # an SFT distill put in first must be the kept one: it is not run again (this root's own distills, of a run of
  # this part before, pass)
  distilled_are_kept --own "$root/teachers" || return 1
  stage "$root/teachers/sft" teacher_sft ./launch_mono.sh teacher_sft "${teacher_sft_size[@]}" data=custom \
    "data.source=$traces" sft.explanation_column=trace seed=0 || return 1
  local rl_names=() name
  for seed in $rl_seeds; do rl_names+=("rl_s$seed"); done
  [ "$answer_only" = 0 ] || rl_names+=(rl_answer_s0)
  for name in "${rl_names[@]}"; do rm -f "$root/teachers/$name/rl_ended"; done
  if [ "$sft_distill" = beside ]; then
    sft_distills $lane & pids+=($!)
  else  # once every RL run has ended (beside the RL teachers' own distills)
    { for name in "${rl_names[@]}"; do
        until [ "$check" = 1 ] || [ -e "$root/teachers/$name/rl_ended" ]; do sleep 5; done
      done
      sft_distills 0; } & pids+=($!)
  fi
  for seed in $rl_seeds; do
    teacher_chain "$lane" "$seed" worked & pids+=($!)
    lane=$((lane + rl_gpus))
  done
  [ "$answer_only" = 0 ] || { teacher_chain "$lane" 0 answer & pids+=($!); }
  for pid in "${pids[@]}"; do wait "$pid" || status=1; done
  return $status
}
sft_distills() {  # <lane>: the SFT teacher's distill (seed 0) and those of STUDY_SFT_SEEDS, side by side
  local lane=$1 seed pids=() status=0
  on_gpu "$lane" distill "$root/teachers/sft/final" sft & pids+=($!)
  for seed in $sft_seeds; do on_gpu "$lane" distill "$root/teachers/sft/final" "sft_s$seed" "seed=$seed" & pids+=($!); done
  for pid in "${pids[@]}"; do wait "$pid" || status=1; done
  return $status
}
arm_teacher() {  # <arm> <seed>: the teacher whose explanations that arm's students read (nothing: none's); the SFT
  # teacher's sample of that seed where there is one (STUDY_SFT_SEEDS)
  case "$1" in
    sft_teacher) if [ "$2" != 0 ] && [ -s "$distilled/sft_s$2.jsonl" ]; then echo "sft_s$2"; else echo sft; fi ;;
    rl_teacher) echo "rl_s$2" ;;
    rl_teacher_answer_only) echo rl_answer_s0 ;;
    rl_teacher_step*) echo "rl_step${1#rl_teacher_step}" ;;
  esac
}
taught() {  # <seed> <arm>: a student trained on that arm's explanations + solutions, then evaluated
  local seed=$1 arm=$2 file column=explanation data=()
  case "$arm" in  # the control's arms, in the same job slots
    untrained) evaluate "$root/$student/untrained/eval" student 0; return ;;
    untrained_plain) evaluate "$root/$student/untrained_plain/eval" plain 0; return ;;
    worked) worked "$seed"; return ;;
  esac
  case "$arm" in
    traces) file=$root/traces/traces.jsonl column=trace ;;
    worked_common) file=$distilled/sft.jsonl column=none ;;  # the same questions, the worked solutions alone
    *) file=$distilled/$(arm_teacher "$arm" "$seed").jsonl ;;
  esac
  [ -s "$file" ] || [ "$check" = 1 ] || { echo "bench/study_fair.sh: no $file for the $arm students" >&2; return 2; }
  if [ "$arm" = rl_teacher_answer_only ]; then  # its explanations + the worked solution, as every taught arm learns
    local worked_rows=$root/$student/${arm}_s$seed/rows.jsonl
    if [ -s "$file" ] && [ "$check" != 1 ]; then  # (a check writes nothing)
      mkdir -p "${worked_rows%/*}"
      PYTHONPATH=".${PYTHONPATH:+:$PYTHONPATH}" "${PYTHON:-python3}" bench/study_fair.py worked-target "$file" \
        --out "$worked_rows" > /dev/null || return 2
    fi
    file=$worked_rows
  fi
  # All of the arm's rows go to training (the held-out sets are GSM-Symbolic's, in the eval), two passes.
  trained_student "$root/$student/${arm}_s$seed" "$seed" "${custom_sft[@]}" "${sft_size[@]}" "${sft_extra[@]}" \
    "student=$student_cfg" student.dtype=float32 data=custom "data.source=$file" data.eval_rows=0 \
    sft.eval_strategy=no "sft.explanation_column=$column"
}
answered() {  # <student> <label>: its answers are in STUDY_ANSWERS, from this study's commit
  [ -n "${STUDY_ANSWERS:-}" ] || return 1
  local commit=()
  [ -s "$root/commit" ] && commit=(--commit "$(cat "$root/commit")")
  PYTHONPATH=".${PYTHONPATH:+:$PYTHONPATH}" "${PYTHON:-python3}" bench/study_fair.py answered "$STUDY_ANSWERS" "$1" \
    "$2" "${commit[@]}"
}
taught_jobs() {  # <student:arm:seed...>: those runs one after another; a failed one is named in the log. Under
  # STUDY_MINUTES a run that would end past the budget (the slot's longest run so far from now) is not started:
  # named, and the slot ends with code 3 unless a run failed (1)
  local job arm seed status=0 longest=0 began left=()
  for job in "$@"; do
    IFS=: read -r student arm seed <<< "$job"
    if [ -n "$budget_s" ] && [ $((SECONDS - start + longest)) -gt "$budget_s" ]; then
      left+=("$student/${arm}_s$seed")
      continue
    fi
    student_cfg=$student
    [ "${STUDY_TINY:-0}" = 1 ] && student_cfg=tiny
    began=$SECONDS
    taught "$seed" "$arm" || { status=1; echo "bench/study_fair.sh: $student $arm seed $seed failed" >&2; }
    [ $((SECONDS - began)) -le "$longest" ] || longest=$((SECONDS - began))
  done
  if [ ${#left[@]} -gt 0 ]; then
    echo "bench/study_fair.sh: not started, as they would end past STUDY_MINUTES=$STUDY_MINUTES (the slot's longest" \
         "run took $longest s): ${left[*]}" >&2
    [ $status = 1 ] || status=3
  fi
  return $status
}

pids=() names=()
for one in $parts; do
  if [ "$one" = traces ]; then
    on_gpu 0 traces & pids+=($!) names+=(traces)
    continue
  fi
  if [ "$one" = teachers ]; then
    teachers & pids+=($!) names+=(teachers)
    continue
  fi
  if [ "$one" = students ]; then
    # Every (student, arm, seed) run is a job; the jobs are dealt round-robin to STUDY_SLOTS lanes a GPU, each lane's
    # jobs one after another (on CPU each job is a lane of its own). STUDY_ARMS' order is the dealing order.
    default_slots=2
    [[ $students != *1.5b* ]] || default_slots=1
    slots=${STUDY_SLOTS:-$default_slots}
    [ "${STUDY_SERIAL:-0}" = 1 ] && slots=1
    [[ $slots =~ ^[1-9][0-9]*$ ]] || { echo "bench/study_fair.sh: STUDY_SLOTS=$slots: a whole number >= 1" >&2; exit 2; }
    # the explanations the repository keeps, where no earlier machine's came with this root (the same rows, byte
    # for byte, as bench/study_fair.py common wrote); a check restores them too, so that each command it checks
    # names the rows the student would read (sft_teacher seed s: sft_s<s> where it is kept)
    if [ -f "$kept_explanations/manifest.json" ] \
        && ! compgen -G "$distilled/*.jsonl" > /dev/null && ! compgen -G "$distilled/*.jsonl.gz" > /dev/null; then
      PYTHONPATH=".${PYTHONPATH:+:$PYTHONPATH}" "${PYTHON:-python3}" bench/study_fair.py restore "$kept_explanations" \
        --out "$distilled" || echo "bench/study_fair.sh: the explanations in $kept_explanations were not restored" \
                                  "(above)" >&2
    fi
    # each input unpacked once, before lanes that share it start
    for file in "$distilled"/*.jsonl.gz; do
      [ -f "$file" ] && [ ! -s "${file%.gz}" ] && gzip -dc "$file" > "${file%.gz}.tmp" && mv "${file%.gz}.tmp" "${file%.gz}"
    done
    [[ " $arms " != *" traces "* ]] || unpack_traces
    # no student trains on other rows than the kept explanations, nor misses a kept SFT sample (sft_s<seed>, which
    # its seed's SFT-teacher students read) or the answer-only teacher's rows: the part fails
    if ! distilled_are_kept --students; then
      false & pids+=($!) names+=(students)
      continue
    fi
    # kept teachers that trained full 16-bit weights (most of each step rounded away): their students are not run
    rounded=" "
    if [ -n "$kept_explanations" ] && [ -f "$kept_explanations/manifest.json" ] \
        && [ "${STUDY_ROUNDED_TEACHERS:-0}" != 1 ]; then
      if ! names_rounded=$(PYTHONPATH=".${PYTHONPATH:+:$PYTHONPATH}" "${PYTHON:-python3}" bench/study_fair.py \
                           rounded "$kept_explanations"); then  # unread, none is known sound: no student runs
        echo "bench/study_fair.sh: $kept_explanations/manifest.json: which teachers trained bfloat16 weights was" \
             "not read (above); no student runs" >&2
        false & pids+=($!) names+=(students)
        continue
      fi
      rounded=" ${names_rounded//$'\n'/ } "
    fi
    jobs=() labels=()
    for student in $students; do
      for arm in $arms; do
        arm_seeds=$seeds
        # an untrained student is evaluated once; every trained arm has a student of each seed (seed 0's
        # checkpoints teach three students each, as the SFT teacher does)
        [[ $arm == untrained* ]] && arm_seeds=0
        for seed in $arm_seeds; do
          # (worked_common reads sft's questions and worked solutions, not its explanations)
          teacher=$(arm_teacher "$arm" "$seed")
          if [ -n "$teacher" ] && [[ $rounded == *" $teacher "* ]]; then
            echo "bench/study_fair.sh: $student ${arm}_s$seed: its teacher $teacher trained bfloat16 or float16" \
                 "weights, most of each step rounded away (docs/STUDY.md, \"Steps that round away\"); not run" \
                 "(STUDY_ROUNDED_TEACHERS=1 runs it)" >&2
            continue
          fi
          # a run whose answers are committed is left out before the jobs are dealt, so lanes stay even
          if answered "$student" "${arm}_s$seed"; then
            echo "bench/study_fair.sh: $student ${arm}_s$seed: its answers are in $STUDY_ANSWERS; not run again" >&2
            continue
          fi
          jobs+=("$student:$arm:$seed")
          if [[ $arm == untrained* ]]; then labels+=("$student/$arm"); else labels+=("$student/${arm}_s$seed"); fi
        done
      done
    done
    lanes=${#jobs[@]}
    [ ${#gpus[@]} -eq 0 ] || lanes=$((${#gpus[@]} * slots))
    for ((lane = 0; lane < lanes; lane++)); do
      mine=() label=""
      for ((j = lane; j < ${#jobs[@]}; j += lanes)); do mine+=("${jobs[$j]}") label+="${label:++}${labels[$j]}"; done
      [ ${#mine[@]} -gt 0 ] || continue
      on_gpu $lane taught_jobs "${mine[@]}" & pids+=($!) names+=("$label")
    done
    continue
  fi
  for student in $students; do
    student_cfg=$student
    [ "${STUDY_TINY:-0}" = 1 ] && student_cfg=tiny
    if [ "${STUDY_UNTRAINED:-1}" != 0 ]; then
      on_gpu 0 taught 0 untrained &
      pids+=($!) names+=("$student/untrained")
      on_gpu 0 taught 0 untrained_plain &
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
