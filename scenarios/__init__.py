"""Scenarios: issues, preferences, the generator, scenario files and exact analysis.

Importing this package loads numpy and the standard library only.
"""

from .analysis import ScenarioAnalysis, analyse, offer_at, outcome_space, utilities
from .check import ScenarioCheckError, check_scenario
from .files import ScenarioFileError, load_scenario, load_scenarios, save_scenario
from .generator import generate_scenario, generate_scenarios
from .issues import Issue, IssueKind
from .preferences import Preferences, ValueFunction
from .scenario import Role, Scenario, ScenarioView

__all__ = [
    "Issue",
    "IssueKind",
    "Preferences",
    "Role",
    "Scenario",
    "ScenarioAnalysis",
    "ScenarioCheckError",
    "ScenarioFileError",
    "ScenarioView",
    "ValueFunction",
    "analyse",
    "check_scenario",
    "generate_scenario",
    "generate_scenarios",
    "load_scenario",
    "load_scenarios",
    "offer_at",
    "outcome_space",
    "save_scenario",
    "utilities",
]
