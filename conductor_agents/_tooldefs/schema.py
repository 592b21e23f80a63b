"""JSON schemas for tools: derived from Python signatures, and used to check arguments.

Two halves, both pure functions without shared state (thread-safe):

* :func:`signature_schema` turns a function's signature, type hints and docstring into the
  ``inputSchema`` object the LLM sees, plus per-parameter converters that turn checked JSON
  values into the Python values the hints promise (``Enum`` members, ``tuple``, ``float``).
* :func:`check_arguments` (in :mod:`conductor_agents._common.json_check`, re-exported here) checks the LLM's
  arguments against a JSON schema subset and describes every problem in words the LLM can
  act on.
"""

from __future__ import annotations

import collections.abc
import contextlib
import enum
import functools
import inspect
import re
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any, Optional

import attrs

from .._common import structured as _structured
from .._common.json_check import check_arguments, check_value, describe, is_valid, json_copy, json_type
from ..errors import ToolDefinitionError
from .context import ToolContext

__all__ = [
    "SignatureSchema", "UnsupportedHintError", "check_arguments", "check_value", "describe", "hint_schema", "is_valid",
    "hint_name", "json_copy", "json_type", "parse_docstring", "signature_schema",
]

Converter = Callable[[Any], Any]

SUPPORTED_HINTS = (
    "str, int, float, bool, None, Any, Optional[X] / X | None, Union[X, Y], list[X], "
    "Sequence[X], tuple[X, ...], dict[str, X], Mapping[str, X], Literal[...], Enum subclasses "
    "with str/int/float/bool values, Annotated[X, 'description'], dataclasses, TypedDict, NamedTuple, "
    "pydantic v2 models"
)
#: Keys the server adds to a worker task's input; they can never be tool parameters.
RESERVED_PARAMETER = re.compile(r"method\Z|_agent")

get_origin = typing.get_origin
get_args = typing.get_args
_SCALARS = {str: "string", int: "integer", float: "number", bool: "boolean"}
_ARRAYS = (list, tuple, collections.abc.Sequence)
_OBJECTS = (dict, collections.abc.Mapping)
_UNIONS = (typing.Union, types.UnionType)
_SECTION = re.compile(
    r"^(Args|Arguments|Parameters|Params|Keyword Args|Keyword Arguments|Returns?|Yields?|"
    r"Raises|Notes?|Examples?|Attributes|See Also|Warnings?|Todo)\s*:\s*$"
)
_MODULE_PREFIX = re.compile(r"(?<![\w'\"])(?:[A-Za-z_]\w*\.)+(?=[A-Za-z_])")
_ARG_LINE = re.compile(r"^\*{0,2}(\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$")


@attrs.frozen
class SignatureSchema:
    """What a signature yields: the ``inputSchema`` and the converters, keyed by parameter.

    Immutable value; thread-safe.
    """

    schema: dict[str, Any]
    converters: Mapping[str, Converter]
    summary: str | None
    #: The parameter annotated ``ToolContext`` (left out of the schema), if any.
    context_param: str | None = None


def signature_schema(func: Callable[..., Any], *, skip_first: bool) -> SignatureSchema:
    """Derive the input schema of ``func`` from its signature, type hints and docstring.

    ``skip_first`` drops the first parameter (``self``/``cls`` of a method in a class body).

    Raises:
        ToolDefinitionError: a parameter has no annotation, an unsupported hint or a reserved
            name, or is ``*args``/``**kwargs``/positional-only.
    """
    where = getattr(func, "__qualname__", None) or repr(func)
    try:
        params = list(inspect.signature(func).parameters.values())
        hints = typing.get_type_hints(_hint_source(func), include_extras=True)
    except (NameError, TypeError, ValueError) as err:
        raise ToolDefinitionError(
            f"cannot read the type hints of {where}: {err} (every name in a tool's hints must be "
            "defined at module level in the function's module)"
        ) from err
    if skip_first:
        params = params[1:]
    summary, arg_docs = parse_docstring(_docstring(func))
    properties: dict[str, Any] = {}
    required: list[str] = []
    converters: dict[str, Converter] = {}
    context_param: str | None = None
    for param in params:
        if _is_context_hint(hints.get(param.name)):
            if context_param is not None:
                raise ToolDefinitionError(
                    f"{where}: parameters {context_param!r} and {param.name!r} are both ToolContext; "
                    "declare one"
                )
            if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD, param.POSITIONAL_ONLY):
                raise ToolDefinitionError(f"{where}: the ToolContext parameter {param.name!r} must be "
                                          "a named (keyword-capable) parameter")
            context_param = param.name
            continue
        prop, converter = _parameter_schema(param, hints, where)
        if arg_docs.get(param.name) and "description" not in prop:
            prop["description"] = arg_docs[param.name]
        properties[param.name] = prop
        if param.default is inspect.Parameter.empty:
            required.append(param.name)
        if converter is not None:
            converters[param.name] = converter
    schema: dict[str, Any] = {"type": "object", "properties": properties, "required": required}
    schema["additionalProperties"] = False
    return SignatureSchema(schema=schema, converters=converters, summary=summary, context_param=context_param)


def _is_context_hint(hint: Any) -> bool:
    """``ToolContext`` or ``Optional[ToolContext]`` (possibly ``Annotated``)."""
    if hint is None:
        return False
    hint, _ = _split_annotated(hint)
    if get_origin(hint) in _UNIONS:
        args = [a for a in get_args(hint) if a is not type(None)]
        return len(args) == 1 and args[0] is ToolContext
    return hint is ToolContext


def _hint_source(func: Callable[..., Any]) -> Any:
    """The object whose annotations describe ``func``'s parameters."""
    while isinstance(func, functools.partial):
        func = func.func
    if inspect.isroutine(func):
        return func
    return type(func).__call__


def _docstring(func: Callable[..., Any]) -> str | None:
    """The function's own docstring (never one inherited from a class like ``partial``)."""
    source = _hint_source(func)
    return source.__doc__ if inspect.isroutine(source) else None


def _parameter_schema(
    param: inspect.Parameter, hints: Mapping[str, Any], where: str
) -> tuple[dict[str, Any], Converter | None]:
    """The property schema and converter for one parameter.

    Raises:
        ToolDefinitionError: see :func:`signature_schema`.
    """
    name = param.name
    if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
        star = "*" if param.kind is param.VAR_POSITIONAL else "**"
        raise ToolDefinitionError(
            f"{where}: parameter {star}{name} is not allowed in a tool; "
            "the LLM calls tools with named arguments, so declare each one"
        )
    if param.kind is param.POSITIONAL_ONLY:
        raise ToolDefinitionError(
            f"{where}: parameter {name!r} is positional-only; tools are called with keyword "
            "arguments, so remove the '/' from the signature"
        )
    if RESERVED_PARAMETER.match(name):
        raise ToolDefinitionError(
            f"{where}: parameter {name!r} is reserved (the server adds 'method' and '_agent*' "
            "keys to every tool call); rename it"
        )
    if name not in hints:
        raise ToolDefinitionError(
            f"{where}: parameter {name!r} has no type annotation; a tool's parameters are the "
            f"LLM's contract, so annotate each one (supported: {SUPPORTED_HINTS})"
        )
    hint, description = _split_annotated(hints[name])
    if param.default is None and not _accepts_none(hint):
        hint = Optional[hint]  # noqa: UP045 - a hint built at runtime: `|` refuses some (a string)
    try:
        schema, converter = hint_schema(hint)
    except UnsupportedHintError as err:
        detail = "" if err.hint is hint else f" (in {hint_name(hint)})"
        raise ToolDefinitionError(
            f"{where}: parameter {name!r} has the unsupported type hint "
            f"{hint_name(err.hint)}{detail}{err.reason}; supported: {SUPPORTED_HINTS}"
        ) from None
    if description:
        schema["description"] = description
    if param.default is not inspect.Parameter.empty:
        with contextlib.suppress(TypeError):  # not JSON: the schema simply does not advertise it
            schema["default"] = json_copy(param.default)
    return schema, converter


class UnsupportedHintError(Exception):
    """A hint (possibly nested) that has no JSON-schema equivalent."""

    def __init__(self, hint: Any, reason: str = "") -> None:
        super().__init__(hint)
        self.hint = hint
        self.reason = reason


def hint_name(hint: Any) -> str:
    if inspect.isclass(hint) and get_origin(hint) is None:
        return hint.__qualname__
    return _MODULE_PREFIX.sub("", repr(hint))  # "typing.Optional[a.b.C]" -> "Optional[C]"


def _split_annotated(hint: Any) -> tuple[Any, str | None]:
    """Strip ``Annotated`` from a parameter hint (also inside ``Optional``) and return its text."""
    if get_origin(hint) is typing.Annotated:
        return hint.__origin__, _first_text(hint.__metadata__)
    if get_origin(hint) in _UNIONS:
        args = get_args(hint)
        texts = [_first_text(a.__metadata__) for a in args if get_origin(a) is typing.Annotated]
        if len(texts) == 1 and texts[0]:
            plain = tuple(a.__origin__ if get_origin(a) is typing.Annotated else a for a in args)
            return typing.Union[plain], texts[0]  # noqa: UP007 - a Union of a tuple built at runtime
    return hint, None


def _first_text(metadata: tuple[Any, ...]) -> str | None:
    return next((m.strip() for m in metadata if isinstance(m, str) and m.strip()), None)


def _accepts_none(hint: Any) -> bool:
    if hint is Any or hint is None or hint is type(None):
        return True
    origin = get_origin(hint)
    if origin is typing.Annotated:
        return _accepts_none(hint.__origin__)
    if origin is typing.Literal:
        return None in get_args(hint)
    return origin in _UNIONS and any(_accepts_none(a) for a in get_args(hint))


def hint_schema(hint: Any) -> tuple[dict[str, Any], Converter | None]:
    """The JSON schema of a (parameter-less) hint, and a converter when Python wants other values.

    Raises:
        UnsupportedHintError: the hint, or one nested in it, has no JSON-schema equivalent.
    """
    if hint is Any:
        return {}, None
    if hint is None or hint is type(None):
        return {"type": "null"}, None
    if isinstance(hint, type) and hint in _SCALARS:
        return {"type": _SCALARS[hint]}, (_to_float if hint is float else None)
    if hasattr(hint, "__supertype__"):  # typing.NewType
        return hint_schema(hint.__supertype__)
    origin, args = get_origin(hint), get_args(hint)
    if origin is typing.Annotated:
        schema, converter = hint_schema(hint.__origin__)
        text = _first_text(hint.__metadata__)
        return ({**schema, "description": text} if text else schema), converter
    if origin in _UNIONS:
        return _union_schema(args)
    if origin is typing.Literal:
        return _enum_schema(hint, list(args)), None
    if origin is None and inspect.isclass(hint) and issubclass(hint, enum.Enum):
        return _enum_schema(hint, [m.value for m in hint]), _enum_converter(hint)
    base = origin or hint
    if base in _ARRAYS:
        return _array_schema(hint, base, args)
    if base in _OBJECTS:
        return _object_schema(hint, args)
    if _structured.is_structured(hint):
        try:
            return _structured.structured_schema(hint, hint_schema)
        except _structured.StructuredError as err:
            raise UnsupportedHintError(hint, f": {err}") from None
    raise UnsupportedHintError(hint)


def _to_float(value: Any) -> Any:
    return float(value) if isinstance(value, int) and not isinstance(value, bool) else value


def _enum_converter(cls: type) -> Converter:
    return cls


def _union_schema(args: tuple[Any, ...]) -> tuple[dict[str, Any], Converter | None]:
    branches = [hint_schema(a) for a in args]
    schemas = [s for s, _ in branches]
    if not any(c for _, c in branches):
        return {"anyOf": schemas}, None

    def convert(value: Any) -> Any:
        for schema, converter in branches:
            if is_valid(schema, value):
                return converter(value) if converter else value
        return value

    return {"anyOf": schemas}, convert


def _enum_schema(hint: Any, values: list[Any]) -> dict[str, Any]:
    types_seen: list[str] = []
    for value in values:
        kind = json_type(value)
        if kind not in ("string", "integer", "number", "boolean", "null"):
            raise UnsupportedHintError(hint, f": value {value!r} is not a JSON string, number or boolean")
        if kind not in types_seen:
            types_seen.append(kind)
    if not values:
        raise UnsupportedHintError(hint, ": it has no values")
    kind_field: Any = types_seen[0] if len(types_seen) == 1 else types_seen
    return {"type": kind_field, "enum": values}


def _array_schema(
    hint: Any, base: Any, args: tuple[Any, ...]
) -> tuple[dict[str, Any], Converter | None]:
    if base is tuple and args and not (len(args) == 2 and args[1] is Ellipsis):
        raise UnsupportedHintError(hint, ": only variable-length tuples (tuple[X, ...]) are supported")
    items, inner = hint_schema(args[0]) if args else ({}, None)
    schema: dict[str, Any] = {"type": "array", "items": items}
    make = tuple if base is tuple else list
    if inner is None and make is list:
        return schema, None
    if inner is None:
        return schema, make
    return schema, lambda value: make(inner(v) for v in value)


def _object_schema(hint: Any, args: tuple[Any, ...]) -> tuple[dict[str, Any], Converter | None]:
    if args and args[0] is not str:
        raise UnsupportedHintError(hint, ": JSON object keys are strings, so the key type must be str")
    values, inner = hint_schema(args[1]) if args else ({}, None)
    schema: dict[str, Any] = {"type": "object"}
    if values:
        schema["additionalProperties"] = values
    if inner is None:
        return schema, None
    return schema, lambda value: {k: inner(v) for k, v in value.items()}


def parse_docstring(doc: str | None) -> tuple[str | None, dict[str, str]]:
    """The first paragraph of a docstring, and the per-parameter texts of a Google ``Args:``."""
    if not doc or not doc.strip():
        return None, {}
    lines = inspect.cleandoc(doc).splitlines()
    summary: list[str] = []
    for line in lines:
        if not line.strip() or _SECTION.match(line.strip()):
            break
        summary.append(line.strip())
    return (" ".join(summary) or None), _args_section(lines)


def _args_section(lines: list[str]) -> dict[str, str]:
    """The ``name: text`` entries of a cleaned docstring's ``Args:`` section."""
    args: dict[str, str] = {}
    section_indent: int | None = None
    current: str | None = None
    entry_indent = 0
    for number, line in enumerate(lines):
        indent, stripped = len(line) - len(line.lstrip()), line.strip()
        if section_indent is None:
            if stripped in ("Args:", "Arguments:", "Parameters:", "Params:"):
                # cleandoc dedents the lines after the first, so a header on the first line
                # may sit at the same indent as its entries.
                section_indent = indent if number else -1
            continue
        if not stripped:
            continue
        if indent <= section_indent:
            break
        match = _ARG_LINE.match(stripped)
        if match and (current is None or indent <= entry_indent):
            current, entry_indent = match.group(1), indent
            args[current] = match.group(2).strip()
        elif current is not None:
            args[current] = f"{args[current]} {stripped}".strip()
    return {k: v for k, v in args.items() if v}
