"""Simulation: a market of sellers and buyers over market days, assembled from a :class:`SimulateConfig`.

Modules: :mod:`.config` (``SimulateConfig``), :mod:`.sources` (where scenarios come from), :mod:`.run`
(``run_simulation``: agents, learners, transcripts and the population model, reporting to an observer).
``nego simulate`` is a thin shell over :func:`run_simulation`; nothing here prints or imports the CLI.
"""

from .config import SimulateConfig
from .run import RunStart, SimulationObserver, SimulationResult, run_simulation

__all__ = ["RunStart", "SimulateConfig", "SimulationObserver", "SimulationResult", "run_simulation"]
