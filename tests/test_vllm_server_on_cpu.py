"""placement=async's rollout server (rlt_mono.rl.vllm_server): started with only its GPU visible, waited for until
it answers, one error naming its log when it exits or stays silent, its whole process group ended at stop. A small
HTTP server stands in for vLLM."""

import json
import logging
import os
import re
import sys
import time

import pytest

from rlt_mono.rl.vllm_server import ServerError, VLLMServer, free_port, serve_command

# Answers /health after <delay> seconds, with the environment it was given; spawns a child that must die with it,
# and that takes half a second to end on SIGTERM (as an engine process frees its GPU) after its parent has ended.
CHILD = ("import signal, sys, time; signal.signal(signal.SIGTERM, lambda *_: (time.sleep(0.5), sys.exit(0))); "
         "print('child ready', flush=True); time.sleep(600)")
STAND_IN = """
import http.server, json, os, subprocess, sys, time
port, delay, out = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
child = subprocess.Popen([sys.executable, "-c", CHILD])
with open(out, "w") as f:
    json.dump({"cuda": os.environ.get("CUDA_VISIBLE_DEVICES"), "dev": os.environ.get("VLLM_SERVER_DEV_MODE"),
               "host": os.environ.get("VLLM_HOST_IP"), "child": child.pid}, f)
print("loading the model", flush=True)
time.sleep(delay)
class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()
    def log_message(self, *args):
        pass
http.server.HTTPServer(("127.0.0.1", port), Health).serve_forever()
""".replace("CHILD", repr(CHILD))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as stat:  # a zombie has exited
        return stat.read().split()[2] != "Z"


def test_the_server_sees_only_its_gpu_is_waited_for_and_stops_with_its_children(tmp_path, monkeypatch):
    monkeypatch.setenv("VLLM_HOST_IP", "unset by this test")  # recorded, so the server's default is undone after
    monkeypatch.delenv("VLLM_HOST_IP")
    port, facts = free_port(), tmp_path / "facts.json"
    server = VLLMServer([sys.executable, "-c", STAND_IN, str(port), "1.0", str(facts)], port, "1",
                        tmp_path / "rollout_server.log", poll_s=0.1)
    started = time.monotonic()
    with server:
        assert time.monotonic() - started >= 1.0 and server.healthy()
        assert server.base_url == f"http://127.0.0.1:{port}"
        seen = json.loads(facts.read_text())
        assert (seen["cuda"], seen["dev"], seen["host"]) == ("1", "1", "127.0.0.1")
        assert os.environ["VLLM_HOST_IP"] == "127.0.0.1"  # the trainer's end of the weight transfer too
        pid, child = server.process.pid, seen["child"]
        server.check_alive()
    assert not _alive(pid) and not _alive(child)  # the whole process group
    assert not os.path.exists(f"/proc/{pid}")  # the server's own process reaped, not left a zombie
    assert "loading the model" in (tmp_path / "rollout_server.log").read_text()
    server.stop()  # idempotent


def test_a_server_that_exits_is_one_error_quoting_its_log(tmp_path):
    port = free_port()
    server = VLLMServer([sys.executable, "-c", "print('CUDA out of memory while loading'); raise SystemExit(3)"],
                        port, "1", tmp_path / "rollout_server.log", poll_s=0.1)
    with pytest.raises(ServerError, match=r"exited with code 3 before it answered; .*rollout_server.log ends:\n"
                                          r"CUDA out of memory while loading"):
        server.start()


def test_a_server_deaf_to_sigterm_is_killed_after_the_grace_and_reaped(tmp_path, caplog):
    port = free_port()
    deaf = "import signal; signal.signal(signal.SIGTERM, signal.SIG_IGN)\n" + STAND_IN
    server = VLLMServer([sys.executable, "-c", deaf, str(port), "0", str(tmp_path / "f.json")], port, "1",
                        tmp_path / "rollout_server.log", poll_s=0.1).start()
    pid = server.process.pid
    with caplog.at_level(logging.INFO, logger="rlt_mono.rl.vllm_server"):
        server.stop(grace_s=1.0)
    assert not os.path.exists(f"/proc/{pid}")
    assert re.search(r"rollout server: stopped in \d+\.\d s \(SIGKILL\)", caplog.text), caplog.text


def test_a_silent_server_is_stopped_after_the_timeout(tmp_path):
    port = free_port()
    server = VLLMServer([sys.executable, "-c", STAND_IN, str(port), "60", str(tmp_path / "f.json")], port, "1",
                        tmp_path / "rollout_server.log", start_timeout_s=1.0, poll_s=0.1)
    with pytest.raises(ServerError, match=r"did not answer http://127.0.0.1:\d+/health within 1 s"):
        server.start()
    assert server.process is None


def test_a_dead_server_is_reported_before_a_generation_is_waited_for(tmp_path):
    port, facts = free_port(), tmp_path / "facts.json"
    server = VLLMServer([sys.executable, "-c", STAND_IN, str(port), "0", str(facts)], port, "1",
                        tmp_path / "rollout_server.log", poll_s=0.1).start()
    os.killpg(server.process.pid, 9)
    server.process.wait()
    with pytest.raises(ServerError, match="exited with code -9"):
        server.check_alive()
    server.stop()


def test_the_command_is_trls_vllm_serve_with_the_weight_transfer_engine():
    command = serve_command("/runs/teacher", 8123, dtype="bfloat16", gpu_memory_utilization=0.8, max_model_len=2048)
    assert command[1:5] == ["-m", "vllm.entrypoints.cli.main", "serve", "/runs/teacher"]
    joined = " ".join(command)
    for part in ("--port 8123", "--host 127.0.0.1", "--dtype bfloat16", "--gpu-memory-utilization 0.8",
                 "--max-model-len 2048", '--weight-transfer-config {"backend": "nccl"}',
                 "--logprobs-mode processed_logprobs"):
        assert part in joined


def test_a_server_ends_when_the_run_that_started_it_is_killed(tmp_path):
    """A run killed with -9 runs no exit handler: the server must not outlive it holding its GPU."""
    port, facts = free_port(), tmp_path / "facts.json"
    run = f"""
import os, sys, time
from rlt_mono.rl.vllm_server import VLLMServer
server = VLLMServer([sys.executable, "-c", {STAND_IN!r}, "{port}", "0", "{facts}"], {port}, "1",
                    "{tmp_path / 'rollout_server.log'}", poll_s=0.1).start()
print(server.process.pid, flush=True)
time.sleep(600)
"""
    import subprocess

    parent = subprocess.Popen([sys.executable, "-c", run], stdout=subprocess.PIPE, text=True)
    server_pid = int(parent.stdout.readline())
    assert _alive(server_pid)
    parent.kill()
    parent.wait()
    deadline = time.monotonic() + 10
    while _alive(server_pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(server_pid)
