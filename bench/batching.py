"""Dynamic batching in the in-process transformers backend: generated tokens per second, batched vs not.

Workload: N concurrent negotiations (default 32) on generated scenarios, each an LLM seller (the default prompt
template, text replies, temperature 0.7, 96 new tokens per reply) served by one ``HFBackend`` against a
Boulware buyer, ``max_rounds`` 2 and no retries after an invalid reply (one model call per seller turn). The
model is a randomly initialised Llama with a byte-level BPE tokenizer of 2,000 tokens trained on rendered
prompts, built into a temporary directory and loaded through ``HFBackend.from_spec`` like any checkpoint
(float32, CPU). Its replies are noise, so every seller turn is an invalid action and every negotiation runs its
full length: the same requests in both arms.

The model's shape follows real chat checkpoints where it matters for batching: grouped-query attention (8 query
heads sharing 2 key-value heads of 64 dimensions, as Llama 3 and Qwen 2.5 share theirs), so a context token
costs little cache next to the weights, and weights (49 MiB) larger than a CPU's last-level cache, as every real
checkpoint's are. A decoding step then mostly reads the weights, once for the whole batch, which is what batching
saves. ``--hidden 256 --kv-heads 8`` gives the earlier shape (16 MiB of weights, 8 key-value heads of 32
dimensions), where the cache of 32 rows outweighs the weights and caps what batching can save.

The same run plays the workload twice, once with ``max_batch=1`` (one generate call per request) and once
with ``max_batch=N``; since a request's completion does not depend on its batch, both arms generate the
same tokens, which the script checks. Besides wall-clock rates it reports the seconds spent reading prompts
(prefill, up to the first new token) and decoding, because batching speeds up only the latter on a CPU, and
how many prompt tokens were not read again because a cached prefix was reused. Both arms take the same
generation path: by default the backend's own (read prompts alone, reuse prefixes, decode together);
``--path generate`` forces one left-padded ``generate`` call per batch instead.

Both arms use every core by default, as the backend does: a single row's decoding step is bound by memory
bandwidth and gains little from a second core, while a batch's matrix products use it, so the wall-clock ratio
includes what batching makes of a multi-core machine. The CPU-second ratio, also printed, does not; ``--threads 1``
measures one core alone.

    python bench/batching.py                      # prints a report (3 repeats of both arms)
    python bench/batching.py --out bench/results/batching.txt
    python bench/batching.py --path generate      # the plain transformers generate path, for comparison
    python bench/batching.py --threads 1          # one core
    python bench/batching.py --hidden 256 --kv-heads 8 --template negotiator-v1 --threads 1   # the earlier setup
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

TEMPERATURE = 0.7
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}<|end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


@dataclass(frozen=True)
class Shape:
    """The random model's shape: the default mimics real chat checkpoints' grouped-query attention."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int

    def kv_bytes_per_token(self) -> int:
        """float32 keys and values one context token keeps in the cache, all layers."""
        return 2 * self.kv_heads * (self.hidden // self.heads) * self.layers * 4

    def describe(self, params: int) -> str:
        return (
            f"random Llama, hidden {self.hidden}, {self.layers} layers, {self.heads} heads, {self.kv_heads} key-value "
            f"heads, MLP {self.intermediate}, vocab 2000 BPE, {params / 1e6:.2f}M parameters, float32 "
            f"({params * 4 / 2**20:.1f} MiB of weights, {self.kv_bytes_per_token() / 1024:g} KiB of cache per token)"
        )


def build_model(path: Path, prompts: list[str], shape: Shape) -> int:
    """Train a BPE tokenizer on ``prompts``, build a random Llama, save both to ``path``; return the parameters."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<pad>", "<s>", "<|end|>", "<|system|>", "<|user|>", "<|assistant|>"]
    trainer = trainers.BpeTrainer(
        vocab_size=2000, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(prompts, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="<|end|>", pad_token="<pad>")
    fast.chat_template = CHAT_TEMPLATE
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(fast),
        hidden_size=shape.hidden,
        intermediate_size=shape.intermediate,
        num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads,
        num_key_value_heads=shape.kv_heads,
        max_position_embeddings=4096,
        bos_token_id=fast.bos_token_id,
        eos_token_id=fast.eos_token_id,
        pad_token_id=fast.pad_token_id,
    )
    model = LlamaForCausalLM(config)
    model.save_pretrained(path)
    fast.save_pretrained(path)
    return sum(p.numel() for p in model.parameters())


def sample_prompts(scenarios, template_name: str) -> list[str]:
    from nego.agents.llm.prompts import load_template
    from nego.market.types import Observation
    from nego.scenarios.scenario import Role

    template = load_template(template_name)
    out = []
    for sc in scenarios:
        for role in Role:
            obs = Observation(sc.view_for(role), (), 1, None)
            out.extend(m.content for m in template.render(obs, tools=False))
    return out


async def play(backend, scenarios, max_tokens: int, template: str):
    from nego.agents.llm.negotiator import LLMNegotiator
    from nego.agents.registry import resolve
    from nego.market.protocol import ProtocolConfig, run_negotiation
    from nego.scenarios.scenario import Role

    buyer = resolve("boulware")
    config = ProtocolConfig(max_retries=0)
    start = time.perf_counter()
    results = await asyncio.gather(
        *(
            run_negotiation(
                sc,
                LLMNegotiator(
                    backend, role=Role.SELLER, seed=i, template=template, max_tokens=max_tokens, temperature=TEMPERATURE
                ),
                buyer(Role.BUYER, i),
                seed=i,
                config=config,
            )
            for i, sc in enumerate(scenarios)
        )
    )
    wall = time.perf_counter() - start
    await backend.aclose()
    return results, wall


def arm(path: Path, scenarios, max_batch: int, max_tokens: int, split: bool, template: str) -> dict:
    from nego.agents.llm.backends.hf import HFBackend

    backend = HFBackend.from_spec(str(path), device="cpu", max_batch=max_batch, split_prefill=split)
    cpu = time.process_time()
    results, wall = asyncio.run(play(backend, scenarios, max_tokens, template))
    cpu = time.process_time() - cpu
    generated = sum(r.usage_seller.completion_tokens for r in results)
    prompt = sum(r.usage_seller.prompt_tokens for r in results)
    return {
        "max_batch": max_batch,
        "wall_s": wall,
        "cpu_s": cpu,
        "requests": backend.stats.requests,
        "generate_calls": backend.stats.generate_calls,
        "largest_batch": backend.stats.largest_batch,
        "generated_tokens": generated,
        "prompt_tokens": prompt,
        "tok_s": generated / wall,
        "tok_cpu_s": generated / cpu,
        "prefill_s": backend.stats.prefill_s,
        "decode_s": backend.stats.decode_s,
        "reused": backend.stats.prompt_tokens_reused,
        "decode_tok_s": generated / backend.stats.decode_s,
        "raws": [[t.action.raw for t in r.turns] for r in results],
    }


def table(pairs: list[tuple[dict, dict]]) -> list[str]:
    """One line per arm and repeat, then the median speed-ups over the repeats."""
    lines = [
        f"{'arm':<14}{'wall s':>8}{'cpu s':>7}{'gen calls':>10}{'prompt tok':>11}{'reused':>8}{'new tok':>8}"
        f"{'prefill s':>10}{'decode s':>9}{'new tok/s':>10}{'decode tok/s':>13}"
    ]
    for single, batched in pairs:
        for r in (single, batched):
            lines.append(
                f"{'max_batch=' + str(r['max_batch']):<14}{r['wall_s']:>8.2f}{r['cpu_s']:>7.2f}"
                f"{r['generate_calls']:>10}{r['prompt_tokens']:>11}{r['reused']:>8}{r['generated_tokens']:>8}{r['prefill_s']:>10.2f}"
                f"{r['decode_s']:>9.2f}{r['tok_s']:>10.1f}{r['decode_tok_s']:>13.1f}"
            )

    def ratios(key: str) -> str:
        each = [b[key] / s[key] for s, b in pairs]
        return f"{statistics.median(each):.1f}x (each repeat: {', '.join(f'{x:.1f}x' for x in each)})"

    same = all(s["raws"] == b["raws"] for s, b in pairs)
    return [
        *lines,
        "",
        f"speed-up, new tokens per wall second: {ratios('tok_s')}",
        f"speed-up, new tokens per CPU second: {ratios('tok_cpu_s')}",
        f"speed-up, new tokens per decoding second: {ratios('decode_tok_s')}",
        f"identical transcripts in both arms: {'yes' if same else 'NO'}",
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-n", "--negotiations", type=int, default=32)
    ap.add_argument("--max-rounds", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument(
        "--threads", type=int, default=0, help="torch intra-op threads (0: every core, as the backend runs by default)"
    )
    ap.add_argument("--path", choices=("split", "generate"), default="split", help="generation path, both arms")
    ap.add_argument("--repeats", type=int, default=3, help="play both arms this many times, one after the other")
    ap.add_argument("--template", default=None, help="prompt template (default: the negotiators' default)")
    ap.add_argument("--hidden", type=int, default=512, help="model width")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=8, help="attention (query) heads")
    ap.add_argument("--kv-heads", type=int, default=2, help="key-value heads (grouped-query attention below --heads)")
    ap.add_argument("--intermediate", type=int, default=None, help="MLP width (default: about 2.7 x hidden)")
    ap.add_argument("--out", type=Path, default=None, help="also write the report here")
    args = ap.parse_args()

    import torch
    from nego.agents.llm.prompts import DEFAULT_TEMPLATE, load_template
    from nego.scenarios.generator import generate_scenarios

    args.threads = args.threads or os.cpu_count() or 1
    torch.set_num_threads(args.threads)
    template = load_template(args.template or DEFAULT_TEMPLATE)
    shape = Shape(args.hidden, args.layers, args.heads, args.kv_heads, args.intermediate or args.hidden * 43 // 16)
    scenarios = generate_scenarios(args.negotiations, seed=7, max_rounds=args.max_rounds)
    split = args.path == "split"
    with tempfile.TemporaryDirectory() as tmp:
        params = build_model(Path(tmp), sample_prompts(scenarios, template.name), shape)
        pairs = [
            (
                arm(Path(tmp), scenarios, 1, args.max_tokens, split, template.name),
                arm(Path(tmp), scenarios, args.negotiations, args.max_tokens, split, template.name),
            )
            for _ in range(args.repeats)
        ]
    lines = [
        "# HFBackend dynamic batching: generated tokens/s, batched vs max_batch=1 (same run)",
        f"command: python bench/batching.py {' '.join(sys.argv[1:])}".rstrip(),
        f"machine: {platform.machine()} {os.cpu_count()} CPUs, torch {torch.__version__} CPU, {args.threads} threads",
        f"model: {shape.describe(params)}",
        f"workload: {args.negotiations} concurrent negotiations x {args.max_rounds} seller turns, prompt template "
        f"{template.id}, {args.max_tokens} new tokens per reply, temperature {TEMPERATURE}, per-request seeds",
        f"path (both arms): {args.path}; {args.repeats} repeats, each playing max_batch=1 then max_batch="
        f"{args.negotiations}",
        "",
        *table(pairs),
    ]
    report = "\n".join(lines) + "\n"
    print(report, end="")
    if args.out is not None:
        args.out.write_text(report)


if __name__ == "__main__":
    main()
