"""Typed answers: ``Agent(output_type=...)`` and the client-side check of a run's final answer.

The server is told the JSON schema (``outputType {schema, className}``): it adds the schema to the
system prompt and, for an agent without tools, asks the model for a JSON object (and fails the
model call when the answer is not JSON). It does **not** check the answer against the schema.
This module does, when ``wait()`` returns a COMPLETED run: it parses the answer (the server hands
back an object when it parsed it, else the text), checks it against the schema and builds an
instance of the type with the same converters tool arguments use (dataclasses, attrs classes,
``TypedDict``, ``NamedTuple``, pydantic v2 models through ``model_validate``). The same check runs
in the run, after each answer, when the agent asks the model again (:mod:`.output_check`); a run
that failed because its answer never fit is an :class:`~conductor_agents.OutputValidationError` too.

Pure functions over immutable values; thread-safe.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from typing import Any

import attrs

from .._common import json_check as _json_check
from .._common import structured as _structured
from .._common.answer_text import answer_text
from .._tooldefs import schema as _schema
from ..errors import AgentDefinitionError, OutputValidationError
from ..result import AgentResult

__all__ = ["FAILED_PREFIX", "OutputSpec", "Rejection", "typed_result"]

#: How the run's error (the server's ``reasonForIncompletion``) starts when the answer check gave up.
FAILED_PREFIX = "Answer does not fit output_type"

#: A fenced code block the whole answer may sit in (```json ... ```).
_FENCE = re.compile(r"\A\s*```[A-Za-z0-9_-]*\s*\n(.*?)\n?\s*```\s*\Z", re.DOTALL)
#: How the shared checker names a place (it was written for tool arguments).
_ARGUMENT = re.compile(r"\b(missing required |unexpected )?argument '")


@attrs.frozen
class OutputSpec:
    """The schema and converter of an output type. Immutable; thread-safe."""

    output_type: type
    schema: dict[str, Any] = attrs.field(eq=False, repr=False)
    convert: Callable[[Any], Any] = attrs.field(eq=False, repr=False)

    @classmethod
    def of(cls, output_type: Any) -> OutputSpec:
        """The spec of ``output_type``.

        Raises:
            AgentDefinitionError: it is not a structured class (dataclass, attrs class, TypedDict,
                NamedTuple, pydantic v2 model) or cannot be described as a JSON object.
        """
        if not _structured.is_structured(output_type):
            raise AgentDefinitionError(
                f"Agent.output_type must be a dataclass, attrs class, TypedDict, NamedTuple or pydantic "
                f"model (the answer is a JSON object), got {output_type!r}",
                field="output_type", value=output_type)
        try:
            schema, convert = _schema.hint_schema(output_type)
        except _schema.UnsupportedHintError as err:
            raise AgentDefinitionError(
                f"Agent.output_type {output_type.__qualname__} cannot be described as JSON: "
                f"{_schema.hint_name(err.hint)}{err.reason}", field="output_type", value=output_type) from None
        return cls(output_type=output_type, schema=schema, convert=convert or (lambda v: v))

    def to_config(self) -> dict[str, Any]:
        """The server's ``outputType``."""
        return {"schema": _json_check.json_copy(self.schema), "className": self.output_type.__qualname__}

    def parse(self, raw: Any) -> tuple[Any, list[str]]:
        """``(instance, [])`` for a fitting answer, ``(None, problems)`` otherwise."""
        value, problem = _decoded(raw)
        if problem:
            return None, [problem]
        problems: list[str] = []
        checked = _json_check.check_value(self.schema, value, "", problems)
        if problems:
            return None, [_as_field(p) for p in problems]
        try:
            return self.convert(checked), []
        except Exception as err:  # noqa: BLE001 - the user's class: pydantic validators, its own __init__ checks
            return None, [f"{type(err).__name__}: {err}"]


def _decoded(raw: Any) -> tuple[Any, str | None]:
    """The answer as a JSON value, or a problem."""
    if isinstance(raw, Mapping):
        return dict(raw), None
    if raw is None:
        return None, "the run ended without an answer"
    if not isinstance(raw, str):
        return raw, None
    text = raw.strip()
    fenced = _FENCE.match(text)
    if fenced:
        text = fenced.group(1).strip()
    try:
        return json.loads(text), None
    except ValueError:
        return None, "the answer is not JSON"


def _as_field(problem: str) -> str:
    problem = _ARGUMENT.sub(lambda m: f"{m.group(1) or ''}field '", problem)
    return problem.replace("field ''", "the answer")


def raw_text(raw: Any) -> str | None:
    """The answer as text (an object the server parsed is shown as JSON)."""
    return None if raw is None else answer_text(raw)


@attrs.frozen
class Rejection:
    """Why a FAILED run's answer was refused, read from its tasks.

    ``kind`` is ``"check"`` (the answer check in the run gave up: ``raw`` is the last answer it
    refused) or ``"json_mode"`` (the server's JSON mode failed the model call: ``raw`` is the
    model's text, None when the server did not say). ``answers``: how many answers were refused.
    """

    kind: str
    raw: Any = None
    answers: int = 1


def typed_result(result: AgentResult, spec: OutputSpec | None, rejection: Rejection | None = None) -> AgentResult:
    """``result`` (an AgentResult) with its ``output`` an instance of the output type.

    A COMPLETED run's answer is checked. A FAILED run whose answer was refused (``rejection``, from
    its tasks) raises; other results are returned as they are.

    Raises:
        OutputValidationError: the answer does not fit (``raw_output`` keeps it), or the run FAILED
            because it never did (``err.result.status`` is FAILED).
    """
    if spec is None:
        return result
    if not result.ok:
        if rejection is not None and str(getattr(result.status, "value", "")) == "FAILED":
            _raise_rejected(result, spec, rejection)
        return result
    raw = result.raw_output.get("result")
    value, problems = spec.parse(raw)
    if not problems:
        return attrs.evolve(result, output=value)
    text = raw_text(raw)
    raise OutputValidationError(
        f"run {result.execution_id} COMPLETED but its answer does not fit {spec.output_type.__qualname__}: "
        f"{'; '.join(problems)}; the answer was {_shown(text)!r} (err.raw_output, err.result)",
        execution_id=result.execution_id, output_type=spec.output_type, raw_output=text,
        problems=tuple(problems), result=result)


def _shown(text: str | None) -> str | None:
    return text if text is None or len(text) <= 300 else text[:300] + "..."


def _raise_rejected(result: Any, spec: OutputSpec, rejection: Rejection) -> None:
    text = raw_text(rejection.raw)
    name = spec.output_type.__qualname__
    if rejection.kind == "json_mode":
        problems = spec.parse(text)[1] if text is not None else []
        problems = problems or ["the answer is not a JSON object (the server gave no details)"]
        how = ("the server's JSON mode failed the model call (output_retries=0; the server retried it "
               "without telling the model why)")
    else:
        problems = spec.parse(rejection.raw)[1] if rejection.raw is not None else []
        problems = problems or [str(result.error or "").split(": ", 1)[-1]]
        count = rejection.answers
        how = f"after {count} answer{'s' if count != 1 else ''} (the model was told why and asked again)"
    raise OutputValidationError(
        f"run {result.execution_id} FAILED: its answer does not fit {name}: {'; '.join(problems)}; {how}; "
        f"the last answer was {_shown(text)!r} (err.raw_output, err.result)",
        execution_id=result.execution_id, output_type=spec.output_type, raw_output=text,
        problems=tuple(problems), result=result)
