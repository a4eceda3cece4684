"""nego: a marketplace simulator for bilateral multi-issue bargaining, with an RL plugin for LLM sellers.

``import nego`` is light: it pulls in neither torch nor any provider SDK.
"""

from nego.market.protocol import Negotiator, ProtocolConfig, run_negotiation
from nego.market.types import Action, ActionKind, EndReason, NegotiationResult, Observation, Offer, Outcome
from nego.scenarios.issues import Issue, IssueKind
from nego.scenarios.preferences import Preferences, ValueFunction
from nego.scenarios.scenario import Role, Scenario, ScenarioView

__version__ = "0.1.0"

__all__ = [
    "Action",
    "ActionKind",
    "EndReason",
    "Issue",
    "IssueKind",
    "NegotiationResult",
    "Negotiator",
    "Observation",
    "Offer",
    "Outcome",
    "Preferences",
    "ProtocolConfig",
    "Role",
    "Scenario",
    "ScenarioView",
    "ValueFunction",
    "run_negotiation",
]
