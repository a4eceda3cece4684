"""A Markdown report with PNG plots for an evaluation run directory (matplotlib is imported only here, lazily)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import polars as pl
from nego.market.transcripts import read_turns
from nego.scenarios.scenario import Role

from .leakage import warning_lines
from .metrics import METRIC_COLUMNS, summarise
from .runner import SUITE_GROUP, read_manifest
from .suites import load_suite

PLOTS = ("score_per_arm.png", "gain_per_buyer.png", "deal_vs_score.png", "concession_curves.png")


@dataclass(frozen=True, slots=True)
class RunTables:
    """Everything a report reads from a run directory."""

    directory: Path
    manifest: dict
    metrics: pl.DataFrame
    comparisons: pl.DataFrame


def load_run(directory: Path) -> RunTables:
    directory = Path(directory)
    manifest = read_manifest(directory)
    for name in ("metrics.parquet", "comparisons.parquet"):
        if not (directory / name).is_file():
            raise FileNotFoundError(f"{directory / name} is missing: rerun `nego eval` with the same --out to finish")
    return RunTables(
        directory,
        manifest,
        pl.read_parquet(directory / "metrics.parquet"),
        pl.read_parquet(directory / "comparisons.parquet"),
    )


def pyplot():
    try:
        import matplotlib
    except ModuleNotFoundError as e:
        raise RuntimeError("plots need matplotlib: pip install 'nego[report]'") from e
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def format_interval(mean, low, high, signed: bool = False) -> str:
    if mean is None:
        return ""
    sign = "+" if signed else ""
    return f"{mean:{sign}.3f} [{low:{sign}.3f}, {high:{sign}.3f}]"


def format_p(p) -> str:
    return "" if p is None else (f"{p:.4f}" if p >= 1e-4 else f"{p:.1e}")


def _groups(comparisons: pl.DataFrame) -> list[str]:
    return comparisons["group"].unique(maintain_order=True).to_list()


def _plot_scores(plt, run: RunTables, path: Path) -> None:
    """Arms as circles in the C0, C1, ... colours; reference sellers as grey diamonds beside them."""
    c = run.comparisons
    groups, arms = _groups(c), run.manifest["sellers"]
    references = [r for r in run.manifest.get("baselines") or [] if r not in arms]
    sellers = [*arms, *references]
    fig, ax = plt.subplots(figsize=(1.6 + (1.4 + 0.15 * len(references)) * len(groups), 3.6))
    width = 0.8 / max(1, len(sellers))
    for k, seller in enumerate(sellers):
        rows = c.filter(pl.col("arm") == seller)  # one row per group: a reference that is an arm is shown as the arm
        xs = [groups.index(g) + (k - (len(sellers) - 1) / 2) * width for g in rows["group"]]
        err = [rows["score"] - rows["score_low"], rows["score_high"] - rows["score"]]
        if seller in references:
            shade = str(0.15 + 0.5 * references.index(seller) / max(1, len(references)))
            ax.errorbar(xs, rows["score"], yerr=err, fmt="D", ms=4, capsize=2, color=shade, label=f"{seller} (ref)")
        else:
            ax.errorbar(xs, rows["score"], yerr=err, fmt="o", capsize=3, color=f"C{k}", label=seller)
    ax.set_xticks(range(len(groups)), groups)
    ax.set_ylabel("seller score (mean utility)")
    ax.set_title("Score per seller and buyer, 95% cluster-bootstrap interval")
    ax.legend(fontsize=7 if references else 8, ncol=2 if len(sellers) > 4 else 1)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _plot_gains(plt, run: RunTables, path: Path) -> None:
    c = run.comparisons.filter(pl.col("gain").is_not_null())
    groups = _groups(run.comparisons)
    arms = run.manifest["sellers"][1:]
    fig, ax = plt.subplots(figsize=(1.6 + 1.4 * len(groups), 3.6))
    ax.axhline(0.0, color="grey", lw=0.8)
    width = 0.8 / max(1, len(arms))
    for k, arm in enumerate(arms):
        rows = c.filter(pl.col("arm") == arm)
        xs = [groups.index(g) + (k - (len(arms) - 1) / 2) * width for g in rows["group"]]
        err = [rows["gain"] - rows["gain_low"], rows["gain_high"] - rows["gain"]]
        ax.errorbar(xs, rows["gain"], yerr=err, fmt="s", capsize=3, label=f"{arm} - {run.manifest['sellers'][0]}")
    ax.set_xticks(range(len(groups)), groups)
    ax.set_ylabel("paired gain over base")
    ax.set_title("Gain per buyer, 95% cluster-bootstrap interval")
    if arms:
        ax.legend(fontsize=8)
    else:
        ax.text(0.5, 0.5, "one arm only: no gains", transform=ax.transAxes, ha="center")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _plot_deal_vs_score(plt, run: RunTables, path: Path) -> None:
    c = run.comparisons.filter(pl.col("group") != SUITE_GROUP)
    fig, ax = plt.subplots(figsize=(5.2, 4))
    markers = "osD^v<>p*h"
    buyers = c["group"].unique(maintain_order=True).to_list()
    for k, arm in enumerate(run.manifest["sellers"]):
        rows = c.filter(pl.col("arm") == arm)
        for r in rows.iter_rows(named=True):
            ax.scatter(
                r["deal_rate"], r["score"], marker=markers[buyers.index(r["group"]) % len(markers)], color=f"C{k}"
            )
        ax.scatter([], [], color=f"C{k}", label=arm)
    for j, b in enumerate(buyers):
        ax.scatter([], [], color="grey", marker=markers[j % len(markers)], label=f"vs {b}")
    ax.set_xlabel("deal rate")
    ax.set_ylabel("seller score")
    ax.set_title("Deal rate against score (per arm and buyer)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def concession_table(run: RunTables, per_arm: int = 3) -> pl.DataFrame:
    """Seller offers of a sample of suite negotiations, one row per (offer, issue): the seller's own normalised
    value of that issue in that offer, by round. The sample takes the same suite keys for every arm (arms only, not
    the reference sellers)."""
    suite = load_suite(run.manifest["suite_source"])
    variants = suite.variants()
    m = run.metrics.filter(~pl.col("diagnostic") & pl.col("arm").is_in(run.manifest["sellers"]))
    keys = m["key"].unique(maintain_order=True).to_list()[:: max(1, m["key"].n_unique() // per_arm)][:per_arm]
    sample = m.filter(pl.col("key").is_in(keys)).select("negotiation_id", "arm", "key", "scenario_hash")
    turns = read_turns(run.directory / "transcripts", latest=True)
    turns = turns.filter(
        pl.col("negotiation_id").is_in(sample["negotiation_id"])
        & (pl.col("role") == Role.SELLER.value)
        & pl.col("valid")
        & pl.col("offer").is_not_null()
    ).join(sample, on="negotiation_id")
    rows = []
    for t in turns.iter_rows(named=True):
        scenario = variants[t["scenario_hash"]]
        offer = json.loads(t["offer"])
        for k, issue in enumerate(scenario.issues):
            value = scenario.seller.values[issue.name](issue, offer[issue.name])
            rows.append((t["arm"], t["key"], t["round"], k, issue.name, float(value)))
    schema = {
        "arm": pl.String,
        "key": pl.String,
        "round": pl.Int32,
        "issue_index": pl.Int32,
        "issue": pl.String,
        "seller_value": pl.Float64,
    }
    return pl.DataFrame(rows, schema=schema, orient="row")


def _plot_concessions(plt, run: RunTables, path: Path) -> None:
    table = concession_table(run)
    arms = run.manifest["sellers"]
    keys = table["key"].unique(maintain_order=True).to_list() or ["(no offers)"]
    fig, axes = plt.subplots(len(keys), len(arms), figsize=(3.2 * len(arms), 2.4 * len(keys)), squeeze=False)
    for i, key in enumerate(keys):
        for j, arm in enumerate(arms):
            ax = axes[i][j]
            part = table.filter((pl.col("key") == key) & (pl.col("arm") == arm))
            for issue in part["issue"].unique(maintain_order=True):
                line = part.filter(pl.col("issue") == issue).sort("round")
                ax.plot(line["round"], line["seller_value"], marker=".", label=issue)
            ax.set_ylim(-0.05, 1.05)
            ax.set_title(f"{arm}\n{key}", fontsize=7)
            if part.height:
                ax.legend(fontsize=6)
            if j == 0:
                ax.set_ylabel("seller's value per issue")
            if i == len(keys) - 1:
                ax.set_xlabel("round")
    fig.suptitle("Concession curves: the seller's own value of each issue in its offers")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def comparison_markdown(comparisons: pl.DataFrame, base: str) -> list[str]:
    """One Markdown table per buyer group: score, deal rate and the paired gain over ``base``; with reference
    sellers, each arm's mean optimality gap and paired difference from the best reference against that buyer, and
    the reference block (score, deal rate, gap) after the arms."""
    referenced = "kind" in comparisons.columns
    lines = []
    for group in _groups(comparisons):
        rows = comparisons.filter(pl.col("group") == group)
        title = "All held-out buyers (the suite)" if group == SUITE_GROUP else f"Buyer: `{group}`"
        lines += [f"### {title}", ""]
        head = f"| arm | n | scenarios | score [95% CI] | deal rate | gain vs `{base}` [95% CI] | p | p (Holm) |"
        rule = "| --- | ---: | ---: | --- | ---: | --- | ---: | ---: |"
        if referenced:
            head += " optimality gap | vs best rule seller [95% CI] | best rule seller |"
            rule += " ---: | --- | --- |"
            rows = rows.filter(pl.col("kind") == "arm")
        lines += [head, rule]
        for r in rows.iter_rows(named=True):
            line = (
                f"| `{r['arm']}` | {r['n']} | {r['clusters']} "
                f"| {format_interval(r['score'], r['score_low'], r['score_high'])} "
                f"| {r['deal_rate']:.3f} | {format_interval(r['gain'], r['gain_low'], r['gain_high'], signed=True)} "
                f"| {format_p(r['p_value'])} | {format_p(r['p_holm'])} |"
            )
            if referenced:
                best = f"`{r['best_rule']}`" if r["best_rule"] else ""
                line += (
                    f" {_number(r['optimality_gap'])} "
                    f"| {format_interval(r['vs_best'], r['vs_best_low'], r['vs_best_high'], signed=True)} | {best} |"
                )
            lines.append(line)
        lines.append("")
        if referenced:
            lines += _reference_markdown(comparisons.filter((pl.col("group") == group) & pl.col("reference")))
    return lines


def _reference_markdown(rows: pl.DataFrame) -> list[str]:
    """The reference sellers of one buyer group (an arm that is one of them too)."""
    lines = ["Reference sellers on the same negotiations:", ""]
    lines += ["| reference | n | score [95% CI] | deal rate | optimality gap |", "| --- | ---: | --- | ---: | ---: |"]
    for r in rows.iter_rows(named=True):
        name = f"`{r['arm']}`" + (" (arm)" if r["kind"] == "arm" else "")
        lines.append(
            f"| {name} | {r['n']} | {format_interval(r['score'], r['score_low'], r['score_high'])} "
            f"| {r['deal_rate']:.3f} | {_number(r['optimality_gap'])} |"
        )
    return [*lines, ""]


def _number(value: float | None) -> str:
    return "" if value is None else f"{value:.3f}"


def _metrics_markdown(metrics: pl.DataFrame) -> list[str]:
    table = summarise(metrics)
    head = "| arm | buyer | n | " + " | ".join(METRIC_COLUMNS) + " | errors |"
    lines = [head, "|" + " --- |" * 2 + " ---: |" * (len(METRIC_COLUMNS) + 2)]
    for r in table.iter_rows(named=True):
        cells = ["" if r[c] is None else f"{r[c]:.3f}" if c != "tokens" else f"{r[c]:.0f}" for c in METRIC_COLUMNS]
        lines.append(f"| `{r['arm']}` | `{r['buyer']}` | {r['n']} | " + " | ".join(cells) + f" | {r['errors']} |")
    return lines


def write_report(directory: Path) -> Path:
    """Write ``report.md`` and the PNG plots into ``directory``; returns the report path."""
    run = load_run(Path(directory))
    man = run.manifest
    plt = pyplot()
    for name, draw in zip(PLOTS, (_plot_scores, _plot_gains, _plot_deal_vs_score, _plot_concessions), strict=True):
        draw(plt, run, run.directory / name)
    suite_rows = run.metrics.filter(~pl.col("diagnostic"))
    per_arm = suite_rows.filter(pl.col("arm") == man["sellers"][0])
    diag = f"; diagnostic buyer `{man['diagnostic']}` on extra negotiations" if man.get("diagnostic") else ""
    lines = [
        f"# Evaluation report: {', '.join(f'`{s}`' for s in man['sellers'])}",
        "",
        f"- suite **{man['suite']}**, content hash `{man['suite_hash']}`",
        f"- n = {per_arm.height} negotiations per arm over {per_arm['scenario_id'].n_unique()} scenarios "
        f"(clusters); held-out buyers {', '.join(f'`{b}`' for b in man['buyers'])}{diag}",
        f"- base arm: `{man['sellers'][0]}`; gains are paired differences (arm - base) on identical negotiations",
        *_reference_line(man.get("baselines") or []),
        *_play_line(man.get("play") or {}),
        *(f"- **not held out:** {line}" for line in warning_lines(man.get("trained_against_held_out") or {})),
        "",
        "Intervals are 95% percentile intervals of a cluster bootstrap "
        f"({man['resamples']:,} resamples, seed {man['seed']}) that resamples whole scenarios, so the openers, "
        "seeds and buyers of one scenario are never treated as independent. p-values come from a paired sign-flip "
        "permutation test over scenarios (exact up to 12 scenarios); Holm corrects across arms within each buyer "
        "group. No normal approximation is used. Negotiations that ended in an error are left out and counted.",
        "",
        "## Scores and gains",
        "",
        *comparison_markdown(run.comparisons, man["sellers"][0]),
        "![score per arm](score_per_arm.png)",
        "",
        "![gain per buyer](gain_per_buyer.png)",
        "",
        "![deal rate against score](deal_vs_score.png)",
        "",
        "## All metrics (means per arm and buyer)",
        "",
        *_metrics_markdown(run.metrics),
        "",
        "Definitions: see `nego.evaluation.metrics`. The optimality gap replays rule-based buyers exactly "
        "(`nego.evaluation.best_response`) and is empty for model buyers.",
        "",
        "## Concession curves (a sample of negotiations)",
        "",
        "![concession curves](concession_curves.png)",
        "",
    ]
    path = run.directory / "report.md"
    path.write_text("\n".join(lines))
    return path


def _reference_line(references: list[str]) -> list[str]:
    if not references:
        return []
    return [
        f"- reference sellers {', '.join(f'`{r}`' for r in references)} on the same negotiations (not arms: no gain "
        "over base, no part in the Holm correction); each arm is shown against the best of them per buyer "
        "(highest mean score), as a paired difference on the negotiations both played"
    ]


def _play_line(play: dict) -> list[str]:
    """How model agents were played, when the run recorded it (temperature None: each model's own default)."""
    if not play:
        return []
    shown = ", ".join(f"{k} `{v}`" for k, v in play.items() if v is not None)
    return [f"- model agents played with {shown or 'their defaults'} (unset: each backend's default)"]
