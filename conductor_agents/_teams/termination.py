"""``Agent(termination=...)``: the server's termination conditions, evaluated by this SDK.

On 3.32.3 the server compiles a ``termination`` into a ``SIMPLE`` task named ``<agent>_termination``
(the agent's name with every character other than letters, digits and ``_`` made ``_``) in the
agent's loop, after each turn: the client that serves the agent evaluates the condition there, with
the turn's text (``result``; a multi-agent loop's whole conversation) and the loop's ``iteration``,
and the loop goes on only while the output says ``should_continue``. This module holds the
conditions (the server's ``TerminationConfig`` names, for its records) and that worker.

The server's built-ins (``TerminationConfig.type``): ``text_mention``, ``stop_message``,
``max_message``, ``token_usage`` (``maxTotalTokens`` / ``maxPromptTokens`` /
``maxCompletionTokens``: ends once one is exceeded), ``and``, ``or``. The task's input carries no
token counts, so for a ``token_usage`` condition the worker reads the run's usage as the server
counts it (``GET /agent/execution/{id}``: the sum over the run's LLM calls, guardrail judges
included) before it decides: one more request per turn, only for such a condition.

Pure values; thread-safe.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import attrs

from .._common.answer_text import answer_text
from .._common.checks import Refusal, an_int, optional
from .._common.task_names import termination_task_name
from .._tooldefs.tooldef import ToolDef
from ..errors import AgentDefinitionError, AgentTypeError

__all__ = ["Termination", "termination_worker"]

_KINDS = ("text_mention", "stop_message", "max_message", "token_usage", "and", "or")
#: The input key under which the executor hands a token-usage check the run's usage.
TOKEN_USAGE_INPUT = "token_usage"  # noqa: S105 - an input key, not a secret
_LIMITS = (("max_total_tokens", "maxTotalTokens", "totalTokens"),
           ("max_prompt_tokens", "maxPromptTokens", "promptTokens"),
           ("max_completion_tokens", "maxCompletionTokens", "completionTokens"))


_check_limit = optional(an_int(at_least=1, refusal=Refusal(AgentDefinitionError, prefix="Termination.token_usage: ",
                                                            field="termination")))


def _to_conditions(value: Iterable[Termination]) -> tuple[Termination, ...]:
    return tuple(value)


def _check_conditions(instance: Termination, attribute: attrs.Attribute[Any], value: tuple[Any, ...]) -> None:
    if instance.kind in ("and", "or") and (len(value) < 2 or not all(isinstance(c, Termination) for c in value)):
        raise AgentTypeError("Termination: 'and'/'or' join two or more Terminations", field="termination",
                             value=value)


@attrs.frozen
class Termination:
    """When a loop should end: build with :meth:`text_mention`, :meth:`stop_message`,
    :meth:`max_messages`, :meth:`token_usage`, and join with ``a | b`` (either) or ``a & b``
    (both). Immutable; thread-safe.
    """

    kind: str = attrs.field(validator=attrs.validators.in_(_KINDS))
    text: str | None = None
    case_sensitive: bool = True
    count: int | None = None
    conditions: tuple[Termination, ...] = attrs.field(default=(), converter=_to_conditions,
                                                      validator=_check_conditions)
    max_total_tokens: int | None = attrs.field(default=None, validator=_check_limit, kw_only=True)
    max_prompt_tokens: int | None = attrs.field(default=None, validator=_check_limit, kw_only=True)
    max_completion_tokens: int | None = attrs.field(default=None, validator=_check_limit, kw_only=True)

    @classmethod
    def text_mention(cls, text: str, *, case_sensitive: bool = True) -> Termination:
        """End once the turn's text (a multi-agent loop: the conversation) contains ``text``."""
        if not isinstance(text, str) or not text:
            raise AgentTypeError(f"Termination.text_mention needs a non-empty str, got {text!r}", field="termination",
                                 value=text)
        return cls("text_mention", text=text, case_sensitive=bool(case_sensitive))

    @classmethod
    def stop_message(cls, text: str) -> Termination:
        """End once the turn's text, stripped, is exactly ``text``."""
        if not isinstance(text, str) or not text:
            raise AgentTypeError(f"Termination.stop_message needs a non-empty str, got {text!r}", field="termination",
                                 value=text)
        return cls("stop_message", text=text)

    @classmethod
    def max_messages(cls, count: int) -> Termination:
        """End after ``count`` turns of the loop."""
        refusal = Refusal(AgentDefinitionError, prefix="Termination.max_messages: ", field="termination")
        an_int(at_least=1, refusal=refusal).check("count", count)
        return cls("max_message", count=count)

    @classmethod
    def token_usage(cls, *, max_total_tokens: int | None = None, max_prompt_tokens: int | None = None,
                    max_completion_tokens: int | None = None) -> Termination:
        """End after the turn in which the run's LLM calls have used more tokens than a limit
        (the server's counts, summed over the run: total, prompt (input) or completion (output)).
        Give at least one limit; each an int >= 1."""
        if max_total_tokens is None and max_prompt_tokens is None and max_completion_tokens is None:
            raise AgentDefinitionError("Termination.token_usage needs max_total_tokens, max_prompt_tokens or "
                                       "max_completion_tokens", field="termination", value=None)
        return cls("token_usage", max_total_tokens=max_total_tokens, max_prompt_tokens=max_prompt_tokens,
                   max_completion_tokens=max_completion_tokens)

    @property
    def needs_token_usage(self) -> bool:
        """Whether deciding needs the run's token usage (a ``token_usage`` condition inside)."""
        return self.kind == "token_usage" or any(c.needs_token_usage for c in self.conditions)

    def __or__(self, other: Termination) -> Termination:
        return Termination("or", conditions=(self, other))

    def __and__(self, other: Termination) -> Termination:
        return Termination("and", conditions=(self, other))

    def reached(self, text: str, turn: int, usage: Mapping[str, Any] | None = None) -> bool:
        """Whether the loop ends after a turn with ``text`` (the turn numbered ``turn`` from 1);
        ``usage`` is the run's token usage so far (``{"totalTokens", "promptTokens",
        "completionTokens"}``, the server's names; missing counts are 0)."""
        if self.kind == "text_mention":
            assert self.text is not None
            return self.text in text if self.case_sensitive else self.text.lower() in text.lower()
        if self.kind == "stop_message":
            return text.strip() == self.text
        if self.kind == "max_message":
            assert self.count is not None
            return turn >= self.count
        if self.kind == "token_usage":
            used = usage or {}
            return any(limit is not None and _count(used.get(key)) > limit
                       for limit, key in ((getattr(self, attr), key) for attr, _, key in _LIMITS))
        results = [c.reached(text, turn, usage) for c in self.conditions]
        return all(results) if self.kind == "and" else any(results)

    def to_config(self) -> dict[str, Any]:
        """The server's ``TerminationConfig``."""
        if self.kind == "text_mention":
            return {"type": "text_mention", "text": self.text, "caseSensitive": self.case_sensitive}
        if self.kind == "stop_message":
            return {"type": "stop_message", "stopMessage": self.text}
        if self.kind == "max_message":
            return {"type": "max_message", "maxMessages": self.count}
        if self.kind == "token_usage":
            config: dict[str, Any] = {"type": "token_usage"}
            for attr, name, _ in _LIMITS:
                if getattr(self, attr) is not None:
                    config[name] = getattr(self, attr)
            return config
        return {"type": self.kind, "conditions": [c.to_config() for c in self.conditions]}


def _count(value: Any) -> int:
    if isinstance(value, bool):
        return 0
    if isinstance(value, (int, float)):
        return int(value)
    try:
        return int(str(value))
    except (TypeError, ValueError):
        return 0


@attrs.frozen
class _TerminationCheck:
    condition: Termination

    @property
    def needs_token_usage(self) -> bool:
        """Read by the executor: hand this check the run's token usage (``token_usage`` input)."""
        return self.condition.needs_token_usage

    def __call__(self, **inputs: Any) -> dict[str, Any]:
        text = inputs.get("result")
        turn = inputs.get("iteration")
        usage = inputs.get(TOKEN_USAGE_INPUT)
        reached = self.condition.reached(answer_text(text),
                                         int(turn) if isinstance(turn, (int, float)) else 0,
                                         usage if isinstance(usage, Mapping) else None)
        return {"should_continue": not reached}


def termination_worker(agent_name: str, condition: Termination) -> ToolDef:
    """The worker ToolDef that evaluates ``condition`` for the agent ``agent_name``."""
    return ToolDef(name=termination_task_name(agent_name), description=f"termination of {agent_name}",
                   input_schema={"type": "object", "properties": {}}, func=_TerminationCheck(condition))
