"""Runs as the runtime drives them: starting one (:mod:`.start`), taking up one that exists on the server
(:mod:`.take_up`: resume, adoption, reclaiming a dead worker's tasks, lease checks, refusing a run another
process serves, finishing a listener's switch left half done), the by-execution-id verbs that the runtime
and :class:`~conductor_agents.AgentHandle` share (:mod:`.by_id`), the handle factory (:mod:`.handles`), this
process's share of serving agents (:mod:`.serving`) and the close at interpreter exit (:mod:`.exit`). It may
import everything below the runtime (the wire, the worker, the listener, serving, people, liveness, tool
definitions, ``_common`` and the public value modules), never ``runtime``, and ``handle`` only for type
hints (``handle`` imports :mod:`.by_id`, so the handle factory is given the class); nothing imports it but
``runtime`` and ``handle``.
"""
