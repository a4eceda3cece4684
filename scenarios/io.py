"""Scenarios as plain data: dicts for TOML/JSON files, with validation at the edge."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .issues import Issue, IssueKind
from .limits import (
    MAX_ROUNDS,
    is_finite_number,
    numeric_range_problem,
    options_problem,
    outcomes_problem,
    rounds_problem,
)
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


# Validation of untrusted data (a file a person wrote): every problem is reported with its field path and a fix.

_TOP_FIELDS = (
    "id",
    "category",
    "product",
    "context",
    "max_rounds",
    "opener",
    "zopa",
    "tags",
    "issues",
    "seller",
    "buyer",
)
_ISSUE_FIELDS = ("name", "kind", "low", "high", "step", "options", "unit", "description")
_SIDE_FIELDS = ("brief", "reservation", "weights", "values")

Problems = list[tuple[str, str, str]]
"""(field path, what is wrong, how to fix it)."""


def normalise_scenario(data: Mapping[str, Any]) -> tuple[dict[str, Any], Problems]:
    """Check untrusted scenario data field by field; return a clean dict for :func:`scenario_from_dict` and the
    problems found (the dict is only meaningful when there are none)."""
    problems: Problems = []
    _unknown(data, _TOP_FIELDS, "", problems)
    clean: dict[str, Any] = {}
    clean["id"] = _text(data, "id", "", problems, required=True, fix='add id = "a-short-name"')
    for key in ("category", "product", "context"):
        value = _text(data, key, "", problems, required=key == "product", fix=f'add {key} = "..."')
        if value is not None:
            clean[key] = value
    if "max_rounds" in data:
        rounds = data["max_rounds"]
        if not _is_int(rounds) or rounds_problem(rounds):
            problems.append(
                ("max_rounds", f"must be a whole number in 1..{MAX_ROUNDS}, got {rounds!r}", "use e.g. max_rounds = 10")
            )
        clean["max_rounds"] = rounds
    if "opener" in data:
        if data["opener"] not in ("seller", "buyer"):
            problems.append(("opener", f"must be 'seller' or 'buyer', got {data['opener']!r}", 'use opener = "seller"'))
        clean["opener"] = data["opener"]
    if "zopa" in data:
        if not isinstance(data["zopa"], bool):
            problems.append(("zopa", f"must be true or false, got {data['zopa']!r}", "use zopa = true"))
        clean["zopa"] = data["zopa"]
    if "tags" in data:
        tags = data["tags"]
        if not isinstance(tags, list) or not all(isinstance(t, str) for t in tags):
            problems.append(("tags", f"must be a list of strings, got {tags!r}", 'use tags = ["a", "b"]'))
        clean["tags"] = tags
    issues, broken = _issues(data.get("issues"), problems)
    clean["issues"] = issues
    for side in ("seller", "buyer"):
        clean[side] = _side(data.get(side), side, issues, broken, problems)
    return clean, problems


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_number(x: Any) -> bool:
    return is_finite_number(x)


def _unknown(table: Mapping[str, Any], known: tuple[str, ...], prefix: str, problems: Problems) -> None:
    for key in table:
        if key not in known:
            name = key if key.strip() else repr(key)  # an empty or blank key is still named, quoted
            problems.append((f"{prefix}{name}", "unknown field", f"remove it or use one of: {', '.join(known)}"))


def _text(data: Mapping[str, Any], key: str, prefix: str, problems: Problems, *, required: bool, fix: str) -> Any:
    if key not in data:
        if required:
            problems.append((f"{prefix}{key}", "missing", fix))
        return None
    if not isinstance(data[key], str) or (required and not data[key].strip()):
        problems.append((f"{prefix}{key}", f"must be a non-empty string, got {data[key]!r}", fix))
    return data[key]


def _issues(raw: Any, problems: Problems) -> tuple[list[dict[str, Any]], set[str]]:
    """The valid issues, and the names of those with a problem (the sides' entries for them are not checked, so
    one bad issue is reported once)."""
    if raw is None:
        problems.append(("issues", "missing", "add at least one [[issues]] table with name and kind"))
        return [], set()
    if not isinstance(raw, list) or not raw or not all(isinstance(i, Mapping) for i in raw):
        problems.append(("issues", "must be a non-empty list of tables", "write each issue as an [[issues]] table"))
        return [], set()
    out: list[dict[str, Any]] = []
    broken: set[str] = set()
    names: set[str] = set()
    sizes: list[int] = []
    for k, item in enumerate(raw):
        issue, size = _issue(item, f"issues[{k}].", problems)
        if issue is None:
            if isinstance(item.get("name"), str):
                broken.add(item["name"])
            continue
        if issue["name"] in names:
            problems.append(
                (f"issues[{k}].name", f"duplicate issue name {issue['name']!r}", "give each issue its own name")
            )
            continue
        names.add(issue["name"])
        out.append(issue)
        sizes.append(size)
    too_many = outcomes_problem(sizes)
    if too_many:
        problems.append(("issues", too_many, "use coarser steps, fewer options or fewer issues"))
    return out, broken - names


def _issue(item: Mapping[str, Any], at: str, problems: Problems) -> tuple[dict[str, Any] | None, int]:
    before = len(problems)
    _unknown(item, _ISSUE_FIELDS, at, problems)
    name = item.get("name")
    if not isinstance(name, str) or not name or not name.replace("_", "").isalnum():
        problems.append(
            (f"{at}name", f"must be an identifier (letters, digits, _), got {name!r}", 'use name = "price"')
        )
        return None, 1
    kind = item.get("kind")
    kinds = [k.value for k in IssueKind]
    if kind not in kinds:
        problems.append((f"{at}kind", f"issue {name!r}: unknown kind {kind!r}", f"use one of {', '.join(kinds)}"))
        return None, 1
    clean: dict[str, Any] = {"name": name, "kind": kind}
    for key in ("unit", "description"):
        if key in item:
            if not isinstance(item[key], str):
                problems.append((f"{at}{key}", f"must be a string, got {item[key]!r}", f'use {key} = "..."'))
            clean[key] = item[key]
    if kind == IssueKind.CATEGORICAL.value:
        size = _categorical_issue(item, name, at, clean, problems)
    else:
        size = _numeric_issue(item, name, kind, at, clean, problems)
    return (clean if len(problems) == before else None), size


def _categorical_issue(item: Mapping[str, Any], name: str, at: str, clean: dict[str, Any], problems: Problems) -> int:
    for key in ("low", "high", "step"):
        if key in item:
            problems.append((f"{at}{key}", f"categorical issue {name!r} takes options, not {key}", f"remove {key}"))
    options = item.get("options")
    ok = isinstance(options, list) and all(isinstance(o, str) and o for o in options)
    if not ok or len(options) < 2 or len(set(options)) != len(options):
        problems.append(
            (
                f"{at}options",
                f"issue {name!r} needs at least 2 distinct option names, got {options!r}",
                'use options = ["a", "b"]',
            )
        )
        return 1
    limit = options_problem(len(options))
    if limit:
        problems.append((f"{at}options", f"issue {name!r}: {limit.message}", limit.fix))
        return 1
    clean["options"] = list(options)
    return len(options)


def _numeric_issue(
    item: Mapping[str, Any], name: str, kind: str, at: str, clean: dict[str, Any], problems: Problems
) -> int:
    if "options" in item:
        problems.append((f"{at}options", f"{kind} issue {name!r} takes low/high/step, not options", "remove options"))
    low, high, step = item.get("low"), item.get("high"), item.get("step")
    for key, value in (("low", low), ("high", high)):
        if not _is_number(value):
            problems.append((f"{at}{key}", f"issue {name!r} needs a finite number, got {value!r}", f"add {key} = ..."))
    if step is not None and (not _is_number(step) or step <= 0):
        problems.append((f"{at}step", f"issue {name!r}: step must be a positive number, got {step!r}", "use step = 1"))
        return 1
    if not (_is_number(low) and _is_number(high)):
        return 1
    integer = kind == IssueKind.INT.value
    if integer:
        step = 1 if step is None else step
        if not all(float(x).is_integer() for x in (low, high, step)):
            problems.append((f"{at}step", f"int issue {name!r} needs whole low, high and step", "use whole numbers"))
            return 1
        low, high, step = int(low), int(high), int(step)
    limit = numeric_range_problem(integer, low, high, step)
    if limit is None and step is None:
        limit = numeric_range_problem(integer, low, high, (high - low) / 20)
    if limit is not None:
        problems.append((f"{at}{limit.field}", f"issue {name!r}: {limit.message}", limit.fix))
        return 1
    if integer:
        if (high - low) % step:
            fix = f"set high = {low + (high - low) // step * step} or pick a step that divides {high - low}"
            problems.append((f"{at}high", f"issue {name!r}: high - low must be a multiple of step {step}", fix))
            return 1
        clean.update(low=low, high=high, step=step)
        return (high - low) // step + 1
    clean.update(low=float(low), high=float(high))
    if step is not None:
        clean["step"] = float(step)
        return round((high - low) / step) + 1
    return 21


def _side(raw: Any, side: str, issues: list[dict[str, Any]], broken: set[str], problems: Problems) -> dict[str, Any]:
    if not isinstance(raw, Mapping):
        problems.append((side, "missing" if raw is None else "must be a table", f"add a [{side}] table"))
        return {}
    _unknown(raw, _SIDE_FIELDS, f"{side}.", problems)
    clean: dict[str, Any] = {}
    brief = raw.get("brief", "")
    if not isinstance(brief, str):
        problems.append((f"{side}.brief", f"must be a string, got {brief!r}", f'use brief = "..." under [{side}]'))
    clean["brief"] = brief
    rv = raw.get("reservation")
    if not _is_number(rv) or not 0.0 <= rv <= 1.0:
        got = "missing" if rv is None else f"must lie in [0, 1], got {rv!r}"
        problems.append(
            (f"{side}.reservation", got, f"set reservation = 0.3 (a utility between 0 and 1) under [{side}]")
        )
    else:
        clean["reservation"] = float(rv)
    clean["weights"] = _weights(raw.get("weights"), side, issues, broken, problems)
    clean["values"] = _values(raw.get("values"), side, issues, broken, problems)
    return clean


def _weights(
    raw: Any, side: str, issues: list[dict[str, Any]], broken: set[str], problems: Problems
) -> dict[str, float]:
    at = f"{side}.weights"
    if not isinstance(raw, Mapping):
        problems.append((at, "missing" if raw is None else "must be a table", f"add [{at}] with one number per issue"))
        return {}
    names = [i["name"] for i in issues]
    for key in raw:
        if key not in names and key not in broken:
            problems.append((f"{at}.{key}", "not an issue of this scenario", f"remove it or use one of {names}"))
    missing = [n for n in names if n not in raw]
    if missing:
        problems.append((at, f"no weight for {missing}", "give every issue a weight (0 is allowed)"))
    bad = {k: v for k, v in raw.items() if not _is_number(v) or v < 0}
    for key, value in bad.items():
        problems.append((f"{at}.{key}", f"must be a non-negative number, got {value!r}", "use a number such as 0.25"))
    if bad or missing or broken:  # with an issue left out, the sum says nothing
        return {}
    total = sum(float(raw[n]) for n in names)
    if abs(total - 1.0) > 1e-6:
        fix = f"divide each weight by {total:.6g}" if total > 0 else "give at least one issue a positive weight"
        problems.append((at, f"weights must sum to 1, they sum to {total:.6g}", fix))
    return {n: float(raw[n]) for n in names}


def _values(raw: Any, side: str, issues: list[dict[str, Any]], broken: set[str], problems: Problems) -> dict[str, Any]:
    at = f"{side}.values"
    if not isinstance(raw, Mapping):
        problems.append((at, "missing" if raw is None else "must be a table", f"add [{at}] with one entry per issue"))
        return {}
    by_name = {i["name"]: i for i in issues}
    for key in raw:
        if key not in by_name and key not in broken:
            problems.append(
                (f"{at}.{key}", "not an issue of this scenario", f"remove it or use one of {list(by_name)}")
            )
    clean: dict[str, Any] = {}
    for name, issue in by_name.items():
        value = raw.get(name)
        field = f"{at}.{name}"
        if issue["kind"] != IssueKind.CATEGORICAL.value:
            if value not in ("increasing", "decreasing"):
                problems.append(
                    (field, f"must be 'increasing' or 'decreasing', got {value!r}", f'use {name} = "increasing"')
                )
            clean[name] = value
            continue
        options = issue["options"]
        if not isinstance(value, Mapping):
            problems.append(
                (
                    field,
                    f"needs a value in [0, 1] for each option {options}",
                    f"use {name} = {{ {options[0]} = 1.0, ... }}",
                )
            )
            continue
        extra = [k for k in value if k not in options]
        lacking = [o for o in options if o not in value]
        if extra or lacking:
            problems.append(
                (
                    field,
                    f"options must be exactly {options}; unknown {extra}, missing {lacking}",
                    "name each option once",
                )
            )
        for opt, v in value.items():
            if not _is_number(v) or not 0.0 <= v <= 1.0:
                problems.append(
                    (f"{field}.{opt}", f"must be a number in [0, 1], got {v!r}", "use a value between 0 and 1")
                )
        clean[name] = dict(value)
    return clean
