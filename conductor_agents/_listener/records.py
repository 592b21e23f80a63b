"""Records the server creates once per key, whatever the number of processes racing to create them.

``POST /agent/start`` with an ``idempotencyKey`` is the server's one atomic create-once: it gives the run a stable
execution id (derived from the agent's name and the key) and returns the run it made to every later start with the
key (atomic across a cluster's nodes with the Redis execution lock: ``docs/operations.md``). A record is such a run
of a ``manual`` team waiting on a person (no model call, no worker task); its input's ``context`` holds what the
record says, with a nonce that tells the racers whose request created it. It is ended as soon as it has been read
back: its input stays, and a start with the same key still returns it, whatever its status.

Used for the leases of served runs (``_serving/leases.py``) and for the mailbox of a listener started with an
idempotency key (:mod:`.mailbox`): two such starts at the same moment each open a mailbox, and the record says
which one the listener keeps.
"""

from __future__ import annotations

import copy
import functools
import logging
import time
import uuid
from collections.abc import Callable
from typing import Any

import attrs

from .._wire.api import ConductorApi
from .._wire.starting import start_run
from .._wire.transport import HttpError
from ..errors import ExecutionNotFoundError, ServerError
from .chain import link_id

__all__ = ["Record", "create_once", "read_record", "record_id"]

log = logging.getLogger("conductor_agents.serve")

_MODEL = "openai/none"  # never called: the team's first step waits on a person
#: Tries of a start that met the server's execution lock (another racer's start of the same key) or a 5xx.
_START_TRIES = 3
#: Reads of a record just created: on a cluster, another node may not see it for a moment.
_READ_TRIES = 3


@attrs.frozen
class Record:
    """A record as the server holds it: its run's id, what it says (None when it could not be read back), and
    whether this process's request created it."""

    execution_id: str
    context: dict[str, Any] | None
    created_here: bool


@functools.lru_cache(maxsize=8)
def _config(agent_name: str, instructions: str) -> dict[str, Any]:
    # A manual team: its first task is a HUMAN pick. No model call, no worker task, until answered.
    from ..agent import Agent

    member = Agent(name=f"{agent_name}_record", model=_MODEL, instructions=instructions)
    return Agent(name=agent_name, model=_MODEL, instructions=instructions, agents=[member],
                 strategy="manual", max_turns=1).to_config()


def record_id(agent_name: str, key: str) -> str:
    """The execution id of the record ``key`` of ``agent_name`` (whether or not it exists)."""
    return link_id(agent_name, key)


def create_once(api: ConductorApi, agent_name: str, key: str, context: dict[str, Any], *, prompt: str,
                pause: Callable[[float], bool], kind: str = "record") -> Record:
    """Create the record ``key`` saying ``context``, unless a racer (or an earlier call) did: the record either way.
    ``kind`` names what it records (its agent's instructions, the reason it is ended with).

    Raises: ServerError (and subclasses) when the start itself failed.
    """
    nonce = uuid.uuid4().hex
    body = {"agentConfig": copy.deepcopy(_config(agent_name, kind)), "prompt": prompt, "idempotencyKey": key,
            "context": {**context, "nonce": nonce}}
    execution_id = str(_start(api, body, pause)["executionId"])
    said = read_record(api, execution_id)
    created_here = said is not None and said.get("nonce") == nonce
    if created_here:
        _end(api, execution_id, f"{kind} written")  # its input stays; the run need not wait on a person
    return Record(execution_id, said, created_here)


def read_record(api: ConductorApi, execution_id: str, *, tries: int = _READ_TRIES) -> dict[str, Any] | None:
    """What the record ``execution_id`` says; None when the server does not hold it (``tries`` reads apart: a record
    just created on another node of a cluster may not be visible yet; 1 where an absent record is the common answer,
    as in a search for the newest lease).

    Raises: ServerError (and subclasses) when the server could not be read.
    """
    for attempt in range(tries):
        try:
            workflow = api.get_workflow(execution_id)
        except ExecutionNotFoundError:
            if attempt < tries - 1:
                time.sleep(0.1)  # created on another node of a cluster, not yet visible here
            continue
        context = (workflow.get("input") or {}).get("context")
        return context if isinstance(context, dict) else {}
    return None


def _start(api: ConductorApi, body: dict[str, Any], pause: Callable[[float], bool]) -> dict[str, Any]:
    # Racers on one key may meet the server's execution lock: one of them then fails (a 5xx) without creating
    # anything; a second try finds the record made.
    for attempt in range(1, _START_TRIES + 1):
        try:
            return start_run(api, body, pause=pause)
        except HttpError as err:
            if err.status is None or err.status < 500 or attempt == _START_TRIES:
                raise
            log.debug("record start %s failed (%s); trying again", body["idempotencyKey"], err)
            if pause(0.2 * attempt):
                raise
    raise AssertionError("unreachable")


def _end(api: ConductorApi, execution_id: str, reason: str) -> None:
    try:
        api.cancel_agent(execution_id, reason)
    except ServerError as err:  # it only waits on a person: harmless if left running
        log.debug("could not end record run %s: %s", execution_id, err)
