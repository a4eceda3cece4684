"""Jobs through submitit (sweep cells, evaluation shards): one SLURM job each (a job array per submission), local
subprocesses, or the in-process debug executor.

submitit is imported here only, and only when a launcher is used (``pip install 'nego[cluster]'``). This module
submits, tells whether a job recorded earlier is still queued or running, and waits; what a job did is read from
the directory it wrote (its results, the ``error.log`` of a failed attempt, the lock a live job holds) and from its
log, not from its pickled return value.
"""

from __future__ import annotations

import json
import os
import socket
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from nego.market.locks import RUN_LOCK, DirectoryBusy, exclusive_run

from .config import LauncherConfig

JOB_RECORD = "job.json"
ERROR_LOG = "error.log"
"""What a failed attempt of a job leaves in its directory: the exception on the first line, then the traceback."""
OUTLIVES_PARENT = frozenset({"submitit-local", "slurm"})
"""Launchers whose jobs go on when the submitting process exits (the only ones ``--no-wait`` makes sense with)."""
_CLUSTERS = {"submitit-local": "local", "submitit-debug": "debug", "slurm": "slurm"}
_SLURM_ACTIVE = frozenset(
    {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD", "RESIZING"}
    | {"SUSPENDED", "PREEMPTED", "SIGNALING", "STAGE_OUT", "READY"}
)


def _submitit() -> Any:
    try:
        import submitit
    except ImportError as e:
        raise RuntimeError("a sweep launcher other than 'local' needs submitit: pip install 'nego[cluster]'") from e
    return submitit


@dataclass(frozen=True, slots=True)
class JobRecord:
    """How to find a submitted cell job again (``job.json`` in the cell directory): its id and log files."""

    kind: str
    job_id: str
    stdout: str
    stderr: str
    folder: str
    host: str

    def write(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        tmp = directory / f"{JOB_RECORD}.tmp"
        tmp.write_text(json.dumps(asdict(self), indent=1) + "\n")
        tmp.replace(directory / JOB_RECORD)

    @classmethod
    def read(cls, directory: Path) -> JobRecord | None:
        """The record in ``directory``, or None when there is none or it cannot be read (then it is not trusted)."""
        try:
            data = json.loads((directory / JOB_RECORD).read_text())
            return cls(**{k: str(data[k]) for k in ("kind", "job_id", "stdout", "stderr", "folder", "host")})
        except (OSError, ValueError, KeyError, TypeError):
            return None


def executor_parameters(launcher: LauncherConfig, name: str) -> dict[str, Any]:
    """The launcher's settings as submitit ``AutoExecutor`` parameters (shared names, then ``slurm_`` ones)."""
    params: dict[str, Any] = {
        "name": name,
        "timeout_min": launcher.timeout_min,
        "gpus_per_node": launcher.gpus_per_node,
        "cpus_per_task": launcher.cpus_per_task,
        "mem_gb": launcher.mem_gb,
    }
    if launcher.kind == "slurm":
        params |= {
            "slurm_partition": launcher.partition,
            "slurm_array_parallelism": launcher.slurm_array_parallelism,
            "slurm_additional_parameters": dict(launcher.slurm_additional_parameters) or None,
            "slurm_setup": list(launcher.setup) or None,
        }
    elif launcher.kind == "submitit-local":
        params["local_setup"] = list(launcher.setup) or None
    return {k: v for k, v in params.items() if v is not None}


def make_executor(launcher: LauncherConfig, folder: Path, name: str) -> Any:
    """A submitit executor for ``launcher`` writing its scripts, pickles and logs under ``folder``."""
    if launcher.kind not in _CLUSTERS:
        raise ValueError(f"launcher kind {launcher.kind!r} does not submit jobs")
    submitit = _submitit()
    try:
        executor = submitit.AutoExecutor(folder=folder, cluster=_CLUSTERS[launcher.kind])
    except RuntimeError as e:  # SlurmExecutor refuses a machine without srun
        raise RuntimeError(
            f"launcher kind {launcher.kind!r}: {e} Submit from a SLURM login node, or use kind 'submitit-local'."
        ) from None
    executor.update_parameters(**executor_parameters(launcher, name))
    return executor


@dataclass(frozen=True, slots=True)
class Submitted:
    """A live submitit job and its record."""

    job: Any
    record: JobRecord


def submit(executor: Any, kind: str, fn: Callable[..., Any], calls: Sequence[tuple[Any, ...]]) -> list[Submitted]:
    """Submit ``fn(*args)`` for every ``args`` in ``calls`` at once (one job array on SLURM)."""
    with executor.batch():
        jobs = [executor.submit(fn, *args) for args in calls]
    host = socket.gethostname()
    return [
        Submitted(
            job,
            JobRecord(kind, str(job.job_id), str(job.paths.stdout), str(job.paths.stderr), str(executor.folder), host),
        )
        for job in jobs
    ]


def as_finished(jobs: Sequence[Any], poll_s: float = 1.0) -> Iterator[int]:
    """Indices of ``jobs`` as each one ends (successfully or not), polling every ``poll_s`` seconds."""
    pending = list(range(len(jobs)))
    while pending:
        ended = [i for i in pending if jobs[i].done()]
        yield from ended
        pending = [i for i in pending if i not in ended]
        if pending and not ended:
            time.sleep(poll_s)


def job_state(job: Any) -> str:
    """What the launcher says of an ended job (e.g. FINISHED, INTERRUPTED, FAILED, TIMEOUT)."""
    try:
        return str(job.state)
    except Exception as e:  # a scheduler query that fails must not hide the cell's own record
        return f"unknown ({e})"


def still_active(records: Sequence[JobRecord | None]) -> list[bool | None]:
    """For each record: True while its job is queued or running, False once it ended (or when there is no record),
    None when that cannot be told from here (another host, no answer from the scheduler)."""
    answers: list[bool | None] = [False] * len(records)
    slurm = [i for i, r in enumerate(records) if r is not None and r.kind == "slurm"]
    if slurm:
        for i, state in zip(slurm, _slurm_states([records[i] for i in slurm]), strict=True):
            answers[i] = None if state is None else state in _SLURM_ACTIVE
    for i, r in enumerate(records):
        if r is not None and r.kind == "submitit-local":
            answers[i] = _process_alive(r) if r.host == socket.gethostname() else None
    return answers


def _slurm_states(records: Sequence[Any]) -> list[str | None]:
    try:
        submitit = _submitit()
    except RuntimeError:
        return [None] * len(records)
    jobs = [submitit.SlurmJob(folder=r.folder, job_id=r.job_id) for r in records]
    submitit.SlurmJob.watcher.update()  # one sacct call for them all
    states = []
    for job in jobs:
        state = job.watcher.get_state(job.job_id, mode="cache").split()[0].upper()
        states.append(None if state == "UNKNOWN" else state)
    return states


def _process_alive(record: JobRecord) -> bool:
    # a local job's id is the pid of submitit's controller process, which outlives the process that submitted it
    try:
        pid = int(record.job_id)
    except ValueError:
        return False
    try:  # submitted from this very process (a sweep run twice from Python): reap it if it ended
        ended, _ = os.waitpid(pid, os.WNOHANG)
        return ended == 0
    except ChildProcessError:
        pass
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def write_error_log(directory: Path, error: BaseException) -> None:
    """Leave :data:`ERROR_LOG` in ``directory`` for ``error`` (call it while handling it: the traceback is its)."""
    summary = "".join(traceback.format_exception_only(error)).strip().replace("\n", " ")
    tmp = directory / f"{ERROR_LOG}.tmp"
    tmp.write_text(f"{summary}\n\n{traceback.format_exc()}")
    tmp.replace(directory / ERROR_LOG)


def error_summary(directory: Path) -> str | None:
    """The first line of the directory's ``error.log`` (the exception), or None when its last attempt left none."""
    path = directory / ERROR_LOG
    if not path.is_file():
        return None
    lines = path.read_text().splitlines()
    return lines[0] if lines else "failed (empty error.log)"


def holder(directory: Path) -> str | None:
    """Who holds ``directory`` now (a live job working in it), or None when nobody does."""
    if not directory.is_dir():
        return None
    try:
        with exclusive_run(directory, "a check whether a job holds the directory"):
            return None
    except DirectoryBusy:
        text = (directory / RUN_LOCK).read_text().strip() if (directory / RUN_LOCK).is_file() else ""
        return text or "another process"


def last_line(log: str) -> str:
    """': LINE' for the last non-blank line of the log file ``log`` (cut at 300 characters), '' without one."""
    try:
        lines = [line for line in Path(log).read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return ""
    return f": {lines[-1].strip()[:300]}" if lines else ""
