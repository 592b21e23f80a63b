"""Serving an agent from many processes: presence rows (:mod:`.presence`), create-once leases
(:mod:`.leases`), adoption of orphaned runs (:mod:`.adoption`) and whether the worker that polled a domain is
alive (:mod:`.live_workers`), put together as one process's :class:`~.service.Service`; the runtime's share
of it, made on the first ``serve()`` (:mod:`.process`: the agents served, and adoption and presence as the
parts its ``close()`` stops), and the close at interpreter exit that hands the runs over (:mod:`.at_exit`).

May import: :mod:`.._worker`, :mod:`.._listener`, :mod:`.._liveness`, :mod:`.._wire`, :mod:`.._common` and the
public value modules.
"""
