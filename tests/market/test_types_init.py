"""The protocol's records are frozen dataclasses with a faster ``__init__``: they must behave as the generated one."""

from __future__ import annotations

import dataclasses
import inspect
import pickle

import pytest
from nego.market.types import Action, ActionKind, Observation, Offer, PublicMove, Turn
from nego.scenarios.scenario import Role


@pytest.mark.parametrize("cls", [Action, PublicMove, Observation, Turn])
def test_signature_and_defaults_are_the_dataclass_fields(cls):
    params = list(inspect.signature(cls).parameters.values())
    assert [p.name for p in params] == [f.name for f in dataclasses.fields(cls)]
    for p, f in zip(params, dataclasses.fields(cls), strict=True):
        assert p.default is (inspect.Parameter.empty if f.default is dataclasses.MISSING else f.default)


def test_records_stay_frozen_equal_hashable_and_picklable():
    offer = Offer({"price": 10})
    action = Action(ActionKind.OFFER, offer, message="hi")
    assert action == Action(kind=ActionKind.OFFER, offer=offer, message="hi")
    assert hash(action) == hash(Action(ActionKind.OFFER, offer, "hi"))
    turn = Turn(0, 1, Role.SELLER, 0, action, True, utility_buyer=0.25)
    assert (turn.feedback, turn.utility_seller, turn.utility_buyer) == (None, None, 0.25)
    with pytest.raises(dataclasses.FrozenInstanceError):
        turn.valid = False
    assert pickle.loads(pickle.dumps(turn)) == turn
    assert dataclasses.replace(turn, valid=False).valid is False
    with pytest.raises(TypeError):
        Turn(0, 1, Role.SELLER)  # required fields are still required
    move = PublicMove(1, Role.BUYER, ActionKind.ACCEPT, None)
    assert move.message == ""
