"""A factory source for sharded-evaluation tests, at module level so that launcher jobs in other processes unpickle
it by reference: agents as nego resolves them, except that the first job process to build its ``after``-th buyer is
killed (as a scheduler or the kernel would kill it: no Python error, no result)."""

from __future__ import annotations

import os
import signal
import sys

from nego.agents.registry import resolve


class KillOnce:
    """Resolves specs with :func:`~nego.agents.registry.resolve`; in a process other than the one that made it, the
    ``after``-th buyer built kills that process, once: the first to do so claims the file ``marker``."""

    def __init__(self, marker: str, after: int) -> None:
        self.marker, self.after, self.home = marker, after, os.getpid()
        self.built = 0

    def __call__(self, spec: str) -> _Counting:
        return _Counting(resolve(spec), self)

    def built_buyer(self) -> None:
        self.built += 1
        if os.getpid() == self.home or self.built != self.after:
            return
        try:
            os.close(os.open(self.marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:  # another job was killed already
            return
        print(f"shard job {os.getpid()}: about to be killed", file=sys.stderr, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)


class _Counting:
    def __init__(self, inner, source: KillOnce) -> None:
        self.inner, self.source = inner, source
        self.spec, self.kind = inner.spec, inner.kind

    def __call__(self, role, seed):
        if role.value == "buyer":
            self.source.built_buyer()
        return self.inner(role, seed)
