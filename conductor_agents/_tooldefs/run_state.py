"""A run's context: what ``start(context=...)`` seeds and what tools read and update.

The server keeps it in the run's ``_agent_state`` variable: it starts as the start request's
``context``, is shown to the model before every turn (a ``Context:`` block in the user message,
each value as text), is given to every tool task as its ``_agent_state`` input, and is updated by
the ``_state_updates`` map a tool puts in its output (merged key by key after each turn: a list
onto a list appends the new items, anything else replaces). The run's output carries it back as
``context``.

The server truncates each value to 4,096 characters and drops keys past 32,768 characters when it
shows the context to the model; the SDK refuses a context that would be cut (a clear error rather
than a model silently seeing less). Values are shown to the model as text (a nested map appears
in Java's ``{a=1}`` notation): strings, numbers and booleans read best.

Pure functions and one small thread-safe holder.
"""

from __future__ import annotations

import collections.abc
import json
import threading
import types
from collections.abc import Iterable, Mapping
from typing import Any

from .._common.json_check import json_copy
from ..errors import PayloadError, RunContextError

__all__ = ["MAX_CONTEXT_BYTES", "MAX_VALUE_BYTES", "StateUpdates", "check_context", "check_media",
           "merge_updates", "state_of_task"]

#: The server's limit per context value when it shows the context to the model.
MAX_VALUE_BYTES = 4096
#: The server's limit for the whole context shown to the model.
MAX_CONTEXT_BYTES = 32768
#: The output key the server reads a tool's state updates from.
STATE_UPDATES_KEY = "_state_updates"


def _rendered(value: Any) -> str:
    # What the server shows: strings as they are, other values as text (JSON is a close bound).
    return value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))


def check_context(context: Any, *, what: str = "context") -> dict[str, Any]:
    """A JSON copy of ``context`` that fits the server's limits.

    Raises:
        PayloadError: (a TypeError) not a mapping with string keys, or not JSON-serialisable.
        RunContextError: (a ValueError) a value or the whole context is too large.
    """
    if not isinstance(context, collections.abc.Mapping):
        raise PayloadError(f"{what} must be a mapping of names to JSON values, got {type(context).__name__}")
    if any(not isinstance(key, str) for key in context):
        raise PayloadError(f"{what} keys must be strings")
    try:
        copy: dict[str, Any] = json_copy(context)
    except TypeError as err:
        raise PayloadError(f"{what} is not JSON: {err}") from None
    total = 0
    for key, value in copy.items():
        if value is None:
            continue
        size = len(_rendered(value).encode("utf-8"))
        if size > MAX_VALUE_BYTES:
            raise RunContextError(
                f"{what}[{key!r}] is {size} bytes; the server shows at most {MAX_VALUE_BYTES} bytes of a "
                "value to the model (keep large data elsewhere and put a reference here)",
                key=key, size=size, limit=MAX_VALUE_BYTES)
        total += size + len(key) + 6
    if total > MAX_CONTEXT_BYTES:
        raise RunContextError(
            f"{what} is about {total} bytes; the server shows at most {MAX_CONTEXT_BYTES} bytes of context "
            "to the model", size=total, limit=MAX_CONTEXT_BYTES)
    return copy


def check_media(media: Any) -> list[str]:
    """``media`` as a list of URLs for the start request.

    Raises:
        PayloadError: (a TypeError) not a list of non-blank strings.
    """
    if isinstance(media, (str, bytes)) or not isinstance(media, Iterable):
        raise PayloadError(f"media must be a list of URLs, got {media!r}")
    urls = list(media)
    if not all(isinstance(url, str) and url.strip() for url in urls):
        raise PayloadError(f"media must be a list of URLs (non-blank strings), got {urls!r}")
    return [url.strip() for url in urls]


def state_of_task(input_data: Mapping[str, Any]) -> Mapping[str, Any]:
    """The run's context as a tool task received it (read-only)."""
    state = input_data.get("_agent_state") if isinstance(input_data, Mapping) else None
    return types.MappingProxyType(dict(state) if isinstance(state, Mapping) else {})


class StateUpdates:
    """The updates one tool call makes to its run's context. Thread-safe."""

    __slots__ = ("_lock", "_updates")

    def __init__(self) -> None:
        self._updates: dict[str, Any] = {}
        self._lock = threading.Lock()

    def update(self, values: Mapping[str, Any]) -> None:
        """Record ``values`` (checked against the server's limits).

        Raises:
            PayloadError, RunContextError: as :func:`check_context`.
        """
        checked = check_context(values, what="update_state()")
        with self._lock:
            self._updates.update(checked)

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return dict(self._updates)


def merge_updates(output: dict[str, Any], updates: StateUpdates | None) -> dict[str, Any]:
    """The task output with the call's state updates in ``_state_updates`` (the tool's own entries
    there, if it set any, are kept; ``update_state()`` wins on the same key)."""
    recorded = updates.snapshot() if updates is not None else {}
    if not recorded:
        return output
    own = output.get(STATE_UPDATES_KEY)
    merged = {**(own if isinstance(own, Mapping) else {}), **recorded}
    return {**output, STATE_UPDATES_KEY: merged}
