"""Held-out means held out: which seller arms are registered models trained against a buyer family that an
evaluation holds out. Their gains against that family are in-distribution, and the run and its report say so."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from nego.agents.model_registry import RegistryError, lookup
from nego.agents.registry import rule_family


def families(specs: Iterable[str]) -> set[str]:
    """The rule-based families among ``specs`` (model specs have none)."""
    return {f for f in (rule_family(s) for s in specs) if f is not None}


def trained_against(sellers: Sequence[str], held_out: Iterable[str]) -> dict[str, list[str]]:
    """For each seller that is a registered model whose training pool (``train_buyers`` in its registry record)
    shares a family with the ``held_out`` buyer specs: those families, sorted. Other sellers are left out."""
    held = families(held_out)
    out: dict[str, list[str]] = {}
    for seller in sellers:
        try:
            entry = lookup(seller)
        except RegistryError:
            continue  # an unreadable registry fails later, where the seller is resolved, with its own message
        pool = entry.config.get("train_buyers") if entry is not None else None
        if isinstance(pool, list) and (shared := sorted(held & families(map(str, pool)))):
            out[seller] = shared
    return out


def warning_lines(overlap: dict[str, list[str]]) -> list[str]:
    """One sentence per affected arm."""
    return [
        f"{arm} was trained against buyer famil{'ies' if len(fams) > 1 else 'y'} {', '.join(fams)}, which this "
        "evaluation holds out: its results against them are not out-of-distribution"
        for arm, fams in overlap.items()
    ]
