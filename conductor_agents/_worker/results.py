"""Posting a tool's result to the server until it is taken, or the server says the task is gone.

A result that is lost costs a lot: the task sits IN_PROGRESS until its lease ends (an hour for agent
tools) and the tool then runs again. So every failure that may pass is retried with a bounded
backoff (0.25 s doubling to 5 s): no connection, a timeout, 5xx, 408, 429, the token endpoint
failing, credentials refused while a token is refreshed. The retries end when the server takes the
result, when it answers that the task is gone (404: logged ``DROPPED``) or refuses the result itself
(another 4xx: logged ``REFUSED``; the same body would be refused again), or when the runtime's
close grace period ends (``abandon`` is set; logged ``DROPPED``), optionally also after
``retry_seconds``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from typing import Any

from .._common.clock import SYSTEM_CLOCK, Clock
from .._wire.api import ConductorApi
from .._wire.transport import HttpError
from ..errors import ServerError

__all__ = ["ResultPoster"]

log = logging.getLogger("conductor_agents.worker")

_FIRST_DELAY = 0.25
_MAX_DELAY = 5.0
#: While the server stays unreachable, one warning per this many attempts (the others at DEBUG).
_WARN_EVERY = 12
#: 4xx statuses that still mean "try again later".
_RETRY_4XX = frozenset({408, 429})


class ResultPoster:
    """Posts task results with retries. Thread-safe (no state between calls)."""

    def __init__(self, api: ConductorApi, *, clock: Clock = SYSTEM_CLOCK,
                 retry_seconds: float | None = None) -> None:
        self._api = api
        self._clock = clock
        self._retry_seconds = retry_seconds

    def post(self, task: Any, result: Mapping[str, Any], abandon: threading.Event) -> bool:
        """POST ``result`` for ``task`` (a TaskRef); True once the server took it.

        ``abandon`` is waited on between attempts; once it is set the result is given up.
        """
        deadline = None if self._retry_seconds is None else self._clock.monotonic() + self._retry_seconds
        delay = _FIRST_DELAY
        attempt = 0
        while True:
            attempt += 1
            try:
                self._api.update_task(result)
            except ServerError as err:
                if isinstance(err, HttpError) and _is_final(err):
                    self._log_final(task, result, err)
                    return False
                if deadline is not None and self._clock.monotonic() + delay > deadline:
                    log.error("DROPPED the %s result of task %s (%s, run %s) after %d attempts: %s",
                              result["status"], task.task_id, task.task_type, task.workflow_id, attempt, err)
                    return False
                level = logging.WARNING if attempt % _WARN_EVERY == 1 else logging.DEBUG
                log.log(level, "posting the result of task %s failed (attempt %d: %s); retrying in %.2fs",
                        task.task_id, attempt, err, delay)
            else:
                if attempt > 1:
                    log.info("result of task %s accepted after %d attempts", task.task_id, attempt)
                return True
            if abandon.wait(delay):
                log.error("DROPPED the %s result of task %s (%s, run %s): the runtime closed while the server "
                          "did not take it (%d attempts)", result["status"], task.task_id, task.task_type,
                          task.workflow_id, attempt)
                return False
            delay = min(delay * 2, _MAX_DELAY)

    @staticmethod
    def _log_final(task: Any, result: Mapping[str, Any], err: HttpError) -> None:
        if err.status == 404:
            log.error("DROPPED the %s result of task %s (%s, run %s): the server no longer knows the task "
                      "(HTTP 404: %s)", result["status"], task.task_id, task.task_type, task.workflow_id,
                      err.server_message)
        else:
            log.error("REFUSED: the server refused the %s result of task %s (%s, run %s) with HTTP %s: %s; "
                      "not retried", result["status"], task.task_id, task.task_type, task.workflow_id,
                      err.status, err.server_message)


def _is_final(err: HttpError) -> bool:
    """Whether the server answered this very request with a refusal that a retry cannot change.

    Only an HTTP 4xx to ``POST /tasks`` itself; 5xx, 408, 429, no answer, and any failure to get
    a token (an :class:`~conductor_agents.errors.AuthenticationError` or the token endpoint's own
    5xx) may pass.
    """
    return 400 <= (err.status or 0) < 500 and err.status not in _RETRY_4XX
