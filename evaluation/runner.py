"""Evaluation arms: play every seller arm on a suite through the marketplace, then compute metrics and paired
comparisons.

Reference sellers (``EvalConfig.baselines``, the built-in rule sellers by default) are played beside the arms on the
same suite slots and seeds, as jobs labelled with their own spec like an arm's, so that each arm is shown against the
best of them per buyer; they are not arms: no gain over the base, no part in its Holm correction.

A run directory holds ``run.json`` (suite, hash, arms, the specs played as references under ``baselines``, buyers),
``transcripts/`` (the marketplace's resumable Parquet transcripts), ``metrics.parquet`` (one row per negotiation,
the references' too) and ``comparisons.parquet`` (see :func:`compare` and :func:`with_references`). Rerunning the
same command resumes: negotiations already in the transcripts are read back, not played again.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import polars as pl
from nego.market.locks import exclusive_run
from nego.market.marketplace import FactorySource, Job, Marketplace
from nego.market.packing import PackedResult, pack_result, unpack_result
from nego.market.rates import deal_rate_expr
from nego.market.transcript_rows import results_from_tables
from nego.market.transcripts import TranscriptWriter, read_negotiations, read_turns
from nego.market.types import NegotiationResult
from nego.market.workers import WorkerPool, run_map

from .best_response import best_response_value
from .config import EvalConfig
from .leakage import trained_against, warning_lines
from .metrics import compute_metrics
from .stats import PairedComparison, bootstrap_interval, paired_comparison, with_holm
from .suites import RECIPES, Suite, load_suite

logger = logging.getLogger(__name__)

SUITE_GROUP = "suite"
"""Buyer-group label of the pooled held-out buyers (the suite proper)."""


@dataclass(frozen=True, slots=True)
class PlannedJob:
    """A marketplace job with what evaluation needs to pair it: the suite key and whether it is a diagnostic."""

    job: Job
    key: str
    diagnostic: bool


def plan(suite: Suite, sellers: Sequence[str], buyers: Sequence[str], diagnostic: str | None) -> list[PlannedJob]:
    """Every job of the run: each arm on each suite slot, plus diagnostic negotiations (first seed only)."""
    if len(buyers) != suite.recipe.buyer_slots:
        raise ValueError(f"suite {suite.name} has {suite.recipe.buyer_slots} buyer slots; got buyers {list(buyers)}")
    if len(set(buyers)) != len(buyers):
        raise ValueError(f"buyer specs must be distinct, got {list(buyers)}")
    if diagnostic is not None and diagnostic in buyers:
        raise ValueError(f"the diagnostic buyer {diagnostic!r} is already one of the suite buyers")
    out = []
    for seller in sellers:
        for slot in suite.slots():
            job = Job(slot.scenario, seller, buyers[slot.buyer_slot], slot.seed, arm=seller, run_id=suite.name)
            out.append(PlannedJob(job, slot.key, False))
        if diagnostic is None:
            continue
        for slot in suite.slots():
            if slot.buyer_slot == 0 and slot.seed == suite.recipe.seeds[0]:
                key = slot.key.rsplit("/", 1)[0] + "/diag"
                job = Job(slot.scenario, seller, diagnostic, slot.seed, arm=seller, run_id=suite.name)
                out.append(PlannedJob(job, key, True))
    return out


@dataclass(frozen=True, slots=True)
class RunPlan:
    """What one evaluation plays: its suite, the specs played as reference sellers, every planned job (arms first,
    then the references that are not arms), and the arms trained against a family it holds out."""

    suite: Suite
    references: tuple[str, ...]
    jobs: tuple[PlannedJob, ...]
    overlap: dict[str, list[str]]


def plan_run(config: EvalConfig, factories: FactorySource) -> RunPlan:
    """The plan of ``config`` (logging a warning for each arm that is not held out)."""
    suite = load_suite(config.suite)
    references = references_to_play(config.sellers, config.baselines, factories)
    sellers = (*config.sellers, *(r for r in references if r not in config.sellers))
    jobs = plan(suite, sellers, config.buyers, config.diagnostic)
    overlap = trained_against(config.sellers, [*config.buyers, *([config.diagnostic] if config.diagnostic else [])])
    for line in warning_lines(overlap):
        logger.warning("%s", line)
    return RunPlan(suite, references, tuple(jobs), overlap)


def write_manifest(config: EvalConfig, run: RunPlan) -> None:
    """``run.json`` of ``config.out``; a directory that holds a run on another suite, or one that played model agents
    otherwise, is refused (ValueError) before anything is written."""
    suite, overlap, references = run.suite, run.overlap, run.references
    path = config.out / "run.json"
    manifest = {
        "suite": suite.name,
        "suite_source": config.suite if config.suite in RECIPES else str(Path(config.suite).resolve()),
        "suite_hash": suite.content_hash(),
        "sellers": list(config.sellers),
        "baselines": list(references),
        "buyers": list(config.buyers),
        "diagnostic": config.diagnostic,
        "resamples": config.resamples,
        "seed": config.seed,
        "play": dict(config.play),
        "trained_against_held_out": overlap,
    }
    if path.exists():
        old = _manifest_at(path)
        if old.get("suite_hash") != manifest["suite_hash"]:
            raise ValueError(
                f"{config.out} holds a run on suite {old.get('suite')} (hash {old.get('suite_hash')}); "
                f"this run uses {suite.name} (hash {manifest['suite_hash']}): choose another --out"
            )
        if "play" in old and old["play"] != manifest["play"]:
            raise ValueError(
                f"{config.out} holds a run whose model agents were played with {old['play']}; this run plays them "
                f"with {manifest['play']}: choose another --out"
            )
    config.out.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(manifest, indent=1) + "\n")
    os.replace(tmp, path)  # whole or not at all: a run killed while writing it leaves the previous one


def read_manifest(directory: Path) -> dict:
    path = Path(directory) / "run.json"
    if not path.is_file():
        raise FileNotFoundError(f"{directory} is not an evaluation run directory (no run.json): run `nego eval` first")
    return _manifest_at(path)


def _manifest_at(path: Path) -> dict:
    """The manifest in ``path``; one that is not a JSON object (edited, or cut short by an older version) is a
    ValueError that says what to do."""
    fix = f"choose another --out, or delete {path.parent} to play the run there afresh"
    try:
        manifest = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path} is not a run manifest ({e}): {fix}") from None
    if not isinstance(manifest, dict):
        raise ValueError(f"{path} is not a run manifest: {fix}")
    return manifest


@contextlib.contextmanager
def worker_pool(config: EvalConfig, factories: FactorySource) -> Iterator[WorkerPool | None]:
    """The run's ``config.workers`` processes (they rebuild ``factories``: give a picklable resolver then), closed on
    the way out; None for one process."""
    if config.workers <= 1:
        yield None
        return
    with WorkerPool(config.workers, factories) as pool:
        yield pool


async def play(
    config: EvalConfig, factories: FactorySource, jobs: Sequence[PlannedJob], pool: WorkerPool | None = None
) -> int:
    """Play the jobs missing from the transcripts (on ``pool``'s workers when given); returns how many negotiations
    were played now."""
    with TranscriptWriter(config.out / "transcripts") as writer:
        market = Marketplace(
            factories, concurrency=config.concurrency, per_kind=config.per_kind, writer=writer, pool=pool
        )
        try:
            await market.run([p.job for p in jobs])
        finally:
            await market.aclose()
        return writer.written


GapItem = tuple[Job, NegotiationResult | PackedResult]
"""One negotiation whose gap is to be found: its job and its result (packed to cross to a worker)."""


def _gaps(
    negotiations: pl.DataFrame,
    turns: pl.DataFrame,
    jobs: dict[str, PlannedJob],
    factories: FactorySource,
    pool: WorkerPool | None,
) -> dict[str, float]:
    """The gaps of the negotiations with a rule-based buyer that did not end in an error, found on ``pool``'s workers
    when there is one (each gap replays its negotiation many times: most of an evaluation of rule sellers)."""
    results = results_from_tables(negotiations, turns)
    market = Marketplace(factories)
    items: list[GapItem] = []
    for nid, result in results.items():
        job = jobs[nid].job
        if getattr(market.factory(job.buyer), "kind", None) != "rule" or result.outcome.end_reason.value == "error":
            continue
        items.append((job, result if pool is None else pack_result(result)))
    batches = [items[i : i + GAP_BATCH] for i in range(0, len(items), GAP_BATCH)]
    values = [v for batch in run_map(partial(gaps_of, factories), batches, pool) for v in batch]
    return {job.negotiation_id: value for (job, _), value in zip(items, values, strict=True)}


GAP_BATCH = 16
"""Negotiations whose gaps one call of :func:`gaps_of` finds (on one event loop)."""


def gaps_of(factories: FactorySource, items: Sequence[GapItem]) -> list[float]:
    """The optimality gap of each negotiation of ``items`` (module level, so that a worker can run it)."""
    market = Marketplace(factories)

    async def gaps() -> list[float]:
        out = []
        for job, sent in items:
            result = sent if isinstance(sent, NegotiationResult) else unpack_result(sent)
            score = result.outcome.seller_utility
            value = await best_response_value(job.scenario, market.factory(job.buyer), job.seed, result.turns, score)
            out.append(value - score)
        return out

    return asyncio.run(gaps())


def optimality_gaps(
    directory: Path,
    negotiations: pl.DataFrame,
    jobs: dict[str, PlannedJob],
    factories: FactorySource,
    pool: WorkerPool | None = None,
):
    """Gaps for every negotiation with a rule-based buyer, cached in ``gaps.parquet`` by negotiation id and attempt
    (a negotiation's id fixes its scenario, specs and seed, so its gap never changes); found on ``pool``'s workers
    when given."""
    cache_path = directory / "gaps.parquet"
    schema = {"negotiation_id": pl.String, "attempt": pl.Int32, "gap": pl.Float64}
    cache = pl.read_parquet(cache_path) if cache_path.exists() else pl.DataFrame(schema=schema)
    known = {(n, a): g for n, a, g in cache.iter_rows()}
    todo = negotiations.filter(
        ~pl.struct("negotiation_id", "attempt").map_elements(
            lambda r: (r["negotiation_id"], r["attempt"]) in known, return_dtype=pl.Boolean
        )
    )
    if todo.height:
        ids = todo["negotiation_id"]
        turns = read_turns(directory / "transcripts", latest=True).filter(pl.col("negotiation_id").is_in(ids))
        fresh = _gaps(todo, turns, jobs, factories, pool)
        attempts = dict(todo.select("negotiation_id", "attempt").iter_rows())
        for nid in todo["negotiation_id"]:
            known[(nid, attempts[nid])] = fresh.get(nid)
        rows = [(n, a, g) for (n, a), g in known.items()]
        tmp = cache_path.with_suffix(".tmp")
        pl.DataFrame(rows, schema=schema, orient="row").write_parquet(tmp)
        os.replace(tmp, cache_path)
    return {n: known[(n, a)] for n, a in negotiations.select("negotiation_id", "attempt").iter_rows()}


def metrics_table(
    config: EvalConfig,
    suite: Suite,
    jobs: Sequence[PlannedJob],
    factories: FactorySource,
    pool: WorkerPool | None = None,
):
    """Metrics of the latest attempt of every planned job, with pairing keys (written to metrics.parquet)."""
    by_id = {p.job.negotiation_id: p for p in jobs}
    ids = pl.Series(list(by_id), dtype=pl.String)
    tdir = config.out / "transcripts"
    negotiations = read_negotiations(tdir, latest=True).filter(pl.col("negotiation_id").is_in(ids))
    missing = len(by_id) - negotiations.height
    if missing:
        raise RuntimeError(f"{missing} planned negotiation(s) have no transcript in {tdir}: rerun to finish them")
    gaps = optimality_gaps(config.out, negotiations, by_id, factories, pool) if config.optimality_gap else {}
    metrics = compute_metrics(negotiations, suite.variants(), gaps)
    extra = pl.DataFrame(
        {
            "negotiation_id": list(by_id),
            "key": [p.key for p in by_id.values()],
            "diagnostic": [p.diagnostic for p in by_id.values()],
        }
    )
    metrics = metrics.join(extra, on="negotiation_id", how="left").sort("diagnostic", "arm", "key")
    metrics.write_parquet(config.out / "metrics.parquet")
    return metrics


def _groups(metrics: pl.DataFrame) -> list[tuple[str, pl.DataFrame]]:
    suite_rows = metrics.filter(~pl.col("diagnostic"))
    groups = [(SUITE_GROUP, suite_rows)]
    for buyer in metrics["buyer"].unique(maintain_order=True):
        groups.append((buyer, metrics.filter(pl.col("buyer") == buyer)))
    return groups


def _arm_row(group: str, arm: str, frame: pl.DataFrame, mine: pl.DataFrame, resamples: int, seed: int) -> dict:
    ci = bootstrap_interval(mine["score"], mine["scenario_id"], resamples=resamples, seed=seed)
    return {
        "group": group,
        "arm": arm,
        "n": ci.n,
        "clusters": ci.clusters,
        "errors": frame.filter(pl.col("arm") == arm)["error"].sum(),
        "score": ci.mean,
        "score_low": ci.low,
        "score_high": ci.high,
        "deal_rate": mine.select(deal_rate_expr(column="deal")).item(),
    }


def _gain_columns(c: PairedComparison | None, pairs: int) -> dict:
    return {
        "gain": None if c is None else c.gain.mean,
        "gain_low": None if c is None else c.gain.low,
        "gain_high": None if c is None else c.gain.high,
        "pairs": pairs,
        "p_value": None if c is None else c.p_value,
        "p_holm": None if c is None else c.p_holm,
    }


def compare(metrics: pl.DataFrame, arms: Sequence[str], *, resamples: int, seed: int) -> pl.DataFrame:
    """Per buyer group (the pooled suite, then each buyer): each arm's score interval and deal rate, and each later
    arm's paired gain over the first with its interval, sign-flip p-value and Holm-adjusted p (across arms within
    the group). Negotiations that ended in an error are left out of every pair and counted; an arm with no pair
    left gets no gain (and takes no part in the Holm correction)."""
    rows = []
    for group, frame in _groups(metrics):
        ok = frame.filter(~pl.col("error"))
        base = ok.filter(pl.col("arm") == arms[0]).select("key", "scenario_id", pl.col("score").alias("base"))
        arm_rows, tests = [], {}
        for arm in arms:
            mine = ok.filter(pl.col("arm") == arm)
            if mine.is_empty():
                continue
            row = _arm_row(group, arm, frame, mine, resamples, seed)
            pairs = base.join(mine.select("key", "score"), on="key", how="inner")
            row["pairs"] = None if arm == arms[0] else pairs.height
            if arm != arms[0] and pairs.height:
                tests[arm] = paired_comparison(
                    pairs["base"], pairs["score"], pairs["scenario_id"], resamples=resamples, seed=seed
                )
            arm_rows.append(row)
        adjusted = dict(zip(tests, with_holm(list(tests.values())), strict=True))
        for row in arm_rows:
            rows.append(row | _gain_columns(adjusted.get(row["arm"]), row["pairs"]))
    return pl.DataFrame(rows, infer_schema_length=None)


VERSUS_COLUMNS = ("best_rule", "vs_best", "vs_best_low", "vs_best_high", "vs_best_pairs")
REFERENCE_KIND = "reference"
ARM_KIND = "arm"


def references_to_play(arms: Sequence[str], baselines: Sequence[str], factories: FactorySource) -> tuple[str, ...]:
    """The seller spec each baseline is played as: the arm's own spec when the baseline is one of the arms (by
    literal spec, or the same rule seller under another name, ``boulware`` and ``timedep:e=0.2``), so that it is not
    played twice; otherwise the baseline spec itself, which labels its negotiations in the transcripts."""
    from nego.agents.registry import rule_family

    def canonical(spec: str) -> str:
        return getattr(factories(spec), "spec", spec) if rule_family(spec) is not None else spec

    by_canonical = {canonical(arm): arm for arm in arms}
    out: list[str] = []
    for spec in baselines:
        played = spec if spec in arms else by_canonical.get(canonical(spec), spec)
        if played not in out:
            out.append(played)
    return tuple(out)


def _best_references(references: pl.DataFrame) -> dict[str, str]:
    """Per buyer group (not the pooled suite), the reference with the highest mean score; the first listed on a tie."""
    best: dict[str, tuple[str, float]] = {}
    for r in references.filter(pl.col("group") != SUITE_GROUP).iter_rows(named=True):
        if r["score"] is not None and (r["group"] not in best or r["score"] > best[r["group"]][1]):
            best[r["group"]] = (r["arm"], r["score"])
    return {group: arm for group, (arm, _) in best.items()}


def _versus_best(ok: pl.DataFrame, arm: str, best: str | None, resamples: int, seed: int) -> dict:
    """The paired difference arm - best reference over the negotiations both finished without an error."""
    none = {"best_rule": best, "vs_best": None, "vs_best_low": None, "vs_best_high": None, "vs_best_pairs": 0}
    if best is None:
        return none | {"vs_best_pairs": None}
    ref = ok.filter(pl.col("arm") == best).select("key", "scenario_id", pl.col("score").alias("best"))
    pairs = ref.join(ok.filter(pl.col("arm") == arm).select("key", "score"), on="key", how="inner")
    if pairs.is_empty():
        return none
    c = paired_comparison(pairs["best"], pairs["score"], pairs["scenario_id"], resamples=resamples, seed=seed)
    return none | {
        "vs_best": c.gain.mean,
        "vs_best_low": c.gain.low,
        "vs_best_high": c.gain.high,
        "vs_best_pairs": pairs.height,
    }


def with_references(
    comparisons: pl.DataFrame, metrics: pl.DataFrame, references: Sequence[str], *, resamples: int, seed: int
) -> pl.DataFrame:
    """``comparisons`` (the arms' rows from :func:`compare`, ``kind`` "arm") with the reference block after them in
    each buyer group: a row per reference seller that is not an arm (``kind`` "reference": the numbers
    :func:`compare` gives it as an arm of its own; no gain, no part in the arms' Holm correction). ``reference``
    marks every reference seller's row, an arm's too, so that each seller keeps one row per group. On each arm row
    of a buyer (not the pooled suite): the best reference against that buyer (``best_rule``: highest mean score)
    and the paired difference arm - best (``vs_best`` with its interval, on ``vs_best_pairs`` pairs); on every row
    the mean optimality gap. Without references, ``comparisons`` as it is."""
    if not references:
        return comparisons
    refs = pl.concat(
        [compare(metrics, (ref,), resamples=resamples, seed=seed) for ref in references], how="diagonal_relaxed"
    )
    best = _best_references(refs) if not refs.is_empty() else {}
    arms = set(comparisons["arm"]) if not comparisons.is_empty() else set()
    rows = []
    for group, frame in _groups(metrics):
        ok = frame.filter(~pl.col("error"))
        gaps = dict(ok.group_by("arm").agg(pl.col("optimality_gap").mean()).iter_rows())
        mine = comparisons.filter(pl.col("group") == group) if arms else comparisons
        for r in mine.iter_rows(named=True):
            versus = _versus_best(ok, r["arm"], best.get(group), resamples, seed)
            marks = {"kind": ARM_KIND, "reference": r["arm"] in references, "optimality_gap": gaps.get(r["arm"])}
            rows.append(r | marks | versus)
        theirs = refs.filter((pl.col("group") == group) & ~pl.col("arm").is_in(arms)) if not refs.is_empty() else refs
        for r in theirs.iter_rows(named=True):
            marks = {"kind": REFERENCE_KIND, "reference": True, "optimality_gap": gaps.get(r["arm"])}
            rows.append(r | marks | dict.fromkeys(VERSUS_COLUMNS))
    return pl.DataFrame(rows, infer_schema_length=None)


@dataclass(frozen=True, slots=True)
class EvalResult:
    """What an evaluation produced: the suite, per-negotiation metrics and the comparison table."""

    suite: Suite
    metrics: pl.DataFrame
    comparisons: pl.DataFrame
    played: int
    trained_against_held_out: dict[str, list[str]] = field(default_factory=dict)
    """Arms that are registered models trained against a family this evaluation holds out (see ``leakage``)."""
    references: tuple[str, ...] = ()
    """The specs played as reference sellers (an arm's own spec where a baseline is one of the arms)."""


def summarize(
    config: EvalConfig, run: RunPlan, factories: FactorySource, played: int, pool: WorkerPool | None = None
) -> EvalResult:
    """Metrics and comparisons of a run whose transcripts in ``config.out`` hold every planned negotiation, written
    there (``metrics.parquet``, ``gaps.parquet``, ``comparisons.parquet``; the caller holds the directory).
    ``played`` is what the result reports as played now; ``pool``'s workers find the optimality gaps."""
    metrics = metrics_table(config, run.suite, run.jobs, factories, pool)
    comparisons = compare(metrics, config.sellers, resamples=config.resamples, seed=config.seed)
    comparisons = with_references(comparisons, metrics, run.references, resamples=config.resamples, seed=config.seed)
    comparisons.write_parquet(config.out / "comparisons.parquet")
    return EvalResult(run.suite, metrics, comparisons, played, run.overlap, run.references)


def warn_of_errors(result: EvalResult) -> None:
    """Log how many negotiations ended in an error (left out of the comparisons), if any did."""
    errors = int(result.metrics["error"].sum())
    if errors:
        logger.warning(
            "%d negotiation(s) ended in an error and are left out of the comparisons; rerun to retry", errors
        )


def evaluate(config: EvalConfig, factories: FactorySource | None = None) -> EvalResult:
    """Run (or resume) an evaluation and write its metrics and comparisons into ``config.out``."""
    if factories is None:
        from nego.agents.registry import resolve

        factories = resolve
    run = plan_run(config, factories)
    with exclusive_run(config.out, f"nego eval --out {config.out}"):
        write_manifest(config, run)
        # one pool for the run: it plays the negotiations, then finds their optimality gaps
        with worker_pool(config, factories) as pool:
            played = asyncio.run(play(config, factories, run.jobs, pool))
            result = summarize(config, run, factories, played, pool)
    warn_of_errors(result)
    return result
