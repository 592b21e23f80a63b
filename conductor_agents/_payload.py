"""JSON normalisation of what crosses to the server: message payloads and tool outputs."""

from __future__ import annotations

import json
from typing import Any, Mapping

from .errors import PayloadError

__all__ = ["message_payload", "tool_output", "ToolOutputError"]


class ToolOutputError(ValueError):
    """A tool body returned something the server cannot store."""


def _first_bad_key(value: Any) -> Any:
    """``(key,)`` for the first non-string mapping key anywhere in ``value``, else None.

    json.dumps would silently turn such keys into strings.
    """
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, Mapping):
            for key, inner in item.items():
                if not isinstance(key, str):
                    return (key,)
                stack.append(inner)
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
    return None


def _json_roundtrip(value: Any) -> Any:
    """``value`` as plain JSON types; raises TypeError/ValueError when it is not JSON."""
    return json.loads(json.dumps(value, allow_nan=False))


def message_payload(payload: Any) -> dict:
    """The JSON object sent for a message.

    A mapping is sent as is; a string becomes ``{"message": s}``; any other JSON value
    becomes ``{"message": value}``.

    Raises:
        PayloadError: (a ``TypeError``) the payload is not JSON-serialisable, or a mapping
            has non-string keys. No request is sent.
    """
    body: Any = dict(payload) if isinstance(payload, Mapping) else {"message": payload}
    bad_key = _first_bad_key(body)
    if bad_key is not None:
        raise PayloadError(f"message payload keys must be strings, got {bad_key[0]!r}")
    try:
        return _json_roundtrip(body)
    except (TypeError, ValueError) as err:
        raise PayloadError(f"message payload is not JSON-serialisable: {err}") from None


def tool_output(value: Any) -> dict:
    """A tool body's return value as the task's output map.

    A dict is the output itself; anything else is wrapped as ``{"result": value}``.

    Raises:
        ToolOutputError: the value (or part of it) is not JSON-serialisable.
    """
    body = value if isinstance(value, dict) else {"result": value}
    bad_key = _first_bad_key(body)
    if bad_key is not None:
        raise ToolOutputError(f"the returned value has a non-string key {bad_key[0]!r}")
    try:
        return _json_roundtrip(body)
    except (TypeError, ValueError) as err:
        raise ToolOutputError(f"the returned value is not JSON-serialisable ({err})") from None
