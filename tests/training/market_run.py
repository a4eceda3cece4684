"""`nego simulate --learn tiny` on a small market, meant to be killed: ``python -m tests.training.market_run DIR DAYS``.

Needs ``NEGO_HOME`` holding a registered ``tiny`` model. Runs the command with plain output, so that each day's
learning prints a ``day N: tiny-learning learned`` line a test can wait for before killing it.
"""

from __future__ import annotations

import sys

from nego.cli.app import main

ARGS = ["--learn", "tiny", "--negotiations", "1", "--sellers", "boulware", "--buyers", "conceder,tft,hazard"]
ARGS += ["--learn-sellers", "2", "--learn-group", "4", "--learn-batch", "2", "--learn-lr", "1e-3", "--seed", "3"]

if __name__ == "__main__":
    directory, days = sys.argv[1], sys.argv[2]
    sys.argv = ["nego", "simulate", *ARGS, "--days", days, "--threads", "1", "--out", directory, "--no-live"]
    main()
