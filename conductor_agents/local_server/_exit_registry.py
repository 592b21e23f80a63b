"""Never orphan: every attached process this package started is stopped when Python exits.

``LocalServer`` and the helper processes (Redis, HAProxy) register while they run; the
``atexit`` hook calls each one's ``_stop_at_exit()``. (If Python dies without running
``atexit``, ``PR_SET_PDEATHSIG`` still ends them; see :mod:`._proc`.)
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
from typing import Any

_log = logging.getLogger("conductor_agents.local_server")

_lock = threading.Lock()
_attached: set[Any] = set()


def register(process: Any) -> None:
    """Stop ``process`` (anything with ``_stop_at_exit()``) at interpreter exit."""
    with _lock:
        _attached.add(process)


def unregister(process: Any) -> None:
    """Forget ``process`` (it stopped). No error when it was not registered."""
    with _lock:
        _attached.discard(process)


def _forget_parent_processes() -> None:
    """In a forked child: the parent's processes are not this process's to stop at exit."""
    global _lock  # noqa: PLW0603 - the child needs a new lock: a parent's thread may have held the old one
    _lock = threading.Lock()
    _attached.clear()


os.register_at_fork(after_in_child=_forget_parent_processes)


@atexit.register
def stop_all_at_exit() -> None:
    """Stop every registered process (the ``atexit`` hook; also callable directly)."""
    with _lock:
        processes = list(_attached)
    for process in processes:
        try:
            process._stop_at_exit()
        except Exception:  # noqa: BLE001 - logged; keep stopping the others
            _log.exception("could not stop %r at exit", process)
