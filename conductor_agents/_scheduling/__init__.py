"""Schedules: an agent started on a cron expression by the server's own scheduler (``/scheduler``).

Owns the :class:`Schedule` record and the :class:`Schedules` verbs the runtime exposes as
``runtime.schedules``. Imports the agent definitions and the wire, nothing that serves a run: a
scheduled run is served by the processes that ``serve()`` its agent (they adopt it like any run that
no process holds).
"""

from .schedules import Schedule, Schedules

__all__ = ["Schedule", "Schedules"]
