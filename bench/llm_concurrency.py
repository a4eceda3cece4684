"""What nego adds on top of the model calls themselves when many LLM negotiations run at once, and what each OpenAI
client costs per call.

Starts the fake model server (``tests/fakes/llm_server.py``) in its own process with a fixed latency per
request, then, on one machine and in one run, for each client (``--clients``: ``lean``, nego's aiohttp client,
and ``sdk``, the ``openai`` package on its aiohttp transport):

- market: ``Marketplace.run`` of N negotiations (widget scenario, both sides ``openai:bench-model`` through the
  client, prompts rendered, replies parsed, retries and limits in place), all N at once;
- bare: N coroutines at once, each sending one negotiation's worth of requests through the same client one after
  another (the very requests the market sends, recorded in an untimed run first and replayed with the same client
  settings), and nothing else; the garbage collector paced as a market run paces it
  (:mod:`nego.market.collector`), so the two arms differ only in the market's own work.

The arms alternate (market and bare of each client, every repeat), so load from other jobs falls on all of them.
Printed: the best client CPU per call of each bare loop (this process only; the server runs elsewhere), the lean
client's CPU per call as a fraction of the SDK's, and per client the ratio of the best market to the best bare
wall time and client CPU time (target: <= 1.05x), with the load average before and after. Results are appended
to ``bench/results/llm_concurrency.txt`` with the command line.

    python bench/llm_concurrency.py -n 1000 --latency 0.05 --repeat 3
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import platform
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import openai
from nego.agents.llm.backends.limits import RateLimits
from nego.agents.llm.backends.openai_lean import WireClient
from nego.agents.model_specs import LLMSettings, resolve_model_spec
from nego.market.collector import paced_collection
from nego.market.marketplace import Job, Marketplace
from nego.market.types import EndReason
from nego.scenarios.issues import Issue, IssueKind
from nego.scenarios.preferences import Preferences, ValueFunction
from nego.scenarios.scenario import Scenario

ROOT = Path(__file__).resolve().parent.parent
SPEC = "openai:bench-model"


def widget_scenario() -> Scenario:
    """The scenario the fake server's built-in brain is written for (it ends in a deal in round 6)."""
    issues = (
        Issue("price", IssueKind.INT, low=50, high=150, step=5, unit="USD"),
        Issue("quantity", IssueKind.INT, low=1, high=10, unit="units"),
        Issue("warranty", IssueKind.CATEGORICAL, options=("none", "1y", "2y")),
    )
    prices = {"price": ValueFunction.increasing(), "quantity": ValueFunction.increasing()}
    seller = Preferences(
        {"price": 0.6, "quantity": 0.2, "warranty": 0.2},
        {**prices, "warranty": ValueFunction.options({"none": 1.0, "1y": 0.5, "2y": 0.0})},
        reservation=0.3,
    )
    buyer = Preferences(
        {"price": 0.5, "quantity": 0.1, "warranty": 0.4},
        {
            "price": ValueFunction.decreasing(),
            "quantity": ValueFunction.increasing(),
            "warranty": ValueFunction.options({"none": 0.0, "1y": 0.6, "2y": 1.0}),
        },
        reservation=0.3,
    )
    return Scenario("bench-widgets", "industrial widgets", "A distributor buys widgets.", issues, seller, buyer, 6)


def start_server(latency: float) -> tuple[subprocess.Popen, str]:
    server = ROOT / "tests" / "fakes" / "llm_server.py"
    proc = subprocess.Popen([sys.executable, str(server), "--latency", str(latency)], stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline().strip()
    if not line.startswith("port="):
        proc.kill()
        raise SystemExit(f"the fake server did not start (said {line!r})")
    return proc, f"http://127.0.0.1:{line.removeprefix('port=')}/v1"


Timing = tuple[float, float]
"""Wall seconds and this process's CPU seconds."""


def market_of(settings: LLMSettings, concurrency: int, sent: list[dict] | None) -> tuple[Marketplace, Any]:
    """A marketplace for the bench spec and its factory; with ``sent``, every request body is kept there (the bare
    loop replays exactly these requests)."""
    factory = resolve_model_spec(SPEC, settings)
    if sent is not None:
        build = factory.backend._kwargs

        def record(request):
            kwargs = build(request)
            sent.append(kwargs)
            return kwargs

        factory.backend._kwargs = record
    return Marketplace({SPEC: factory}, concurrency=concurrency), factory


async def run_market(jobs: list[Job], settings: LLMSettings, sent: list[dict] | None) -> tuple[Timing, list[int], int]:
    """One market run; with ``sent``, every request body is recorded there (an untimed run: the bodies it keeps
    alive would make the collector's passes in the timed run longer)."""
    market, factory = market_of(settings, len(jobs), sent)
    start, cpu = time.perf_counter(), time.process_time()
    results = await market.run(jobs)
    wall = time.perf_counter() - start, time.process_time() - cpu
    await factory.aclose()
    errors = sum(r.outcome.end_reason is EndReason.ERROR for r in results)
    return wall, [r.usage_seller.calls + r.usage_buyer.calls for r in results], errors


def bare_client(client: str, url: str, concurrency: int) -> tuple[Callable[..., Awaitable[Any]], Any]:
    """The call and the closable object of one client, with the settings the backend gives it."""
    if client == "lean":
        wire = WireClient(url, "none", concurrency, 120.0)
        return wire.create, wire
    sdk = openai.AsyncOpenAI(
        api_key="none", base_url=url, max_retries=0, http_client=openai.DefaultAioHttpClient(timeout=120.0)
    )
    return sdk.chat.completions.create, sdk


async def run_bare(client: str, calls: list[int], sent: list[dict], url: str, concurrency: int) -> Timing:
    create, closable = bare_client(client, url, concurrency)
    starts = [0, *itertools.accumulate(calls)][:-1]
    slots = asyncio.Semaphore(concurrency)

    async def one(first: int, n: int) -> None:
        async with slots:
            for kwargs in sent[first : first + n]:
                await create(**kwargs)

    start, cpu = time.perf_counter(), time.process_time()
    with paced_collection():  # the collector as a market run paces it, so the arms differ only in the market's work
        await asyncio.gather(*(one(f, n) for f, n in zip(starts, calls, strict=True)))
    wall = time.perf_counter() - start, time.process_time() - cpu
    await closable.close()
    return wall


def measure(args: argparse.Namespace, url: str, clients: list[str]) -> tuple[dict, dict, list[int], int]:
    """Market and bare timings per client, the arms alternating on every repeat."""
    jobs = [Job(widget_scenario(), SPEC, SPEC, seed) for seed in range(args.n)]
    market: dict[str, list[Timing]] = {c: [] for c in clients}
    bare: dict[str, list[Timing]] = {c: [] for c in clients}
    settings = {c: LLMSettings(base_url=url, limits=RateLimits(concurrency=args.n), client=c) for c in clients}
    sent: dict[str, list[dict]] = {c: [] for c in clients}
    calls, errors = [], 0
    for client in clients:  # seeded runs send the same requests every time: record them once, untimed
        _, calls, errs = asyncio.run(run_market(jobs, settings[client], sent[client]))
        errors += errs
    for rep in range(args.repeat):
        for client in clients if rep % 2 == 0 else clients[::-1]:
            wall, run_calls, errs = asyncio.run(run_market(jobs, settings[client], None))
            if run_calls != calls:
                raise SystemExit(f"the {client} market run made other calls than the recorded one")
            market[client].append(wall)
            errors += errs
            bare[client].append(asyncio.run(run_bare(client, calls, sent[client], url, args.n)))
    return market, bare, calls, errors


def report(args: argparse.Namespace, market: dict, bare: dict, calls: list[int], errors: int, load: list) -> list[str]:
    total = sum(calls)
    lines = [
        f"# llm_concurrency  {time.strftime('%Y-%m-%d %H:%M')}  python {platform.python_version()}  "
        f"cpus={os.cpu_count()}  openai {openai.__version__}",
        f"command: python bench/{Path(__file__).name} {' '.join(sys.argv[1:])}",
        "load average (1, 5, 15 min) before: {:.2f} {:.2f} {:.2f}  after: {:.2f} {:.2f} {:.2f}".format(*load),
        f"negotiations={args.n} (all at once)  calls={total} ({total / args.n:.1f} per negotiation)  "
        f"server latency={args.latency * 1000:.0f} ms (separate process)  error outcomes={errors}",
    ]
    per_call = {}
    for client in market:
        per_call[client] = min(c for _, c in bare[client]) / total * 1000
        wall = min(w for w, _ in market[client]) / min(w for w, _ in bare[client])
        cpu = min(c for _, c in market[client]) / min(c for _, c in bare[client])
        lines += [
            f"{client:4} market wall s (client CPU s): " + ", ".join(f"{w:.2f} ({c:.2f})" for w, c in market[client]),
            f"{client:4} bare   wall s (client CPU s): " + ", ".join(f"{w:.2f} ({c:.2f})" for w, c in bare[client]),
            f"{client:4} ratio market/bare, best of {args.repeat}: wall {wall:.3f}x, client CPU {cpu:.3f}x "
            f"(target <= 1.05x); bare client CPU per call {per_call[client]:.3f} ms",
        ]
    if {"lean", "sdk"} <= per_call.keys():
        lines.append(
            f"bare client CPU per call: lean {per_call['lean']:.3f} ms, sdk {per_call['sdk']:.3f} ms "
            f"(lean/sdk {per_call['lean'] / per_call['sdk']:.3f}x; target <= 0.5 ms)"
        )
    lines.append(f"ideal wall (calls in sequence x latency): {max(calls) * args.latency:.2f} s")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=1000, help="negotiations, all at once")
    parser.add_argument("--latency", type=float, default=0.05, help="fake server latency per request, seconds")
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--clients", default="lean,sdk", help="comma-separated: lean, sdk")
    args = parser.parse_args()
    clients = [c.strip() for c in args.clients.split(",") if c.strip()]
    os.environ.pop("OPENAI_API_KEY", None)
    before = os.getloadavg()
    proc, url = start_server(args.latency)
    try:
        market, bare, calls, errors = measure(args, url, clients)
    finally:
        proc.terminate()
        proc.wait()
    lines = report(args, market, bare, calls, errors, [*before, *os.getloadavg()])
    print("\n".join(lines))
    out = ROOT / "bench" / "results" / "llm_concurrency.txt"
    with out.open("a") as f:
        f.write("\n".join(lines) + "\n\n")


if __name__ == "__main__":
    main()
