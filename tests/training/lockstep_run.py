"""One training process of the several-process test in ``test_vllm_turns.py``; run it with ``accelerate launch``.

Each process plays its own share of chat negotiations (a different number per process, each ending at its own
turn) through a market rollout of :class:`~nego.training.chat_rollout.ChatRollout` with TRL's server-mode vLLM
generation over a fake server, then writes what it saw to ``OUT/rankN.json``: the prompts it sent per call, and
whether every trained run of ids in its rollouts is exactly the fake server's reply to the sequence before it.

    accelerate launch --multi_gpu --num_processes 2 tests/training/lockstep_run.py MODEL_DIR OUT [--no-lockstep]
"""

from __future__ import annotations

import json
import sys
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace


def main(model_dir: str, out: str, lockstep: bool = True) -> None:
    from accelerate import Accelerator
    from accelerate.utils import InitProcessGroupKwargs
    from nego.tests.training.chat_models import END
    from nego.tests.training.fake_vllm import FakeVLLMClient, fake_vllm_generation, reply_for
    from nego.training.chat_rollout import ChatRollout
    from nego.training.pool import BuyerPool
    from nego.training.rollout import MarketRollout, split_scenarios
    from nego.training.runner import EpisodeRunner
    from transformers import AutoModelForCausalLM, AutoTokenizer

    # a process left waiting on the others fails after a minute instead of hanging the test
    accelerator = Accelerator(cpu=True, kwargs_handlers=[InitProcessGroupKwargs(timeout=timedelta(seconds=60))])
    rank = accelerator.process_index
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    end_id = tok.convert_tokens_to_ids(END)
    reply = reply_for(tok, end_id)
    client = FakeVLLMClient(reply)
    vllm = fake_vllm_generation(accelerator, tok, client, max_completion_length=4096)
    sent: list[int] = []
    generate = vllm.generate

    def counting(prompts, images, num_generations, profiler=None):
        sent.append(len(prompts))
        return generate(prompts, images, num_generations, profiler)

    vllm.generate = counting
    cap = 24
    scenarios = split_scenarios("train", 5, max_rounds=4)[rank * 2 : rank * 2 + 2 + rank]  # 2 and 3 scenarios
    with EpisodeRunner() as runner:
        rollout = MarketRollout(
            scenarios,
            BuyerPool(("timedep:e=0.3..3",)),
            tok,
            runner,
            policy=ChatRollout(tok, max_new=cap),
            spec="learner",
            seed=rank,
            max_tokens=10**6,
            group_size=2,
            run_id="lockstep",
        )
        if not lockstep:
            rollout_learner = rollout.learner

            def without_lockstep(model, trainer):
                factory = rollout_learner(model, trainer)
                factory.policy.generator.lockstep = None
                return factory

            rollout.learner = without_lockstep
        trainer = SimpleNamespace(
            state=SimpleNamespace(global_step=0),
            accelerator=accelerator,
            model=model,
            temperature=1.0,
            use_vllm=True,
            vllm_generation=vllm,
        )
        batch = rollout([s.id for s in scenarios for _ in range(2)], trainer)
        turns = [r.seller_turns for r in rollout.last]
        filler = rollout.policy.last.generator.filler_rows
    checks = []
    for prompt, completion, mask in zip(batch["prompt_ids"], batch["completion_ids"], batch["env_mask"], strict=True):
        full, offset = [*prompt, *completion], len(prompt)
        runs, start = [], None
        for i, m in enumerate([*mask, 0]):
            if m and start is None:
                start = i
            elif not m and start is not None:
                runs.append((offset + start, offset + i))
                start = None
        checks.append([full[a:b] == reply(full[:a])[:cap] for a, b in runs])
    result = {
        "rank": rank,
        "sent": sent,
        "seller_turns": turns,
        "filler_rows": filler,
        "runs": checks,
        "server_calls": [c.__dict__ for c in client.calls] if accelerator.is_main_process else [],
        "stop_ids": sorted({end_id, tok.convert_tokens_to_ids("<eos>")}),
    }
    Path(out, f"rank{rank}.json").write_text(json.dumps(result))
    accelerator.wait_for_everyone()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], lockstep="--no-lockstep" not in sys.argv[3:])
