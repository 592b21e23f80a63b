"""The wire: the only code that speaks HTTP to the Conductor server.

Owns the transport (:mod:`.transport`, the one module that imports ``requests``), the endpoints
(:mod:`.api`), telling a base URL without ``/api`` (:mod:`.base_url`), server-sent events (:mod:`.sse`),
the start request (:mod:`.starting`), the domain a run is pinned to (:mod:`.domains`), the JSON payloads
that cross to the server (:mod:`.payload`) and a failed request's cause in one line (:mod:`.causes`).

May import: :mod:`.._common` and :mod:`conductor_agents.errors`.
"""
