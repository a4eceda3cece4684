"""The training buyer pool: negotiator specs, where ``key=a..b`` draws the parameter uniformly per negotiation."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from nego.agents import NegotiatorFactory
from nego.agents.registry import resolve, rule_family
from nego.agents.rules.heldout import HELD_OUT_FAMILIES

_RANGE = re.compile(r"(?P<key>[A-Za-z_]+)=(?P<lo>-?[0-9.]+)\.\.(?P<hi>-?[0-9.]+)")


def refuse_held_out(field: str, specs: Sequence[str]) -> None:
    """Raise ConfigError if any spec is a held-out evaluation family (whatever its parameters)."""
    from .config import ConfigError

    for spec in specs:
        family = rule_family(spec)
        if family in HELD_OUT_FAMILIES:
            raise ConfigError(
                f"{field}: {spec!r} is the held-out evaluation family {family!r}; the held-out families "
                f"({', '.join(HELD_OUT_FAMILIES)}) never enter training, so evaluations against them stay held out"
            )


@dataclass(frozen=True, slots=True)
class BuyerPool:
    """Draws one buyer spec per negotiation: a spec uniformly from ``specs``, then any ranges inside it.

    An entry listed k times is drawn k times as often."""

    specs: tuple[str, ...]

    def check(self) -> None:
        """Resolve every spec at both ends of its ranges, so a typo fails before anything loads (a league entry,
        played by the learning policy itself, is checked for its form only)."""
        from .config import ConfigError
        from .league import league_every

        for spec in self.specs:
            if league_every(spec) is not None:
                continue
            for end in ("lo", "hi"):
                try:
                    resolve(_RANGE.sub(lambda m, end=end: f"{m['key']}={m[end]}", spec))
                except ValueError as e:
                    raise ConfigError(f"train_buyers: {e}") from None

    @property
    def league(self) -> tuple[int, ...]:
        """The refresh intervals of the pool's ``league:every=N`` entries, each once, in order."""
        from .league import league_every

        found = (league_every(s) for s in self.specs)
        return tuple(dict.fromkeys(n for n in found if n is not None))

    def rules(self) -> BuyerPool:
        """The pool without its league entries: the opponents of play that has no learning policy (the warm start)."""
        from .league import league_every

        kept = tuple(s for s in self.specs if league_every(s) is None)
        return self if len(kept) == len(self.specs) else BuyerPool(kept)

    def draw(self, rng: np.random.Generator) -> str:
        spec = self.specs[int(rng.integers(len(self.specs)))]
        return _RANGE.sub(lambda m: f"{m['key']}={rng.uniform(float(m['lo']), float(m['hi'])):.3f}", spec)

    def factory(self, rng: np.random.Generator) -> NegotiatorFactory:
        return resolve(self.draw(rng))
