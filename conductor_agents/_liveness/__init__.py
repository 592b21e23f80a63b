"""Liveness: is anybody serving a run? The stall rule (:mod:`.stall`, pure), the one watchdog thread of a runtime
(:mod:`.watchdog`) and a run's tree of sub-runs (:mod:`.tree`).

May import: :mod:`.._wire`, :mod:`.._common`, :mod:`conductor_agents.result` and :mod:`conductor_agents.errors`.
"""
