"""One process of the several-process test in ``test_packing.py``; run it with ``accelerate launch``.

Each process builds nego's trainer on the tiny model and reads log-probabilities of a batch of its own, whose rows
fall into a different number of length buckets in each process, then a batch that only one process cannot read in
buckets. It writes ``OUT/rankN.json``: the model calls each read made, and how far the bucketed log-probabilities are
from TRL's padded ones.

    accelerate launch --multi_gpu --num_processes 2 tests/training/packing_run.py OUT
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path


def main(out: str) -> None:
    import torch
    from nego.tests.training.test_packing import _batch, _logps, _trainer

    trainer = _trainer("tiny", Path(out) / f"work-{os.environ.get('RANK', '0')}")
    rank = trainer.accelerator.process_index
    vocab = trainer.model.config.vocab_size
    calls = [0]
    trainer.model.get_input_embeddings().register_forward_pre_hook(lambda m, a: calls.__setitem__(0, calls[0] + 1))
    # one bucket in the first process; lengths far apart, so several, in the second
    rows = [(3, 20, True)] * 4 if rank == 0 else [(3, 2, True), (3, 20, True), (3, 60, True), (3, 140, True)]
    covered = _batch(vocab, rows=rows, seed=rank)
    # a row without a prompt token in the second process only: both read TRL's way
    uncovered = _batch(vocab, rows=[(3, 5, True), (0 if rank else 3, 5, True)], seed=rank)
    report = {"rank": rank}
    with torch.no_grad():
        for name, batch in (("covered", covered), ("uncovered", uncovered)):
            padded, _ = _logps(trainer, batch, pack=False)
            calls[0] = 0
            logps, _ = _logps(trainer, batch, pack=True)
            report[name] = {"calls": calls[0], "gap": float((logps - padded).abs().max())}
    Path(out, f"rank{rank}.json").write_text(json.dumps(report))
    trainer.accelerator.wait_for_everyone()


if __name__ == "__main__":
    main(sys.argv[1])
