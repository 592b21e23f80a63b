"""Runs as the runtime drives them: starting one (:mod:`.start`), taking up one that exists on the server
(:mod:`.take_up`: resume, adoption, reclaiming a dead worker's tasks, lease checks, refusing a run another
process serves, finishing a listener's switch left half done), the handle factory (:mod:`.handles`), this
process's share of serving agents (:mod:`.serving`) and the close at interpreter exit (:mod:`.exit`).

May import everything below the runtime: :mod:`conductor_agents.handle`, the worker, the listener, serving,
people, liveness, tool definitions, the wire, ``_common`` and the public value modules. Only ``runtime``
imports it.
"""
