"""The value types a script is written in: tool calls, replies, usage and scripted failures.

A *turn* is what the fake model answers to one request. Scripts and policies may write a
turn in the shortest form that says what they mean; :func:`to_outcome` turns every form
into a :class:`Reply` or a :class:`Failure`:

- ``"text"``: a final answer (the agent loop ends and the run's result is that text);
- ``ToolCall(...)``: one tool call;
- ``[ToolCall(...), ToolCall(...)]``: several tool calls in one reply (the server runs them in parallel);
- ``Reply(...)``: full control (text or tool calls, plus token usage);
- ``Failure(status=...)``: an HTTP error instead of a reply.

All types are frozen and safe to share between threads.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, Union

import attrs

from conductor_agents._common.checks import Refusal, an_int, optional
from conductor_agents.testing._errors import ScriptError

__all__ = ["Failure", "Reply", "ToolCall", "Turn", "Usage", "to_outcome"]


def _json_object(value: Any) -> dict[str, Any]:
    """Copy ``value`` into a plain dict, rejecting anything that is not a JSON object."""
    if not isinstance(value, Mapping):
        raise ScriptError(f"tool call arguments must be a dict, got {type(value).__name__}: {value!r}")
    copied = dict(value)
    try:
        json.dumps(copied)
    except (TypeError, ValueError) as err:
        raise ScriptError(f"tool call arguments are not JSON-serialisable: {err}") from err
    return copied


def _check_name(instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if not isinstance(value, str) or not value.strip():
        raise ScriptError(f"{attribute.name} must be a non-empty string, got {value!r}")


def _check_optional_id(instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if value is not None:
        _check_name(instance, attribute, value)


#: A bad field or argument raises ScriptError.
_SCRIPT = Refusal(ScriptError)
_check_count = optional(an_int(at_least=0, refusal=_SCRIPT))


@attrs.frozen
class Usage:
    """Token usage reported with a reply. ``total_tokens`` defaults to the sum of the other two."""

    input_tokens: int = attrs.field(default=10, validator=_check_count)
    output_tokens: int = attrs.field(default=5, validator=_check_count)
    total_tokens: int | None = attrs.field(default=None, validator=_check_count)

    def to_dict(self) -> dict[str, Any]:
        """The ``usage`` object of a Responses API reply."""
        total = self.total_tokens
        if total is None:
            total = self.input_tokens + self.output_tokens
        return {
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "total_tokens": total,
        }


def _to_usage(value: Any) -> Usage | None:
    if value is None or isinstance(value, Usage):
        return value
    if isinstance(value, Mapping):
        try:
            return Usage(**value)
        except TypeError as err:
            raise ScriptError(f"bad usage {dict(value)!r}: {err}") from err
    raise ScriptError(f"usage must be a Usage or a dict, got {type(value).__name__}")


@attrs.frozen
class ToolCall:
    """The model asks the server to run tool ``name`` with ``arguments``.

    ``call_id`` is generated (``call_<n>``, unique per ScriptedLLM) when left ``None``.
    ``arguments`` must be a JSON object; it is copied, so later changes to the caller's
    dict do not leak into the script.

    Raises:
        ScriptError: the name is empty or the arguments are not a JSON-serialisable dict.
    """

    name: str = attrs.field(validator=_check_name)
    arguments: dict[str, Any] = attrs.field(factory=dict, converter=_json_object, hash=False)
    call_id: str | None = attrs.field(default=None, validator=_check_optional_id)


def _to_tool_calls(value: Any) -> tuple[ToolCall, ...]:
    if isinstance(value, ToolCall):
        return (value,)
    if isinstance(value, (str, bytes, Mapping)) or not isinstance(value, Sequence):
        raise ScriptError(f"tool_calls must be a ToolCall or a sequence of them, got {value!r}")
    calls = tuple(value)
    for call in calls:
        if not isinstance(call, ToolCall):
            raise ScriptError(f"tool_calls may hold only ToolCall values, got {call!r}")
    return calls


@attrs.frozen
class Reply:
    """One complete answer of the model: a final ``text`` or one or more ``tool_calls``.

    ``usage`` (a :class:`Usage` or a dict of its fields) overrides the default token counts
    (10 in, 5 out).

    Raises:
        ScriptError: both or neither of ``text`` and ``tool_calls`` are given.
    """

    text: str | None = None
    tool_calls: tuple[ToolCall, ...] = attrs.field(default=(), converter=_to_tool_calls)
    usage: Usage | None = attrs.field(default=None, converter=_to_usage)

    def __attrs_post_init__(self) -> None:
        if self.text is not None and not isinstance(self.text, str):
            raise ScriptError(f"text must be a string, got {type(self.text).__name__}")
        if (self.text is None) == (not self.tool_calls):
            raise ScriptError("a Reply holds exactly one of text and tool_calls")


def _default_failure_body(status: int) -> dict[str, Any]:
    return {
        "error": {
            "message": f"scripted failure (HTTP {status})",
            "type": "server_error" if status >= 500 else "invalid_request_error",
            "param": None,
            "code": None,
        }
    }


#: A scripted failure is an HTTP error status.
_check_status = an_int(at_least=400, at_most=599, refusal=_SCRIPT)


@attrs.frozen
class Failure:
    """Answer one request with HTTP ``status`` and ``body`` instead of a reply.

    ``body`` may be a dict (sent as JSON) or a string; by default it is an OpenAI-style
    error object. Remember that the server retries failed LLM calls, so one scripted
    failure usually costs one extra request, not the run.

    Raises:
        ScriptError: ``status`` is not in 400-599.
    """

    status: int = attrs.field(default=500, validator=_check_status)
    body: Any = attrs.field(default=None, hash=False)

    def body_or_default(self) -> Any:
        """The body to send: the scripted one, or the default error object."""
        return _default_failure_body(self.status) if self.body is None else self.body


Turn = Union[str, ToolCall, Sequence[ToolCall], Reply, Failure]  # noqa: UP007 - public: its value stays a typing.Union
"""Anything a script or a policy may answer with; see the module docstring."""

Outcome = Reply | Failure


def to_outcome(turn: Any) -> Outcome:
    """Turn any accepted turn form into a :class:`Reply` or a :class:`Failure`.

    Raises:
        ScriptError: ``turn`` is not one of the accepted forms (``None``, a dict, an empty
            list, a list holding something other than ToolCall...).
    """
    if isinstance(turn, (Reply, Failure)):
        return turn
    if isinstance(turn, str):
        return Reply(text=turn)
    if isinstance(turn, ToolCall):
        return Reply(tool_calls=(turn,))
    if isinstance(turn, (list, tuple)):
        if not turn:
            raise ScriptError("an empty list is not a turn; give at least one ToolCall")
        return Reply(tool_calls=tuple(turn))
    raise ScriptError(
        "a turn is a str, a ToolCall, a list of ToolCall, a Reply or a Failure; "
        f"got {type(turn).__name__}: {turn!r}"
    )
