"""Serving an agent from many processes: presence rows (:mod:`.presence`), create-once leases
(:mod:`.leases`), adoption of orphaned runs (:mod:`.adoption`) and whether a domain is still served
(:mod:`.takeover`), put together as one process's :class:`~.service.Service`.

May import: :mod:`.._worker`, :mod:`.._listener`, :mod:`.._liveness`, :mod:`.._wire`, :mod:`.._common` and the
public value modules.
"""
