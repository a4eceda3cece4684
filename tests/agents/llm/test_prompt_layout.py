"""The default prompt's layout serves prefix caching: negotiations of one role share a long opening, and a later
turn's prompt repeats an earlier one's up to the lines that change every turn. It carries what version 1 does."""

from __future__ import annotations

import asyncio
import itertools

from hypothesis import given, settings
from hypothesis import strategies as st
from nego.agents.llm.prompts import DEFAULT_TEMPLATE, load_template
from nego.agents.registry import resolve
from nego.market.protocol import run_negotiation
from nego.market.types import Action, Observation
from nego.scenarios.generator import generate_scenario
from nego.scenarios.scenario import Role

V1, V2 = load_template("negotiator-v1"), load_template("negotiator-v2")


def common_prefix(a: str, b: str) -> int:
    return sum(1 for _ in itertools.takewhile(lambda pair: pair[0] == pair[1], zip(a, b, strict=False)))


def first_prompt(template, seed: int, index: int, role: Role, tools: bool) -> tuple[str, str]:
    view = generate_scenario(seed, index=index).view_for(role)
    system, user = template.render(Observation(view, (), 1, None), tools=tools)
    return system.content, user.content


def test_v2_is_the_default_and_v1_still_loads_by_name():
    assert DEFAULT_TEMPLATE == "negotiator-v2" and load_template().id == V2.id
    assert V1.id.startswith("negotiator-v1:") and V1.id != V2.id


def test_v2_carries_exactly_the_fields_of_v1():
    def fields(template) -> set[str]:
        return set(template.system.get_identifiers()) | set(template.user.get_identifiers())

    assert fields(V2) == fields(V1)
    # the fields that change every turn stay out of the system message, which then never changes
    assert set(V2.system.get_identifiers()).isdisjoint({"round", "rounds_left_text", "history", "standing_offer"})


@settings(max_examples=30, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    indices=st.lists(st.integers(0, 50), min_size=2, max_size=2, unique=True),
    role=st.sampled_from(Role),
    tools=st.booleans(),
)
def test_two_negotiations_of_one_role_share_a_long_opening(seed, indices, role, tools):
    (a, _), (b, _) = (first_prompt(V2, seed, i, role, tools) for i in indices)
    shared = common_prefix(a, b)
    # everything before the deal itself is shared: the protocol, what a turn can be, the reply format's start
    assert "A message you attach is shown to the" in a[:shared]
    assert shared >= 0.2 * min(len(a), len(b))
    (a1, _), (b1, _) = (first_prompt(V1, seed, i, role, tools) for i in indices)
    assert shared > common_prefix(a1, b1)  # v1 shares only up to the product name (more for one product)


class Recording:
    """A rule-based negotiator that keeps every observation it is shown."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.seen: list[Observation] = []

    async def act(self, obs: Observation) -> Action:
        self.seen.append(obs)
        return await self.inner.act(obs)


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 10_000), opener=st.sampled_from(Role), tools=st.booleans())
def test_a_later_turn_repeats_the_earlier_prompt_up_to_the_lines_of_the_turn(seed, opener, tools):
    scenario = generate_scenario(seed, max_rounds=6, opener=opener)
    seller = Recording(resolve("boulware")(Role.SELLER, seed))
    asyncio.run(run_negotiation(scenario, seller, resolve("tft")(Role.BUYER, seed), seed=seed))
    texts = [[m.content for m in V2.render(obs, tools=tools)] for obs in seller.seen]
    assert len(texts) >= 2
    for (sys1, user1), (sys2, user2), obs in zip(texts, texts[1:], seller.seen, strict=False):
        assert sys2 == sys1
        per_turn = user1.index(f"\n\nRound {obs.round} of ")
        kept = user1[:per_turn] if obs.history else "What has happened so far:\n"
        assert user2.startswith(kept)
