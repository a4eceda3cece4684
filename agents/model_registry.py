"""The local model registry: named seller models (tiny compact models, fine-tuned checkpoints) on this machine.

A JSON file at ``$NEGO_HOME/models.json`` (default ``~/.nego/models.json``) maps a name such as ``tiny`` or
``4.5b-rl`` to where the weights live and how they were made. Training writes it; ``--sellers NAME`` reads it.
No heavy imports here: reading the registry must stay cheap.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from nego.market.locks import locked

ModelFormat = Literal["compact", "hf"]
FORMATS: tuple[str, ...] = ("compact", "hf")
SCHEMA_VERSION = 1


class RegistryError(RuntimeError):
    """The registry file is unreadable or an entry is malformed."""


@dataclass(frozen=True, slots=True)
class ModelEntry:
    """One registered model.

    ``format`` says how to play it: ``compact`` (the tiny word-level protocol, see ``nego.agents.compact.protocol``)
    or ``hf`` (a chat model driven through its chat template). ``base`` names the model it was trained from
    (empty for a model built from scratch), ``steps`` the optimizer steps of its last training stage and
    ``eval`` a small dev-set evaluation recorded at registration.
    """

    name: str
    path: str
    base: str
    format: ModelFormat
    config: dict[str, Any] = field(default_factory=dict)
    steps: int = 0
    eval: dict[str, Any] | None = None
    created: str = ""

    def __post_init__(self) -> None:
        if not self.name or any(c.isspace() for c in self.name):
            raise ValueError(f"model name {self.name!r} must be non-empty and contain no whitespace")
        if self.format not in FORMATS:
            raise ValueError(f"model {self.name!r}: format must be one of {FORMATS}, got {self.format!r}")
        if self.steps < 0:
            raise ValueError(f"model {self.name!r}: steps must be >= 0, got {self.steps}")
        if not self.created:
            object.__setattr__(self, "created", datetime.now(UTC).isoformat(timespec="seconds"))


def nego_home() -> Path:
    """Where nego keeps per-user state: ``$NEGO_HOME`` or ``~/.nego``."""
    return Path(os.environ.get("NEGO_HOME") or Path.home() / ".nego")


def registry_path() -> Path:
    """The registry file: ``$NEGO_HOME/models.json``."""
    return nego_home() / "models.json"


def _read(path: Path) -> dict[str, dict[str, Any]]:
    if not path.exists():
        return {}
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise RegistryError(f"model registry {path} is unreadable ({e}); fix or delete the file") from None
    if not isinstance(data, dict) or not isinstance(data.get("models"), dict):
        raise RegistryError(f"model registry {path} has no 'models' table; fix or delete the file")
    return data["models"]


def _entry(name: str, raw: dict[str, Any], path: Path) -> ModelEntry:
    try:
        return ModelEntry(**raw)
    except (TypeError, ValueError) as e:
        raise RegistryError(f"model registry {path}: entry {name!r} is malformed: {e}") from None


def register(entry: ModelEntry) -> Path:
    """Add or replace ``entry`` (by name). The file is replaced atomically, so a crash never leaves half a file,
    and under a lock, so two processes registering at once never drop each other's entries."""
    path = registry_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    with locked(path.parent / ".models.lock"):
        models = _read(path)
        models[entry.name] = asdict(entry)
        blob = json.dumps({"schema_version": SCHEMA_VERSION, "models": models}, indent=2, sort_keys=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".models-", suffix=".json")
        try:
            with os.fdopen(fd, "w") as f:
                f.write(blob)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    return path


def lookup(name: str) -> ModelEntry | None:
    """The entry registered as ``name``, or None."""
    path = registry_path()
    raw = _read(path).get(name)
    return None if raw is None else _entry(name, raw, path)


def list_models() -> list[ModelEntry]:
    """Every registered model, sorted by name."""
    path = registry_path()
    return [_entry(k, v, path) for k, v in sorted(_read(path).items())]
