"""CPU threads for in-process models: the default follows the usable cores and the processes of the job, an
explicit number or OMP_NUM_THREADS wins, and setting it never imports torch."""

from __future__ import annotations

import os
import subprocess
import sys
import types

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from nego.agents import threads
from nego.agents.threads import cgroup_cpu_limit, default_threads, resolve_threads, set_threads, usable_cores


@pytest.fixture
def cores(monkeypatch, tmp_path):
    """Pretend this process may run on ``n`` cores, without a cgroup quota."""

    def pretend(n: int) -> None:
        monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(n)))

    monkeypatch.setattr(threads, "CGROUP_CPU_MAX", tmp_path / "no-cpu.max")
    return pretend


def test_default_divides_usable_cores_among_the_jobs_processes(cores):
    cores(16)
    assert default_threads({}) == 16
    assert default_threads({"LOCAL_WORLD_SIZE": "4", "WORLD_SIZE": "16"}) == 4  # four ranks on this machine
    assert default_threads({"WORLD_SIZE": "8"}) == 2
    assert default_threads({"LOCAL_WORLD_SIZE": "32"}) == 1  # at least one
    assert default_threads({"LOCAL_WORLD_SIZE": "zero", "WORLD_SIZE": "0"}) == 16  # nonsense is ignored


@settings(max_examples=50, deadline=None)
@given(st.integers(1, 512), st.integers(1, 64))
def test_default_never_oversubscribes_and_never_drops_below_one(n, processes):
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(os, "sched_getaffinity", lambda pid: set(range(n)))
        mp.setattr(threads, "CGROUP_CPU_MAX", threads.Path("/nonexistent/cpu.max"))
        got = default_threads({"LOCAL_WORLD_SIZE": str(processes)})
    assert got >= 1 and (got * processes <= n or got == 1)


def test_a_cgroup_quota_caps_the_cores(tmp_path, monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)))
    quota = tmp_path / "cpu.max"
    for text, limit in (("200000 100000\n", 2), ("50000 100000", 1), ("max 100000", None), ("garbage", None)):
        quota.write_text(text)
        assert cgroup_cpu_limit(quota) == limit
        assert usable_cores(quota) == (limit or 16)
    assert cgroup_cpu_limit(tmp_path / "missing") is None


def test_an_explicit_number_then_the_environment_then_the_default(cores):
    cores(6)
    assert resolve_threads(3, {"OMP_NUM_THREADS": "1"}) == (3, "requested")
    assert resolve_threads(0, {"OMP_NUM_THREADS": "1"}) == (1, "OMP_NUM_THREADS")
    assert resolve_threads(0, {"OMP_NUM_THREADS": "", "LOCAL_WORLD_SIZE": "2"}) == (3, "default")
    with pytest.raises(ValueError, match="threads must be >= 0"):
        resolve_threads(-1, {})


def test_set_threads_writes_the_variables_and_keeps_a_chosen_wait_policy(cores, monkeypatch):
    cores(4)
    env: dict[str, str] = {}
    setting = set_threads(0, env)
    assert env == {"OMP_NUM_THREADS": "4", "MKL_NUM_THREADS": "4", "OMP_WAIT_POLICY": "PASSIVE"}
    assert (setting.threads, setting.source, setting.wait_policy) == (4, "default", "PASSIVE")
    env = {"OMP_WAIT_POLICY": "ACTIVE"}
    assert set_threads(2, env).wait_policy == "ACTIVE" and env["OMP_NUM_THREADS"] == "2"


def test_set_threads_tells_a_loaded_torch(monkeypatch):
    told = []
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(set_num_threads=told.append))
    set_threads(3, {})
    assert told == [3]


def test_setting_threads_and_the_simulate_command_never_import_torch(tmp_path):
    code = (
        "import os, sys; from nego.cli.app import app; from typer.testing import CliRunner; "
        f"r = CliRunner().invoke(app, ['simulate', '--days', '1', '--negotiations', '2', '--threads', '3', "
        f"'--no-live', '--out', {str(tmp_path / 'run')!r}]); "
        "print(r.exit_code, os.environ['OMP_NUM_THREADS'], os.environ['MKL_NUM_THREADS'], 'torch' in sys.modules)"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env).stdout
    assert out.split()[-4:] == ["0", "3", "3", "False"]
