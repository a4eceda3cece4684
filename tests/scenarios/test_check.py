"""check_scenario catches the faults it promises to catch."""

from __future__ import annotations

from dataclasses import replace

import pytest
from nego.scenarios.check import ScenarioCheckError, check_scenario
from nego.scenarios.scenario import Role, Scenario, ScenarioView

from tests.conftest import make_widget_scenario


def test_a_conforming_scenario_passes() -> None:
    check_scenario(make_widget_scenario(seller_brief="sell high", buyer_brief="buy low"))


def test_a_false_zopa_flag_is_caught() -> None:
    s = make_widget_scenario()
    no_zone = replace(s, seller=replace(s.seller, reservation=0.99), buyer=replace(s.buyer, reservation=0.99))
    with pytest.raises(ScenarioCheckError, match="says it has a zone of agreement"):
        check_scenario(no_zone)
    check_scenario(replace(no_zone, zopa=False))


def test_a_leaky_view_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    s = make_widget_scenario(seller_brief="sell high", buyer_brief="buy low")

    def leaky(self: Scenario, role: Role) -> ScenarioView:
        role = Role(role)
        own = self.seller_brief if role is Role.SELLER else self.buyer_brief
        leaked = self.context + " " + self.buyer_brief
        return ScenarioView(
            self.id, role, self.product, leaked, self.issues, self.preferences(role), own, self.max_rounds, self.opener
        )

    monkeypatch.setattr(Scenario, "view_for", leaky)
    with pytest.raises(ScenarioCheckError, match="seller view exposes the buyer's brief"):
        check_scenario(s)


def test_check_errors_are_assertion_errors() -> None:
    assert issubclass(ScenarioCheckError, AssertionError)
