"""Run a command in a pseudo-terminal (120 columns), as from a shell: what it drew there, and its exit code."""

import fcntl
import os
import pty
import struct
import subprocess
import termios
from pathlib import Path


def run_in_terminal(command: list[str], cwd: Path, timeout: float = 60) -> tuple[int, str]:
    """``command`` with its stdout and stderr on a fresh pseudo-terminal, and the progress-bar switches a test
    process may have set taken out of its environment (``rlt_mono.runtime.PROGRESS_BAR_SWITCHES``): its exit code
    and everything it wrote there."""
    from rlt_mono.runtime import PROGRESS_BAR_SWITCHES

    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    env = {name: value for name, value in os.environ.items() if name not in PROGRESS_BAR_SWITCHES}
    process = subprocess.Popen(command, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=follower,
                               stderr=follower)
    os.close(follower)
    chunks = []
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # the terminal closed: the command has ended
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(leader)
    return process.wait(timeout=timeout), b"".join(chunks).decode(errors="replace")
