"""The text a user's check gets for an answer the server hands over: :func:`answer_text`.

The server (3.32.3) reads every model answer that is a JSON object (fenced in ```json or not) into an
object, whatever the agent, and hands a turn of tool calls on as an empty list. Python checks (function
guardrails, gates, ``stop_when``, termination, handoff conditions) and what a person reviews get the
answer as text: the model's text as it was, or, once the server parsed it, that object as JSON text
(same content; the key order is the server's), never a Python repr.

Pure functions; thread-safe.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

__all__ = ["answer_text"]


def answer_text(value: Any) -> str:
    """``value`` as the text a check gets.

    A str is returned as it is; ``None`` and the empty list of a turn of tool calls are ``""``; an
    object or list the server parsed from JSON is ``json.dumps(value, ensure_ascii=False)``, and so is
    a number or a bool (``true``, not ``True``). Anything else (not JSON) is ``str(value)``.
    """
    if isinstance(value, str):
        return value
    if value is None or (isinstance(value, (list, tuple)) and not value):
        return ""
    if isinstance(value, (Mapping, list, tuple, bool, int, float)):
        try:
            return json.dumps(value, ensure_ascii=False)
        except (TypeError, ValueError):  # not JSON (a set inside, a non-str key, NaN is fine)
            pass
    return str(value)
