"""Sending a message to a listener that may be in the middle of a continuation (see :mod:`._switch`).

A message goes to the newest link this process knows. Once the server accepted it (``200``), one
small request asks whether a newer link exists; almost always it does not, and the message is in
the queue of the listener's current run. If a newer link exists, a switch has begun, and the old
link's queue is dropped when the switch ends: the message either reached the old run (it is acted
on there, or carried over to the new one) or it did not (then it is sent again, to the new run).
The switch's commit record says which (its ``pulled`` ids). A ``409`` from a link that was continued
sends the message to its successor. So every message this SDK sends reaches the listener once.

A sender that bypasses the SDK (``POST /workflow/{id}/messages`` itself) gets a ``409`` from a link
that was continued (it must then find the current run itself), and a message it pushes to a link
during the few seconds of its switch can be dropped: see ``docs/operations.md``.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Mapping

from ._api import ConductorApi
from ._chain_directory import Chain, ChainDirectory, Link
from ._clock import Clock
from ._switch import read_commit
from .errors import ExecutionNotRunningError

__all__ = ["send_to_listener"]

log = logging.getLogger("conductor_agents.continuation")

#: Pause between two looks at a switch a message is caught in.
_COMMIT_POLL = 0.25
#: Most times one message is sent again (each resend follows a switch that dropped it).
_MAX_ATTEMPTS = 50


def send_to_listener(api: ConductorApi, directory: ChainDirectory, execution_id: str, body: Mapping[str, Any], *,
                     switch_wait: float, clock: Clock, pause: Callable[[float], Any],
                     on_accepted: Callable[[str, Link], None] = lambda message_id, link: None) -> str:
    """Push ``body`` into the listener ``execution_id`` names; the message id of the copy that counts.

    ``switch_wait`` bounds how long a message caught in a switch waits for the switch's commit; past
    it the message id is returned as is (the switch's outcome decides its fate, and
    ``wait_delivered`` tells it) and a warning is logged.

    Raises:
        as :meth:`ConductorApi.push_message`; ExecutionNotRunningError when the listener has ended.
    """
    chain = directory.chain(execution_id)
    if not chain.continuable:
        return api.push_message(execution_id, body)
    link = directory.newest(chain)
    for _ in range(_MAX_ATTEMPTS):
        try:
            message_id = api.push_message(link.execution_id, body)
        except ExecutionNotRunningError:
            newer = directory.refresh(chain)
            if newer.number <= link.number:
                raise
            link = newer
            continue
        on_accepted(message_id, link)
        if not directory.exists(chain, link.number + 1):
            return message_id
        # Link ``link`` is being (or was) continued: did the message reach it?
        record, open_ = _wait_for_commit(api, chain, link, switch_wait, clock, pause)
        if record is None:
            if open_:
                log.warning("message %s reached listener %s during a switch that was not committed within "
                            "%.0fs; its fate is decided when the switch is completed (wait_delivered tells)",
                            message_id, chain.execution_id, switch_wait)
            return message_id
        if message_id in record.pulled:
            return message_id
        log.info("message %s was dropped with run %s's queue at a continuation; sending it again",
                 message_id, link.execution_id)
        link = directory.refresh(chain)
    raise ExecutionNotRunningError(
        f"listener {execution_id} was continued {_MAX_ATTEMPTS} times while one message was being sent; "
        "it was not delivered", execution_id=execution_id)


def _wait_for_commit(api: ConductorApi, chain: Chain, link: Link, timeout: float, clock: Clock,
                     pause: Callable[[float], Any]):
    new = chain.link(link.number + 1)
    deadline = clock.monotonic() + timeout
    while True:
        record, open_ = read_commit(api, new)
        if record is not None or not open_:
            return record, open_
        if clock.monotonic() >= deadline:
            return None, True
        pause(_COMMIT_POLL)
