"""Gates between the stages of a sequential team: :class:`Gate`.

What the server (3.32.3) does with a stage's ``gate``, checked against its compiler and a running server:

- Only a ``strategy="sequential"`` parent reads its sub-agents' ``gate``, and only of a stage that has
  a next one: after that stage (and the INLINE task that makes its answer a string, ``""`` for none)
  it adds the gate task ``<parent>_gate_<i>`` and a ``SWITCH`` on the gate's
  ``output.result.decision``. ``"continue"`` runs the remaining stages; any other value (``"stop"``,
  or nothing) ends the pipeline, and the run's answer is the last answer a stage gave (the
  stopping stage's). Every other place ignores a ``gate`` silently: an agent run on its own, as a
  tool, as a router, planner or fallback, a sub-agent of any other strategy, the last stage.
- ``{"type": "text_contains", "text": ..., "caseSensitive": ...}`` compiles to an INLINE script (no
  worker): ``stop`` when the stage's answer contains ``text``.
- ``{"taskName": ...}`` compiles to a ``SIMPLE`` task of that name (the server registers its task
  definition), given ``result``: the stage's answer as a string. The worker's output must be
  ``{"result": {"decision": "stop" | "continue"}}`` (the SWITCH reads ``output.result.decision``:
  ``{"decision": "continue"}`` without ``result``, or ``"CONTINUE"``, ends the pipeline, checked on a
  running server); a worker task that fails fails the run. It runs in the parent's run, so a stateful tree's domain
  covers it like the parent's other worker tasks.

Pure values and functions; thread-safe.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs

from .._common.answer_text import answer_text
from .._common.checks import Refusal, a_bool
from .._common.task_names import gate_task_name
from .._tooldefs.tooldef import ToolDef
from ..errors import AgentDefinitionError, AgentTypeError

__all__ = ["Gate", "GateCheck", "gate_worker"]

#: ``check(answer)``: True stops the pipeline after the stage, False runs the next stage.
GateCheck = Callable[[str], bool]
_KINDS = ("text_contains", "function")


def _check_text(instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if value is None:
        return
    if not isinstance(value, str):
        raise AgentTypeError(f"Gate.text_contains needs a str, got {value!r}", field="gate", value=value)
    if not value:
        raise AgentDefinitionError("Gate.text_contains needs a non-empty text (every answer contains '')",
                                   field="gate", value=value)


_check_case = a_bool(refusal=Refusal(AgentDefinitionError, type_error=AgentTypeError, prefix="Gate.text_contains: ",
                                     field="gate"))


def _check_function(instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if value is not None and not callable(value):
        raise AgentTypeError(f"Gate.function needs a callable, got {value!r}", field="gate", value=value)


@attrs.frozen
class Gate:
    """A check after a stage of a ``strategy="sequential"`` team: it stops the pipeline, or lets the
    next stage run.

    Give it to the stage: ``Agent(name="draft", ..., gate=Gate.text_contains("NO_ACTION"))``. When it
    stops, the later stages never run and the stopping stage's answer is the run's. Build one with
    :meth:`text_contains` (checked on the server) or :meth:`function` (Python, run here).
    Immutable; thread-safe (a function may run on several worker threads at once).
    """

    kind: str = attrs.field(validator=attrs.validators.in_(_KINDS))
    text: str | None = attrs.field(default=None, validator=_check_text)
    case_sensitive: bool = attrs.field(default=True, validator=_check_case)
    check: GateCheck | None = attrs.field(default=None, validator=_check_function)

    def __attrs_post_init__(self) -> None:
        needed = "text" if self.kind == "text_contains" else "check"
        if getattr(self, needed) is None:
            raise AgentDefinitionError(f"Gate.{self.kind} needs {needed}", field="gate", value=None)

    @classmethod
    def text_contains(cls, text: str, *, case_sensitive: bool = True) -> Gate:
        """Stop the pipeline when the stage's answer contains ``text`` (``case_sensitive=False``: in any
        case). The server checks it (an INLINE script): no worker task."""
        if text is None:
            raise AgentTypeError("Gate.text_contains needs a str, got None", field="gate", value=None)
        return cls("text_contains", text=text, case_sensitive=case_sensitive)

    @classmethod
    def function(cls, check: GateCheck) -> Gate:
        """Stop the pipeline when ``check(answer)`` returns True (False: the next stage runs).

        ``answer`` is the stage's answer as text (``""`` when it gave none; JSON text for a
        structured one). It runs in Python, as a worker task of the parent's run served with the
        team's tools (on the run's domain when the team is stateful). An exception, or a result other
        than True or False, fails the run.
        """
        if not callable(check):
            raise AgentTypeError(f"Gate.function needs a callable, got {check!r}", field="gate", value=check)
        return cls("function", check=check)

    @property
    def needs_worker(self) -> bool:
        """Whether the gate is a worker task served by this SDK (a :meth:`function` gate)."""
        return self.kind == "function"

    def to_config(self, task_name: str | None = None) -> dict[str, Any]:
        """The server's ``gate`` of a stage's config (``task_name``: a function gate's worker task)."""
        if self.kind == "text_contains":
            return {"type": "text_contains", "text": self.text, "caseSensitive": self.case_sensitive}
        if not task_name:
            raise AgentDefinitionError("Gate.function: its task name comes from the sequential team "
                                       "(Agent.to_config())", field="gate", value=self.check)
        return {"taskName": task_name}


CONTINUE, STOP = "continue", "stop"


@attrs.frozen
class _GateRun:
    """The worker body of a function gate: ``{"result": {"decision": "stop" | "continue"}}``."""

    check: GateCheck
    stage: str

    def __call__(self, **inputs: Any) -> dict[str, Any]:
        answer = inputs.get("result")
        stop = self.check(answer_text(answer))
        if not isinstance(stop, bool):
            raise TypeError(f"the gate after {self.stage!r} returned {stop!r}; it must return True (stop the "
                            "pipeline) or False (run the next stage)")
        return {"result": {"decision": STOP if stop else CONTINUE}}


def gate_worker(agent_name: str, index: int, stage: str, gate: Gate) -> ToolDef:
    """The worker ToolDef of the function gate after stage ``index`` (the sub-agent ``stage``) of the
    sequential team ``agent_name``."""
    assert gate.check is not None
    return ToolDef(name=gate_task_name(agent_name, index), description=f"gate of {agent_name} after {stage}",
                   input_schema={"type": "object", "properties": {}}, func=_GateRun(gate.check, stage))
