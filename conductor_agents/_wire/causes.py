"""A failed request's cause, short: the one fact a person needs, not the four exceptions that carried it.

``requests`` wraps a refused connection in four exceptions (``ConnectionError`` around urllib3's
``MaxRetryError`` around ``NewConnectionError`` around ``ConnectionRefusedError``), each printed with its own
traceback: about a hundred lines under a :class:`~conductor_agents.errors.ServerUnavailableError` for one
fact. The transport raises its error from :func:`short_cause` instead: a copy of the innermost exception
(``ConnectionRefusedError: [Errno 111] Connection refused``) with no traceback and no chain of its own, so
``err.__cause__`` still says why in one line. Pure; thread-safe.
"""

from __future__ import annotations

import requests
import urllib3

from ..errors import ServerUnavailableError

__all__ = ["innermost", "short_cause", "unavailable"]


def innermost(err: BaseException) -> BaseException:
    """The exception at the bottom of ``err``'s chain: followed through ``__cause__``, a ``reason`` (urllib3),
    an exception held as the first argument (``requests``), then ``__context__``."""
    seen = {id(err)}
    current = err
    while True:
        first = current.args[0] if current.args else None
        below = next((candidate for candidate in (current.__cause__, getattr(current, "reason", None), first,
                                                  current.__context__)
                      if isinstance(candidate, BaseException) and id(candidate) not in seen), None)
        if below is None:
            return current
        seen.add(id(below))
        current = below


def short_cause(err: BaseException) -> BaseException:
    """A copy of :func:`innermost` of ``err`` without its traceback or chain (``err`` itself when it cannot be
    copied), to raise from."""
    root = innermost(err)
    try:
        copy = type(root)(*root.args)
    except Exception:  # noqa: BLE001 - an exception type whose arguments do not rebuild it: keep the original
        copy = root
    else:
        copy.__suppress_context__ = True
    return copy


def unavailable(message: str, err: requests.exceptions.RequestException) -> ServerUnavailableError:
    """A ServerUnavailableError for ``err``; its ``request_sent`` is False when the request never left (no
    connection was made), so the server cannot have acted on it (a start then needs no resend to find its run)."""
    error = ServerUnavailableError(message)
    reason = err.args[0] if err.args else None
    reason = getattr(reason, "reason", reason)  # a MaxRetryError's cause
    error.request_sent = not (isinstance(err, requests.exceptions.ConnectTimeout)
                              or isinstance(reason, urllib3.exceptions.NewConnectionError))
    return error
