"""Evaluation: frozen suites, per-negotiation metrics, paired cluster statistics, arm runs, reports and sweeps.

Modules: :mod:`.suites` (eval-1152, eval-192, eval-dev, the training stream), :mod:`.metrics`, :mod:`.best_response`
(optimality gap), :mod:`.stats`, :mod:`.runner` (``evaluate``), :mod:`.report`, :mod:`.sweep` with
:mod:`.sweep_cell` and :mod:`.launchers` (submitit), :mod:`.config`.
Nothing is imported here, so ``import nego.evaluation`` stays light.
"""
