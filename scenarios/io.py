"""Scenarios as plain data: dicts for TOML/JSON files, with validation at the edge."""

from __future__ import annotations

from typing import Any

from .issues import Issue, IssueKind
from .preferences import Direction, Preferences, ValueFunction
from .scenario import Role, Scenario


def issue_to_dict(issue: Issue) -> dict[str, Any]:
    d: dict[str, Any] = {"name": issue.name, "kind": issue.kind.value}
    if issue.kind is IssueKind.CATEGORICAL:
        d["options"] = list(issue.options)
    else:
        d.update(low=issue.low, high=issue.high, step=issue.step)
    if issue.unit:
        d["unit"] = issue.unit
    if issue.description:
        d["description"] = issue.description
    return d


def preferences_to_dict(prefs: Preferences, issues: tuple[Issue, ...]) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for issue in issues:
        vf = prefs.values[issue.name]
        values[issue.name] = dict(vf.table) if issue.kind is IssueKind.CATEGORICAL else vf.direction.value
    return {
        "reservation": prefs.reservation,
        "weights": {i.name: prefs.weights[i.name] for i in issues},
        "values": values,
    }


def scenario_to_dict(s: Scenario) -> dict[str, Any]:
    return {
        "id": s.id,
        "category": s.category,
        "product": s.product,
        "context": s.context,
        "max_rounds": s.max_rounds,
        "opener": s.opener.value,
        "zopa": s.zopa,
        "tags": list(s.tags),
        "issues": [issue_to_dict(i) for i in s.issues],
        "seller": {"brief": s.seller_brief, **preferences_to_dict(s.seller, s.issues)},
        "buyer": {"brief": s.buyer_brief, **preferences_to_dict(s.buyer, s.issues)},
    }


def _prefs_from_dict(d: dict[str, Any], issues: tuple[Issue, ...]) -> Preferences:
    values = {}
    for issue in issues:
        v = d["values"][issue.name]
        if issue.kind is IssueKind.CATEGORICAL:
            values[issue.name] = ValueFunction.options({str(k): float(x) for k, x in v.items()})
        else:
            values[issue.name] = ValueFunction(direction=Direction(v))
    return Preferences(
        weights={k: float(w) for k, w in d["weights"].items()},
        values=values,
        reservation=float(d["reservation"]),
    )


def scenario_from_dict(d: dict[str, Any]) -> Scenario:
    """Build a scenario from trusted, already-validated data (see :func:`nego.scenarios.files.load_scenario`)."""
    issues = tuple(
        Issue(
            name=i["name"],
            kind=IssueKind(i["kind"]),
            low=i.get("low"),
            high=i.get("high"),
            step=i.get("step"),
            options=tuple(i.get("options", ())),
            unit=i.get("unit", ""),
            description=i.get("description", ""),
        )
        for i in d["issues"]
    )
    return Scenario(
        id=d["id"],
        product=d.get("product", ""),
        context=d.get("context", ""),
        issues=issues,
        seller=_prefs_from_dict(d["seller"], issues),
        buyer=_prefs_from_dict(d["buyer"], issues),
        max_rounds=int(d.get("max_rounds", 10)),
        opener=Role(d.get("opener", "seller")),
        seller_brief=d["seller"].get("brief", ""),
        buyer_brief=d["buyer"].get("brief", ""),
        category=d.get("category", "custom"),
        zopa=bool(d.get("zopa", True)),
        tags=tuple(d.get("tags", ())),
    )
