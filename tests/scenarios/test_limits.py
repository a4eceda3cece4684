"""Untrusted scenario files: any mutation of a shipped file loads or is refused with a ScenarioFileError naming
the file; every limit is enforced with the field named; shipped and generated scenarios sit far inside them."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from nego.evaluation.suites import load_suite
from nego.scenarios.catalog import CATEGORIES, NumericSpec
from nego.scenarios.check import ScenarioCheckError, check_scenario
from nego.scenarios.files import ScenarioFileError, builtin_scenarios, dumps_toml, load_scenario, save_scenario
from nego.scenarios.generator import generate_scenario
from nego.scenarios.io import scenario_to_dict
from nego.scenarios.issues import Issue, IssueKind
from nego.scenarios.limits import MAX_ISSUE_POINTS, MAX_OUTCOMES, MAX_ROUNDS
from nego.scenarios.safeload import DataLimitError, loads_json, loads_toml

from tests.conftest import make_widget_scenario

DATA = Path(__file__).parents[2] / "scenarios" / "data"


def shipped_files() -> list[tuple[str, bytes]]:
    """The shipped TOML examples, and each as JSON too."""
    files = []
    for path in sorted(DATA.glob("*.toml")):
        files.append(("toml", path.read_bytes()))
        data = scenario_to_dict(load_scenario(path))
        files.append(("json", json.dumps(data, indent=1).encode()))
    return files


SHIPPED = shipped_files()
TOKENS = [
    b"1e-320", b"nan", b"inf", b"-1e308", b"1e308", b"9" * 5000, b"[" * 3000, b"{" * 3000, b"\xff\xfe", b"\xc3",
    b"1000000000", b"9223372036854775807", b"0.00000001", b"10000000", b"NaN", b"Infinity", b"1e400", b"-", b"0",
    b'"', b"\n", b"=", b",", b"]", b"}", b"[[issues]]\n",
]  # fmt: skip


@st.composite
def mutated_files(draw: st.DrawFn) -> tuple[str, bytes]:
    fmt, data = draw(st.sampled_from(SHIPPED))
    data = bytearray(data)
    for _ in range(draw(st.integers(1, 4))):
        pos = draw(st.integers(0, len(data)))
        how = draw(st.sampled_from(["byte", "insert", "delete", "value"]))
        if how == "byte" and data:
            data[min(pos, len(data) - 1)] = draw(st.integers(0, 255))
        elif how == "insert":
            data[pos:pos] = draw(st.sampled_from(TOKENS))
        elif how == "delete":
            del data[pos : pos + draw(st.integers(1, 8))]
        else:  # replace the value after the next '=' or ':' with a hostile token
            sep = max(data.find(b"=", pos), data.find(b":", pos))
            if sep >= 0:
                end = min((i for i in (data.find(b"\n", sep), data.find(b",", sep)) if i >= 0), default=len(data))
                data[sep + 1 : end] = b" " + draw(st.sampled_from(TOKENS))
    return fmt, bytes(data)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(mutated_files())
def test_a_mutated_shipped_file_loads_or_is_refused_naming_the_file(tmp_path: Path, mutated: tuple[str, bytes]):
    fmt, data = mutated
    path = tmp_path / f"mutated.{fmt}"
    path.write_bytes(data)
    try:
        scenario = load_scenario(path)
    except ScenarioFileError as e:
        assert e.problems and all(p.file == str(path) and p.field for p in e.problems)
        assert str(path) in str(e)
    else:
        assert scenario.max_rounds <= MAX_ROUNDS and scenario.outcome_count <= MAX_OUTCOMES


def _used_bike() -> str:
    return (DATA / "used_bike.toml").read_text()


@pytest.mark.parametrize(
    ("old", "new", "field", "message"),
    [
        ("step = 25.0", "step = 1e-320", "issues[0].step", "finer than 1e-09"),
        ("step = 25.0", "step = 0.00000001", "issues[0].step", "50,000,000,001 points (limit 10,000)"),
        ("step = 25.0", "step = 600.0", "issues[0].step", "wider than the range"),
        ("step = 25.0", "step = inf", "issues[0].step", "positive number, got inf"),
        ("low = 400.0", "low = -1e308", "issues[0].low", "beyond the limit of 1e+15"),
        ("low = 400.0", "low = nan", "issues[0].low", "needs a finite number, got nan"),
        ("high = 900.0", "high = 1e16", "issues[0].high", "beyond the limit of 1e+15"),
        ("max_rounds = 6", "max_rounds = 1000000000", "max_rounds", "must be a whole number in 1..1000"),
        ("max_rounds = 6", "max_rounds = 9223372036854775807", "max_rounds", "in 1..1000"),
        ("max_rounds = 6", "max_rounds = 1001", "max_rounds", "in 1..1000"),
        ("max_rounds = 6", "max_rounds = " + "9" * 5000, "(limits)", "an integer far longer than 20 digits"),
        ("max_rounds = 6", "max_rounds = " + "[" * 5000 + "]" * 5000, "(limits)", "nested deeper than 32"),
        ("max_rounds = 6", "max_rounds = " + "[" * 40 + "]" * 40, "max_rounds" + "[0]" * 31, "nested deeper than 32"),
        ("max_rounds = 6", "max_rounds = 123456789012345678901", "max_rounds", "more than 20 digits"),
    ],
)
def test_a_toml_file_past_a_limit_is_refused_naming_the_field(tmp_path: Path, old, new, field, message):
    text = _used_bike()
    assert old in text
    path = tmp_path / "bad.toml"
    path.write_text(text.replace(old, new, 1))
    with pytest.raises(ScenarioFileError) as err:
        load_scenario(path)
    # one problem: a bad issue is not reported again through the sides' weights and values
    assert [(p.file, p.field) for p in err.value.problems] == [(str(path), field)]
    assert message in err.value.problems[0].message


@pytest.mark.parametrize(
    ("replace_in_json", "field", "message"),
    [
        (lambda d: d.update(max_rounds=10**9), "max_rounds", "in 1..1000, got 1000000000"),
        (lambda d: d["issues"][0].update(low=0, high=10**7, step=1, kind="int"), "issues[0].step", "10,000,001"),
        (lambda d: d["issues"][1].update(options=[f"o{k}" for k in range(10_001)]), "issues[1].options", "10,001"),
        (lambda d: d.update(issues=d["issues"] + _issues(20)), "issues", "(limit 1,000,000)"),
    ],
    ids=["max_rounds", "int-range", "options", "outcomes"],
)
def test_a_json_file_past_a_limit_is_refused_naming_the_field(tmp_path: Path, replace_in_json, field, message):
    data = scenario_to_dict(load_scenario(DATA / "used_bike.toml"))
    replace_in_json(data)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ScenarioFileError) as err:
        load_scenario(path)
    assert any(p.field == field and message in p.message for p in err.value.problems), str(err.value)


def _issues(n: int) -> list[dict]:
    return [{"name": f"extra{k}", "kind": "int", "low": 0, "high": 9} for k in range(n)]


@pytest.mark.parametrize(
    ("raw", "field", "message"),
    [
        (b'id = "r\xffad"', "(file)", "not UTF-8 text: byte 0xff at offset 7"),
        (b'{"max_rounds": ' + b"9" * 5000 + b"}", "max_rounds", "an integer of 5,000 digits"),
        (b'{"issues": [{"low": NaN}]}', "issues[0].low", "NaN is not a JSON number"),
        (b'{"issues": [{"low": 1e400}]}', "issues[0].low", "the number 1e400 is out of range"),
        (b"[" * 100_000 + b"]" * 100_000, "(limits)", "nested deeper than 32"),
        (b"\xef\xbb\xbf{}", "(syntax)", "not valid JSON"),
    ],
    ids=["bad-utf8", "digits", "nan", "overflow", "nesting-bomb", "bom"],
)
def test_unreadable_text_is_refused_naming_the_file(tmp_path: Path, raw: bytes, field: str, message: str):
    path = tmp_path / ("bad.toml" if raw.startswith(b"id") else "bad.json")
    path.write_bytes(raw)
    with pytest.raises(ScenarioFileError) as err:
        load_scenario(path)
    problem = err.value.problems[0]
    assert (problem.file, problem.field) == (str(path), field) and message in problem.message


def test_a_huge_file_is_refused_before_it_is_read(tmp_path: Path):
    path = tmp_path / "huge.json"
    with path.open("wb") as f:
        f.truncate(5 << 20)
    with pytest.raises(ScenarioFileError, match=r"huge\.json: \(file\): larger than 4 MiB"):
        load_scenario(path)


def test_simulate_names_a_bad_utf8_scenario_file(tmp_path: Path):
    from nego.cli.app import app
    from typer.testing import CliRunner

    path = tmp_path / "bike.toml"
    path.write_bytes(_used_bike().encode().replace(b"road", b"r\xffad"))
    result = CliRunner().invoke(app, ["simulate", "--scenarios", str(path), "--out", str(tmp_path / "run")])
    text = " ".join(result.output.split())
    assert result.exit_code != 0 and "bike.toml" in text and "not UTF-8 text" in text, result.output


def test_shipped_and_generated_scenarios_sit_far_inside_the_limits():
    margin = 10
    scenarios = [s for _, s in builtin_scenarios()]
    for suite in ("eval-1152", "eval-dev"):
        scenarios += load_suite(suite).scenarios
    scenarios += [generate_scenario(seed, index=k) for seed in range(3) for k in range(30)]
    for s in scenarios:
        assert s.max_rounds * margin <= MAX_ROUNDS
        assert s.outcome_count * margin <= MAX_OUTCOMES
        assert all(i.size * margin <= MAX_ISSUE_POINTS for i in s.issues)
    # the generator's largest possible scenario: every issue of a category, each at its most points
    largest = max(
        math.prod(spec.points[1] if isinstance(spec, NumericSpec) else len(spec.options) for spec in cat.issues)
        for cat in CATEGORIES
    )
    assert largest * margin <= MAX_OUTCOMES


def test_the_core_types_and_the_generator_enforce_the_limits():
    with pytest.raises(ValueError, match=r"issue 'price': step: the range 0\.\.10000000"):
        Issue("price", IssueKind.INT, low=0, high=10_000_000)
    with pytest.raises(ValueError, match=r"step: step 1e-320 is finer"):
        Issue("rate", IssueKind.FLOAT, low=0.0, high=1.0, step=1e-320)
    with pytest.raises(ValueError, match=r"needs finite numbers"):
        Issue("rate", IssueKind.FLOAT, low=0.0, high=10**400)
    with pytest.raises(ValueError, match=r"finer than"):  # the default step (a twentieth) is too fine here
        Issue("rate", IssueKind.FLOAT, low=1e15 - 1, high=1e15)
    with pytest.raises(ValueError, match=r"max_rounds must lie in 1\.\.1000"):
        make_widget_scenario(max_rounds=1001)
    many = tuple(Issue(f"i{k}", IssueKind.INT, low=0, high=9) for k in range(7))
    with pytest.raises(ValueError, match=r"10,000,000 outcomes"):
        replace(make_widget_scenario(), issues=many)
    with pytest.raises(ValueError, match=r"max_rounds must lie in 1\.\.1000"):
        generate_scenario(0, max_rounds=10**6)


def test_check_scenario_catches_a_scenario_altered_past_the_limits():
    s = make_widget_scenario()
    object.__setattr__(s, "max_rounds", 5000)
    with pytest.raises(ScenarioCheckError, match=r"max_rounds must lie in 1\.\.1000"):
        check_scenario(s)


def test_a_generated_scenario_round_trips_through_both_formats_within_the_limits(tmp_path: Path):
    s = generate_scenario(4, max_rounds=MAX_ROUNDS)
    for fmt in ("toml", "json"):
        assert load_scenario(save_scenario(s, tmp_path / f"s.{fmt}")) == s
    assert dumps_toml(scenario_to_dict(s)).count("max_rounds = 1000") == 1


@pytest.mark.parametrize(
    ("text", "path", "reason"),
    [
        ('{"a": [1, {"b": ' + "9" * 21 + "}]}", "a[1].b", "an integer of 21 digits"),
        ('{"a": -' + "9" * 20 + "}", "", ""),
        ('{"a": ' + "[" * 32 + "]" * 32 + "}", "a" + "[0]" * 31, "nested deeper than 32"),
        ('{"a": -Infinity}', "a", "-Infinity is not a JSON number"),
        ("{bad", "", "not valid JSON"),
    ],
)
def test_loads_json_names_the_path_of_what_it_refuses(text: str, path: str, reason: str):
    if not reason:
        assert loads_json(text) == {"a": -int("9" * 20)}
        return
    with pytest.raises(DataLimitError) as err:
        loads_json(text)
    assert err.value.path == path and reason in err.value.reason


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3),
    max_leaves=20,
)


@given(JSON_VALUES)
def test_loads_json_gives_the_data_or_a_data_limit_error(value):
    text = json.dumps(value)
    try:
        parsed = loads_json(text)
    except DataLimitError as e:  # NaN, infinities and integers past 20 digits
        assert "not a JSON number" in e.reason or "digits" in e.reason
    else:
        assert parsed == json.loads(text)


def test_loads_toml_refuses_what_tomllib_would_choke_on():
    with pytest.raises(DataLimitError, match="nested deeper than 32"):
        loads_toml("a = " + "[" * 5000 + "]" * 5000)
    with pytest.raises(DataLimitError, match="far longer than 20 digits"):
        loads_toml("a = " + "9" * 5000)
    assert loads_toml("a = nan")["a"] != 0  # non-finite floats are left to the field checks
