"""What the transport sends again, and when: the one place that decides it (see :mod:`.transport`).

A request is sent again only when that cannot run a side effect twice: a connection that could not be
established (nothing reached the server), for any method; a GET whose connection broke before the answer, except a
poll that takes tasks (:func:`hands_out_tasks`): the server hands a polled task to the worker before it answers, so
the broken answer may have held tasks, and a poll sent again gets others (or none) while those wait for their
response timeout (an hour for an agent's tool). The poller hears of the failure and looks for them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, TypeVar

import requests
import urllib3
from urllib3.util.retry import Retry

__all__ = ["again_if_broken", "connect_retries", "hands_out_tasks"]

log = logging.getLogger("conductor_agents.transport")

T = TypeVar("T")


def connect_retries() -> Retry:
    """Only failures to establish a connection are retried (nothing reached the server then)."""
    return Retry(total=None, connect=2, read=0, status=0, other=0, redirect=0,
                 backoff_factor=0.2, raise_on_status=False)


def _broke_mid_exchange(err: BaseException) -> bool:
    """Whether ``err`` (from requests or urllib3) says an established connection broke before the answer
    came, as opposed to a refused connection or a timeout."""
    cause: Any = err
    if isinstance(cause, requests.exceptions.ConnectionError) and cause.args:
        cause = cause.args[0]
    if isinstance(cause, urllib3.exceptions.MaxRetryError):
        cause = cause.reason
    return isinstance(cause, urllib3.exceptions.ProtocolError)


def hands_out_tasks(path: str, params: Any) -> bool:
    """Whether ``GET path`` with ``params`` is a poll that may take tasks (``/tasks/poll...`` with a count that is
    not 0; a poll for none only tells the server who polls)."""
    if not path.startswith("/tasks/poll"):
        return False
    count = params.get("count", 1) if isinstance(params, dict) else 1
    return str(count) != "0"


def again_if_broken(send: Callable[[], T], what: str, *, resend: bool = True) -> T:
    """``send()``, and once more when its connection broke before the answer (only for requests that
    change nothing on the server; ``resend=False`` for one that does: see :func:`hands_out_tasks`)."""
    try:
        return send()
    except (requests.exceptions.ConnectionError, urllib3.exceptions.HTTPError) as err:
        if not resend or isinstance(err, requests.exceptions.Timeout) or not _broke_mid_exchange(err):
            raise
        log.debug("%s: the connection broke before the answer; sending it once more", what)
        return send()
