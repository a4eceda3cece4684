"""A seeded scenario generator over the product categories of :mod:`nego.scenarios.catalog`.

Every scenario draws from its own ``numpy.random.default_rng([seed, index])``, so scenario ``index`` of a suite is
the same whether it is generated alone or with its neighbours, and nothing touches a global random state.

The ``opposition`` knob in [0, 1] shapes the two sides' preferences: at 1 both sides weight the issues alike and
want opposite things on every issue (nearly zero-sum); towards 0 the buyer cares most about what the seller cares
least about (room for trade-offs), categorical options are valued alike by both, and some numeric issues become
shared interests. The measured opposition of the result is :attr:`ScenarioAnalysis.opposition`.
"""

from __future__ import annotations

import math
import re
import string
from dataclasses import dataclass

import numpy as np

from .analysis import compute_utilities
from .catalog import CATEGORIES, FILLERS, CategoricalSpec, Category, IssueSpec, NumericSpec, category
from .issues import Issue, IssueKind, Value
from .limits import rounds_problem
from .preferences import Preferences, ValueFunction
from .scenario import Role, Scenario

RESERVATION_RANGE = (0.2, 0.5)
"""Reservation values of scenarios with a zone of agreement are drawn uniformly from this range."""

_ID_PATTERN = re.compile(r"^(?P<cat>[a-z_]+)-(?P<seed>\d+)-(?P<index>\d+)(?:-o(?P<opp>[0-9.e-]+))?(?P<nz>-nozopa)?$")


@dataclass(frozen=True, slots=True)
class GeneratedId:
    """The recipe encoded in a generated scenario's id: enough to generate the same scenario again."""

    category: str
    seed: int
    index: int
    opposition: float | None = None
    zopa: bool = True

    def __str__(self) -> str:
        text = f"{self.category}-{self.seed}-{self.index}"
        if self.opposition is not None:
            text += f"-o{self.opposition!r}"
        return text if self.zopa else text + "-nozopa"

    @staticmethod
    def parse(text: str) -> GeneratedId | None:
        """The recipe in ``text``, or None if it is not a generated scenario id."""
        m = _ID_PATTERN.match(text)
        if m is None or m["cat"] not in {c.name for c in CATEGORIES}:
            return None
        try:
            opp = float(m["opp"]) if m["opp"] else None
        except ValueError:
            return None
        return GeneratedId(m["cat"], int(m["seed"]), int(m["index"]), opp, m["nz"] is None)


def generate_scenario(
    seed: int,
    *,
    index: int = 0,
    category: str | None = None,
    opposition: float | None = None,
    max_rounds: int = 10,
    opener: Role = Role.SELLER,
    zopa: bool = True,
) -> Scenario:
    """Scenario ``index`` of the stream for ``seed``: category and opposition are drawn unless given.

    With ``zopa=True`` (the default) the scenario has at least one outcome that both sides prefer to walking
    away; with ``zopa=False`` it is built to have none, and says so in ``Scenario.zopa``.
    """
    if seed < 0 or index < 0:
        raise ValueError(f"seed and index must be non-negative, got seed={seed}, index={index}")
    if opposition is not None and not 0.0 <= opposition <= 1.0:
        raise ValueError(f"opposition must lie in [0, 1], got {opposition}")
    rounds = rounds_problem(max_rounds)
    if rounds is not None:
        raise ValueError(f"max_rounds {rounds}")
    rng = np.random.default_rng([seed, index])
    # Always draw both, so that fixing one of them leaves the rest of the stream unchanged.
    drawn_category = CATEGORIES[int(rng.integers(len(CATEGORIES)))]
    drawn_opposition = float(rng.random())
    cat = drawn_category if category is None else _category(category)
    opp = drawn_opposition if opposition is None else float(opposition)
    specs = _choose_specs(cat, rng)
    issues = tuple(_make_issue(spec, rng) for spec in specs)
    seller_party = str(rng.choice(cat.seller_party))
    buyer_party = str(rng.choice(cat.buyer_party))
    fill = _fillers(cat, rng) | {"seller": seller_party, "buyer": buyer_party}
    product = cat.product.format_map(fill)
    context = _capitalise(cat.context.format_map(fill))
    seller, buyer = _preferences(specs, issues, opp, rng)
    rv_s, rv_b = _reservations(issues, seller, buyer, rng, zopa)
    seller = Preferences(seller.weights, seller.values, rv_s)
    buyer = Preferences(buyer.weights, buyer.values, rv_b)
    gid = GeneratedId(cat.name, seed, index, opposition if opposition is None else float(opposition), zopa)
    return Scenario(
        id=str(gid),
        product=product,
        context=context,
        issues=issues,
        seller=seller,
        buyer=buyer,
        max_rounds=max_rounds,
        opener=Role(opener),
        seller_brief=write_brief(Role.SELLER, seller_party, buyer_party, product, issues, seller),
        buyer_brief=write_brief(Role.BUYER, buyer_party, seller_party, product, issues, buyer),
        category=cat.name,
        zopa=zopa,
        tags=("generated", cat.segment.lower()),
    )


def generate_scenarios(
    n: int,
    seed: int,
    *,
    category: str | None = None,
    opposition: float | None = None,
    max_rounds: int = 10,
    opener: Role = Role.SELLER,
    zopa: bool = True,
) -> list[Scenario]:
    """Scenarios ``0 .. n-1`` of the stream for ``seed`` (see :func:`generate_scenario`)."""
    if n < 0:
        raise ValueError(f"n must be non-negative, got {n}")
    return [
        generate_scenario(
            seed,
            index=i,
            category=category,
            opposition=opposition,
            max_rounds=max_rounds,
            opener=opener,
            zopa=zopa,
        )
        for i in range(n)
    ]


def regenerate(scenario_id: str, *, max_rounds: int = 10, opener: Role = Role.SELLER) -> Scenario:
    """The generated scenario whose id is ``scenario_id``; raise KeyError if the id is not a generated one."""
    gid = GeneratedId.parse(scenario_id)
    if gid is None:
        raise KeyError(f"{scenario_id!r} is not a generated scenario id (expected CATEGORY-SEED-INDEX)")
    return generate_scenario(
        gid.seed,
        index=gid.index,
        category=gid.category,
        opposition=gid.opposition,
        max_rounds=max_rounds,
        opener=opener,
        zopa=gid.zopa,
    )


def _category(name: str) -> Category:
    try:
        return category(name)
    except KeyError as e:
        raise ValueError(e.args[0]) from None


def _choose_specs(cat: Category, rng: np.random.Generator) -> tuple[IssueSpec, ...]:
    optional = cat.issues[cat.required :]
    keep = rng.random(len(optional)) < 0.5
    return cat.issues[: cat.required] + tuple(s for s, k in zip(optional, keep, strict=True) if k)


def _nice_step(raw: float, integer: bool) -> float:
    """The 1-2-5 (or 1-2-2.5-5 for floats) step closest to ``raw`` on a log scale."""
    exp = math.floor(math.log10(raw))
    mantissas = (1.0, 2.0, 5.0, 10.0) if integer else (1.0, 2.0, 2.5, 5.0, 10.0)
    best = min(mantissas, key=lambda m: abs(math.log(m * 10**exp / raw)))
    step = best * 10**exp
    return max(1.0, round(step)) if integer else round(step, 10)


def _make_issue(spec: IssueSpec, rng: np.random.Generator) -> Issue:
    if isinstance(spec, CategoricalSpec):
        return Issue(spec.name, IssueKind.CATEGORICAL, options=spec.options, unit=spec.unit,
                     description=spec.description)  # fmt: skip
    lo_c, hi_c = spec.centre
    centre = math.exp(rng.uniform(math.log(lo_c), math.log(hi_c))) if hi_c > lo_c else lo_c
    points = int(rng.integers(spec.points[0], spec.points[1] + 1))
    integer = spec.kind is IssueKind.INT
    step = spec.step or _nice_step(2 * spec.spread * centre / (points - 1), integer)
    low = max(0.0, round(centre * (1 - spec.spread) / step) * step)
    if integer:
        low, step_i = int(low), int(step)
        return Issue(spec.name, IssueKind.INT, low=low, high=low + step_i * (points - 1), step=step_i,
                     unit=spec.unit, description=spec.description)  # fmt: skip
    low = round(low, 10)
    return Issue(spec.name, IssueKind.FLOAT, low=low, high=round(low + step * (points - 1), 10), step=step,
                 unit=spec.unit, description=spec.description)  # fmt: skip


def _fillers(cat: Category, rng: np.random.Generator) -> dict[str, str]:
    names = [f for text in (cat.product, cat.context) for _, f, _, _ in string.Formatter().parse(text) if f]
    fill: dict[str, str] = {}
    for name in dict.fromkeys(names):
        if name in ("seller", "buyer"):
            continue
        choices = FILLERS[name]
        if isinstance(choices[0], tuple):
            lo, hi, step = choices[0]
            fill[name] = str(lo + step * int(rng.integers((hi - lo) // step + 1)))
        else:
            fill[name] = str(rng.choice(choices))
    return fill


def _capitalise(text: str) -> str:
    return text[:1].upper() + text[1:]


def _round_weights(w: np.ndarray) -> dict[int, float]:
    """Weights rounded to 3 decimals that still sum to 1 (the largest absorbs the rounding)."""
    r = np.round(w, 3)
    r[int(np.argmax(r))] += 1.0 - r.sum()
    return {k: round(float(x), 6) for k, x in enumerate(r)}


def _minmax(t: np.ndarray) -> np.ndarray | None:
    span = t.max() - t.min()
    return None if span < 1e-9 else (t - t.min()) / span


def _preferences(
    specs: tuple[IssueSpec, ...], issues: tuple[Issue, ...], opp: float, rng: np.random.Generator
) -> tuple[Preferences, Preferences]:
    n = len(specs)
    prior_s = np.array([s.importance[0] for s in specs])
    prior_b = np.array([s.importance[1] for s in specs])
    w_s = 0.02 + (1 - 0.02 * n) * rng.dirichlet(8 * prior_s / prior_s.sum())
    own_b = 0.02 + (1 - 0.02 * n) * rng.dirichlet(8 * prior_b / prior_b.sum())
    # The complement gives the buyer's largest weight to the seller's least important issue: logrolling room.
    complement = np.empty(n)
    complement[np.argsort(w_s)] = np.sort(w_s)[::-1]
    own_share = 0.1 + 0.3 * (1 - opp)
    w_b = (1 - own_share) * (opp * w_s + (1 - opp) * complement) + own_share * own_b
    ws, wb = _round_weights(w_s), _round_weights(w_b / w_b.sum())
    v_s: dict[str, ValueFunction] = {}
    v_b: dict[str, ValueFunction] = {}
    for spec, issue in zip(specs, issues, strict=True):
        if isinstance(spec, NumericSpec):
            up = ValueFunction.increasing() if spec.seller_up else ValueFunction.decreasing()
            down = ValueFunction.decreasing() if spec.seller_up else ValueFunction.increasing()
            shared = spec.alignable and rng.random() < 0.7 * (1 - opp)
            v_s[issue.name], v_b[issue.name] = up, (up if shared else down)
        else:
            t_s, t_b = _option_tables(spec, opp, rng)
            v_s[issue.name] = ValueFunction.options(dict(zip(spec.options, t_s, strict=True)))
            v_b[issue.name] = ValueFunction.options(dict(zip(spec.options, t_b, strict=True)))
    names = [i.name for i in issues]
    seller = Preferences({names[k]: w for k, w in ws.items()}, v_s, 0.0)
    buyer = Preferences({names[k]: w for k, w in wb.items()}, v_b, 0.0)
    return seller, buyer


def _option_tables(spec: CategoricalSpec, opp: float, rng: np.random.Generator) -> tuple[list[float], list[float]]:
    m = len(spec.options)
    base_s = np.clip(np.array(spec.seller_values) + rng.normal(0, 0.1, m), 0, 1)
    t_s = _minmax(base_s)
    if t_s is None:
        t_s = np.array(spec.seller_values, dtype=float)
    conflict = 0.5 * (1 - t_s) + 0.5 * np.clip(np.array(spec.buyer_values) + rng.normal(0, 0.1, m), 0, 1)
    shared = np.clip(t_s + rng.normal(0, 0.15, m), 0, 1)
    t_b = _minmax(opp * conflict + (1 - opp) * shared)
    if t_b is None:
        t_b = _minmax(conflict)
    if t_b is None:
        t_b = 1 - t_s
    return [round(float(x), 2) for x in t_s], [round(float(x), 2) for x in t_b]


def _reservations(
    issues: tuple[Issue, ...], seller: Preferences, buyer: Preferences, rng: np.random.Generator, zopa: bool
) -> tuple[float, float]:
    probe = Scenario("probe", "", "", issues, seller, buyer)
    u_s, u_b = compute_utilities(probe)
    return _with_zopa(u_s, u_b, rng) if zopa else _without_zopa(u_s, u_b, rng)


def _with_zopa(u_s: np.ndarray, u_b: np.ndarray, rng: np.random.Generator) -> tuple[float, float]:
    for _ in range(50):
        rv_s, rv_b = (round(float(x), 3) for x in rng.uniform(*RESERVATION_RANGE, 2))
        if np.any((u_s >= rv_s) & (u_b >= rv_b)):
            return rv_s, rv_b
    # Rare on very opposed spaces with coarse grids: fall back to just below the best balanced outcome.
    best = float(np.max(np.minimum(u_s, u_b)))
    rv = math.floor(best * 0.9 * 1000) / 1000
    return rv, rv


def _without_zopa(u_s: np.ndarray, u_b: np.ndarray, rng: np.random.Generator) -> tuple[float, float]:
    for _ in range(20):
        rv_s = round(float(rng.uniform(0.35, 0.75)), 3)
        rv_b = _buyer_floor_above(u_s, u_b, rv_s, float(rng.uniform(0.02, 0.12)))
        if rv_b <= 1.0:
            return rv_s, rv_b
    # Integrative spaces can give both sides nearly everything: put the seller's floor at one of its own
    # achievable utilities instead, and the buyer's just above the best it can get there.
    candidates = []
    for level in np.unique(np.floor(u_s * 1000) / 1000):
        rv_b = _buyer_floor_above(u_s, u_b, float(level), 0.02)
        if rv_b <= 1.0:
            candidates.append((float(level), rv_b))
    if not candidates:
        raise ValueError("these preferences let both sides get their best outcome: no scenario without agreement")
    return candidates[int(rng.integers(len(candidates)))]


def _buyer_floor_above(u_s: np.ndarray, u_b: np.ndarray, rv_s: float, margin: float) -> float:
    """A buyer reservation just above the best the buyer can get among outcomes the seller accepts."""
    reachable = u_b[u_s >= rv_s]
    best_b = float(reachable.max()) if reachable.size else 0.0
    return math.ceil((best_b + margin) * 1000) / 1000


def write_brief(role: Role, party: str, other: str, product: str, issues: tuple[Issue, ...], prefs: Preferences) -> str:
    """A short private brief, in words, derived from one side's preferences: priorities and walk-away point."""
    verb = "selling" if role is Role.SELLER else "buying"
    prep = "to" if role is Role.SELLER else "from"
    ranked = sorted(issues, key=lambda i: -prefs.weights[i.name])
    parts = [f"{i.name} ({prefs.weights[i.name]:.0%}; {_wish(i, prefs.values[i.name])})" for i in ranked]
    return (
        f"You are {party}, {verb} {product} {prep} {other}. "
        f"What matters most to you, in order: {'; '.join(parts)}. "
        f"Your walk-away point: any deal worth less than {prefs.reservation:.0%} of your ideal deal is worse for "
        "you than no deal at all."
    )


def _wish(issue: Issue, vf: ValueFunction) -> str:
    if issue.kind is IssueKind.CATEGORICAL:
        table = dict(vf.table)
        order: list[Value] = sorted(issue.options, key=lambda o: -table[o])
        return f"best {order[0]}, worst {order[-1]}"
    unit = f" {issue.unit}" if issue.unit else ""
    want = "higher is better" if vf.direction is not None and vf.direction.value == "increasing" else "lower is better"
    return f"{want}, range {issue.low}-{issue.high}{unit}"
