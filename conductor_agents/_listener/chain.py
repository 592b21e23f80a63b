"""How the runs of one continued listener are named on the server (pure; no I/O).

A listener continued as fresh runs is a *chain*: the first run (link 0, the id callers hold) and
links 1, 2, ... each started by ``POST /agent/start`` with the same ``runId`` (so the same task
domain) and an idempotency key that names the chain and the link::

    conductor-agents/<run id>/<link>/<agent name>

The server derives an idempotent run's execution id from the agent's name and the key
(``UUID.nameUUIDFromBytes("agent:" + name + ":" + key)``, a version-3 UUID: read in
``WorkflowExecutorOps.agentIdempotencyWorkflowId``, and checked against the server by the tests), so:

- every process can compute link *n*'s id from the chain's run id and agent name, and learn whether
  it exists with one small request (``GET /workflow/{id}/status``);
- starting a link is create-once: two processes (or one retrying after a crash) that start link *n*
  get the same run, never a second one;
- a link's ``correlationId`` (the key) tells its chain, number and agent without another request.

A link ended by a continuation is TERMINATED with a reason starting with :data:`CONTINUED_REASON`.

A listener started since the mailbox (:mod:`.mailbox`) is named by its *mailbox* instead: a small
workflow that lives as long as the listener, whose ``correlationId`` is
``conductor-agents/<run id>/mailbox/<agent name>`` (:func:`mailbox_key`): the id callers hold is the
mailbox's, and link 0 is then a link like the others (retention may retire it).
"""

from __future__ import annotations

import hashlib
import re
import uuid

import attrs

__all__ = [
    "ABANDONED_REASON",
    "CONTINUED_REASON",
    "LinkKey",
    "continued_reason",
    "is_abandoned",
    "is_continued",
    "link_id",
    "link_key",
    "is_human_wait_key",
    "mailbox_key",
    "parse_mailbox_key",
    "run_id_for_key",
    "parse_link_key",
]

#: The termination reason of a link that was continued (followed by " as <next id>").
CONTINUED_REASON = "conductor-agents: continued"
#: The termination reason of a link started for a switch that could not happen (the old run ended
#: on its own, or was cancelled, while the switch was under way).
ABANDONED_REASON = "conductor-agents: continuation abandoned"

_PREFIX = "conductor-agents"
#: The word in a mailbox's key where a link's number would be.
MAILBOX = "mailbox"
#: The same word for the mailbox of a listener that waits on a ``HUMAN`` task (``listener_wait="human"``).
INBOX = "inbox"
_KEY = re.compile(r"^conductor-agents/([0-9a-f]{32})/(\d+)/([A-Za-z_][A-Za-z0-9_-]{0,127})$")


@attrs.frozen
class LinkKey:
    """A link's place in its chain, as its idempotency key (and ``correlationId``) says."""

    run_id: str
    number: int
    agent_name: str

    @property
    def key(self) -> str:
        return link_key(self.run_id, self.number, self.agent_name)

    @property
    def execution_id(self) -> str:
        return link_id(self.agent_name, self.key)


def link_key(run_id: str, number: int, agent_name: str) -> str:
    """The idempotency key of link ``number`` of the chain on ``run_id``."""
    return f"{_PREFIX}/{run_id}/{int(number)}/{agent_name}"


def parse_link_key(value: str | None) -> LinkKey | None:
    """The link a ``correlationId`` names, or None when it is not one of ours."""
    match = _KEY.match(value or "")
    if match is None:
        return None
    return LinkKey(run_id=match.group(1), number=int(match.group(2)), agent_name=match.group(3))


def mailbox_key(run_id: str, agent_name: str, *, human_wait: bool = False) -> str:
    """The ``correlationId`` of the mailbox of the listener on ``run_id`` (see :mod:`.mailbox`); a listener
    that waits on a ``HUMAN`` task (``human_wait``) says so with :data:`INBOX` instead of :data:`MAILBOX`."""
    return f"{_PREFIX}/{run_id}/{INBOX if human_wait else MAILBOX}/{agent_name}"


_MAILBOX_KEY = re.compile(r"^conductor-agents/([0-9a-f]{32})/(mailbox|inbox)/([A-Za-z_][A-Za-z0-9_-]{0,127})$")


def is_human_wait_key(value: str | None) -> bool:
    """Whether a mailbox's ``correlationId`` says its listener waits on a ``HUMAN`` task."""
    match = _MAILBOX_KEY.match(value or "")
    return match is not None and match.group(2) == INBOX


def parse_mailbox_key(value: str | None) -> LinkKey | None:
    """The listener a mailbox's ``correlationId`` names (as its link 0), or None when it is no mailbox."""
    match = _MAILBOX_KEY.match(value or "")
    if match is None:
        return None
    return LinkKey(run_id=match.group(1), number=0, agent_name=match.group(3))


def link_id(agent_name: str, key: str) -> str:
    """The execution id the server gives an agent run started with idempotency key ``key``.

    Java's ``UUID.nameUUIDFromBytes``: the MD5 of the name's UTF-8 bytes with the version (3) and
    the IETF variant bits set.
    """
    digest = bytearray(hashlib.md5(f"agent:{agent_name}:{key}".encode(), usedforsecurity=False).digest())  # an id
    digest[6] = (digest[6] & 0x0F) | 0x30
    digest[8] = (digest[8] & 0x3F) | 0x80
    return str(uuid.UUID(bytes=bytes(digest)))


def run_id_for_key(agent_name: str, idempotency_key: str) -> str:
    """The run id (task domain) of a listener started with the caller's ``idempotency_key``: derived from
    it, so starting again with the same key names the same chain, hence the same first run."""
    return hashlib.sha256(f"{agent_name}\0{idempotency_key}".encode()).hexdigest()[:32]


def continued_reason(next_execution_id: str) -> str:
    """The reason a link is terminated with when ``next_execution_id`` continues it."""
    return f"{CONTINUED_REASON} as {next_execution_id}"


def is_continued(reason: str | None) -> bool:
    """Whether a run's ``reasonForIncompletion`` says it was continued by a newer link."""
    return bool(reason) and str(reason).startswith(CONTINUED_REASON)


def is_abandoned(reason: str | None) -> bool:
    """Whether a link was given up because its switch could not happen."""
    return bool(reason) and str(reason).startswith(ABANDONED_REASON)
