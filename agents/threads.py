"""CPU threads for in-process models: one sane default per process, set before torch loads.

Torch and its OpenMP runtime start one thread per core and, between parallel regions, let them spin. When other
processes share the cores (a second training rank, a neighbour's job), a spinning thread waits for one that is
not running, and a decoding step gets many times slower than with fewer threads. So the default is the cores
this process may use (its CPU affinity, capped by a cgroup CPU quota) divided by the processes started on this
machine for the same job (``LOCAL_WORLD_SIZE`` or ``WORLD_SIZE`` under torchrun and accelerate), at least one.

:func:`set_threads` writes the OpenMP and MKL variables, which take effect when torch is imported later, and
calls ``torch.set_num_threads`` when torch is already loaded; it never imports torch itself.
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import MutableMapping
from dataclasses import dataclass
from pathlib import Path

THREADS_HELP = (
    "CPU threads for in-process models (torch, OpenMP, MKL); 0 = $OMP_NUM_THREADS if set, else the usable "
    "cores divided by the processes of this job on the machine"
)
THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")
WAIT_POLICY = "OMP_WAIT_POLICY"
CGROUP_CPU_MAX = Path("/sys/fs/cgroup/cpu.max")


def usable_cores(cpu_max: Path = CGROUP_CPU_MAX) -> int:
    """The cores this process may run on: its affinity mask, capped by a cgroup v2 CPU quota if one is set."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # no affinity API on this platform
        cores = os.cpu_count() or 1
    quota = cgroup_cpu_limit(cpu_max)
    return max(1, min(cores, quota) if quota else cores)


def cgroup_cpu_limit(cpu_max: Path = CGROUP_CPU_MAX) -> int | None:
    """Whole CPUs granted by a cgroup v2 ``cpu.max`` quota (at least 1), or None without a quota."""
    try:
        quota, period = cpu_max.read_text().split()[:2]
        return max(1, math.floor(int(quota) / int(period)))
    except (OSError, ValueError, ZeroDivisionError):  # no file, "max" (no quota) or anything unreadable
        return None


def local_processes(env: MutableMapping[str, str] | None = None) -> int:
    """Processes of this job on this machine: ``LOCAL_WORLD_SIZE``, else ``WORLD_SIZE``, else 1."""
    env = os.environ if env is None else env
    for name in ("LOCAL_WORLD_SIZE", "WORLD_SIZE"):
        value = _positive(env.get(name))
        if value is not None:
            return value
    return 1


def default_threads(env: MutableMapping[str, str] | None = None, cpu_max: Path = CGROUP_CPU_MAX) -> int:
    """Usable cores // local processes, at least 1."""
    return max(1, usable_cores(cpu_max) // local_processes(env))


@dataclass(frozen=True, slots=True)
class ThreadSetting:
    """What :func:`set_threads` chose and why."""

    threads: int
    source: str
    """'requested' (the caller's number), 'OMP_NUM_THREADS' (the environment) or 'default'."""
    wait_policy: str | None
    """``OMP_WAIT_POLICY`` as it now stands (None if unset)."""


def resolve_threads(requested: int = 0, env: MutableMapping[str, str] | None = None) -> tuple[int, str]:
    """The thread count for ``requested`` (0: ``OMP_NUM_THREADS`` if set to a positive number, else the default)."""
    env = os.environ if env is None else env
    if requested < 0:
        raise ValueError(f"threads must be >= 0 (0 = automatic), got {requested}")
    if requested:
        return requested, "requested"
    from_env = _positive(env.get("OMP_NUM_THREADS"))
    if from_env is not None:
        return from_env, "OMP_NUM_THREADS"
    return default_threads(env), "default"


def set_threads(requested: int = 0, env: MutableMapping[str, str] | None = None) -> ThreadSetting:
    """Set this process's CPU threads (see :func:`resolve_threads`) for OpenMP, MKL and torch.

    Also sets ``OMP_WAIT_POLICY=PASSIVE`` unless the environment already says otherwise, so that threads
    waiting for work sleep instead of spinning (measured in ``bench/threads.py``); like the thread variables it
    takes effect only if torch is imported afterwards.
    """
    env = os.environ if env is None else env
    threads, source = resolve_threads(requested, env)
    for name in THREAD_VARIABLES:
        env[name] = str(threads)
    env.setdefault(WAIT_POLICY, "PASSIVE")
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(threads)
    return ThreadSetting(threads, source, env.get(WAIT_POLICY))


def _positive(text: str | None) -> int | None:
    try:
        value = int(text) if text is not None else 0
    except ValueError:
        return None
    return value if value >= 1 else None
