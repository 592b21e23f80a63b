"""JSON normalisation of what crosses to the server: message payloads and tool outputs."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from .._common.structured import CycleError, jsonable
from ..errors import PayloadError

__all__ = ["message_payload", "tool_output", "ToolOutputError"]


class ToolOutputError(ValueError):
    """A tool body returned something the server cannot store."""


class _CycleError(Exception):
    """The value contains itself (a container reachable from inside itself)."""


def _first_bad_key(value: Any) -> Any:
    """``(key,)`` for the first non-string mapping key anywhere in ``value``, else None.

    json.dumps would silently turn such keys into strings. Walks the containers with an
    explicit stack and the ids of those on the current path, so a value that contains
    itself raises :class:`_CycleError` at once instead of being walked for ever.
    """
    on_path: set[int] = set()
    stack: list[tuple[Any, bool]] = [(value, False)]
    while stack:
        item, leaving = stack.pop()
        if leaving:
            on_path.discard(id(item))
            continue
        if not isinstance(item, (Mapping, list, tuple)):
            continue
        if id(item) in on_path:
            raise _CycleError()
        on_path.add(id(item))
        stack.append((item, True))
        if isinstance(item, Mapping):
            for key, inner in item.items():
                if not isinstance(key, str):
                    return (key,)
                stack.append((inner, False))
        else:
            stack.extend((inner, False) for inner in item)
    return None


def _json_roundtrip(value: dict[str, Any]) -> dict[str, Any]:
    """``value`` as plain JSON types; raises TypeError/ValueError when it is not JSON."""
    try:
        loaded: dict[str, Any] = json.loads(json.dumps(value, allow_nan=False))
        return loaded
    except RecursionError:
        raise ValueError("it is nested too deeply") from None


def message_payload(payload: Any) -> dict[str, Any]:
    """The JSON object sent for a message.

    A mapping is sent as is; a string becomes ``{"message": s}``; any other JSON value
    becomes ``{"message": value}``.

    Raises:
        PayloadError: (a ``TypeError``) the payload is not JSON-serialisable, contains
            itself, or a mapping has non-string keys. No request is sent.
    """
    body: Any = dict(payload) if isinstance(payload, Mapping) else {"message": payload}
    try:
        bad_key = _first_bad_key(body)
    except _CycleError:
        raise PayloadError("message payload contains itself (a cycle); it cannot be sent as JSON") from None
    if bad_key is not None:
        raise PayloadError(f"message payload keys must be strings, got {bad_key[0]!r}")
    try:
        return _json_roundtrip(body)
    except (TypeError, ValueError) as err:
        raise PayloadError(f"message payload is not JSON-serialisable: {err}") from None


def tool_output(value: Any) -> dict[str, Any]:
    """A tool body's return value as the task's output map.

    Dataclasses, NamedTuples and pydantic models become JSON objects first (also when nested).
    A dict is the output itself; anything else is wrapped as ``{"result": value}``.

    Raises:
        ToolOutputError: the value (or part of it) is not JSON-serialisable, or contains itself.
    """
    try:
        value = jsonable(value)
    except CycleError:
        raise ToolOutputError("the returned value contains itself (a cycle); it cannot be stored as JSON") from None
    except Exception as err:  # noqa: BLE001 - the user's model_dump() that fails, a property that raises
        raise ToolOutputError(f"the returned value could not be turned into JSON ({type(err).__name__}: {err})") \
            from None
    body = value if isinstance(value, dict) else {"result": value}
    try:
        bad_key = _first_bad_key(body)
    except _CycleError:
        raise ToolOutputError("the returned value contains itself (a cycle); it cannot be stored as JSON") from None
    if bad_key is not None:
        raise ToolOutputError(f"the returned value has a non-string key {bad_key[0]!r}")
    try:
        return _json_roundtrip(body)
    except (TypeError, ValueError) as err:
        raise ToolOutputError(f"the returned value is not JSON-serialisable ({err})") from None
