"""The rollout engine of ``placement=async``: vLLM's own server (``vllm serve``) on a GPU of its own, started and
stopped by the run.

TRL's server mode (``vllm_mode="server"``) talks to it: completions over HTTP, the trainer's weights over NCCL through
vLLM's weight-transfer engine after each optimizer step (``VLLMClient.init_communicator`` / ``update_named_params``).
The command is TRL's (``trl.scripts.vllm_serve.build_command``: the weight-transfer engine, processed log-probs for
TRL's importance-sampling correction), run with the engine's GPU as the only one it sees and vLLM's development
endpoints on (the weight-update ones live there). Its output goes to a log file in the run folder; a server that
exits or does not answer its health check in time is one error naming that file and its last lines.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

logger = logging.getLogger(__name__)
LOOPBACK = "127.0.0.1"  # the server listens on this host only

# Lines of the server's log quoted in an error.
LOG_TAIL_LINES = 15
# prctl's option: the signal a process gets when its parent dies (linux/prctl.h).
PR_SET_PDEATHSIG = 1


def _end_with_parent() -> None:
    """In the server's process before it runs: SIGTERM when the process that started it dies (Linux), so a run
    killed with -9 leaves no server holding its GPU (vLLM's server ends its engine on SIGTERM)."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):  # not Linux: stop() and the run's exit handlers remain
        pass


class ServerError(RuntimeError):
    """The rollout server did not start, or stopped; the message names its log."""


def free_port() -> int:
    """A TCP port no process listens on now (the kernel's pick)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def serve_command(model: str, port: int, *, dtype: str, gpu_memory_utilization: float,
                  max_model_len: int | None) -> list[str]:
    """The ``vllm serve`` command line TRL's server mode expects (``trl.scripts.vllm_serve.build_command``), with
    vLLM's compiled graphs (a server generates for the whole run)."""
    from trl.scripts.vllm_serve import ScriptArguments, build_command

    return build_command(ScriptArguments(model=model, host=LOOPBACK, port=port, dtype=dtype,
                                         gpu_memory_utilization=gpu_memory_utilization, max_model_len=max_model_len,
                                         log_level="warning"))


def _group_running(pgid: int) -> bool:
    """Whether a process of group ``pgid`` still runs (a zombie does not: it has exited), from ``/proc``."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()  # after "pid (comm)": state, ppid, pgrp, ...
        except (OSError, IndexError):
            continue  # ended while read
        if int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False


def _group_ended(process: subprocess.Popen, wait_s: float) -> bool:
    """Whether every process of ``process``'s group has ended within ``wait_s``."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        process.poll()  # reaps the first process; the others are reaped by whoever adopts them
        if not _group_running(process.pid):
            return True
        time.sleep(0.05)
    return False


class VLLMServer:
    """``command`` (``serve_command``'s, listening on ``port``) run with only ``gpu`` visible, its output in
    ``log_path``; ``start()`` returns once ``/health`` answers (or raises ``ServerError``), ``stop()`` ends its
    process group. A context manager."""

    def __init__(self, command: list[str], port: int, gpu: str, log_path: Path, *, start_timeout_s: float = 600.0,
                 poll_s: float = 1.0):
        self.command, self.port, self.gpu, self.log_path = command, port, gpu, Path(log_path)
        self.start_timeout_s, self.poll_s = start_timeout_s, poll_s
        self.process: subprocess.Popen | None = None

    @property
    def base_url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    def start(self) -> VLLMServer:
        # The weight-transfer group's address: TRL's client names this host by vLLM's get_ip(), which looks for the
        # route to the internet (none on an offline host); the server runs here, so the loopback address (unless
        # VLLM_HOST_IP is set already), in this process and the server's.
        os.environ.setdefault("VLLM_HOST_IP", LOOPBACK)
        env = {**os.environ, "CUDA_VISIBLE_DEVICES": self.gpu, "VLLM_SERVER_DEV_MODE": "1"}
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(self.command, env=env, stdout=log, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL, start_new_session=True,
                                            preexec_fn=_end_with_parent)
        logger.info("rollout server: starting vLLM on GPU %s at %s (pid %d, log %s)", self.gpu, self.base_url,
                    self.process.pid, self.log_path)
        started = time.monotonic()
        while not self.healthy():
            if self.process.poll() is not None:
                raise ServerError(f"the rollout server (vLLM on GPU {self.gpu}) exited with code "
                                  f"{self.process.returncode} before it answered; {self.log_path} ends:\n"
                                  f"{self.log_tail()}")
            if time.monotonic() - started > self.start_timeout_s:
                self.stop()
                raise ServerError(f"the rollout server (vLLM on GPU {self.gpu}) did not answer {self.base_url}/health "
                                  f"within {self.start_timeout_s:g} s; {self.log_path} ends:\n{self.log_tail()}")
            time.sleep(self.poll_s)
        logger.info("rollout server: up after %.1f s", time.monotonic() - started)
        return self

    def healthy(self) -> bool:
        """Whether ``/health`` answers 200 now."""
        try:
            with urllib.request.urlopen(f"{self.base_url}/health", timeout=5) as reply:
                return reply.status == 200
        except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
            return False

    def check_alive(self) -> None:
        """``ServerError`` if the server's process has ended (checked before each generation is waited for)."""
        if self.process is not None and self.process.poll() is not None:
            raise ServerError(f"the rollout server (vLLM on GPU {self.gpu}) exited with code "
                              f"{self.process.returncode}; {self.log_path} ends:\n{self.log_tail()}")

    def log_tail(self) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return "(no log)"
        return "\n".join(lines[-LOG_TAIL_LINES:]) or "(empty)"

    def stop(self, grace_s: float = 30.0) -> None:
        """End the server's process group (SIGTERM, then SIGKILL after ``grace_s``) and return once none of its
        processes runs: the engine's own processes hold the GPU's memory until they end, not when the server's
        first process does. Idempotent."""
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        started = time.monotonic()
        for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10.0)):
            try:
                os.killpg(process.pid, sig)
            except ProcessLookupError:
                break
            if _group_ended(process, wait):
                break
        try:  # reaped, so that its pid is gone: a process killed while the driver frees its memory takes a moment
            process.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            logger.warning("rollout server: pid %d still there %.0f s after it was told to end", process.pid,
                           time.monotonic() - started)
            return
        logger.info("rollout server: stopped in %.1f s (%s)", time.monotonic() - started, signal.Signals(sig).name)

    def __enter__(self) -> VLLMServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
