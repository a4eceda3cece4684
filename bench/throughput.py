"""Negotiation throughput: nego's protocol and rule-based agents against NegMAS on the same workload.

Workload: four issues (price: 20 values over 50..150, quantity 1..10, delivery days, warranty months), opposing
linear-additive utilities with fresh random weights per negotiation (drawn from the negotiation's seed, so both
engines see identical scenarios), reservation 0.3, 20 rounds, a Boulware seller (e=0.2) opening against a
Conceder buyer (e=2). ``--space small`` has 6,000 outcomes (delivery {1,7,13,19,25,30}, warranty
{0,6,12,18,24}); ``--space full`` has 150,000 (delivery 1..30, warranty 0..24).

nego plays through ``run_negotiation`` with agents from the registry (``timedep:e=...,clock=negmas``: the same
time-dependent strategy with NegMAS's relative time t = round / (rounds + 1)); NegMAS plays its
``AspirationNegotiator`` (exponent 1/e, tolerance 1e-9) in ``SAOMechanism``. Each engine runs in its own
subprocess (NegMAS from its own virtualenv); speed is negotiations per CPU-second (``time.process_time``), with the
imports and the draw of the weights timed apart. The machine's speed drifts, so the engines take turns over
``--rounds`` short rounds (10 on the small space: nego plays its 2,000 negotiations, NegMAS the next 100 of its
own; the one going first alternates) and each engine's rate pools its rounds; the report gives the per-round
ratios' median and range too. Each engine process plays one negotiation untimed before the timed ones. The
virtualenv, once: ``python3.11 -m venv bench/.venv-negmas && bench/.venv-negmas/bin/pip install negmas==0.16.0``.

    python bench/throughput.py                       # both engines, both spaces, prints a report
    python bench/throughput.py --engine nego --space small -n 2000    # one engine, JSON lines on stdout
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
NEGMAS_PY = HERE / ".venv-negmas" / "bin" / "python"
NEGO_PY = HERE.parent / ".venv" / "bin" / "python"
ROUNDS, RESERVATION, E_SELLER, E_BUYER = 20, 0.3, 0.2, 2.0
PRICES = [round(50 + 100 * i / 19, 10) for i in range(20)]
SPACES = {
    "small": {"delivery": [1, 7, 13, 19, 25, 30], "warranty": [0, 6, 12, 18, 24]},
    "full": {"delivery": list(range(1, 31)), "warranty": list(range(25))},
}
# seller's direction per issue (the buyer's is the opposite): +1 prefers high values, -1 low ones
SELLER_DIRECTION = {"price": 1, "quantity": 1, "delivery": 1, "warranty": -1}


def grids(space: str) -> dict[str, list]:
    return {"price": PRICES, "quantity": list(range(1, 11)), **SPACES[space]}


def linear_values(values: list, direction: int) -> list[float]:
    lo, hi = min(values), max(values)
    return [((v - lo) / (hi - lo)) if direction > 0 else ((hi - v) / (hi - lo)) for v in values]


def weights(k: int) -> tuple[dict[str, float], dict[str, float]]:
    """Seller and buyer weights of negotiation ``k`` (identical in both engines)."""
    rng = np.random.default_rng(1000 + k)
    names = list(SELLER_DIRECTION)
    ws, wb = rng.dirichlet(np.ones(4)), rng.dirichlet(np.ones(4))
    return dict(zip(names, map(float, ws), strict=True)), dict(zip(names, map(float, wb), strict=True))


def run_nego(space: str, ks: range, draws: list[tuple[dict[str, float], dict[str, float]]]) -> list[dict]:
    import asyncio

    from nego.agents.registry import resolve
    from nego.market.protocol import run_negotiation
    from nego.scenarios.issues import Issue, IssueKind
    from nego.scenarios.preferences import Preferences, ValueFunction
    from nego.scenarios.scenario import Scenario

    g = grids(space)
    step = 1 if space == "full" else None
    issues = (
        Issue("price", IssueKind.FLOAT, low=50.0, high=150.0, step=100 / 19),
        Issue("quantity", IssueKind.INT, low=1, high=10),
        Issue("delivery", IssueKind.INT, low=1, high=30)
        if step
        else Issue("delivery", IssueKind.CATEGORICAL, options=tuple(map(str, g["delivery"]))),
        Issue("warranty", IssueKind.INT, low=0, high=24, step=1 if step else 6),
    )
    assert [i.grid() for i in issues][:2] == [tuple(PRICES), tuple(g["quantity"])]

    def value_fns(sign: int) -> dict[str, ValueFunction]:
        fns = {}
        for name, d in SELLER_DIRECTION.items():
            d *= sign
            if name == "delivery" and not step:
                vals = linear_values(g["delivery"], d)
                fns[name] = ValueFunction.options(dict(zip(map(str, g["delivery"]), vals, strict=True)))
            else:
                fns[name] = ValueFunction.increasing() if d > 0 else ValueFunction.decreasing()
        return fns

    seller_fns, buyer_fns = value_fns(1), value_fns(-1)
    seller_f, buyer_f = resolve(f"timedep:e={E_SELLER},clock=negmas"), resolve(f"timedep:e={E_BUYER},clock=negmas")

    async def main() -> list[dict]:
        rows = []
        for k, (ws, wb) in zip(ks, draws, strict=True):
            sc = Scenario(
                f"bench-{k}",
                "widgets",
                "",
                issues,
                Preferences(ws, seller_fns, RESERVATION),
                Preferences(wb, buyer_fns, RESERVATION),
                max_rounds=ROUNDS,
            )
            r = await run_negotiation(sc, seller_f("seller", k), buyer_f("buyer", k), seed=k)
            o = r.outcome
            rows.append({"agreed": o.agreed, "us": o.seller_utility, "ub": o.buyer_utility, "rounds": o.rounds})
        return rows

    return asyncio.run(main())


def run_negmas(space: str, ks: range, draws: list[tuple[dict[str, float], dict[str, float]]]) -> list[dict]:
    from negmas import AspirationNegotiator, SAOMechanism, make_issue
    from negmas.outcomes import make_os
    from negmas.preferences import LinearAdditiveUtilityFunction
    from negmas.preferences.value_fun import TableFun

    g = grids(space)
    names = list(SELLER_DIRECTION)
    issues = [make_issue(values=g[name], name=name) for name in names]
    os_ = make_os(issues)
    tables = {
        sign: {
            name: TableFun(dict(zip(g[name], linear_values(g[name], d * sign), strict=True)))
            for name, d in SELLER_DIRECTION.items()
        }
        for sign in (1, -1)
    }
    rows = []
    for ws, wb in draws:
        m = SAOMechanism(outcome_space=os_, n_steps=ROUNDS)
        us = LinearAdditiveUtilityFunction(values=tables[1], weights=ws, outcome_space=os_, reserved_value=RESERVATION)
        ub = LinearAdditiveUtilityFunction(values=tables[-1], weights=wb, outcome_space=os_, reserved_value=RESERVATION)
        m.add(AspirationNegotiator(aspiration_type=1 / E_SELLER, tolerance=1e-9, name="seller"), ufun=us)
        m.add(AspirationNegotiator(aspiration_type=1 / E_BUYER, tolerance=1e-9, name="buyer"), ufun=ub)
        state = m.run()
        agreed = state.agreement is not None
        rows.append(
            {
                "agreed": agreed,
                "us": float(us(state.agreement)) if agreed else RESERVATION,
                "ub": float(ub(state.agreement)) if agreed else RESERVATION,
                "rounds": state.step,
            }
        )
    return rows


ENGINE_MODULES = {
    "nego": ("nego.agents.registry", "nego.market.protocol", "nego.scenarios.scenario"),
    "negmas": ("negmas", "negmas.outcomes", "negmas.preferences", "negmas.preferences.value_fun"),
}


def engine_main(engine: str, space: str, n: int, start: int = 0) -> None:
    """Import the engine, draw the workload's weights and play the first negotiation once (all timed apart), then
    play and time the negotiations, scenario and utility-function construction included."""
    import importlib

    t0 = time.process_time()
    for module in ENGINE_MODULES[engine]:
        importlib.import_module(module)
    ks = range(start, start + n)
    draws = [weights(k) for k in ks]
    play = run_nego if engine == "nego" else run_negmas
    play(space, ks[:1], draws[:1])  # a first negotiation, untimed: what either engine sets up on first use
    t1 = time.process_time()
    rows = play(space, ks, draws)
    cpu = time.process_time() - t1
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    result = {"engine": engine, "space": space, "n": n, "cpu_s": cpu, "import_s": t1 - t0, "rss_mb": rss_mb}
    print(json.dumps({**result, "rows": rows}))


def spawn(engine: str, space: str, n: int, start: int = 0) -> dict:
    py = NEGMAS_PY if engine == "negmas" else NEGO_PY
    env = dict(os.environ, PYTHONPATH="" if engine == "negmas" else os.environ.get("PYTHONPATH", ""))
    out = subprocess.run(
        [str(py), __file__, "--engine", engine, "--space", space, "-n", str(n), "--start", str(start)],
        capture_output=True,
        text=True,
        env=env,
        check=False,
        cwd=HERE if engine == "negmas" else HERE.parent,
    )
    if out.returncode != 0:
        raise SystemExit(f"{engine} run failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def summarise(res: dict) -> dict:
    from nego.market.rates import deal_rate

    rows = res["rows"]
    return {
        "rate": res["n"] / res["cpu_s"],
        "agree": deal_rate(sum(r["agreed"] for r in rows), len(rows)),
        "us": float(np.mean([r["us"] for r in rows])),
        "ub": float(np.mean([r["ub"] for r in rows])),
        "rss": res["rss_mb"],
    }


def rate_line(engine: str, n: int, s: dict) -> str:
    return (
        f"  {engine:6s} {n:5d} negs  {s['rate']:9.1f} negs/CPU-s  agree {s['agree']:.3f}  "
        f"seller {s['us']:.4f}  buyer {s['ub']:.4f}  peak RSS {s['rss']:.0f} MB"
    )


def compare(space: str, n_nego: int, n_negmas: int, rounds: int) -> list[str]:
    """``rounds`` short rounds of both engines in turn (the one going first alternates), so that both sample the
    machine over the same stretch of time: nego plays negotiations 0..n_nego-1 each round, NegMAS the next
    ``n_negmas`` of its own each round. Rates pool each engine's negotiations and CPU time over the rounds."""
    lines = [f"[{space}: {len(grids(space)['delivery']) * len(grids(space)['warranty']) * 200:,} outcomes]"]
    if not NEGMAS_PY.exists():
        nego = spawn("nego", space, n_nego)
        lines.append(rate_line("nego", n_nego, summarise(nego)))
        lines.append(f"  negmas not installed at {NEGMAS_PY}: nego figures only")
        return lines
    runs: dict[str, list[dict]] = {"nego": [], "negmas": []}
    for r in range(rounds):
        order = ("nego", "negmas") if r % 2 == 0 else ("negmas", "nego")
        for engine in order:
            start = 0 if engine == "nego" else r * n_negmas
            runs[engine].append(spawn(engine, space, n_nego if engine == "nego" else n_negmas, start))
    ratios = [a["n"] / a["cpu_s"] / (b["n"] / b["cpu_s"]) for a, b in zip(runs["nego"], runs["negmas"], strict=True)]
    pooled = {engine: pool(res) for engine, res in runs.items()}
    s, t = summarise(pooled["nego"]), summarise(pooled["negmas"])
    lines += [rate_line("nego", pooled["nego"]["n"], s), rate_line("negmas", pooled["negmas"]["n"], t)]
    lines.append(f"  speed ratio nego/negmas: {s['rate'] / t['rate']:.1f}x (pooled over {rounds} rounds)")
    if rounds > 1:
        lines.append(
            f"  per round: median {statistics.median(ratios):.1f}x, range {min(ratios):.1f}x-{max(ratios):.1f}x"
        )
    paired = runs["nego"][0]["rows"][: len(pooled["negmas"]["rows"])]
    s2 = summarise({**runs["nego"][0], "rows": paired})
    same = sum(
        a["agreed"] == b["agreed"] and abs(a["us"] - b["us"]) < 1e-6 and abs(a["ub"] - b["ub"]) < 1e-6
        for a, b in zip(paired, pooled["negmas"]["rows"], strict=False)
    )
    lines.append(
        f"  on the {len(paired)} shared scenarios: agreement {s2['agree']:.3f} vs {t['agree']:.3f}; "
        f"mean seller diff {s2['us'] - t['us']:+.4f}, buyer diff {s2['ub'] - t['ub']:+.4f}; "
        f"identical outcomes {same}/{len(paired)}"
    )
    return lines


def pool(results: list[dict]) -> dict:
    """One engine's rounds as one run: negotiations, CPU time and rows added up, the largest peak RSS."""
    return {
        "n": sum(r["n"] for r in results),
        "cpu_s": sum(r["cpu_s"] for r in results),
        "rss_mb": max(r["rss_mb"] for r in results),
        "rows": [row for r in results for row in r["rows"]],
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--engine", choices=["nego", "negmas", "both"], default="both")
    p.add_argument("--space", choices=["small", "full", "both"], default="both")
    p.add_argument("-n", type=int, default=2000, help="nego's negotiations per round (one engine: in all)")
    p.add_argument("--start", type=int, default=0, help="one engine: the first negotiation's number")
    p.add_argument("--negmas-n", type=int, default=100, help="NegMAS negotiations per round on the small space")
    p.add_argument("--negmas-n-full", type=int, default=100, help="NegMAS negotiations on the full space (slow)")
    p.add_argument("--rounds", type=int, default=10, help="rounds of both engines on the small space")
    p.add_argument("--rounds-full", type=int, default=1, help="rounds of both engines on the full space")
    a = p.parse_args()
    if a.engine != "both":
        engine_main(a.engine, a.space, a.n, a.start)
        return
    cmd = "python bench/throughput.py " + " ".join(sys.argv[1:])
    lines = [
        f"$ {cmd.strip()}",
        f"# {time.strftime('%Y-%m-%d')}, {os.cpu_count()} CPUs, Python {sys.version.split()[0]}",
    ]
    for space in ["small", "full"] if a.space == "both" else [a.space]:
        if space == "small":
            lines += compare(space, a.n, min(a.n // a.rounds, a.negmas_n), a.rounds)
        else:
            lines += compare(space, a.n, min(a.n, a.negmas_n_full), a.rounds_full)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
