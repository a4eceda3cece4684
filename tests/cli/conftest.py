"""Commands set the process's thread variables (``nego.agents.threads.set_threads``): restore them per test."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _thread_variables(monkeypatch):
    import os

    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OMP_WAIT_POLICY"):
        if name in os.environ:
            monkeypatch.setenv(name, os.environ[name])
        else:
            monkeypatch.delenv(name, raising=False)
