"""Stand-ins for training in sweep tests, as module-level functions so that launcher jobs in other processes can
unpickle them by reference. Each learning rate "trains" a different rule seller, and every training run appends a
line to ``trained.txt`` in the cell's training directory, so a test can count them across processes."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

from nego.evaluation.sweep import Cell, TrainedArms

CONCESSION = {1e-5: 0.2, 1e-4: 1.0, 3e-4: 2.0}


def importable_root() -> str:
    """The folder to put on a subprocess's ``PYTHONPATH`` so it imports this module under the same name."""
    return str(Path(__file__).resolve().parents[__name__.count(".")])


def rule_training(cell: Cell, directory: Path, settings: dict) -> TrainedArms:
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / "trained.txt", "a") as f:
        f.write(f"{os.getpid()}\n")
    return TrainedArms("boulware", f"timedep:e={CONCESSION[cell.lr]}")


def failing_at_3e4(cell: Cell, directory: Path, settings: dict) -> TrainedArms:
    if cell.lr == 3e-4:
        raise RuntimeError(f"CUDA out of memory while training {cell.name}")
    return rule_training(cell, directory, settings)


def killed_at_3e4(cell: Cell, directory: Path, settings: dict) -> TrainedArms:
    """As if the scheduler or the kernel killed the job: no Python error, no result."""
    if cell.lr == 3e-4:
        print(f"{cell.name}: about to be killed", file=sys.stderr, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    return rule_training(cell, directory, settings)


def gated_training(cell: Cell, directory: Path, settings: dict) -> TrainedArms:
    """Holds the job until the file ``settings["gate"]`` exists (a minute at most), then trains as above."""
    gate = Path(settings["gate"])
    for _ in range(1200):
        if gate.exists():
            return rule_training(cell, directory, settings)
        time.sleep(0.05)
    raise TimeoutError(f"{gate} never appeared")


def training_runs(out: Path) -> dict[str, int]:
    """How many times each cell of the sweep in ``out`` was trained."""
    return {p.parent.parent.name: len(p.read_text().split()) for p in sorted(out.glob("cells/*/train/trained.txt"))}
