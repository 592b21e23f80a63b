"""Where a run keeps its trace context: the W3C ``traceparent`` of its ``invoke_agent`` span, sent as the
start's ``sessionId`` (the server stores it as the run's input ``session_id`` and shows it to no model).

Every later run of a listener, and any process that adopts or resumes a run, reads it there: that is how one
listener keeps one trace across its continued runs and processes. Pure: no OpenTelemetry import.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

__all__ = ["START_KEY", "carrier_of", "is_traceparent"]

#: The start body's key that carries it (``POST /agent/start``); the run's input calls it ``session_id``.
START_KEY = "sessionId"
_INPUT_KEY = "session_id"
_TRACEPARENT = re.compile(r"^00-(?!0{32})[0-9a-f]{32}-(?!0{16})[0-9a-f]{16}-[0-9a-f]{2}$")


def is_traceparent(value: Any) -> bool:
    """Whether ``value`` is a W3C ``traceparent`` (version 00, valid ids)."""
    return isinstance(value, str) and bool(_TRACEPARENT.match(value))


def carrier_of(workflow: Mapping[str, Any]) -> str | None:
    """The ``traceparent`` run ``workflow`` was started with, or None (started untraced)."""
    value = (workflow.get("input") or {}).get(_INPUT_KEY)
    return value if is_traceparent(value) else None
