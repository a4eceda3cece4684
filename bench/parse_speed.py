"""Is reading a model reply linear in its length, whatever the reply holds?

Run: .venv/bin/python bench/parse_speed.py [--chars 50000 --repeat 9]
Times `parse_response` (CPU time, best of --repeat) on replies of the same length: an ordinary one (prose with a
fenced JSON action at the end, the peer) and pathological ones (open braces, a nesting bomb, many small objects,
many action blocks, tool-call arguments nested deep), and prints each one's time per character as a ratio to the
ordinary reply's. It also times each reply at a tenth of the length: per-character time that stays flat from
the short to the long reply (growth ~1x) is linear work; quadratic work would grow ~10x.
"""

from __future__ import annotations

import argparse
import gc
import json
import time
from collections.abc import Callable

from nego.agents.llm.backends.base import ChatResponse, ToolCall
from nego.agents.llm.parsing import parse_response
from nego.scenarios.issues import Issue, IssueKind

ISSUES = (
    Issue("price", IssueKind.INT, low=50, high=150, step=5, unit="USD"),
    Issue("quantity", IssueKind.INT, low=1, high=10, unit="units"),
    Issue("warranty", IssueKind.CATEGORICAL, options=("none", "1y", "2y")),
)
BLOCK = json.dumps({"action": "offer", "offer": {"price": 120, "quantity": 4, "warranty": "1y"}, "message": "ok"})
PROSE = (
    "The buyer moved 10 USD last round, so I will concede a little on price but hold the warranty at 1y. "
    "Quantity matters less to me than to them (their brief mentions stock levels). "
)


def _fill(unit: str, n: int) -> str:
    return (unit * (n // len(unit) + 1))[:n]


def ordinary(n: int) -> ChatResponse:
    block = f"\n```json\n{BLOCK}\n```\n"
    return ChatResponse(_fill(PROSE, n - len(block)) + block)


REPLIES: dict[str, Callable[[int], ChatResponse]] = {
    "ordinary (prose + action block)": ordinary,
    "open braces {{{...": lambda n: ChatResponse("{" * n),
    'nesting bomb {"a":{"a":...}}': lambda n: ChatResponse(_nested(n)),
    'many small objects {"k": 1}': lambda n: ChatResponse(_fill('{"k": 1} ', n)),
    "many action blocks": lambda n: ChatResponse(_fill('{"action": "accept"} ', n)),
    "tool arguments [[[...": lambda n: ChatResponse("", (ToolCall("make_offer", "[" * n),)),
}


def _nested(n: int) -> str:
    depth = (n - 1) // 6
    return ('{"a":' * depth + "1" + "}" * depth).ljust(n)


def best_cpu_s(response: ChatResponse, repeat: int) -> float:
    """Best CPU time of ``repeat`` parses, with the garbage collector paused as ``timeit`` does."""
    best = float("inf")
    gc.disable()
    try:
        for _ in range(repeat):
            t = time.process_time()
            parse_response(response, ISSUES)
            best = min(best, time.process_time() - t)
    finally:
        gc.enable()
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--chars", type=int, default=50_000, help="length of every reply (the parser reads 50,000)")
    ap.add_argument("--repeat", type=int, default=9)
    args = ap.parse_args()
    long_n, short_n = args.chars, args.chars // 10
    rows = []
    for name, make in REPLIES.items():
        long_s = best_cpu_s(make(long_n), args.repeat)
        short_s = best_cpu_s(make(short_n), args.repeat)
        rows.append((name, long_s, long_s / long_n, (long_s / long_n) / max(short_s / short_n, 1e-12)))
    peer = rows[0][2]
    print(f"parse_response, CPU time (best of {args.repeat}), replies of {long_n:,} characters; growth = time per")
    print(f"character at {long_n:,} / at {short_n:,} characters (1x: linear, 10x: quadratic)")
    print(f"{'reply':34s} {'ms':>8s} {'us/char':>8s} {'vs ordinary':>12s} {'growth':>7s}")
    for name, seconds, per_char, growth in rows:
        print(f"{name:34s} {seconds * 1e3:8.2f} {per_char * 1e6:8.3f} {per_char / peer:11.1f}x {growth:6.2f}x")
    worst = max(rows[1:], key=lambda r: r[2])
    print(f"slowest pathological reply: {worst[0]}, {worst[2] / peer:.0f}x the ordinary reply per character")


if __name__ == "__main__":
    main()
