"""``POST /agent/start`` with the one retry it needs: the first starts of a new agent racing each other.

The server compiles the agent and registers its workflow definition on every start, then starts
the run. When two starts of an agent it has never seen arrive together (a web app's first burst
after a deploy, two worker processes), both find no definition and both insert one: the loser gets
``HTTP 500: Workflow with <name>.<version> already exists!`` (a conflict in the metadata store,
raised before the run is created: no run exists for that request, verified on the real server).
Sent again, the start finds the definition and updates it, so the conflict is safe to retry.

A start whose answer is lost (a read timeout, a reset connection, a proxy's 502/503/504: the server may have
started the run), or that meets the run of its key being evaluated (``Error acquiring lock``), is sent again
when it carries an idempotency key: the server gives a keyed start a stable execution id and returns the run it
made for that key, so the caller gets the one run either way, and never hears of a lost answer while the server
can still say. :class:`~conductor_agents._runs.start.RunStarter` gives every start a key (the caller's, a
listener's link key, or one of its own).
"""

from __future__ import annotations

import logging
import random
import re
from collections.abc import Callable, Mapping
from typing import Any

from ..errors import ServerUnavailableError
from .api import ConductorApi
from .transport import HttpError

__all__ = ["start_run"]

log = logging.getLogger("conductor_agents.runtime")

#: The server's message for the definition race (a ConflictException, seen as 500 or 409).
_DEFINITION_RACE = re.compile(r"^Workflow with \S+ already exists")
#: Attempts in all, and the pauses between them: 0.05 s doubling to 1 s, with jitter so racing
#: starters do not collide again (about 4 s in the worst case).
_ATTEMPTS = 8
_FIRST_PAUSE = 0.05
_MAX_PAUSE = 1.0
#: Pauses before each resend of a keyed start whose answer was lost (about 30 s in all: a server restarting, a
#: node failing over behind the balancer).
_LOST_ANSWER_PAUSES = (0.5, 1.0, 2.0, 4.0, 8.0, 15.0)
#: Statuses a balancer answers for a server that may or may not have acted.
_GATEWAY_STATUSES = (502, 503, 504)
#: The server's answer to a keyed start that came while the run of that key is being evaluated (its lock is held:
#: the run exists, and the next try returns it). Seen when a lost answer's resend met the run's first decide.
_LOCKED = re.compile(r"^Error acquiring lock when creating workflow")


def is_definition_race(err: HttpError) -> bool:
    """Whether ``err`` is the server losing a race to create an agent's definition (no run was created)."""
    return err.status in (409, 500) and bool(_DEFINITION_RACE.match(err.server_message or ""))


def start_run(api: ConductorApi, body: Mapping[str, Any], *, pause: Callable[[float], bool]) -> dict[str, Any]:
    """Start the run; on the definition race send the start again after a short pause.

    ``pause(seconds)`` waits and returns True when the caller is closing (then the last error
    is raised).

    Raises:
        as :meth:`ConductorApi.start_agent`; the race's HttpError only when it persists over
        every attempt.
    """
    delay = _FIRST_PAUSE
    races = lost = 0
    while True:
        try:
            return api.start_agent(body)
        except HttpError as err:
            if _answer_lost(body, err, lost):
                lost = _after_lost(body, err, lost, pause)
                continue
            races += 1
            if not is_definition_race(err) or races == _ATTEMPTS:
                raise
            wait = delay * (0.5 + random.random())  # noqa: S311 - jitter between retries, not a secret
            log.debug("start of %s lost the race to create its definition (%s); retrying in %.2fs",
                      _agent_name(body), err.server_message, wait)
            if pause(wait):
                raise
            delay = min(delay * 2, _MAX_PAUSE)
        except ServerUnavailableError as err:
            if not _answer_lost(body, err, lost):
                raise
            lost = _after_lost(body, err, lost, pause)


def _answer_lost(body: Mapping[str, Any], err: Exception, lost: int) -> bool:
    """Whether ``err`` may hide a run the server made, and a keyed start may be sent again to find it."""
    if not body.get("idempotencyKey") or lost >= len(_LOST_ANSWER_PAUSES):
        return False
    if isinstance(err, ServerUnavailableError):
        return err.request_sent  # a connection refused: the server never saw the start
    return isinstance(err, HttpError) and (
        err.status in _GATEWAY_STATUSES or bool(_LOCKED.match(err.server_message or "")))


def _after_lost(body: Mapping[str, Any], err: Exception, lost: int, pause: Callable[[float], bool]) -> int:
    """Pause before the resend of a keyed start whose answer was lost; the count of resends so far.

    Raises: ``err`` when the caller is closing."""
    wait = _LOST_ANSWER_PAUSES[lost]
    log.info("the answer to the start of %s was lost (%s); sending it again in %.1fs (the same key gives the same "
             "run)", _agent_name(body), err, wait)
    if pause(wait):
        raise err
    return lost + 1


def _agent_name(body: Mapping[str, Any]) -> str:
    config = body.get("agentConfig")
    return str(config.get("name")) if isinstance(config, Mapping) else "the agent"
