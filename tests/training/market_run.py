"""A market with a GRPO-learning tiny seller, meant to be killed: ``python -m tests.training.market_run DIR DAYS``.

Needs ``NEGO_HOME`` holding a registered ``tiny`` model. Prints ``ready``, then ``learned N`` after each day's
learning, then ``done``; the learner's state and the transcripts live under DIR.
"""

from __future__ import annotations

import sys
from pathlib import Path

from nego.agents.registry import resolve
from nego.market.events import EventBus, LearnerUpdated
from nego.market.population import BuyerSetup, MarketModel, SellerSetup
from nego.market.transcripts import TranscriptWriter
from nego.training.config import TrainConfig
from nego.training.market_learner import GRPOLearner


def main(directory: str, days: int) -> None:
    import torch

    torch.set_num_threads(1)
    out = Path(directory)
    cfg = TrainConfig(group_size=4, scenarios_per_step=2, lr=1e-3, threads=1, time_budget_min=0)
    learner = GRPOLearner("tiny", cfg, out / "learner", echo=lambda s: None)
    sellers = [SellerSetup(learner.spec, 100), SellerSetup(learner.spec, 100), SellerSetup("boulware", 100)]
    buyers = [BuyerSetup("conceder", 100), BuyerSetup("tft", 100), BuyerSetup("hazard", 100)]
    bus = EventBus()
    bus.subscribe(lambda e: print(f"learned {e.day}", flush=True) if isinstance(e, LearnerUpdated) else None)
    print("ready", flush=True)
    with (
        TranscriptWriter(out / "transcripts") as writer,
        MarketModel(resolve, sellers, buyers, days=days, seed=3, writer=writer, bus=bus, learners=[learner]) as m,
    ):
        m.run()
    print("done", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
