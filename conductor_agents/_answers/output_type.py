"""Typed answers: ``Agent(output_type=...)`` and the client-side check of a run's final answer.

The server is told the JSON schema (``outputType {schema, className}``): it adds the schema to the
system prompt and, for an agent without tools, asks the model for a JSON object (and fails the
model call when the answer is not JSON). It does **not** check the answer against the schema.
This module does, when ``wait()`` returns a COMPLETED run: it parses the answer (the server hands
back an object when it parsed it, else the text), checks it against the schema and builds an
instance of the type with the same converters tool arguments use (dataclasses, attrs classes,
``TypedDict``, ``NamedTuple``, pydantic v2 models through ``model_validate``).

Pure functions over immutable values; thread-safe.
"""

from __future__ import annotations

import json
import re
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

import attrs

from .._common import json_check as _json_check
from .._tooldefs import schema as _schema
from .._common import structured as _structured
from ..errors import AgentDefinitionError, OutputValidationError

__all__ = ["OutputSpec", "typed_result"]

#: A fenced code block the whole answer may sit in (```json ... ```).
_FENCE = re.compile(r"\A\s*```[A-Za-z0-9_-]*\s*\n(.*?)\n?\s*```\s*\Z", re.DOTALL)
#: How the shared checker names a place (it was written for tool arguments).
_ARGUMENT = re.compile(r"\b(missing required |unexpected )?argument '")


@attrs.frozen
class OutputSpec:
    """The schema and converter of an output type. Immutable; thread-safe."""

    output_type: type
    schema: Dict[str, Any] = attrs.field(eq=False, repr=False)
    convert: Callable[[Any], Any] = attrs.field(eq=False, repr=False)

    @classmethod
    def of(cls, output_type: Any) -> "OutputSpec":
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
        except _schema._Unsupported as err:
            raise AgentDefinitionError(
                f"Agent.output_type {output_type.__qualname__} cannot be described as JSON: "
                f"{_schema._hint_name(err.hint)}{err.reason}", field="output_type", value=output_type) from None
        return cls(output_type=output_type, schema=schema, convert=convert or (lambda v: v))

    def to_config(self) -> Dict[str, Any]:
        """The server's ``outputType``."""
        return {"schema": _json_check.json_copy(self.schema), "className": self.output_type.__qualname__}

    def parse(self, raw: Any) -> Tuple[Any, List[str]]:
        """``(instance, [])`` for a fitting answer, ``(None, problems)`` otherwise."""
        value, problem = _decoded(raw)
        if problem:
            return None, [problem]
        problems: List[str] = []
        checked = _json_check.check_value(self.schema, value, "", problems)
        if problems:
            return None, [_as_field(p) for p in problems]
        try:
            return self.convert(checked), []
        except Exception as err:  # pydantic validators, a class's own __init__ checks
            return None, [f"{type(err).__name__}: {err}"]


def _decoded(raw: Any) -> Tuple[Any, Optional[str]]:
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


def raw_text(raw: Any) -> Optional[str]:
    """The answer as text (an object the server parsed is shown as JSON)."""
    if raw is None or isinstance(raw, str):
        return raw
    try:
        return json.dumps(raw)
    except (TypeError, ValueError):
        return str(raw)


def typed_result(result: Any, spec: Optional[OutputSpec]) -> Any:
    """``result`` (an AgentResult) with its ``output`` an instance of the output type.

    Only a COMPLETED run is checked; other results are returned as they are.

    Raises:
        OutputValidationError: the answer does not fit (``raw_output`` keeps it).
    """
    if spec is None or not result.ok:
        return result
    raw = result.raw_output.get("result")
    value, problems = spec.parse(raw)
    if not problems:
        return attrs.evolve(result, output=value)
    text = raw_text(raw)
    shown = text if text is None or len(text) <= 300 else text[:300] + "..."
    raise OutputValidationError(
        f"run {result.execution_id} COMPLETED but its answer does not fit {spec.output_type.__qualname__}: "
        f"{'; '.join(problems)}; the answer was {shown!r} (err.raw_output, err.result)",
        execution_id=result.execution_id, output_type=spec.output_type, raw_output=text,
        problems=tuple(problems), result=result)
