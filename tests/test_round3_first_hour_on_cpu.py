"""A newcomer's first hour, the small things: a terminal shows one clean training bar with the log lines above it,
and a few mistakes answer in one line before anything heavy loads."""

import fcntl
import io
import logging
import os
import pty
import re
import struct
import subprocess
import sys
import termios
from pathlib import Path
from types import SimpleNamespace

from transformers import TrainerControl, TrainerState

from rlt_mono import console

ROOT = Path(__file__).resolve().parent.parent
# A log line that starts right after a bar's last redraw, on the bar's own line: "... 3.63it/s]2026-11-27 ...".
GLUED = re.compile(r"(?:it/s|s/it|\?it/s)\][^\r\n]")


def _state(step: int, max_steps: int) -> TrainerState:
    state = TrainerState(max_steps=max_steps)
    state.global_step = step
    return state


def _fake_terminal(monkeypatch) -> io.StringIO:
    """stderr a terminal that keeps what is written, with the root logger's console handler on it (as
    ``logging.basicConfig`` leaves it in ``rlt_mono.cli``)."""
    stderr = io.StringIO()
    stderr.isatty = lambda: True
    monkeypatch.setattr(sys, "stderr", stderr)
    handler = logging.StreamHandler(stderr)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    monkeypatch.setattr(root, "handlers", [*root.handlers, handler])
    monkeypatch.setattr(root, "level", logging.INFO)
    return stderr


# ---- 1. one clean bar in a terminal, the log lines above it ------------------------------------------------------
def test_a_line_logged_while_the_bar_is_open_is_written_above_it(monkeypatch):
    stderr = _fake_terminal(monkeypatch)
    handlers = list(logging.getLogger().handlers)
    callback = console.CompactProgressCallback()
    args = SimpleNamespace(disable_tqdm=False, output_dir="/runs/a")
    state, control = _state(0, 2), TrainerControl()
    callback.on_train_begin(args, state, control)
    state.global_step = 2
    callback.on_step_end(args, state, control)
    callback.on_log(args, state, control, logs={"train_runtime": 3.0})
    # what another callback logs at the end of training, before this one closes the bar (the reward plot)
    logging.getLogger("rlt_mono.plots").info("wrote /runs/a/reward_components.png")
    callback.on_train_end(args, state, control)
    logging.getLogger("rlt_mono.teacher_rlt").info("final teacher saved to /runs/a/final")
    text = stderr.getvalue()
    assert not GLUED.search(text), text
    # each line starts on a cleared line (the bar wiped with \r), the bar drawn again under it
    assert re.search(r"\r *\rdone: step 2/2 in 3\.0 s \(1\.5 s/step\) \| outputs in /runs/a\n\r100%\|", text), text
    assert re.search(r"\r *\rINFO rlt_mono\.plots: wrote /runs/a/reward_components\.png\n\r100%\|", text), text
    assert re.search(r"\]\nINFO rlt_mono\.teacher_rlt: final teacher saved to /runs/a/final\n$", text), text
    assert logging.getLogger().handlers == handlers and not list(console.OPEN_BARS)


def test_a_run_stopped_in_training_closes_its_bar_before_the_error_line(monkeypatch):
    stderr = _fake_terminal(monkeypatch)
    handlers = list(logging.getLogger().handlers)
    callback = console.CompactProgressCallback()
    callback.on_train_begin(SimpleNamespace(disable_tqdm=False, output_dir="/runs/b"), _state(0, 4), TrainerControl())
    assert callback.bar is not None and list(console.OPEN_BARS) == [callback]
    from rlt_mono.cli import close_training_bar

    close_training_bar()  # what cli.main does before it writes the error line
    sys.stderr.write("error: interrupted at step 0\n")
    assert callback.bar is None and not list(console.OPEN_BARS)
    assert stderr.getvalue().endswith("| 0/4 [00:00<?, ?it/s]\nerror: interrupted at step 0\n"), stderr.getvalue()
    assert logging.getLogger().handlers == handlers


def test_off_a_terminal_there_is_no_bar_and_the_handlers_stay(monkeypatch, caplog):
    stderr = io.StringIO()
    stderr.isatty = lambda: False
    monkeypatch.setattr(sys, "stderr", stderr)
    handlers = list(logging.getLogger().handlers)
    callback = console.CompactProgressCallback()
    args, state, control = SimpleNamespace(disable_tqdm=False, output_dir="/runs/c"), _state(0, 1), TrainerControl()
    with caplog.at_level(logging.INFO, logger="rlt_mono.console"):
        callback.on_train_begin(args, state, control)
        assert logging.getLogger().handlers == handlers  # nothing redirected
        state.global_step = 1
        callback.on_log(args, state, control, logs={"loss": 0.5, "step_time": 0.25})
        callback.on_train_end(args, state, control)
    assert stderr.getvalue() == "" and [r.getMessage() for r in caplog.records] == ["step 1/1 | loss 0.5 | 0.25 s/step"]


def test_the_demo_in_a_terminal_shows_one_clean_bar(tmp_path):
    """The RL demo in a pseudo-terminal: the reward plot's line, logged at the end of training while the bar is
    still open, is written above the bar, not glued to its last redraw."""
    from rlt_mono.cli import PROGRESS_BAR_SWITCHES

    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    env = {name: value for name, value in os.environ.items() if name not in PROGRESS_BAR_SWITCHES}
    process = subprocess.Popen(["./launch_mono.sh", "cfgs/run_cfg/demo_tiny.yaml", "trainer.max_steps=2",
                                f"output_dir={tmp_path / 'run'}"], cwd=ROOT, env=env, stdin=subprocess.DEVNULL,
                               stdout=follower, stderr=follower)
    os.close(follower)
    chunks = []
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # the terminal closed: the run has ended
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(leader)
    text = b"".join(chunks).decode(errors="replace")
    assert process.wait(timeout=60) == 0, text[-3000:]
    assert {total for _, total in re.findall(r"\d+%\|[^|]*\| *(\d+)/(\d+) \[", text)} == {"2"}, text
    assert not GLUED.search(text), text[-3000:]
    assert re.search(r"\r *\r[\d-]+ [\d:,]+ INFO rlt_mono\.plots: wrote .*reward_components\.png\r\n\r100%\|", text)
    assert re.search(r"\]\r\n[\d-]+ [\d:,]+ INFO rlt_mono\.teacher_rlt: final teacher saved to ", text)
