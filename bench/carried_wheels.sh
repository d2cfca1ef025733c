# Sourced by bench/gpu_pipeline.sh, bench/multi_gpu.sh and bench/speed.sh on a GPU host without network access:
# the pure-Python wheels carried in .whl (gguf, math-verify, liger-kernel, reasoning-gym, pytest-timeout, and the
# HTTP server packages vLLM's `vllm serve` imports for placement=async; bench/gpu_pipeline.sh's setup lists them
# with the command that fetches them) into /tmp/gguf-site, on PYTHONPATH. Each run installs them again (seconds),
# so a wheel added to .whl since the last run on the same host is not missed.
install_carried_wheels() {
  compgen -G ".whl/*.whl" > /dev/null || return 0
  python3 -m pip install -q --no-index --no-deps --upgrade --target /tmp/gguf-site .whl/*.whl
  case ":${PYTHONPATH:-}:" in
    *:/tmp/gguf-site:*) ;;
    *) export PYTHONPATH=/tmp/gguf-site${PYTHONPATH:+:$PYTHONPATH} ;;
  esac
}
