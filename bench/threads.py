"""Decoding speed of an in-process model by CPU thread setting, on an idle machine and next to a busy process.

Each thread setting has its own worker process, because OpenMP reads its variables once, when torch loads; the
workers wait on a pipe (asleep) while another measures, so measurements interleave. A worker builds a randomly
initialised Qwen2 model from a config (4 layers, hidden 512, grouped-query attention with 8
query and 2 key-value heads, vocabulary 2,000: 12.6M parameters, float32, the shape ``bench/batching.py`` uses),
reads a 128-token prompt for 8 rows, then times ``--steps`` decoding steps (one new token for every row, with the
KV cache) and reports the median step.

Thread settings, each measured ``--repeat`` times in each condition, interleaved:

- 1 thread (``OMP_NUM_THREADS=1``);
- default: ``nego.agents.threads.default_threads()`` threads, the number ``nego simulate``, ``eval`` and ``train``
  use when neither ``--threads`` nor ``OMP_NUM_THREADS`` is given, with ``OMP_WAIT_POLICY`` unset (OpenMP's own
  policy: threads spin for a while before they sleep);
- default + PASSIVE: the same with ``OMP_WAIT_POLICY=PASSIVE`` (waiting threads sleep at once).

Conditions: idle (nothing started by the script; other users of the machine are not controlled: the load
average is printed) and busy (``--competitors`` processes spinning in a Python loop, started before and stopped
after each measurement). Ratios are step times over the 1-thread step time of the same condition.

    python bench/threads.py                    # prints the table
    python bench/threads.py --competitors 2 --repeat 5
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time

WORKER_TIMEOUT_S = 300


def worker(steps: int, max_seconds: float) -> None:
    """Build the model, say "ready", then time decoding steps each time a line arrives on stdin."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(
        vocab_size=2000,
        hidden_size=512,
        intermediate_size=1408,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(cfg).eval()
    ids = torch.randint(0, cfg.vocab_size, (8, 128), generator=torch.Generator().manual_seed(1))
    print("ready", flush=True)
    for _ in sys.stdin:
        times = []
        with torch.inference_mode():
            out = model(input_ids=ids, use_cache=True)
            cache, token = out.cache, out.logits[:, -1:].argmax(-1)
            started = time.perf_counter()
            for i in range(steps + 3):
                t = time.perf_counter()
                out = model(input_ids=token, cache=cache, use_cache=True)
                cache, token = out.cache, out.logits[:, -1:].argmax(-1)
                if i >= 3:  # the first steps warm caches and the thread pool up
                    times.append(time.perf_counter() - t)
                if time.perf_counter() - started > max_seconds and len(times) >= 5:
                    break
        result = {"step_s": statistics.median(times), "steps": len(times), "threads": torch.get_num_threads()}
        print(json.dumps(result), flush=True)


class Worker:
    """One worker process per thread setting, started once; OpenMP reads its variables when torch loads."""

    def __init__(self, env_changes: dict[str, str], args: argparse.Namespace) -> None:
        env = {
            k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OMP_WAIT_POLICY")
        }
        env.update(env_changes)
        cmd = [sys.executable, __file__, "--worker", "--steps", str(args.steps), "--max-seconds", str(args.max_seconds)]
        self.proc = subprocess.Popen(cmd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def ready(self) -> None:
        line = self.proc.stdout.readline()  # type: ignore[union-attr]
        if line.strip() != "ready":
            raise SystemExit(f"worker failed to start (exit {self.proc.wait()})")

    def measure(self) -> dict:
        self.proc.stdin.write("go\n")  # type: ignore[union-attr]
        self.proc.stdin.flush()  # type: ignore[union-attr]
        return json.loads(self.proc.stdout.readline())  # type: ignore[union-attr]

    def close(self) -> None:
        self.proc.stdin.close()  # type: ignore[union-attr]
        self.proc.wait(timeout=60)


def spin() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "while True: pass"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40, help="decoding steps timed per measurement")
    parser.add_argument("--max-seconds", type=float, default=20.0, help="stop a measurement early after this long")
    parser.add_argument("--repeat", type=int, default=3, help="measurements per setting and condition")
    parser.add_argument("--competitors", type=int, default=1, help="busy processes in the busy condition")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.steps, args.max_seconds)
        return
    from nego.agents.threads import default_threads, usable_cores

    n = default_threads()
    settings = {
        "1 thread": {"OMP_NUM_THREADS": "1"},
        f"default ({n})": {"OMP_NUM_THREADS": str(n)},
        f"default ({n}) + PASSIVE": {"OMP_NUM_THREADS": str(n), "OMP_WAIT_POLICY": "PASSIVE"},
    }
    print(f"machine: {platform.machine()}, {usable_cores()} usable cores, load average {os.getloadavg()[0]:.2f}")
    workers = {label: Worker(changes, args) for label, changes in settings.items()}
    results: dict[tuple[str, str], list[float]] = {}
    try:
        for w in workers.values():
            w.ready()
        for _ in range(args.repeat):
            for condition in ("idle", "busy"):
                for label, w in workers.items():
                    rivals = [spin() for _ in range(args.competitors)] if condition == "busy" else []
                    try:
                        got = w.measure()
                    finally:
                        for p in rivals:
                            p.kill()
                            p.wait()
                    results.setdefault((condition, label), []).append(got["step_s"])
    finally:
        for w in workers.values():
            w.close()
    print(f"median decoding step of 8 rows over {args.repeat} runs; busy = {args.competitors} spinning process(es)")
    print(f"{'condition':<10}{'setting':<26}{'step ms':>10}{'vs 1 thread':>13}   runs (ms)")
    for condition in ("idle", "busy"):
        one = statistics.median(results[(condition, "1 thread")])
        for label in settings:
            runs = results[(condition, label)]
            step = statistics.median(runs)
            shown = " ".join(f"{r * 1e3:.1f}" for r in runs)
            print(f"{condition:<10}{label:<26}{step * 1e3:>10.1f}{step / one:>12.2f}x   {shown}")
    print(f"load average at the end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
