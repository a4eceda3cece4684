"""The market's own CPU per LLM call, with no client and no server in the way, and where it goes.

``bench/llm_concurrency.py`` compares a market run with a bare loop of the same client, both talking to a fake
server in another process: the difference is the market's own work, but it comes out of two noisy wall and CPU
measurements that share a machine with the server. This bench measures that work directly:

1. records the replies of one market run (widget scenario, both sides ``openai:bench-model`` through nego's lean
   client, all N negotiations at once) against the fake server (``tests/fakes/llm_server.py``) in its own process;
2. times a bare loop of the lean client replaying those requests to the server (the peer: what one call costs
   the client), as ``llm_concurrency.py`` does;
3. stops the server and plays the same market again ``--repeat`` times with the client's ``create`` answering each
   request from the recording (a dictionary lookup, no network), so this process's CPU time is the market's own
   work: prompts, request building, limits and retries, reply validation, parsing, the protocol, the marketplace;
4. plays it once more with timers around the stages (prompt rendering, reply parsing, the backend's call path
   without the client), the rest being the protocol, the marketplace and the negotiator's glue.

Printed: the bare client's CPU per call, the market's own CPU per call (best of the repeats), their ratio (the market
can cost no less than ``1 + own / bare`` of a bare loop, whatever the server) and the share of each stage. Every
replayed run must end as the recorded one did. Results are appended to ``bench/results/llm_market_own.txt``.

    python bench/llm_market_own.py -n 1000 --repeat 5
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import llm_concurrency as lc
from nego.agents.llm import negotiator as negotiator_module
from nego.agents.llm.backends import _common, openai_lean
from nego.agents.llm.backends.limits import RateLimits
from nego.agents.model_specs import LLMSettings
from nego.market.marketplace import Job

ROOT = Path(__file__).resolve().parent.parent
Key = tuple[int, str]


def key(body: dict[str, Any]) -> Key:
    """A request's identity in a seeded run: its sampling seed and the text of its last message."""
    return body["seed"], body["messages"][-1]["content"]


def record(jobs: list[Job], url: str) -> tuple[dict[Key, Any], list[dict], list[int], list[tuple]]:
    """One market run against the server: the replies by request, the request bodies in order, calls per
    negotiation and each negotiation's end."""
    replies: dict[Key, Any] = {}
    create = openai_lean.WireClient.create

    async def recording(self: openai_lean.WireClient, **body: Any) -> Any:
        reply = await create(self, **body)
        replies[key(body)] = reply
        return reply

    openai_lean.WireClient.create = recording  # type: ignore[method-assign]
    try:
        sent: list[dict] = []
        results = asyncio.run(play(jobs, url, sent))
    finally:
        openai_lean.WireClient.create = create  # type: ignore[method-assign]
    return replies, sent, [r.usage_seller.calls + r.usage_buyer.calls for r in results], ends(results)


async def play(jobs: list[Job], url: str, sent: list[dict] | None = None) -> list[Any]:
    settings = LLMSettings(base_url=url, limits=RateLimits(concurrency=len(jobs)), client="lean")
    market, factory = lc.market_of(settings, len(jobs), sent)
    try:
        return await market.run(jobs)
    finally:
        await factory.aclose()


def ends(results: list[Any]) -> list[tuple]:
    return [(r.outcome.end_reason, r.outcome.agreement, r.outcome.rounds, r.outcome.turns) for r in results]


class Stages:
    """Seconds spent in each timed stage, summed over a run."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)

    def timed(self, stage: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        seconds, clock = self.seconds, time.perf_counter

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            start = clock()
            try:
                return fn(*args, **kwargs)
            finally:
                seconds[stage] += clock() - start

        return wrapper

    def timed_async(self, stage: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        # exact only while the coroutine never suspends, as in a replayed run (nothing in it waits)
        seconds, clock = self.seconds, time.perf_counter

        async def wrapper(*args: Any, **kwargs: Any) -> Any:
            start = clock()
            try:
                return await fn(*args, **kwargs)
            finally:
                seconds[stage] += clock() - start

        return wrapper


def replayed(jobs: list[Job], replies: dict[Key, Any], stages: Stages | None) -> tuple[float, float, list[tuple]]:
    """One market run with every reply taken from ``replies``: (CPU seconds, wall seconds, ends)."""
    create = openai_lean.WireClient.create
    saved = (negotiator_module.chat_messages, negotiator_module.parse_response, _common.SDKBackend.complete)

    async def replay(self: openai_lean.WireClient, **body: Any) -> Any:
        return replies[key(body)]

    openai_lean.WireClient.create = stages.timed_async("replay", replay) if stages else replay  # type: ignore
    if stages is not None:
        negotiator_module.chat_messages = stages.timed("render", saved[0])
        negotiator_module.parse_response = stages.timed("parse", saved[1])
        _common.SDKBackend.complete = stages.timed_async("backend", saved[2])  # type: ignore[method-assign]
    try:
        cpu, wall = time.process_time(), time.perf_counter()
        results = asyncio.run(play(jobs, "http://127.0.0.1:9/v1"))  # nothing listens there: no call leaves
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    finally:
        openai_lean.WireClient.create = create  # type: ignore[method-assign]
        negotiator_module.chat_messages, negotiator_module.parse_response = saved[0], saved[1]
        _common.SDKBackend.complete = saved[2]  # type: ignore[method-assign]
    return cpu, wall, ends(results)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=1000, help="negotiations, all at once")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    os.environ.pop("OPENAI_API_KEY", None)
    jobs = [Job(lc.widget_scenario(), lc.SPEC, lc.SPEC, seed) for seed in range(args.n)]
    before = os.getloadavg()
    proc, url = lc.start_server(0.05)
    try:
        replies, sent, calls, recorded = record(jobs, url)
        bare = [asyncio.run(lc.run_bare("lean", calls, sent, url, args.n))[1] for _ in range(2)]
    finally:
        proc.terminate()
        proc.wait()
    total = sum(calls)
    own = []
    for _ in range(args.repeat):
        cpu, _, got = replayed(jobs, replies, None)
        if got != recorded:
            raise SystemExit("a replayed run ended otherwise than the recorded one")
        own.append(cpu)
    stages = Stages()
    staged_cpu, staged_wall, got = replayed(jobs, replies, stages)
    if got != recorded:
        raise SystemExit("the staged run ended otherwise than the recorded one")
    per_call = {name: s / total * 1e6 for name, s in stages.seconds.items()}
    backend = per_call.pop("backend") - per_call.get("replay", 0.0)  # the call path without the replayed client
    parts = {
        "prompt rendering (chat_messages)": per_call.get("render", 0.0),
        "backend call path (request, limits, retries, validation, usage)": backend,
        "reply parsing (parse_response)": per_call.get("parse", 0.0),
    }
    staged = staged_wall / total * 1e6
    parts["protocol, marketplace, negotiator glue (the rest)"] = staged - sum(parts.values()) - per_call["replay"]
    parts["the replayed client (a dictionary lookup)"] = per_call["replay"]
    bare_call, own_call = min(bare) / total * 1e6, min(own) / total * 1e6
    lines = [
        f"# llm_market_own  {time.strftime('%Y-%m-%d %H:%M')}  python {platform.python_version()}  "
        f"cpus={os.cpu_count()}",
        f"command: python bench/{Path(__file__).name} {' '.join(sys.argv[1:])}",
        f"load average before: {before[0]:.2f} {before[1]:.2f} {before[2]:.2f}",
        f"negotiations={args.n} (all at once)  calls={total} ({total / args.n:.1f} per negotiation)",
        "bare lean client CPU per call, 2 runs against the fake server: "
        + ", ".join(f"{b / total * 1e6:.1f}" for b in bare)
        + " us",
        f"market's own CPU per call, replayed replies, {args.repeat} runs: "
        + ", ".join(f"{c / total * 1e6:.1f}" for c in own)
        + " us",
        f"best: own {own_call:.1f} us / bare {bare_call:.1f} us = {own_call / bare_call:.3f}: a market run costs at "
        f"least {1 + own_call / bare_call:.2f}x the CPU of the bare loop (target 1.05x)",
        f"where it goes (one more replayed run with stage timers, {staged:.1f} us a call in all, "
        f"{staged_cpu / total * 1e6:.1f} us of CPU):",
    ]
    lines += [f"  {name:66s} {us:6.1f} us  {us / staged:6.1%}" for name, us in parts.items()]
    print("\n".join(lines))
    with (ROOT / "bench" / "results" / "llm_market_own.txt").open("a") as f:
        f.write("\n".join(lines) + "\n\n")


if __name__ == "__main__":
    main()
