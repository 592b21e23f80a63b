"""Structured tool parameters and results: dataclasses, attrs classes, ``TypedDict``, ``NamedTuple``,
pydantic v2 models.

Each such class becomes a JSON object schema (its fields become properties, with their own hints
described by :func:`conductor_agents._tooldefs.schema.hint_schema`, so classes nest), and a converter that
builds an instance from the checked JSON object. :func:`jsonable` turns results back into JSON.

pydantic is never imported: a class is a pydantic model when it has ``model_json_schema`` and
``model_validate`` (v2), and an instance is dumped with ``model_dump(mode="json")``. Pure functions;
thread-safe.
"""

from __future__ import annotations

import collections.abc
import contextlib
import dataclasses
import enum
import inspect
import threading
import typing
from collections.abc import Callable, Mapping
from typing import Any, Protocol, TypeGuard

import attrs

from .json_check import json_copy

__all__ = ["CycleError", "StructuredError", "is_structured", "jsonable", "structured_schema"]

Converter = Callable[[Any], Any]
Describe = Callable[[Any], tuple[dict[str, Any], Converter | None]]
_MISSING = object()  # a required field
_ABSENT = object()  # an optional field without a default (a TypedDict key that may be left out)
_WRAPPERS = tuple(w for w in (getattr(typing, "Required", None), getattr(typing, "NotRequired", None)) if w)


_local = threading.local()


def _describing() -> set[type]:
    """The classes being described on this thread (a recursion guard)."""
    active = getattr(_local, "active", None)
    if active is None:
        active = _local.active = set()
    return active


class StructuredError(Exception):
    """The class cannot be described as a JSON object (the text says why)."""


class PydanticModel(Protocol):
    """What this module uses of a pydantic v2 model class (duck typed: pydantic is never imported)."""

    @classmethod
    def model_json_schema(cls) -> dict[str, Any]: ...

    @classmethod
    def model_validate(cls, obj: Any) -> Any: ...


class _NamedTuple(Protocol):
    _fields: tuple[str, ...]


def is_pydantic_model(hint: Any) -> TypeGuard[type[PydanticModel]]:
    return inspect.isclass(hint) and callable(getattr(hint, "model_json_schema", None)) \
        and callable(getattr(hint, "model_validate", None))


def is_named_tuple(hint: Any) -> TypeGuard[type[_NamedTuple]]:
    return inspect.isclass(hint) and issubclass(hint, tuple) and isinstance(getattr(hint, "_fields", None), tuple)


def is_structured(hint: Any) -> bool:
    """Whether ``hint`` is a class this module describes."""
    if not inspect.isclass(hint) or typing.get_origin(hint) is not None:
        return False
    return (dataclasses.is_dataclass(hint) or attrs.has(hint) or typing.is_typeddict(hint)
            or is_named_tuple(hint) or is_pydantic_model(hint))


def structured_schema(hint: type, describe: Describe) -> tuple[dict[str, Any], Converter]:
    """The object schema of a structured class and the converter from JSON to an instance.

    ``describe`` describes each field's hint (raising for unsupported ones); a class that
    contains itself (directly or through others) is refused.

    Raises:
        StructuredError: the class refers to itself, or pydantic cannot produce its schema.
    """
    active = _describing()
    if hint in active:
        raise StructuredError("it contains itself (a recursive type has no finite JSON schema for a tool)")
    if is_pydantic_model(hint):
        return _pydantic_schema(hint), hint.model_validate
    active.add(hint)
    try:
        fields = _fields(hint)
        properties: dict[str, Any] = {}
        required: list[str] = []
        converters: dict[str, Converter] = {}
        for name, field_hint, default in fields:
            schema, converter = describe(field_hint)
            if default is _MISSING:
                required.append(name)
            elif default is not _ABSENT:
                with contextlib.suppress(TypeError):  # not JSON: the schema does not advertise it
                    schema = {**schema, "default": json_copy(jsonable(default))}
            properties[name] = schema
            if converter is not None:
                converters[name] = converter
    finally:
        active.discard(hint)
    schema = {"type": "object", "properties": properties, "required": required, "additionalProperties": False}
    summary = _class_summary(hint)
    if summary:
        schema["description"] = summary
    return schema, _builder(hint, converters)


def _fields(hint: type) -> list[tuple[str, Any, Any]]:
    """``(name, hint, default or _MISSING)`` of each field a JSON object sets."""
    try:
        hints = typing.get_type_hints(hint, include_extras=True)
    except (NameError, TypeError) as err:
        raise StructuredError(f"its type hints cannot be read ({err})") from None
    if dataclasses.is_dataclass(hint):
        out = []
        for field in dataclasses.fields(hint):
            if not field.init:
                continue
            if field.default is not dataclasses.MISSING:
                default = field.default
            elif field.default_factory is not dataclasses.MISSING:
                default = field.default_factory()
            else:
                default = _MISSING
            out.append((field.name, hints.get(field.name, Any), default))
        return out
    if attrs.has(hint):
        return [(field.alias, hints.get(field.name, field.type if field.type is not None else Any),
                 _attrs_default(field))
                for field in attrs.fields(hint) if field.init]
    if is_named_tuple(hint):
        defaults = getattr(hint, "_field_defaults", {})
        return [(name, hints.get(name, Any), defaults.get(name, _MISSING)) for name in hint._fields]
    required_keys = getattr(hint, "__required_keys__", frozenset(hints))
    out = []
    for name, field_hint in hints.items():
        # Required[]/NotRequired[] decide when present: with string annotations (``from __future__
        # import annotations``) Python 3.11 cannot see them when it computes __required_keys__.
        required, unwrapped = _unwrap_required(field_hint, name in required_keys)
        out.append((name, unwrapped, _MISSING if required else _ABSENT))
    return out


def _attrs_default(field: attrs.Attribute[Any]) -> Any:
    default = field.default
    if default is attrs.NOTHING:
        return _MISSING
    if isinstance(default, attrs.Factory):  # type: ignore[arg-type]  # the stubs call Factory a function: a class
        factory: Any = default  # the stubs type a field's default as the value, not the Factory making it
        return _ABSENT if factory.takes_self else factory.factory()
    return default


def _unwrap_required(hint: Any, required: bool) -> tuple[bool, Any]:
    while _WRAPPERS and typing.get_origin(hint) in _WRAPPERS:
        required = typing.get_origin(hint) is getattr(typing, "Required", None)
        hint = typing.get_args(hint)[0]
    return required, hint


def _builder(hint: type, converters: Mapping[str, Converter]) -> Converter:
    typed_dict = typing.is_typeddict(hint)

    def build(value: Any) -> Any:
        values = {key: (converters[key](item) if key in converters else item) for key, item in value.items()}
        if typed_dict:
            return values  # a TypedDict is a dict at runtime
        return hint(**values)

    return build


def _class_summary(hint: type) -> str | None:
    doc = inspect.getdoc(hint)
    if not doc or doc.startswith(f"{hint.__name__}("):  # the generated docstring of a dataclass/NamedTuple
        return None
    if doc == inspect.getdoc(dict) or doc == inspect.getdoc(tuple):
        return None
    return doc.split("\n\n", 1)[0].replace("\n", " ").strip() or None


# --- pydantic ---------------------------------------------------------------------------


def _pydantic_schema(model: type[PydanticModel]) -> dict[str, Any]:
    """The model's JSON schema with every ``$ref`` inlined (a tool's parameter schema has no ``$defs``)."""
    try:
        schema = model.model_json_schema()
    except Exception as err:  # noqa: BLE001 - pydantic's own errors: we do not import pydantic to name them
        raise StructuredError(f"pydantic cannot describe it: {err}") from None
    defs = schema.pop("$defs", {}) if isinstance(schema, dict) else {}
    inlined: dict[str, Any] = _inline(schema, defs, ())
    return inlined


def _inline(node: Any, defs: Mapping[str, Any], trail: tuple[str, ...], in_properties: bool = False) -> Any:
    if isinstance(node, list):
        return [_inline(item, defs, trail) for item in node]
    if not isinstance(node, dict):
        return node
    ref = node.get("$ref")
    if isinstance(ref, str):
        name = ref.rsplit("/", 1)[-1]
        if not ref.startswith("#/$defs/") or name not in defs:
            raise StructuredError(f"its schema refers to {ref!r}, which it does not define")
        if name in trail:
            raise StructuredError(f"{name} contains itself (a recursive type has no finite JSON schema for a tool)")
        siblings = {k: v for k, v in node.items() if k != "$ref"}
        return {**_inline(defs[name], defs, (*trail, name)), **_inline(siblings, defs, trail)}
    out = {}
    for key, value in node.items():
        if key == "title" and not in_properties:
            continue  # pydantic's titles repeat the names; the model does not need them
        out[key] = _inline(value, defs, trail, in_properties=(key == "properties" and not in_properties))
    return out


# --- results ----------------------------------------------------------------------------


class CycleError(ValueError):
    """A value handed to :func:`jsonable` contains itself."""


def jsonable(value: Any) -> Any:
    """``value`` with structured instances turned into JSON objects, recursively.

    Dataclass, attrs and NamedTuple instances become dicts of their fields, pydantic models their
    ``model_dump(mode="json")``, enum members their values. Anything else is left for the JSON
    encoder to accept or refuse.

    Raises:
        CycleError: a container or instance contains itself.
    """
    return _jsonable(value, set())


def _jsonable(value: Any, active: set[int]) -> Any:
    if isinstance(value, enum.Enum):
        return _jsonable(value.value, active)
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if id(value) in active:
        raise CycleError("the value contains itself (a cycle)")
    active.add(id(value))
    try:
        if not inspect.isclass(value) and callable(getattr(value, "model_dump", None)) \
                and is_pydantic_model(type(value)):
            return value.model_dump(mode="json")
        if dataclasses.is_dataclass(value) and not inspect.isclass(value):
            return {f.name: _jsonable(getattr(value, f.name), active) for f in dataclasses.fields(value)}
        if attrs.has(type(value)):
            return {f.alias: _jsonable(getattr(value, f.name), active) for f in attrs.fields(type(value))
                    if f.init}
        if isinstance(value, tuple) and is_named_tuple(kind := type(value)):
            return {name: _jsonable(item, active) for name, item in zip(kind._fields, value, strict=True)}
        if isinstance(value, collections.abc.Mapping):
            return {key: _jsonable(item, active) for key, item in value.items()}
        if isinstance(value, (list, tuple)):
            return [_jsonable(item, active) for item in value]
        return value
    finally:
        active.discard(id(value))
