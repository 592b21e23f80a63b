"""Where a continued listener's newest committed run is written down: its *head hint*.

Retention (:mod:`.retention`) removes a listener's older ended runs, so "link *n* exists" stops being
true of every *n* below the newest: a process that knows only the first run's id cannot find the
newest link by probing forward from link 0. So the serving process writes the number of each link it
has committed into the server's poll data before it retires anything, and :class:`ChainDirectory`
probes forward from there.

The poll data is what the server keeps of each poll, as one row per (task type, domain):
``{workerId, lastPollTime}``, written on every poll (also one that takes nothing: ``count=0``), read
back with one small request, on every node's shared store, and never deleted (the research for
issue 30 found nothing that removes it). :mod:`.._serving.presence` keeps its rows there the same way.
A listener's hint is a made-up task type named after its run id, with :data:`SLOTS` rows: link *n* is
written into row ``n % SLOTS`` as the worker id ``head:<n>``, and the hint is the largest number in
the rows. A process that writes late (it committed link *n* and was paused while another process
went on to *n+1*) overwrites only its own slot, so the largest number never goes back unless a
writer is :data:`SLOTS` links behind. So a listener costs :data:`SLOTS` small rows, for ever, whatever
its number of runs.

A listener's mailbox (:mod:`.mailbox`) is written down the same way, once: one row whose worker id is
``mailbox:<its execution id>``, so a process that holds only a link's id (an adopter) finds the id
callers hold.
"""

from __future__ import annotations

import logging
import re

from .._wire.api import ConductorApi

__all__ = ["SLOTS", "head_task_type", "read_head", "read_mailbox", "write_head", "write_mailbox"]

log = logging.getLogger("conductor_agents.continuation")

#: Rows per listener: a late writer must be this many links behind to hide the newest number.
SLOTS = 4
_WORKER = re.compile(r"^head:(\d+)$")
_MAILBOX = re.compile(r"^mailbox:([0-9a-f-]{36})$")


def head_task_type(run_id: str) -> str:
    """The made-up task type whose poll-data rows hold the head hint of the listener on ``run_id``."""
    return f"conductor_agents_head_{run_id}"


def write_head(api: ConductorApi, run_id: str, number: int) -> None:
    """Record that link ``number`` of the listener on ``run_id`` is committed (one small request).

    Raises: as :meth:`ConductorApi.mark_presence` (the server could not be reached).
    """
    api.mark_presence(head_task_type(run_id), worker_id=f"head:{int(number)}", domain=f"h{int(number) % SLOTS}")


def read_head(api: ConductorApi, run_id: str | None) -> int:
    """The newest link number written for the listener on ``run_id``; 0 when none was (one request).

    Raises: as :meth:`ConductorApi.poll_data`.
    """
    if not run_id:
        return 0
    best = 0
    for row in api.poll_data(head_task_type(run_id)):
        match = _WORKER.match(str((row or {}).get("workerId") or ""))
        if match is not None:
            best = max(best, int(match.group(1)))
    return best


def _mailbox_task_type(run_id: str) -> str:
    return f"conductor_agents_mailbox_{run_id}"


def write_mailbox(api: ConductorApi, run_id: str, mailbox_id: str) -> None:
    """Record that ``mailbox_id`` is the mailbox of the listener on ``run_id`` (one small request).

    Raises: as :meth:`ConductorApi.mark_presence`.
    """
    api.mark_presence(_mailbox_task_type(run_id), worker_id=f"mailbox:{mailbox_id}", domain="m")


def read_mailbox(api: ConductorApi, run_id: str | None) -> str | None:
    """The mailbox id written for the listener on ``run_id``, or None (one request).

    Raises: as :meth:`ConductorApi.poll_data`.
    """
    if not run_id:
        return None
    for row in api.poll_data(_mailbox_task_type(run_id)):
        match = _MAILBOX.match(str((row or {}).get("workerId") or ""))
        if match is not None:
            return match.group(1)
    return None
