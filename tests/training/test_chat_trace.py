"""How a chat episode's ids are recorded: the sequence is always the latest rendering of the conversation, and of each
reply exactly the ids the rendering writes back as the model sampled them are trained."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from nego.agents.llm.backends.hf_engine import Generated
from nego.training.chat_rollout import ChatTrace, TemplateError

IDS = st.lists(st.integers(0, 9), max_size=8)


@settings(max_examples=200, deadline=None)
@given(prompt=st.lists(st.integers(0, 9), min_size=1, max_size=5), turns=st.lists(st.tuples(IDS, IDS), max_size=5))
def test_the_sequence_is_the_rendering_and_only_the_reproduced_sampled_ids_are_trained(prompt, turns):
    trace = ChatTrace()
    trace.extend(prompt)
    rendered = list(prompt)
    sampled_total = dropped = 0
    for sampled, written in turns:
        trace.generated(Generated(tuple(sampled), tuple(-float(i + 1) for i in range(len(sampled))), True))
        before = len(rendered)
        rendered = rendered + written  # the template writes the reply (maybe differently) and the next user turn
        trace.extend(rendered)
        assert trace.prompt + trace.ids == rendered
        same = 0
        while same < min(len(sampled), len(written)) and sampled[same] == written[same]:
            same += 1
        new_mask = trace.mask[before - len(prompt) :]
        assert new_mask == [1] * same + [0] * (len(written) - same)
        assert trace.logprobs[before - len(prompt) :][:same] == [-float(i + 1) for i in range(same)]
        sampled_total += len(sampled)
        dropped += len(sampled) - same
    assert (trace.sampled, trace.context_only) == (sampled_total, dropped)


def test_the_episode_ends_with_the_last_reply_as_sampled_and_an_end_id():
    trace = ChatTrace()
    trace.extend([1, 2])
    trace.generated(Generated((5, 6), (-0.1, -0.2), False))  # cut off at the cap: no end id
    episode = trace.close(eos_ids=(9, 8), closing_id=9)
    assert episode.completion_ids == (5, 6, 9) and episode.mask == (1, 1, 0) and episode.logprobs == (-0.1, -0.2, 0.0)
    trace = ChatTrace()
    trace.extend([1, 2])
    trace.generated(Generated((5, 8), (-0.1, -0.2), True))  # stopped on another end id of the generation config
    assert trace.close(eos_ids=(9, 8), closing_id=9).completion_ids == (5, 8)


def test_a_rendering_that_changes_what_came_before_is_refused():
    trace = ChatTrace()
    trace.extend([1, 2, 3])
    trace.generated(Generated((4,), (-0.1,), True))
    trace.extend([1, 2, 3, 4, 7])
    with pytest.raises(TemplateError, match="prefix-preserving"):
        trace.extend([1, 2, 3, 5, 7, 8])


def test_a_withheld_reply_is_counted_apart_and_nothing_of_it_is_trained():
    trace = ChatTrace()
    trace.extend([1, 2])
    trace.generated(Generated((5, 6, 9), (-0.1, -0.2, -0.3), True))  # an invalid reply the layout withholds
    trace.extend([1, 2, 9, 3, 4], withheld=True)  # written as an empty message: the end id, then the feedback
    assert trace.mask == [0, 0, 0] and trace.logprobs == [0.0, 0.0, 0.0]
    assert (trace.sampled, trace.withheld, trace.context_only) == (3, 3, 0)
    trace.generated(Generated((5, 7, 9), (-0.4, -0.5, -0.6), True))  # its retry, shown as written
    trace.extend([1, 2, 9, 3, 4, 5, 7, 9, 3])
    assert trace.mask == [0, 0, 0, 1, 1, 1, 0] and (trace.withheld, trace.context_only) == (3, 0)
