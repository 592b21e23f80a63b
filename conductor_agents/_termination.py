"""``Agent(termination=...)``: the server's termination conditions, evaluated by this SDK.

On 3.32.3 the server compiles a ``termination`` into a ``SIMPLE`` task named ``<agent>_termination``
(the agent's name with every character other than letters, digits and ``_`` made ``_``) in the
agent's loop, after each turn: the client that serves the agent evaluates the condition there, with
the turn's text (``result``; a multi-agent loop's whole conversation) and the loop's ``iteration``,
and the loop goes on only while the output says ``should_continue``. This module holds the
conditions (the server's ``TerminationConfig`` names, for its records) and that worker.

Pure values; thread-safe.
"""

from __future__ import annotations

import re
from typing import Any, Dict, Optional

import attrs

from ._tooldef import TOOL_NAME, ToolDef
from .errors import AgentDefinitionError, AgentTypeError

__all__ = ["Termination", "termination_task_name", "termination_worker"]

_KINDS = ("text_mention", "stop_message", "max_message", "and", "or")


def _check_conditions(instance: "Termination", attribute: "attrs.Attribute[Any]", value: tuple) -> None:
    if instance.kind in ("and", "or") and (len(value) < 2 or not all(isinstance(c, Termination) for c in value)):
        raise AgentTypeError("Termination: 'and'/'or' join two or more Terminations", field="termination",
                             value=value)


@attrs.frozen
class Termination:
    """When a loop should end: build with :meth:`text_mention`, :meth:`stop_message`,
    :meth:`max_messages`, and join with ``a | b`` (either) or ``a & b`` (both). Immutable; thread-safe.
    """

    kind: str = attrs.field(validator=attrs.validators.in_(_KINDS))
    text: Optional[str] = None
    case_sensitive: bool = True
    count: Optional[int] = None
    conditions: "tuple[Termination, ...]" = attrs.field(default=(), converter=tuple, validator=_check_conditions)

    @classmethod
    def text_mention(cls, text: str, *, case_sensitive: bool = True) -> "Termination":
        """End once the turn's text (a multi-agent loop: the conversation) contains ``text``."""
        if not isinstance(text, str) or not text:
            raise AgentTypeError(f"Termination.text_mention needs a non-empty str, got {text!r}", field="termination",
                                 value=text)
        return cls("text_mention", text=text, case_sensitive=bool(case_sensitive))

    @classmethod
    def stop_message(cls, text: str) -> "Termination":
        """End once the turn's text, stripped, is exactly ``text``."""
        if not isinstance(text, str) or not text:
            raise AgentTypeError(f"Termination.stop_message needs a non-empty str, got {text!r}", field="termination",
                                 value=text)
        return cls("stop_message", text=text)

    @classmethod
    def max_messages(cls, count: int) -> "Termination":
        """End after ``count`` turns of the loop."""
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise AgentDefinitionError(f"Termination.max_messages needs an int >= 1, got {count!r}",
                                       field="termination", value=count)
        return cls("max_message", count=count)

    def __or__(self, other: "Termination") -> "Termination":
        return Termination("or", conditions=(self, other))

    def __and__(self, other: "Termination") -> "Termination":
        return Termination("and", conditions=(self, other))

    def reached(self, text: str, turn: int) -> bool:
        """Whether the loop ends after a turn with ``text`` (the turn numbered ``turn`` from 1)."""
        if self.kind == "text_mention":
            assert self.text is not None
            return self.text in text if self.case_sensitive else self.text.lower() in text.lower()
        if self.kind == "stop_message":
            return text.strip() == self.text
        if self.kind == "max_message":
            assert self.count is not None
            return turn >= self.count
        results = [c.reached(text, turn) for c in self.conditions]
        return all(results) if self.kind == "and" else any(results)

    def to_config(self) -> Dict[str, Any]:
        """The server's ``TerminationConfig``."""
        if self.kind == "text_mention":
            return {"type": "text_mention", "text": self.text, "caseSensitive": self.case_sensitive}
        if self.kind == "stop_message":
            return {"type": "stop_message", "stopMessage": self.text}
        if self.kind == "max_message":
            return {"type": "max_message", "maxMessages": self.count}
        return {"type": self.kind, "conditions": [c.to_config() for c in self.conditions]}


def termination_task_name(agent_name: str) -> str:
    """The task the server schedules for an agent's termination condition.

    Raises:
        AgentDefinitionError: the name is too long for a task this SDK serves (64 characters).
    """
    name = re.sub(r"[^A-Za-z0-9_]", "_", agent_name) + "_termination"
    if not TOOL_NAME.fullmatch(name):
        raise AgentDefinitionError(
            f"Agent.termination: the server names its task {name!r}, longer than the 64 characters this SDK "
            f"serves; use an agent name of at most {64 - len('_termination')} characters", field="termination",
            value=agent_name)
    return name


@attrs.frozen
class _TerminationCheck:
    condition: Termination

    def __call__(self, **inputs: Any) -> Dict[str, Any]:
        text = inputs.get("result")
        turn = inputs.get("iteration")
        reached = self.condition.reached("" if text is None else str(text),
                                         int(turn) if isinstance(turn, (int, float)) else 0)
        return {"should_continue": not reached}


def termination_worker(agent_name: str, condition: Termination) -> ToolDef:
    """The worker ToolDef that evaluates ``condition`` for the agent ``agent_name``."""
    return ToolDef(name=termination_task_name(agent_name), description=f"termination of {agent_name}",
                   input_schema={"type": "object", "properties": {}}, func=_TerminationCheck(condition))
