"""One shape for the background parts an owner stops: :class:`Part`, and :func:`close_in_order`.

Every part the runtime owns (the pending monitor, adoption, the workers with their pollers, tool pool,
queue watcher and watchdog, presence, the observer's event streams, the transport it made) stops the
same way: ``close()``. So the owner's own ``close()`` is a list of its parts, in the order they stop.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Protocol, runtime_checkable

__all__ = ["Part", "Step", "close_in_order"]


@runtime_checkable
class Part(Protocol):
    """A background part of an owner.

    ``close()`` stops what the part runs and releases what it holds: its threads are stopped and joined,
    every wait bounded (each part's docstring says by what). Idempotent, safe before the part started (or
    if it never does), callable from any thread but the part's own.
    """

    def close(self) -> None:
        """Stop, join (bounded) and release. Idempotent; safe before start."""


class Step:
    """A step of an owner's ``close()`` that is not an object of its own (stop some loops together, end some
    spans), as a :class:`Part` so it takes its place in the owner's list: ``close()`` calls ``run``."""

    def __init__(self, name: str, run: Callable[[], None]) -> None:
        self._name = name
        self._run = run

    def __repr__(self) -> str:
        return f"<step {self._name}>"

    def close(self) -> None:
        self._run()


def close_in_order(parts: Iterable[Part], log: logging.Logger) -> None:
    """``close()`` each part in turn; a part that fails is logged and the next ones are closed all the same.

    Raises: the first part's error, once every part was closed. A ``KeyboardInterrupt`` or ``SystemExit``
    (any ``BaseException`` that is not an ``Exception``) is not caught: it propagates at once, the parts
    after it left open.
    """
    errors = [error for error in (_closed(part, log) for part in parts) if error is not None]
    if errors:
        raise errors[0]


def _closed(part: Part, log: logging.Logger) -> Exception | None:
    """``part.close()``; the error it raised (logged), or None. Ctrl-C and exits propagate."""
    try:
        part.close()
    except Exception as err:  # the caller raises it, after the other parts
        log.exception("closing %r failed", part)
        return err
    return None
