# The set-up of a GPU host without network access, in one place: sourced by gpu_pipeline.sh, multi_gpu.sh and
# speed.sh beside it (README.md there describes such a host).
# Every folder the scripts keep on the host lies under OFFLINE_HOST_ROOT, so that one setting moves them all to the
# disk with room for them: the stashed parts, the models' cache and each job's folder (pipeline, study, speed,
# multi_gpu).
OFFLINE_HOST_ROOT=${OFFLINE_HOST_ROOT:-$HOME/rlt_mono_host}
# The GPU stack (vLLM, TRL and their wheels) is an offline bundle whose pieces `gpu_pipeline.sh stash` puts in
# GPU_STACK_PARTS, with the install_gpu_stack.sh that unpacks it (it skips a bundle already unpacked) and prints,
# last, the `export PYTHONPATH=...` line to use.
GPU_STACK_PARTS=${GPU_STACK_PARTS:-$OFFLINE_HOST_ROOT/parts}
# The pure-Python wheels carried in .whl (gguf, math-verify, liger-kernel, reasoning-gym, pytest-timeout, and the
# HTTP server packages vLLM's `vllm serve` imports for placement=async; gpu_pipeline.sh's setup lists them with
# the command that fetches them) are installed into CARRIED_SITE.
CARRIED_SITE=/tmp/gguf-site

# install_gpu_stack <log file>: unpack the stack (its output in <log file>) and print its export line; without a
# stack, or when it does not unpack, one line (and the log's end) on stderr and status 2.
install_gpu_stack() {
  local log=$1
  if [ ! -f "$GPU_STACK_PARTS/install_gpu_stack.sh" ]; then
    echo "$0: no $GPU_STACK_PARTS/install_gpu_stack.sh: stash the GPU stack's parts there first" \
      "(offline_host/gpu_pipeline.sh stash), or set GPU_STACK_PARTS" >&2
    return 2
  fi
  # flock: commands started side by side on one host (each on its own GPUs) unpack the bundle once, in turn.
  if ! flock "$GPU_STACK_PARTS/.install.lock" bash "$GPU_STACK_PARTS/install_gpu_stack.sh" "$GPU_STACK_PARTS" \
      > "$log" 2>&1; then
    echo "$0: the GPU stack did not install; $log ends:" >&2
    tail -n 5 "$log" >&2
    return 2
  fi
  tail -n 1 "$log"
}

# install_carried_wheels: the .whl wheels into CARRIED_SITE, on PYTHONPATH. A run installs them again when they
# differ from the last install's (a wheel added to .whl since is not missed), and only then: a part running beside
# keeps importing from files no install rewrites; one install at a time (flock).
install_carried_wheels() {
  compgen -G ".whl/*.whl" > /dev/null || return 0
  mkdir -p "$CARRIED_SITE"
  local stamp
  stamp=$(cd .whl && sha256sum -- *.whl | sha256sum | cut -d' ' -f1)
  # shellcheck disable=SC2016  # expanded by the inner shell
  flock "$CARRIED_SITE/.install.lock" bash -c '[ "$(cat "$1/.installed" 2>/dev/null)" = "$2" ] && exit 0
    python3 -m pip install -q --no-index --no-deps --upgrade --target "$1" .whl/*.whl && echo "$2" > "$1/.installed"' \
    _ "$CARRIED_SITE" "$stamp"
  case ":${PYTHONPATH:-}:" in
    *:"$CARRIED_SITE":*) ;;
    *) export PYTHONPATH=$CARRIED_SITE${PYTHONPATH:+:$PYTHONPATH} ;;
  esac
}

# visible_gpus: how many GPUs this process's CUDA programs see: CUDA_VISIBLE_DEVICES's entries where it is set (a
# command given some of the host's GPUs), else nvidia-smi's count.
visible_gpus() {
  if [ -n "${CUDA_VISIBLE_DEVICES:-}" ]; then
    tr ',' '\n' <<< "$CUDA_VISIBLE_DEVICES" | grep -c .
  else
    nvidia-smi --list-gpus | wc -l
  fi
}

# study_settings: the STUDY_* variables set now (STUDY_ANSWERS aside: the host's own path), sorted, as words a
# shell reads back to the same values ("NAME=value ", a value with other characters than letters, digits and
# _.,:/=+@%- in single quotes), for the command a study keeps beside its results.
study_settings() {
  local name value prefix shown
  for name in $(compgen -e | grep '^STUDY_' | grep -vx STUDY_ANSWERS | LC_ALL=C sort); do
    value=${!name} prefix='' shown=${!name}
    # A path inside the working tree is written as $PWD/<path>: the command reads back in any checkout, and the
    # record names no folder of the machine that ran it.
    if [[ $value == "$PWD"/?* ]]; then prefix='$PWD/' shown=${value#"$PWD"/}; fi
    if [[ -n $shown && $shown =~ ^[A-Za-z0-9_.,:/=+@%-]+$ ]]; then printf '%s=%s%s ' "$name" "$prefix" "$shown"
    else printf "%s='%s' " "$name" "${value//\'/\'\\\'\'}"; fi
  done
}
