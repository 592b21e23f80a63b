"""JSON normalisation of what crosses to the server: message payloads and tool outputs."""

from __future__ import annotations

import json
from typing import Any, Mapping

from .errors import PayloadError

__all__ = ["message_payload", "tool_output", "ToolOutputError"]


class ToolOutputError(ValueError):
    """A tool body returned something the server cannot store."""


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
    if isinstance(payload, Mapping):
        bad_keys = [k for k in payload if not isinstance(k, str)]
        if bad_keys:
            raise PayloadError(f"message payload keys must be strings, got {bad_keys[0]!r}")
        body: Any = dict(payload)
    else:
        body = {"message": payload}
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
    if any(not isinstance(k, str) for k in body):
        raise ToolOutputError("the returned dict has non-string keys")
    try:
        return _json_roundtrip(body)
    except (TypeError, ValueError) as err:
        raise ToolOutputError(f"the returned value is not JSON-serialisable ({err})") from None
