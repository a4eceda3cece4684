"""Run directories: the config a run was started with, its warm-started base, and its resumable checkpoints.

Layout of a run directory::

    config.json            the TrainConfig (so --resume continues with exactly the same settings)
    base/                  the warm-started model and tokenizer (tiny runs)
    checkpoints/checkpoint-N/   weights or adapter, optimizer, scheduler, RNG states, trainer state
                           (step and data position), written by the trainer every save_every steps
    final/                 the trained model and tokenizer
    train_log.parquet      one row per step
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import asdict
from pathlib import Path

from .config import ConfigError, TrainConfig, from_mapping

CONFIG_FILE = "config.json"
CUT_SHORT = "CUT_SHORT"
"""A file in a model directory whose training the time cap ended early (its text says how far it got)."""
_CKPT = re.compile(r"^checkpoint-(\d+)$")


def save_run_config(run_dir: Path, cfg: TrainConfig) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    data = {k: v for k, v in asdict(cfg).items() if k != "resume"}
    tmp = run_dir / f".{CONFIG_FILE}.tmp"
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True))
    os.replace(tmp, run_dir / CONFIG_FILE)  # whole or not at all: --resume reads it


def load_run_config(run_dir: Path) -> TrainConfig:
    """The config saved in ``run_dir``, with ``resume`` pointing at it."""
    path = run_dir / CONFIG_FILE
    if not path.exists():
        raise ConfigError(f"--resume {run_dir}: no {CONFIG_FILE} there; is it a training run directory?")
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(f"--resume {run_dir}: {path} is not valid JSON ({e})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"--resume {run_dir}: {path} does not hold a training config")
    return from_mapping({**data, "resume": str(run_dir)}, str(path))


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The checkpoint with the highest step under ``run_dir/checkpoints`` (None if there is none)."""
    root = run_dir / "checkpoints"
    if not root.is_dir():
        return None
    found = [(int(m[1]), p) for p in root.iterdir() if (m := _CKPT.match(p.name)) and p.is_dir()]
    return max(found)[1] if found else None


def checkpoint_step(path: Path) -> int:
    m = _CKPT.match(path.name)
    if m is None:
        raise ValueError(f"{path} is not a checkpoint-N directory")
    return int(m[1])
