"""What nego adds on top of the SDK calls themselves when many LLM negotiations run at once.

Starts the fake model server (``tests/fakes/llm_server.py``) in its own process with a fixed latency per
request, then, on one machine and in one run:

- market: ``Marketplace.run`` of N negotiations (widget scenario, both sides ``openai:bench-model`` through the
  real ``openai`` SDK, prompts rendered, replies parsed, retries and limits in place), all N at once;
- bare: N coroutines at once, each sending one negotiation's worth of ``chat.completions.create`` calls one after
  another (the very requests the market run sent, replayed with the same client settings), and nothing else.

Each is run ``--repeat`` times alternately; the ratio of the best market wall time to the best bare wall time
is printed (target: <= 1.15), and the same ratio of this process's CPU time (the server runs elsewhere), which
is the steadier number on a shared machine. Results are appended to ``bench/results/llm_concurrency.txt``.

    python bench/llm_concurrency.py -n 1000 --latency 0.05
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
from pathlib import Path

import openai
from nego.agents.llm.backends.limits import RateLimits
from nego.agents.model_specs import LLMSettings, resolve_model_spec
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


async def run_market(
    jobs: list[Job], settings: LLMSettings, sent: list[dict]
) -> tuple[tuple[float, float], list[int], int]:
    factory = resolve_model_spec(SPEC, settings)
    build = factory.backend._kwargs

    def record(request):  # the bare loop replays exactly these requests
        kwargs = build(request)
        sent.append(kwargs)
        return kwargs

    factory.backend._kwargs = record
    market = Marketplace({SPEC: factory}, concurrency=len(jobs))
    start, cpu = time.perf_counter(), time.process_time()
    results = await market.run(jobs)
    wall = time.perf_counter() - start, time.process_time() - cpu
    await factory.aclose()
    errors = sum(r.outcome.end_reason is EndReason.ERROR for r in results)
    return wall, [r.usage_seller.calls + r.usage_buyer.calls for r in results], errors


async def run_bare(calls: list[int], sent: list[dict], url: str, concurrency: int) -> tuple[float, float]:
    client = openai.AsyncOpenAI(
        api_key="none", base_url=url, max_retries=0, http_client=openai.DefaultAioHttpClient(timeout=120.0)
    )
    starts = [0, *itertools.accumulate(calls)][:-1]
    slots = asyncio.Semaphore(concurrency)

    async def one(first: int, n: int) -> None:
        async with slots:
            for kwargs in sent[first : first + n]:
                await client.chat.completions.create(**kwargs)

    start, cpu = time.perf_counter(), time.process_time()
    await asyncio.gather(*(one(f, n) for f, n in zip(starts, calls, strict=True)))
    wall = time.perf_counter() - start, time.process_time() - cpu
    await client.close()
    return wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=1000, help="negotiations, all at once")
    parser.add_argument("--latency", type=float, default=0.05, help="fake server latency per request, seconds")
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()
    os.environ.pop("OPENAI_API_KEY", None)
    proc, url = start_server(args.latency)
    try:
        scenario = widget_scenario()
        jobs = [Job(scenario, SPEC, SPEC, seed) for seed in range(args.n)]
        settings = LLMSettings(base_url=url, limits=RateLimits(concurrency=args.n))
        market_walls, bare_walls, calls, errors = [], [], [], 0
        for _ in range(args.repeat):
            sent: list[dict] = []
            wall, calls, errs = asyncio.run(run_market(jobs, settings, sent))
            market_walls.append(wall)
            errors += errs
            bare_walls.append(asyncio.run(run_bare(calls, sent, url, args.n)))
    finally:
        proc.terminate()
        proc.wait()
    total = sum(calls)
    ratio = min(w for w, _ in market_walls) / min(w for w, _ in bare_walls)
    cpu_ratio = min(c for _, c in market_walls) / min(c for _, c in bare_walls)
    lines = [
        f"# llm_concurrency  {time.strftime('%Y-%m-%d %H:%M')}  python {platform.python_version()}  "
        f"cpus={os.cpu_count()}  openai {openai.__version__}",
        f"negotiations={args.n} (all at once)  calls={total} ({total / args.n:.1f} per negotiation)  "
        f"server latency={args.latency * 1000:.0f} ms (separate process)  error outcomes={errors}",
        "market wall s (client CPU s): " + ", ".join(f"{w:.2f} ({c:.2f})" for w, c in market_walls),
        "bare   wall s (client CPU s): " + ", ".join(f"{w:.2f} ({c:.2f})" for w, c in bare_walls),
        f"ratio market/bare, best of {args.repeat}: wall {ratio:.3f}x (target <= 1.15x), client CPU {cpu_ratio:.3f}x",
        f"ideal wall (calls in sequence x latency): {max(calls) * args.latency:.2f} s",
    ]
    print("\n".join(lines))
    out = ROOT / "bench" / "results" / "llm_concurrency.txt"
    with out.open("a") as f:
        f.write("\n".join(lines) + "\n\n")


if __name__ == "__main__":
    main()
