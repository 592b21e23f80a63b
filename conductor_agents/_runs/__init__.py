"""Taking up runs, as the runtime drives them: starting one (:mod:`.start`), taking up one that exists on the
server (:mod:`.existing`: attach, resume, adoption, reclaiming a dead worker's tasks, lease checks, refusing a
run another process serves, finishing a listener's switch left half done), the handle each take-up ends in
(:mod:`.handles`: the handle factory, with its liveness watch and the runtime's hooks), and the parts of one
process that do all this, made again in a forked child (:mod:`.process`).

May import everything below the runtime: :mod:`conductor_agents.handle`, the worker, the listener, serving,
people, liveness, tool definitions, the wire, ``_common`` and the public value modules. Only ``runtime``
imports it.
"""
