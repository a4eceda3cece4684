"""The training buyer pool: negotiator specs, where ``key=a..b`` draws the parameter uniformly per negotiation."""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
from nego.agents.registry import NegotiatorFactory, resolve

_RANGE = re.compile(r"(?P<key>[A-Za-z_]+)=(?P<lo>-?[0-9.]+)\.\.(?P<hi>-?[0-9.]+)")


@dataclass(frozen=True, slots=True)
class BuyerPool:
    """Draws one buyer spec per negotiation: a spec uniformly from ``specs``, then any ranges inside it."""

    specs: tuple[str, ...]

    def check(self) -> None:
        """Resolve every spec at both ends of its ranges, so a typo fails before anything loads."""
        from .config import ConfigError

        for spec in self.specs:
            for end in ("lo", "hi"):
                try:
                    resolve(_RANGE.sub(lambda m, end=end: f"{m['key']}={m[end]}", spec))
                except ValueError as e:
                    raise ConfigError(f"train_buyers: {e}") from None

    def draw(self, rng: np.random.Generator) -> str:
        spec = self.specs[int(rng.integers(len(self.specs)))]
        return _RANGE.sub(lambda m: f"{m['key']}={rng.uniform(float(m['lo']), float(m['hi'])):.3f}", spec)

    def factory(self, rng: np.random.Generator) -> NegotiatorFactory:
        return resolve(self.draw(rng))
