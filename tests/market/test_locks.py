"""File locks: one run per output directory (a second fails at once, naming the first; a killed run leaves no stale
lock), and read-modify-writes that never lose each other's updates."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
from nego.market.locks import DirectoryBusy, exclusive_run


def test_a_second_run_on_a_held_directory_is_refused_and_names_the_first(tmp_path):
    busy = r"in use by nego eval --out X \(pid \d+\).*another output directory"
    with (
        exclusive_run(tmp_path, "nego eval --out X"),
        pytest.raises(DirectoryBusy, match=busy),
        exclusive_run(tmp_path, "nego eval --out X"),
    ):
        pass
    with exclusive_run(tmp_path, "again"):  # released on exit
        pass


def test_a_killed_run_leaves_no_stale_lock(tmp_path):
    holder = textwrap.dedent(
        f"""
        import sys, time
        from nego.market.locks import exclusive_run
        with exclusive_run({str(tmp_path)!r}, "holder"):
            print("held", flush=True)
            time.sleep(60)
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", holder], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "held"
        with pytest.raises(DirectoryBusy, match="holder"), exclusive_run(tmp_path, "second"):
            pass
    finally:
        proc.kill()
        proc.wait()
    with exclusive_run(tmp_path, "after the kill"):
        pass


def test_a_file_system_without_flock_runs_unlocked_with_a_warning(tmp_path, monkeypatch, caplog):
    from nego.market import locks

    def no_locks(fd, op):
        raise OSError(37, "No locks available")

    monkeypatch.setattr(locks.fcntl, "flock", no_locks)
    ran = False
    with exclusive_run(tmp_path, "run"):
        ran = True
    assert ran and "cannot lock" in caplog.text
