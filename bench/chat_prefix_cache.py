"""What keeping each negotiation's conversation in the prompt store buys a chat model played in process on a CPU.

One chat model (a folder, such as a warm-started SmolLM2's ``base``) plays the same negotiations twice through the
in-process backend, on the conversation template it was trained with: once with the store at its old fixed size
(256 MB: five SmolLM2 conversations, so with more negotiations in flight every turn reads its whole conversation
again) and once sized for every negotiation in flight (the default). Prints negotiations per CPU-minute of each
arm, their ratio, the prompt tokens read and reused, and checks that both arms play identical negotiations (a reused
prefix gives the states a fresh read gives).

    python bench/chat_prefix_cache.py --model FOLDER --negotiations 16 --out bench/results/chat_prefix_cache.txt
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path


def play(model_dir: str, template: str, n: int, budget: float | None, max_tokens: int) -> tuple[list, float, dict]:
    import asyncio

    from nego.agents.llm.backends.hf import HFBackend
    from nego.agents.llm.negotiator import LLMNegotiator
    from nego.agents.registry import resolve
    from nego.market.marketplace import Job, Marketplace
    from nego.training.config import DEV_BUYERS
    from nego.training.rollout import split_scenarios

    backend = HFBackend.from_spec(model_dir, max_batch=n, prefix_cache_mb=budget)

    class Seller:
        kind, spec = "hf", "model"

        def __call__(self, role, seed):
            return LLMNegotiator(
                backend, role=role, seed=seed, template=template, max_tokens=max_tokens, temperature=1.0
            )

    seller = Seller()
    scenarios = split_scenarios("dev", n, 10)
    jobs = [Job(sc, "model", DEV_BUYERS[i % len(DEV_BUYERS)], 1000 + i) for i, sc in enumerate(scenarios)]
    market = Marketplace(lambda spec: seller if spec == "model" else resolve(spec), concurrency=n)
    t0 = time.process_time()
    results = asyncio.run(market.run(jobs))
    cpu = time.process_time() - t0
    stats = backend.engine.stats
    return results, cpu, {"reused": stats.prompt_tokens_reused, "requests": stats.requests}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="a chat model folder")
    ap.add_argument("--template", default="negotiator-chat-small-v1")
    ap.add_argument("--negotiations", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    from nego.agents.threads import set_threads

    set_threads(args.threads)
    lines = [f"# python bench/chat_prefix_cache.py --model {args.model} --negotiations {args.negotiations}"]
    arms = {}
    for label, budget in (("store 256 MB", 256.0), ("store sized for the batch", None)):
        results, cpu, stats = play(args.model, args.template, args.negotiations, budget, args.max_tokens)
        turns = sum(1 for r in results for t in r.turns if t.role.value == "seller")
        invalid = sum(1 for r in results for t in r.turns if t.role.value == "seller" and not t.valid)
        arms[label] = (results, cpu)
        lines.append(
            f"{label}: {len(results) / (cpu / 60):.2f} negotiations per CPU-minute ({cpu:.0f} CPU s), "
            f"{stats['requests']} model calls, {stats['reused']} prompt tokens reused, "
            f"invalid {invalid}/{turns} seller moves"
        )
        print(lines[-1], flush=True)
    (a, ca), (b, cb) = arms.values()
    same = sum(x.outcome == y.outcome and len(x.turns) == len(y.turns) for x, y in zip(a, b, strict=True))
    lines.append(
        f"ratio (sized / 256 MB) in negotiations per CPU-minute: {ca / cb:.2f}x; identical outcomes {same}/{len(a)}"
    )
    print(lines[-1])
    if args.out:
        args.out.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
