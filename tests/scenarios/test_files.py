"""Scenario files: round trips, and malformed files refused with the file, the field and the fix named."""

from __future__ import annotations

import copy
import json
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from nego.scenarios.check import check_scenario
from nego.scenarios.files import (
    ScenarioFileError,
    builtin_scenarios,
    dumps_toml,
    load_scenario,
    load_scenarios,
    save_scenario,
)
from nego.scenarios.generator import generate_scenario
from nego.scenarios.io import scenario_to_dict
from nego.scenarios.scenario import Scenario

from tests.conftest import make_widget_scenario


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.integers(0, 10_000), st.sampled_from(["toml", "json"]), st.booleans())
def test_generated_scenarios_round_trip_through_files(tmp_path: Path, seed: int, fmt: str, zopa: bool) -> None:
    s = generate_scenario(seed, zopa=zopa)
    path = save_scenario(s, tmp_path / f"{seed}.{fmt}")
    back = load_scenario(path)
    assert back == s and back.content_hash() == s.content_hash()


@given(st.text(), st.text(min_size=1))
def test_toml_writer_escapes_any_text(text: str, key: str) -> None:
    data = {"brief": text, "table": {key: text}, "deep": {"inner": {"x": {key: 1.5}}}}
    assert tomllib.loads(dumps_toml(data)) == data


def test_builtin_examples_load_and_conform() -> None:
    examples = dict(builtin_scenarios())
    assert len(examples) >= 3
    assert any(not s.zopa for s in examples.values())
    assert [s.id for s in load_scenarios("builtin")] == [s.id for s in examples.values()]
    for s in examples.values():
        check_scenario(s)


def _widget_dict() -> dict[str, Any]:
    return scenario_to_dict(make_widget_scenario())


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def apply(d: dict[str, Any]) -> None:
        *head, last = path.split("/")
        for key in head:
            d = d[int(key)] if isinstance(d, list) else d[key]
        if value is _DELETE:
            del d[last]
        else:
            d[last] = value

    return apply


_DELETE = object()

MALFORMED = [
    ("issues/0/kind", "range", "issues[0].kind", "use one of int, float, categorical"),
    ("seller/weights/price", 0.9, "seller.weights", "divide each weight by 1.3"),
    ("buyer/reservation", 1.5, "buyer.reservation", "between 0 and 1"),
    ("seller/values/warranty", {"none": 1.0, "1y": 0.5}, "seller.values.warranty", "name each option once"),
    ("buyer/values/warranty", {"none": 1.0, "1y": 0.5, "2y": 1.5}, "buyer.values.warranty.2y", "between 0 and 1"),
    ("seller/values/price", "up", "seller.values.price", '"increasing"'),
    ("product", _DELETE, "product", 'add product = "..."'),
    ("colour", "red", "colour", "remove it"),
    ("seller/walkaway", 0.2, "seller.walkaway", "remove it"),
    ("buyer/weights/colour", 0.0, "buyer.weights.colour", "remove it"),
    ("issues/0/high", 152, "issues[0].high", "set high = 150"),
    ("issues/2/options", ["none"], "issues[2].options", "at least 2"),
    ("max_rounds", 0, "max_rounds", "max_rounds = 10"),
    ("opener", "both", "opener", 'opener = "seller"'),
]


@pytest.mark.parametrize(("path", "value", "field", "fix"), MALFORMED, ids=[m[2] for m in MALFORMED])
@pytest.mark.parametrize("fmt", ["toml", "json"])
def test_malformed_file_names_file_field_and_fix(
    tmp_path: Path, fmt: str, path: str, value: Any, field: str, fix: str
) -> None:
    data = _widget_dict()
    _set(path, value)(data)
    file = tmp_path / f"bad.{fmt}"
    file.write_text(dumps_toml(data) if fmt == "toml" else json.dumps(data))
    with pytest.raises(ScenarioFileError) as err:
        load_scenario(file)
    message = str(err.value)
    assert str(file) in message and f": {field}: " in message and fix in message
    assert isinstance(err.value, ValueError)


def test_a_false_zopa_claim_is_refused_and_a_missing_one_is_computed(tmp_path: Path) -> None:
    data = _widget_dict()
    data["seller"]["reservation"] = data["buyer"]["reservation"] = 0.95
    file = tmp_path / "greedy.toml"
    file.write_text(dumps_toml(data))
    with pytest.raises(ScenarioFileError, match=r"greedy\.toml: zopa: .*zopa = false"):
        load_scenario(file)
    del data["zopa"]
    file.write_text(dumps_toml(data))
    assert load_scenario(file).zopa is False


def test_syntax_errors_and_unknown_suffixes(tmp_path: Path) -> None:
    broken = tmp_path / "broken.toml"
    broken.write_text('id = "x"\nproduct = \n')
    with pytest.raises(ScenarioFileError, match=r"broken\.toml: \(syntax\): not valid TOML"):
        load_scenario(broken)
    with pytest.raises(ScenarioFileError, match=r"use \.toml or \.json"):
        load_scenario(tmp_path / "scenario.yaml")
    with pytest.raises(ValueError, match=r"use \.toml or \.json"):
        save_scenario(make_widget_scenario(), tmp_path / "out.yaml")


def test_directory_load_is_all_or_nothing_and_reports_every_bad_file(tmp_path: Path) -> None:
    save_scenario(generate_scenario(1), tmp_path / "a.toml")
    save_scenario(generate_scenario(2), tmp_path / "b.json")
    assert len(load_scenarios(tmp_path)) == 2
    for name, key in (("c.toml", "seller"), ("d.json", "buyer")):
        data = copy.deepcopy(_widget_dict())
        data["id"] = name
        data[key]["reservation"] = -1
        save_text = dumps_toml(data) if name.endswith("toml") else json.dumps(data)
        (tmp_path / name).write_text(save_text)
    with pytest.raises(ScenarioFileError) as err:
        load_scenarios(tmp_path)
    files = {Path(p.file).name for p in err.value.problems}
    assert files == {"c.toml", "d.json"}
    assert {p.field for p in err.value.problems} == {"seller.reservation", "buyer.reservation"}


def test_duplicate_ids_in_a_directory_are_refused(tmp_path: Path) -> None:
    s: Scenario = generate_scenario(3)
    save_scenario(s, tmp_path / "one.toml")
    save_scenario(s, tmp_path / "two.json")
    with pytest.raises(ScenarioFileError, match=r"two\.json: id: .*already used"):
        load_scenarios(tmp_path)
