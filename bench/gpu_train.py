"""GRPO cost of Gemma 4 shaped models on a GPU: step time, tokens/s and peak memory, LoRA and full fine-tuning.

    python bench/gpu_train.py --size e2b --steps 3                 # both LoRA and full
    python bench/gpu_train.py --size e4b --mode lora --batch 16 --completion 256

The model is randomly initialised from a config with the published shapes (no download); prompts are random
token ids and each completion is exactly ``--completion`` tokens, so the numbers measure the trainer (generation
with plain transformers, forward, backward, optimizer), not the negotiation. Needs CUDA; ``--size test`` with
``--allow-cpu`` runs a toy shape anywhere to check the script itself.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

SHAPES = {
    # Published Gemma 4 shapes (per-layer embeddings included); see docs/multi-gpu.md for memory arithmetic.
    "e2b": dict(
        hidden_size=1536,
        intermediate_size=6144,
        num_hidden_layers=35,
        num_attention_heads=8,
        num_key_value_heads=1,
        sliding_every=5,
        num_kv_shared_layers=20,
        use_double_wide_mlp=True,
    ),
    "e4b": dict(
        hidden_size=2560,
        intermediate_size=10240,
        num_hidden_layers=42,
        num_attention_heads=8,
        num_key_value_heads=2,
        sliding_every=6,
        num_kv_shared_layers=18,
        use_double_wide_mlp=False,
    ),
    "test": dict(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=2,
        num_key_value_heads=1,
        sliding_every=2,
        num_kv_shared_layers=2,
        use_double_wide_mlp=False,
    ),
}


def gemma4_config(size: str):
    from transformers import Gemma4TextConfig

    s = dict(SHAPES[size])
    every = s.pop("sliding_every")
    layers = s["num_hidden_layers"]
    # every `every`-th layer attends globally; the first layer in each block of `every` is global so that a
    # full-attention layer precedes the KV-shared tail
    types = ["full_attention" if i % every == 0 else "sliding_attention" for i in range(layers)]
    vocab = 262_144 if size != "test" else 512
    return Gemma4TextConfig(
        vocab_size=vocab,
        vocab_size_per_layer_input=vocab,
        head_dim=256 if size != "test" else 32,
        layer_types=types,
        sliding_window=512,
        final_logit_softcapping=30.0,
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=2,
        **s,
    )


def make_rollout(prompt_len: int, completion_len: int, vocab: int):
    import torch

    def rollout(prompts, trainer):
        model = trainer.accelerator.unwrap_model(trainer.model)
        ids = torch.randint(3, vocab, (len(prompts), prompt_len), device=model.device)
        with torch.no_grad():
            out = model.generate(
                input_ids=ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=completion_len,
                min_new_tokens=completion_len,
                do_sample=True,
                eos_token_id=None,
                pad_token_id=0,
            )
        completions = out[:, prompt_len:].tolist()
        for c in completions:
            c[-1] = 1  # end on EOS so no sequence counts as truncated
        return {
            "prompt_ids": ids.tolist(),
            "completion_ids": completions,
            "logprobs": None,
            "rank": list(range(len(prompts))),
        }

    return rollout


def run(size: str, mode: str, args) -> dict:
    import torch
    from datasets import Dataset
    from transformers import Gemma4ForCausalLM, PreTrainedTokenizerFast, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    cfg = gemma4_config(size)
    cuda = torch.cuda.is_available()
    with torch.device("cuda" if cuda else "cpu"):
        model = Gemma4ForCausalLM(cfg).to(torch.bfloat16 if cuda else torch.float32)
    params = sum(p.numel() for p in model.parameters())
    from tokenizers import Tokenizer, models

    tok = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(models.WordLevel({"<pad>": 0, "<eos>": 1, "<bos>": 2}, unk_token="<pad>")),
        pad_token="<pad>",
        eos_token="<eos>",
        bos_token="<bos>",
    )
    times: list[float] = []

    class Timer(TrainerCallback):
        def on_step_begin(self, *a, **k):
            self.t = time.perf_counter()

        def on_step_end(self, *a, **k):
            if cuda:
                torch.cuda.synchronize()
            times.append(time.perf_counter() - self.t)

    peft = None
    if mode == "lora":
        from peft import LoraConfig

        peft = LoraConfig(r=16, lora_alpha=32, target_modules="all-linear", task_type="CAUSAL_LM")
    gcfg = GRPOConfig(
        out=f"/tmp/gpu_train_{size}_{mode}",
        max_steps=args.steps,
        per_device_train_batch_size=args.batch,
        num_generations=args.group,
        learning_rate=1e-6,
        bf16=cuda,
        use_cpu=not cuda,
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        gradient_checkpointing=True,
        max_completion_length=args.completion,
    )
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=lambda completions, rank, **k: [float(r % 3) for r in rank],
        args=gcfg,
        train_dataset=Dataset.from_list([{"prompt": "x"}] * 1024),
        processing_class=tok,
        rollout_func=make_rollout(args.prompt, args.completion, cfg.vocab_size),
        peft_config=peft,
        callbacks=[Timer()],
    )
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    trainer.train()
    steady = times[1:] or times
    step = sum(steady) / len(steady)
    tokens = args.batch * (args.prompt + args.completion)
    return {
        "size": size,
        "mode": mode,
        "params_b": params / 1e9,
        "step_s": step,
        "tokens_per_s": tokens / step,
        "peak_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else float("nan"),
    }


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", choices=sorted(SHAPES), default="e2b")
    ap.add_argument("--mode", choices=["lora", "full", "both"], default="both")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--group", type=int, default=4)
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--completion", type=int, default=128)
    ap.add_argument("--allow-cpu", action="store_true", help="run without CUDA (only sensible with --size test)")
    args = ap.parse_args(argv)
    import torch

    if not torch.cuda.is_available() and not args.allow_cpu:
        print(
            "error: bench/gpu_train.py needs a CUDA GPU (torch.cuda.is_available() is False); "
            "use --size test --allow-cpu to check the script on a CPU",
            file=sys.stderr,
        )
        return 2
    for mode in ["lora", "full"] if args.mode == "both" else [args.mode]:
        r = run(args.size, mode, args)
        print(
            f"{r['size']} {r['mode']}: {r['params_b']:.2f}B params, {r['step_s']:.2f} s/step, "
            f"{r['tokens_per_s']:.0f} tokens/s, peak GPU memory {r['peak_gib']:.1f} GiB",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
