"""A run's events as the caller iterates them: the server's stream (:mod:`.stream`) and, where it cannot serve
the run, the same events rebuilt from the task list (:mod:`.polling`).

May import: :mod:`.._wire`, :mod:`.._common`, and the public value modules :mod:`conductor_agents.events`,
:mod:`conductor_agents.result` and :mod:`conductor_agents.errors`.
"""
