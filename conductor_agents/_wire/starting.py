"""``POST /agent/start`` with the one retry it needs: the first starts of a new agent racing each other.

The server compiles the agent and registers its workflow definition on every start, then starts
the run. When two starts of an agent it has never seen arrive together (a web app's first burst
after a deploy, two worker processes), both find no definition and both insert one: the loser gets
``HTTP 500: Workflow with <name>.<version> already exists!`` (a conflict in the metadata store,
raised before the run is created: no run exists for that request, verified on the real server).
Sent again, the start finds the definition and updates it, so the conflict is safe to retry.
"""

from __future__ import annotations

import logging
import random
import re
from collections.abc import Callable, Mapping
from typing import Any

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
    for attempt in range(1, _ATTEMPTS + 1):
        try:
            return api.start_agent(body)
        except HttpError as err:
            if not is_definition_race(err) or attempt == _ATTEMPTS:
                raise
            wait = delay * (0.5 + random.random())  # noqa: S311 - jitter between retries, not a secret
            log.debug("start of %s lost the race to create its definition (%s); retrying in %.2fs",
                      _agent_name(body), err.server_message, wait)
            if pause(wait):
                raise
            delay = min(delay * 2, _MAX_PAUSE)
    raise AssertionError("unreachable")  # the loop returns or raises


def _agent_name(body: Mapping[str, Any]) -> str:
    config = body.get("agentConfig")
    return str(config.get("name")) if isinstance(config, Mapping) else "the agent"
