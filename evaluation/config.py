"""Configuration of an evaluation run and of a sweep, as dataclasses the CLI and TOML files fill.

Each field's help text is in its metadata, where ``nego eval`` and ``nego sweep`` take their options from;
defaults are written here only.
"""

from __future__ import annotations

import math
import tomllib
import typing
from collections.abc import Mapping
from dataclasses import MISSING, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from nego.agents.threads import THREADS_HELP

from .stats import DEFAULT_RESAMPLES
from .suites import DEFAULT_BUYERS, DIAGNOSTIC_BUYER

DEFAULT_BASELINES = ("boulware", "linear", "conceder", "tft", "hardliner", "random")
"""The reference sellers of ``--baselines default``: the built-in rule sellers at their default parameters."""

BASELINE_KEYWORDS = ("default", "none")


def _f(default: Any = MISSING, help: str = "", **meta: Any) -> Any:
    return field(default=default, metadata={"help": help, **meta})


@dataclass(frozen=True, slots=True)
class EvalConfig:
    """One evaluation: every seller arm against the suite's held-out buyers, plus the diagnostic buyer."""

    sellers: tuple[str, ...] = _f(help="Seller specs, comma-separated; the first is the base arm.")
    out: Path = field(metadata={"help": "Run directory (resumes if it exists). Default runs/eval/SUITE."})
    suite: str = _f("eval-1152", "Suite: eval-1152, eval-192, eval-dev, or a suite JSON file.")
    buyers: tuple[str, ...] = _f(DEFAULT_BUYERS, "Buyer specs, one per buyer slot of the suite (held-out defaults).")
    diagnostic: str | None = _f(
        DIAGNOSTIC_BUYER, "Extra buyer reported apart (one seed per scenario and opener); 'none' to skip."
    )
    concurrency: int = _f(64, "Negotiations in flight at once.")
    resamples: int = _f(DEFAULT_RESAMPLES, "Bootstrap and permutation resamples (>= 1000).")
    seed: int = _f(0, "Seed of the bootstrap and permutation resampling.")
    optimality_gap: bool = _f(
        True, "Compute the optimality gap against rule-based buyers (by replaying them).", flag="--gap/--no-gap"
    )
    threads: int = _f(0, THREADS_HELP)
    baselines: tuple[str, ...] = _f(
        DEFAULT_BASELINES,
        "Reference sellers played beside the arms on the same negotiations, so that each arm is shown against the "
        "best of them per buyer: 'default' (the built-in rule sellers), 'none', or seller specs, comma-separated.",
    )
    workers: int = _f(
        1,
        "Processes playing the negotiations (1: this one). Same transcripts for any number; rule and remote/API "
        "agents only (not models loaded in this process).",
    )
    per_kind: Mapping[str, int] = field(default_factory=dict)
    """Concurrency caps per agent kind (e.g. {"openai": 16}), on top of ``concurrency`` (``--per-kind``)."""
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
        if self.threads < 0:
            raise ValueError(f"threads must be >= 0 (0 = automatic), got {self.threads}")
        if self.workers < 1:
            raise ValueError(f"workers must be >= 1, got {self.workers}")
        object.__setattr__(self, "baselines", _baselines(self.baselines))


def _baselines(value: str | tuple[str, ...]) -> tuple[str, ...]:
    """``baselines`` with its keywords replaced: ``default`` by :data:`DEFAULT_BASELINES`, ``none`` by nothing."""
    specs = (value,) if isinstance(value, str) else tuple(value)
    words = [s for s in specs if s.strip().lower() in BASELINE_KEYWORDS]
    if words and len(specs) > 1:
        raise ValueError(f"baselines: {words[0]!r} stands alone, not in a list of specs; got {list(specs)}")
    if words:
        return DEFAULT_BASELINES if words[0].strip().lower() == "default" else ()
    if len(set(specs)) != len(specs):
        raise ValueError(f"baseline specs must be distinct, got {list(specs)}")
    return specs


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

    out: Path = field(
        metadata={"help": "Sweep directory (default: the TOML file's path without .toml; relative to the file)."}
    )
    sizes: tuple[str, ...] = _f(("tiny",), "Seller model sizes to train (nego train --model).")
    learning_rates: tuple[float, ...] = _f((1e-5, 1e-4, 3e-4), "GRPO learning rates, comma-separated.")
    seeds: tuple[int, ...] = _f((0,), "Training seeds, comma-separated.")
    suite: str = _f("eval-dev", "Evaluation suite of every cell.")
    buyers: tuple[str, ...] = _f(DEFAULT_BUYERS, "Held-out buyer specs, one per buyer slot of the suite.")
    diagnostic: str | None = _f(DIAGNOSTIC_BUYER, "Extra buyer reported apart; 'none' to skip.")
    train_args: dict[str, Any] = field(default_factory=dict)
    """Extra training settings (fields of ``nego.training.config.TrainConfig``), e.g. {"steps": 20}."""
    concurrency: int = _f(64, "Negotiations in flight at once, per evaluation.")
    resamples: int = _f(DEFAULT_RESAMPLES, "Bootstrap and permutation resamples (>= 1000).")
    launcher: LauncherConfig = field(
        default_factory=LauncherConfig,
        metadata={"help": "where the cells run ([sweep.launcher] table; --launcher KIND)", "cli": False},
    )

    def __post_init__(self) -> None:
        if not self.sizes or not self.learning_rates or not self.seeds:
            raise ValueError("a sweep needs at least one size, one learning rate and one seed")
        bad = [lr for lr in self.learning_rates if not lr > 0]
        if bad:
            raise ValueError(f"learning rates must be positive, got {bad}")


_TOML_KEYS = {"train_args": "train"}
"""Fields whose key in the [sweep] table has another name."""

_LAUNCHER_KEYS = {f.name for f in fields(LauncherConfig)}


def load_launcher_config(table: Any, where: str, base: Path, name: str = "sweep.launcher") -> LauncherConfig:
    """A launcher table (``[sweep.launcher]`` of a sweep file) as a :class:`LauncherConfig`; a relative ``folder`` is
    taken from ``base``. Errors name ``where`` (the file), the table ``name`` and the key."""
    if not isinstance(table, dict):
        raise ValueError(f"{where}: [{name}] must be a table, got {table!r}")
    unknown = set(table) - _LAUNCHER_KEYS
    if unknown:
        raise ValueError(f"{where}: unknown key(s) in [{name}]: {sorted(unknown)}; allowed: {sorted(_LAUNCHER_KEYS)}")
    values = dict(table)
    if "folder" in values:
        if not isinstance(values["folder"], str) or not values["folder"]:
            raise ValueError(f"{where}: [{name}] folder must be a path, got {values['folder']!r}")
        values["folder"] = base / Path(values["folder"]).expanduser()
    if "setup" in values:
        setup = values["setup"]
        values["setup"] = tuple(setup) if isinstance(setup, list) else (setup,)
    try:
        return LauncherConfig(**values)
    except ValueError as e:
        raise ValueError(f"{where}: bad value in [{name}]: {e}") from e


def load_launcher_file(path: Path) -> LauncherConfig:
    """The ``[launcher]`` table of a TOML file (the keys of ``[sweep.launcher]``); a relative ``folder`` is relative
    to the file's folder."""
    try:
        data = tomllib.loads(Path(path).read_text())
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise ValueError(f"{path}: cannot read launcher config: {e}") from e
    if "launcher" not in data:
        raise ValueError(f"{path}: needs a [launcher] table (kind, partition, gpus_per_node, ...)")
    return load_launcher_config(data["launcher"], str(path), Path(path).parent, name="launcher")


@dataclass(frozen=True, slots=True)
class ShardConfig:
    """An evaluation split into ``count`` launcher jobs (``nego eval --shards K --launcher KIND``)."""

    count: int
    launcher: LauncherConfig

    def __post_init__(self) -> None:
        if isinstance(self.count, bool) or not isinstance(self.count, int) or self.count < 1:
            raise ValueError(f"--shards must be an integer >= 1, got {self.count!r}")
        if self.launcher.kind == "local":
            kinds = ", ".join(k for k in LAUNCHER_KINDS if k != "local")
            raise ValueError(
                f"--shards needs a launcher that submits jobs: --launcher {kinds} (or kind in the [launcher] table of "
                "--launcher-config); launcher 'local' runs in this process, which is nego eval without --shards"
            )


def shard_config(shards: int | None, kind: str | None, launcher_file: Path | None) -> ShardConfig | None:
    """The sharding that ``--shards``, ``--launcher`` and ``--launcher-config`` ask for (``--launcher`` overrides the
    file's kind); None without ``--shards``, where the other two are refused."""
    if shards is None:
        if kind is not None or launcher_file is not None:
            raise ValueError("--launcher and --launcher-config go with --shards K (the jobs the run is split into)")
        return None
    launcher = load_launcher_file(launcher_file) if launcher_file is not None else LauncherConfig()
    if kind is not None:
        launcher = replace(launcher, kind=kind)
    return ShardConfig(shards, launcher)


def load_sweep_config(path: Path, overrides: Mapping[str, Any] | None = None) -> SweepConfig:
    """Read a sweep TOML file (``[sweep]`` table, optional ``[sweep.train]`` options and ``[sweep.launcher]`` table),
    then apply ``overrides`` (field values, e.g. from the command line); errors name the file and the key. A relative
    ``out`` in the file is relative to the file's folder; without one, the sweep directory is the file's path without
    ``.toml``."""
    try:
        data = tomllib.loads(Path(path).read_text())
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise ValueError(f"{path}: cannot read sweep config: {e}") from e
    table = data.get("sweep")
    if not isinstance(table, dict):
        raise ValueError(f"{path}: needs a [sweep] table with sizes, learning_rates, seeds, suite")
    known = {_TOML_KEYS.get(f.name, f.name): f.name for f in fields(SweepConfig)}
    unknown = set(table) - set(known)
    if unknown:
        raise ValueError(f"{path}: unknown key(s) in [sweep]: {sorted(unknown)}; allowed: {sorted(known)}")
    hints = typing.get_type_hints(SweepConfig)
    launcher = load_launcher_config(table.get("launcher", {}), str(path), Path(path).parent)
    try:
        values = {known[key]: _typed(value, hints[known[key]]) for key, value in table.items() if key != "launcher"}
        values["out"] = Path(path).parent / values["out"] if "out" in values else Path(path).with_suffix("")
        return SweepConfig(**(values | {"launcher": launcher} | dict(overrides or {})))
    except (TypeError, ValueError) as e:
        raise ValueError(f"{path}: bad value in [sweep]: {e}") from e


def _typed(value: Any, hint: Any) -> Any:
    """A TOML value as the field type ``hint`` wants it: tuples of str/int/float, dicts, scalars; '' or 'none'
    for an optional string means None."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is tuple:
        if not isinstance(value, list):
            raise TypeError(f"expected a list, got {value!r}")
        return tuple(args[0](v) for v in value)
    if origin is dict:
        if not isinstance(value, dict):
            raise TypeError(f"expected a table, got {value!r}")
        return dict(value)
    if type(None) in args:  # str | None
        return None if not value or str(value).lower() == "none" else str(value)
    if hint is Path:
        return Path(value)
    return hint(value)
