"""After ``fork()``: the objects that hold per-process state rebuild it in the child.

A process forked from one that already built an :class:`~conductor_agents.AgentRuntime`
(gunicorn ``--preload``, ``multiprocessing`` with the fork start method, Celery prefork,
uWSGI without ``lazy-apps``) inherits the runtime's memory but only the thread that called
``fork()``: the parent's pollers, tool pool and watcher do not exist in the child, their
locks may be held for ever, and its pooled connections are the parent's sockets.

Objects with such state call :func:`rebuild_after_fork` once; a hook registered with
:func:`os.register_at_fork` then calls their ``_after_fork_in_child()`` in every child,
before any other thread of the child exists, so the rebuild races nothing. The objects are
held through weak references: registering keeps nothing alive. A rebuild starts no thread
and sends no request (threads start on first use in the child); one that raises is logged,
and the others still run.
"""

from __future__ import annotations

import logging
import os
import weakref
from typing import Protocol

__all__ = ["ForkAware", "rebuild_after_fork"]

log = logging.getLogger("conductor_agents.fork")


class ForkAware(Protocol):
    def _after_fork_in_child(self) -> None: ...


_live: weakref.WeakSet[ForkAware] = weakref.WeakSet()


def rebuild_after_fork(obj: ForkAware) -> None:
    """Call ``obj._after_fork_in_child()`` in every process forked from now on (while ``obj`` lives)."""
    _live.add(obj)


def _in_child() -> None:
    # Called in the child with its only thread; the parent's threads are gone, not running.
    for obj in list(_live):
        try:
            obj._after_fork_in_child()
        except Exception:  # one broken object must not leave the others shared with the parent
            log.exception("could not rebuild %r after fork", obj)


os.register_at_fork(after_in_child=_in_child)
