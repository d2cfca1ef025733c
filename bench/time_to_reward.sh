#!/usr/bin/env bash
# memory=speed against the default (memory=auto) on the measure a user cares about: wall-clock time to a held-out
# reward, on the GSM-Symbolic RL run of the 0.5B pair (Qwen2.5-Coder-0.5B-Instruct as teacher and student, GGUF
# dequantized), each run on a GPU of its own, side by side (docs/PERFORMANCE.md, "memory=speed"). The arm async
# (placement=async: the rollout one step off the policy, two GPUs a run) against auto (on-policy) asks whether its
# held-out curve over steps stays within the on-policy seeds' spread (time_to_reward.py's curves).
#   bash bench/time_to_reward.sh <root> [seeds, default 0,1,2] [arms: auto, speed, async; default auto,speed]
# Each run: 200 optimizer steps (at most TTR_MINUTES, default 12, of training: trainer.max_minutes), the held-out
# reward on 128 questions every 25 steps and before the first, in <root>/<arm>_s<seed>; logs in <root>/logs;
# <root>/DONE holds the exit codes. Then, on any machine:
#   python bench/time_to_reward.py auto=<root>/auto_s0,... speed=<root>/speed_s0,... --baseline auto \
#     --target-step 200 --out results/memory_speed/time_to_reward.json --device ... --commit ... --command ...
set -uo pipefail
root=${1:?usage: bash bench/time_to_reward.sh <root> [seeds] [arms]}
seeds=${2:-0,1,2}
arms=${3:-auto,speed}
if command -v nvidia-smi > /dev/null; then mapfile -t gpus < <(nvidia-smi -L | awk '{sub(":", "", $2); print $2}')
else gpus=(); fi
# An arm's settings and the GPUs each of its runs takes.
settings_of() {
  case $1 in
    auto|speed) echo "1 memory=$1" ;;
    async) echo "2 memory=auto placement=async" ;;
    *) return 1 ;;
  esac
}
for arm in ${arms//,/ }; do
  if ! settings_of "$arm" > /dev/null; then
    echo "bench/time_to_reward.sh: unknown arm '$arm' (auto, speed, async)" >&2
    exit 2
  fi
done
mkdir -p "$root/logs"
start=$SECONDS
pids=() names=() lane=0
for arm in ${arms//,/ }; do
  read -r width settings <<< "$(settings_of "$arm")"
  for seed in ${seeds//,/ }; do
    visible=""
    for ((k = 0; k < width && ${#gpus[@]} > 0; k++)); do
      visible+="${visible:+,}${gpus[$(((lane + k) % ${#gpus[@]}))]}"
    done
    # The engine-start lock of the GPU its vLLM starts on: the last one (placement=async's server).
    CUDA_VISIBLE_DEVICES=$visible RLT_MONO_ENGINE_LOCK=${TMPDIR:-/tmp}/rlt_mono-engine-gpu${visible##*,}.lock \
      ./launch_mono.sh teacher_rlt_mono data=gsm_symbolic model=qwen2.5_coder_0.5b_instruct \
      student=qwen2.5_coder_0.5b_instruct $settings "seed=$seed" logging=local trainer.max_steps=200 \
      "trainer.max_minutes=${TTR_MINUTES:-12}" trainer.eval_strategy=steps trainer.eval_steps=25 \
      trainer.eval_on_start=true trainer.eval_questions=128 trainer.save_steps=100000 \
      "output_dir=$root/${arm}_s$seed" >> "$root/logs/${arm}_s$seed.log" 2>&1 &
    pids+=($!) names+=("${arm}_s$seed")
    lane=$((lane + width))
  done
done
codes=""
for i in "${!pids[@]}"; do
  wait "${pids[$i]}"; codes+="${names[$i]}=$? "
done
echo "${codes}seconds=$((SECONDS - start))" > "$root/DONE"
