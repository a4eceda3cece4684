"""Configuration of an evaluation run and of a sweep, as dataclasses the CLI and TOML files fill."""

from __future__ import annotations

import math
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from .stats import DEFAULT_RESAMPLES
from .suites import DEFAULT_BUYERS, DIAGNOSTIC_BUYER


@dataclass(frozen=True, slots=True)
class EvalConfig:
    """One evaluation: every seller arm against the suite's held-out buyers, plus the diagnostic buyer."""

    sellers: tuple[str, ...]
    """Seller specs; the first is the base every later arm is compared with."""
    out: Path
    """Run directory: transcripts, metrics and the report go here; rerunning resumes."""
    suite: str = "eval-1152"
    """A built-in suite name or a suite JSON path."""
    buyers: tuple[str, ...] = DEFAULT_BUYERS
    """One buyer spec per buyer slot of the suite."""
    diagnostic: str | None = DIAGNOSTIC_BUYER
    """Extra buyer reported apart (one seed per scenario and opener); None to skip."""
    concurrency: int = 64
    resamples: int = DEFAULT_RESAMPLES
    seed: int = 0
    """Seed of the bootstrap and permutation resampling."""
    optimality_gap: bool = True
    """Replay rule-based buyers to compute the optimality gap."""
    per_kind: Mapping[str, int] = field(default_factory=dict)
    """Concurrency caps per agent kind (e.g. {"openai": 16}), on top of ``concurrency``."""
    play: Mapping[str, Any] = field(default_factory=dict)
    """How model agents are played (template, temperature, max tokens, tools): recorded in ``run.json``, and a
    rerun into the same directory with other values is refused, so one run never mixes two ways of playing."""

    def __post_init__(self) -> None:
        if not self.sellers:
            raise ValueError("give at least one seller spec (--sellers A,B)")
        if len(set(self.sellers)) != len(self.sellers):
            raise ValueError(f"seller specs must be distinct, got {list(self.sellers)}")
        if self.concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {self.concurrency}")
        if self.resamples < 1_000:
            raise ValueError(f"resamples must be >= 1000 for a stable 95% interval, got {self.resamples}")


LAUNCHER_KINDS = ("local", "submitit-local", "submitit-debug", "slurm")
"""``local`` trains and evaluates the cells one after another in this process; the others hand each cell to
submitit as one job: ``slurm`` (a cluster), ``submitit-local`` (subprocesses on this machine, all at once) and
``submitit-debug`` (in this process, through the same submission path)."""


@dataclass(frozen=True, slots=True)
class LauncherConfig:
    """Where the cells of a sweep run: the ``[sweep.launcher]`` table. SLURM settings are passed to submitit."""

    kind: str = field(default="local", metadata={"help": f"how cells run: {', '.join(LAUNCHER_KINDS)}"})
    folder: Path | None = field(
        default=None, metadata={"help": "where job scripts, pickles and logs go; default: the sweep directory's jobs/"}
    )
    timeout_min: int = field(
        default=720,
        metadata={"help": "wall-clock limit of one cell job in minutes (it must fit the partition's limit)"},
    )
    gpus_per_node: int | None = field(default=None, metadata={"help": "GPUs per cell job"})
    cpus_per_task: int | None = field(default=None, metadata={"help": "CPU cores per cell job"})
    mem_gb: float | None = field(default=None, metadata={"help": "memory per cell job in GB"})
    partition: str | None = field(default=None, metadata={"help": "SLURM partition"})
    slurm_array_parallelism: int | None = field(
        default=None, metadata={"help": "most cell jobs of one submission running at once on SLURM"}
    )
    slurm_additional_parameters: Mapping[str, Any] = field(
        default_factory=dict,
        metadata={"help": "further sbatch options, passed verbatim (e.g. {account = 'proj', qos = 'high'})"},
    )
    setup: tuple[str, ...] = field(
        default=(), metadata={"help": "shell lines run before each job (e.g. 'module load cuda')"}
    )

    def __post_init__(self) -> None:
        if self.kind not in LAUNCHER_KINDS:
            raise ValueError(f"launcher kind must be one of {list(LAUNCHER_KINDS)}, got {self.kind!r}")
        for name in ("timeout_min", "gpus_per_node", "cpus_per_task", "slurm_array_parallelism"):
            value = getattr(self, name)
            smallest = 0 if name == "gpus_per_node" else 1
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < smallest):
                raise ValueError(f"launcher {name} must be an integer >= {smallest}, got {value!r}")
        mem = self.mem_gb
        if mem is not None and (isinstance(mem, bool) or not isinstance(mem, int | float) or not math.isfinite(mem)):
            raise ValueError(f"launcher mem_gb must be a number, got {mem!r}")
        if mem is not None and mem <= 0:
            raise ValueError(f"launcher mem_gb must be positive, got {mem!r}")
        if self.partition is not None and not (isinstance(self.partition, str) and self.partition):
            raise ValueError(f"launcher partition must be a non-empty string, got {self.partition!r}")
        if not all(isinstance(line, str) for line in self.setup):
            raise ValueError(f"launcher setup must be a list of shell lines (strings), got {list(self.setup)!r}")
        extra = self.slurm_additional_parameters
        if not isinstance(extra, Mapping) or not all(isinstance(k, str) for k in extra):
            raise ValueError(f"launcher slurm_additional_parameters must be a table of sbatch options, got {extra!r}")


@dataclass(frozen=True, slots=True)
class SweepConfig:
    """A study grid: every model size x learning rate x seed trained, then evaluated on one suite."""

    out: Path
    sizes: tuple[str, ...] = ("tiny",)
    learning_rates: tuple[float, ...] = (1e-5, 1e-4, 3e-4)
    seeds: tuple[int, ...] = (0,)
    suite: str = "eval-dev"
    buyers: tuple[str, ...] = DEFAULT_BUYERS
    diagnostic: str | None = DIAGNOSTIC_BUYER
    train_args: dict[str, Any] = field(default_factory=dict)
    """Extra training settings (fields of ``nego.training.config.TrainConfig``), e.g. {"steps": 20}."""
    concurrency: int = 64
    resamples: int = DEFAULT_RESAMPLES
    launcher: LauncherConfig = field(
        default_factory=LauncherConfig, metadata={"help": "where the cells run ([sweep.launcher] table)"}
    )

    def __post_init__(self) -> None:
        if not self.sizes or not self.learning_rates or not self.seeds:
            raise ValueError("a sweep needs at least one size, one learning rate and one seed")
        bad = [lr for lr in self.learning_rates if not lr > 0]
        if bad:
            raise ValueError(f"learning rates must be positive, got {bad}")


_SWEEP_KEYS = {
    "out",
    "sizes",
    "learning_rates",
    "seeds",
    "suite",
    "buyers",
    "diagnostic",
    "train",
    "concurrency",
    "resamples",
    "launcher",
}
_LAUNCHER_KEYS = {f.name for f in fields(LauncherConfig)}


def load_launcher_config(table: Any, where: str, base: Path) -> LauncherConfig:
    """A ``[sweep.launcher]`` table as a :class:`LauncherConfig`; a relative ``folder`` is taken from ``base``.
    Errors name ``where`` (the file) and the key."""
    if not isinstance(table, dict):
        raise ValueError(f"{where}: [sweep.launcher] must be a table, got {table!r}")
    unknown = set(table) - _LAUNCHER_KEYS
    if unknown:
        raise ValueError(
            f"{where}: unknown key(s) in [sweep.launcher]: {sorted(unknown)}; allowed: {sorted(_LAUNCHER_KEYS)}"
        )
    values = dict(table)
    if "folder" in values:
        if not isinstance(values["folder"], str) or not values["folder"]:
            raise ValueError(f"{where}: [sweep.launcher] folder must be a path, got {values['folder']!r}")
        values["folder"] = base / Path(values["folder"]).expanduser()
    if "setup" in values:
        setup = values["setup"]
        values["setup"] = tuple(setup) if isinstance(setup, list) else (setup,)
    try:
        return LauncherConfig(**values)
    except ValueError as e:
        raise ValueError(f"{where}: bad value in [sweep.launcher]: {e}") from e


def load_sweep_config(path: Path) -> SweepConfig:
    """Read a sweep TOML file (``[sweep]`` table, optional ``[sweep.train]`` options and ``[sweep.launcher]``
    table); errors name the key."""
    try:
        data = tomllib.loads(Path(path).read_text())
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise ValueError(f"{path}: cannot read sweep config: {e}") from e
    table = data.get("sweep")
    if not isinstance(table, dict):
        raise ValueError(f"{path}: needs a [sweep] table with sizes, learning_rates, seeds, suite")
    unknown = set(table) - _SWEEP_KEYS
    if unknown:
        raise ValueError(f"{path}: unknown key(s) in [sweep]: {sorted(unknown)}; allowed: {sorted(_SWEEP_KEYS)}")
    out = Path(table.get("out", Path(path).with_suffix("")))
    if not out.is_absolute():
        out = Path(path).parent / out
    launcher = load_launcher_config(table.get("launcher", {}), str(path), Path(path).parent)
    try:
        return SweepConfig(
            out=out,
            sizes=tuple(str(s) for s in table.get("sizes", ("tiny",))),
            learning_rates=tuple(float(x) for x in table.get("learning_rates", (1e-5, 1e-4, 3e-4))),
            seeds=tuple(int(x) for x in table.get("seeds", (0,))),
            suite=str(table.get("suite", "eval-dev")),
            buyers=tuple(str(b) for b in table.get("buyers", DEFAULT_BUYERS)),
            diagnostic=table.get("diagnostic", DIAGNOSTIC_BUYER) or None,
            train_args=dict(table.get("train", {})),
            concurrency=int(table.get("concurrency", 64)),
            resamples=int(table.get("resamples", 10_000)),
            launcher=launcher,
        )
    except (TypeError, ValueError) as e:
        raise ValueError(f"{path}: bad value in [sweep]: {e}") from e
