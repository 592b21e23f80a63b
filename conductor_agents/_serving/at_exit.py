"""Closing a serving runtime at interpreter exit, so that its runs are handed over at once.

A recycled web worker exits normally; without this its runs would wait for the stall threshold
before another process adopts them.
"""

from __future__ import annotations

import atexit
import logging
import threading
import weakref
from collections.abc import Callable
from typing import Any

__all__ = ["close_at_exit"]

log = logging.getLogger("conductor_agents.runtime")


def close_at_exit(runtime: Any, *, here: Callable[[Any], bool]) -> None:
    """Call ``runtime.close()`` at interpreter exit if it still exists and ``here(runtime)`` (it belongs
    to the exiting process). Holds ``runtime`` weakly; an error closing it is logged."""
    ref = weakref.ref(runtime)

    def close() -> None:
        live = ref()
        if live is not None and here(live):
            try:
                live.close()
            except Exception:  # exiting anyway
                log.exception("closing the serving runtime at exit failed")

    # CPython's threading hook runs first at exit (hooks in reverse order, so before the one that shuts
    # down the executors, registered earlier): the close hands over while tools can still finish.
    register = getattr(threading, "_register_atexit", None)
    try:
        if register is not None:
            register(close)
            return
    except RuntimeError:  # already exiting
        return
    atexit.register(close)
