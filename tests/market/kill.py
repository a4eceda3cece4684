"""Run ``tests.market.killable_run`` in a child process and SIGKILL it after a chosen finished negotiation."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run_killable(args: list[str], kill_at: int | None, pause: float = 0.0, header: int = 0) -> tuple[bool, list[str]]:
    """Run the killable script with ``args``; with ``kill_at``, SIGKILL it ``pause`` s after its ``kill_at``-th
    finished negotiation. Returns (killed before it finished, the ``header`` lines it printed after "ready")."""
    cmd = [sys.executable, "-m", "tests.market.killable_run", *args]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        lines = [proc.stdout.readline().strip() for _ in range(header)]
        ended = 0
        while kill_at is not None and ended < kill_at:
            if proc.stdout.readline().strip() != "ended":
                break  # "done" or end of output: it finished first
            ended += 1
        if kill_at is not None and ended == kill_at:
            time.sleep(pause)
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            return proc.returncode == -signal.SIGKILL, lines
        proc.stdout.read()
        assert proc.wait(timeout=120) == 0
        return False, lines
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
