"""Peak resident memory of SmolLM2's training step and of its generation on a CPU, against what the preflight's
memory model (``nego.training.memory_model``, ``on_cpu``) estimates for the same shapes.

    python bench/smollm2_memory.py                      # the default grid
    python bench/smollm2_memory.py --train 1x1100,2x2239 --generate 14x1500

Every point runs in a fresh process (so one point's heap never inflates the next): it loads the packaged model in
fp32 as ``nego train`` does on a CPU, then either

- ``RxT`` training: one forward and backward of R rows of T tokens through TRL's fused LM head with gradient
  checkpointing (the loss path of GRPO; three quarters of each row are completion tokens) and one AdamW step; or
- ``RxT`` generation: R prompts of T tokens read and continued by 16 tokens together through nego's generation
  engine, with its prompt store sized for R rows.

"measured" is the process's peak resident memory less what it held before the model loaded (the interpreter and
libraries, which the preflight counts as ``CPU_OVERHEAD``); "estimate" is the memory model's training or rollout
bytes. A ratio at or under 1 means the estimate bounds what the shape held.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TRAIN = "1x1100,2x1100,4x1100,1x2239,2x2239,4x2239,8x2239,1x4000"
GENERATE = "7x1500,14x1500,28x1500,56x1500"
NEW_TOKENS = 16


def peak_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def child(what: str, rows: int, tokens: int) -> dict[str, float]:
    import torch
    from nego.agents.llm.backends.smollm2 import smollm2_source
    from transformers import AutoConfig, AutoModelForCausalLM
    from trl.trainer.utils import add_fused_lm_head

    source = smollm2_source()
    before = peak_gib()
    model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32)
    ids = torch.randint(0, 49_000, (rows, tokens), generator=torch.Generator().manual_seed(0))
    t0 = time.perf_counter()
    if what == "train":
        add_fused_lm_head(model)
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6)
        labels = ids.clone()
        labels[:, : tokens // 4] = -100
        out = model(input_ids=ids, attention_mask=torch.ones_like(ids), labels=labels, fused_lm_head=True)
        out.log_probs.sum().backward()
        optimizer.step()
    else:
        from nego.agents.llm.backends.hf_engine import GenerationEngine, Row

        model.eval()
        engine = GenerationEngine(model, eos_ids=[0], pad_id=0, rows=rows)
        with torch.inference_mode():
            engine.generate([Row(r.tolist(), NEW_TOKENS, 1.0, i) for i, r in enumerate(ids)])
    from nego.training.memory_model import GiB, estimate, model_facts

    facts = model_facts(AutoConfig.from_pretrained(source))
    seq = tokens + (NEW_TOKENS if what == "generate" else 0)
    shape = {"micro_batch": rows, "seq_len": seq, "generation_rows": rows}
    est = estimate(facts, "full", 0, on_cpu=True, **shape)
    estimated = est.training if what == "train" else est.weights + est.generation
    return {"measured": peak_gib() - before, "estimate": estimated / GiB, "seconds": time.perf_counter() - t0}


def shapes(text: str) -> list[tuple[int, int]]:
    return [(int(a), int(b)) for a, b in (item.split("x") for item in text.split(",") if item)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--train", default=TRAIN, help="RxT training shapes (rows x tokens), comma-separated")
    ap.add_argument("--generate", default=GENERATE, help="RxT generation shapes (rows x prompt tokens)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--child", nargs=3, metavar=("WHAT", "ROWS", "TOKENS"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        what, rows, tokens = args.child
        print(json.dumps(child(what, int(rows), int(tokens))))
        return 0
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "MKL_NUM_THREADS": str(args.threads)}
    print(f"# python bench/smollm2_memory.py --train {args.train} --generate {args.generate} --threads {args.threads}")
    print(f"# {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {os.cpu_count()} CPUs, {args.threads} threads")
    print(f"{'point':<22} {'measured GiB':>12} {'estimate GiB':>12} {'ratio':>6} {'seconds':>8}")
    worst = 0.0
    for what, text in (("train", args.train), ("generate", args.generate)):
        for rows, tokens in shapes(text):
            cmd = [sys.executable, __file__, "--child", what, str(rows), str(tokens)]
            out = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True)
            if out.returncode != 0:
                print(out.stdout + out.stderr, file=sys.stderr)
                return 1
            r = json.loads(out.stdout.strip().splitlines()[-1])
            ratio = r["measured"] / r["estimate"]
            worst = max(worst, ratio)
            point = f"{what} {rows}x{tokens}"
            print(f"{point:<22} {r['measured']:>12.2f} {r['estimate']:>12.2f} {ratio:>6.2f} {r['seconds']:>8.1f}")
    print(f"largest measured/estimate: {worst:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
