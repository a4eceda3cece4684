"""Advisory file locks (POSIX ``flock``; no-ops where the platform has none, such as Windows).

- :func:`exclusive_run` holds an output directory for a whole run: a second ``nego simulate``, ``nego eval`` or
  ``nego train`` on a directory that a live run is writing fails at once, naming that run, instead of playing (or
  training) the same work twice. The lock file records who holds it.
- :func:`locked` serialises a short read-modify-write (numbering transcript parts, updating the model registry)
  between processes; it waits for the lock.

The operating system releases a lock when its process ends, so a crashed or killed run never leaves one behind.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from pathlib import Path

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None

RUN_LOCK = ".run.lock"
logger = logging.getLogger(__name__)


class DirectoryBusy(RuntimeError):
    """Another live run holds the directory."""


@contextlib.contextmanager
def locked(path: str | os.PathLike[str]) -> Iterator[None]:
    """Hold an exclusive lock on the file ``path`` (created if missing), waiting for it if another process has it."""
    if fcntl is None:
        yield
        return
    with open(path, "a") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


@contextlib.contextmanager
def exclusive_run(directory: str | os.PathLike[str], what: str) -> Iterator[None]:
    """Hold ``directory`` for one run, or raise :class:`DirectoryBusy` at once if a live run holds it (``what``
    names this run in that other run's error message). On a file system without ``flock`` support the run goes
    ahead unlocked, with a logged warning."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    if fcntl is None:
        yield
        return
    with open(directory / RUN_LOCK, "a+") as handle:
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "another run"
            raise DirectoryBusy(
                f"{directory} is in use by {holder}; wait for it to finish (then rerun to resume) "
                "or choose another output directory"
            ) from None
        except OSError as e:  # e.g. a network file system without lock support
            logger.warning("cannot lock %s (%s): a second run on it would not be stopped", directory, e)
            yield
            return
        handle.seek(0)
        handle.truncate()
        handle.write(f"{what} (pid {os.getpid()})\n")
        handle.flush()
        try:
            yield
        finally:
            handle.truncate(0)
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
