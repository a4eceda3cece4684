"""A value function's values on an issue's grid depend on the function and the issue, not on which objects hold them."""

from __future__ import annotations

from nego.scenarios.issues import Issue, IssueKind
from nego.scenarios.preferences import ValueFunction, _grid_table


def test_grid_values_follow_the_function_and_issue_not_the_object():
    issue = Issue("n", IssueKind.INT, low=0, high=4)
    up, down = ValueFunction.increasing(), ValueFunction.decreasing()
    assert up.grid_values(issue).tolist() == [0.0, 0.25, 0.5, 0.75, 1.0]
    assert down.grid_values(issue).tolist() == [1.0, 0.75, 0.5, 0.25, 0.0]
    twin = ValueFunction.increasing()  # equal by value, another object
    assert twin is not up and twin.grid_values(issue).tolist() == up.grid_values(issue).tolist()
    assert _grid_table(down, issue) == {0: 1.0, 1: 0.75, 2: 0.5, 3: 0.25, 4: 0.0}
    wider = Issue("n", IssueKind.INT, low=0, high=2)
    assert up.grid_values(wider).tolist() == [0.0, 0.5, 1.0]
