"""Guardrails: checks of the model's answer before it leaves the run (:class:`Guardrail`).

Three kinds, as the server (3.32.3) compiles them into the agent's loop after each model turn
that ends in text (a turn of tool calls passes):

- ``Guardrail.regex``: the server matches the answer against patterns (an ``INLINE`` script).
  ``mode="block"`` fails on a match, ``"allow"`` fails unless one matches.
- ``Guardrail.llm``: the server asks a model whether the answer follows ``policy``.
- ``Guardrail.function``: a Python function, run as a worker task of its own (named after the
  guardrail) by whoever serves the agent, pinned to the run's domain when it is stateful.

When a check fails, ``on_fail`` decides: ``"retry"`` shows the model ``Output validation failed:
<message>. Please revise your response.`` and asks again, up to ``max_retries`` turns, then
fails the run; ``"raise"`` fails the run at once (its error is the message); ``"fix"`` replaces
the answer with the function's ``fixed_output`` (a function guardrail only; none given: the run
fails); ``"human"`` makes the run wait for a person, who approves, edits or rejects the answer
(a ``"review"`` :class:`~conductor_agents.PendingRequest`; see :mod:`conductor_agents._people.pending`).

On a tool (``tool(guardrails=[...])``) the server checks a turn's tool calls, formatted as text,
before they run (3.32.3: every call of the turn, whichever tool has the guardrail; ``retry`` does
not stop the calls; ``fix`` is refused here). The server compiles no agent-level input guardrail.

Pure values; thread-safe. A function guardrail's body may run on several worker threads at once.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from typing import Any

import attrs

from .._common.answer_text import answer_text
from .._common.checks import Refusal, an_int
from .._common.task_names import TOOL_NAME
from .._tooldefs.tooldef import ToolCheck, ToolDef
from ..errors import AgentDefinitionError, AgentTypeError

__all__ = ["Guardrail", "GuardrailResult"]

ON_FAIL = ("retry", "raise", "fix", "human")
REGEX, LLM, CUSTOM = "regex", "llm", "custom"


@attrs.frozen
class GuardrailResult:
    """What a function guardrail returns when a bare ``True``/``False`` says too little.

    ``message`` is what the model (``retry``) or the run's error (``raise``) shows; ``fixed_output``
    the answer to use instead (``on_fail="fix"``).
    """

    passed: bool
    message: str = ""
    fixed_output: str | None = None


def _fail(message: str, field: str, value: Any,
          kind: type[AgentDefinitionError | AgentTypeError] = AgentDefinitionError) -> Exception:
    return kind(f"Guardrail: {message}", field=field, value=value)


def _check_name(instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if not isinstance(value, str) or not TOOL_NAME.fullmatch(value):
        raise _fail(f"name must be 1-64 letters, digits, '_' or '-', starting with a letter or '_', got {value!r}",
                    "name", value)


def _check_on_fail(instance: Guardrail, attribute: attrs.Attribute[Any], value: Any) -> None:
    if value not in ON_FAIL:
        raise _fail(f"on_fail must be one of {ON_FAIL}, got {value!r}", "on_fail", value)
    if value == "fix" and instance.kind != CUSTOM:
        raise _fail("on_fail='fix' needs a function guardrail (it gives the fixed output)", "on_fail", value)


_check_retries = an_int(at_least=1, refusal=Refusal(AgentDefinitionError, prefix="Guardrail: "))


def _to_patterns(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        value = [value]
    patterns = tuple(value)
    for pattern in patterns:
        if not isinstance(pattern, str) or not pattern:
            raise _fail(f"patterns must be non-empty strs, got {pattern!r}", "patterns", pattern, AgentTypeError)
        try:
            re.compile(pattern)
        except re.error as err:
            raise _fail(f"pattern {pattern!r} is not a regular expression: {err}", "patterns", pattern) from None
    return patterns


@attrs.frozen
class Guardrail(ToolCheck):
    """A check of the model's answer; build one with :meth:`regex`, :meth:`llm` or :meth:`function`.

    Immutable; thread-safe.

    Raises:
        AgentDefinitionError, AgentTypeError: a bad field (the message names it).
    """

    name: str = attrs.field(validator=_check_name)
    kind: str = attrs.field(validator=attrs.validators.in_((REGEX, LLM, CUSTOM)))
    on_fail: str = attrs.field(default="retry", validator=_check_on_fail, kw_only=True)
    max_retries: int = attrs.field(default=3, validator=_check_retries, kw_only=True)
    patterns: tuple[str, ...] = attrs.field(default=(), converter=_to_patterns, kw_only=True)
    mode: str = attrs.field(default="block", validator=attrs.validators.in_(("block", "allow")), kw_only=True)
    message: str | None = attrs.field(default=None, kw_only=True)
    model: str | None = attrs.field(default=None, kw_only=True)
    policy: str | None = attrs.field(default=None, kw_only=True)
    max_tokens: int | None = attrs.field(default=None, kw_only=True)
    func: Callable[[str], Any] | None = attrs.field(default=None, kw_only=True, eq=False, repr=False)

    def __attrs_post_init__(self) -> None:
        if self.kind == REGEX and not self.patterns:
            raise _fail("a regex guardrail needs at least one pattern", "patterns", self.patterns)
        if self.kind == LLM and not (self.model and self.policy):
            raise _fail("an LLM guardrail needs a model ('provider/model') and a policy", "policy", self.policy)
        if self.kind == CUSTOM and not callable(self.func):
            raise _fail(f"a function guardrail needs a callable, got {self.func!r}", "func", self.func, AgentTypeError)

    @classmethod
    def regex(cls, name: str, patterns: str | Iterable[str], *, mode: str = "block",
              message: str | None = None, on_fail: str = "retry", max_retries: int = 3) -> Guardrail:
        """A check the server runs: the answer must not match (``mode="block"``) or must match
        (``"allow"``) one of ``patterns`` (JavaScript regular expressions)."""
        return cls(name, REGEX, patterns=patterns, mode=mode, message=message, on_fail=on_fail,
                   max_retries=max_retries)

    @classmethod
    def llm(cls, name: str, *, model: str, policy: str, on_fail: str = "retry", max_retries: int = 3,
            max_tokens: int | None = None) -> Guardrail:
        """A check the server runs by asking ``model`` whether the answer follows ``policy``."""
        return cls(name, LLM, model=model, policy=policy, on_fail=on_fail, max_retries=max_retries,
                   max_tokens=max_tokens)

    @classmethod
    def function(cls, func: Callable[[str], Any], *, name: str | None = None, on_fail: str = "retry",
                 max_retries: int = 3) -> Guardrail:
        """A check in Python: ``func(answer)`` returns ``True`` (passed), ``False`` or a
        :class:`GuardrailResult`. It runs as a worker task named ``name`` (default: the function's
        name), so the agent's runtime must be serving the run. An exception fails the run.

        ``answer`` is the model's text; when the answer was a JSON object the server read it into an
        object (any agent), and ``answer`` is that object as JSON text (``json.dumps``: the same content,
        the server's key order), so ``json.loads(answer)`` works. A turn of tool calls is not checked."""
        return cls(name if name is not None else getattr(func, "__name__", ""), CUSTOM, func=func,
                   on_fail=on_fail, max_retries=max_retries)

    @property
    def worker(self) -> ToolDef | None:
        """The worker task that runs a function guardrail (None for the server's own checks)."""
        if self.kind != CUSTOM:
            return None
        assert self.func is not None  # a function guardrail has one (checked when it was made)
        return ToolDef(
            name=self.name,
            description=f"guardrail {self.name}",
            input_schema={"type": "object", "properties": {}},
            func=_Check(self.func, self.on_fail, self.name),
        )

    def to_config(self, position: str = "output") -> dict[str, Any]:
        """The server's ``GuardrailConfig`` (``position="input"`` for a tool's guardrail: the
        server does not read it for tools, it checks their calls)."""
        config: dict[str, Any] = {"name": self.name, "guardrailType": self.kind, "position": position,
                                  "onFail": self.on_fail, "maxRetries": self.max_retries}
        if self.kind == REGEX:
            config.update(patterns=list(self.patterns), mode=self.mode)
        elif self.kind == LLM:
            config.update(model=self.model, policy=self.policy)
            if self.max_tokens is not None:
                config["maxTokens"] = self.max_tokens
        else:
            config["taskName"] = self.name
        if self.message is not None:
            config["message"] = self.message
        return config


@attrs.frozen(eq=True)
class _Check:
    """The worker body of a function guardrail: the verdict in the shape the server reads.

    The function gets the answer as :func:`~conductor_agents._common.answer_text.answer_text` makes it (the
    model's text, or JSON text of an answer the server parsed). It is not called on a turn of tool calls
    (``content`` is ``[]``), which the server passes whatever the verdict. The server's normaliser (3.32.3)
    counts any ``on_fail`` other than ``pass`` as a failure, so a pass carries none.
    """

    func: Callable[[str], Any]
    on_fail: str
    name: str = ""

    def __call__(self, **inputs: Any) -> dict[str, Any]:
        content = inputs.get("content")
        if isinstance(content, list) and not content:  # a turn of tool calls: the server passes it anyway
            return {"passed": True}
        verdict = self.func(answer_text(content))
        if isinstance(verdict, GuardrailResult):
            passed, message, fixed = bool(verdict.passed), verdict.message, verdict.fixed_output
        else:
            passed, message, fixed = bool(verdict), "", None
        if passed:
            return {"passed": True}
        output: dict[str, Any] = {"passed": False, "message": message or f"the answer failed the check {self.name!r}",
                                  "on_fail": self.on_fail}
        if fixed is not None:
            output["fixed_output"] = fixed
        return output
