"""Checking JSON values against a tool's input schema, with problems described for the LLM.

The subset checked: ``type``, ``enum``, ``const``, ``anyOf``/``oneOf``, ``items``,
``properties``, ``required``, ``additionalProperties``; other keywords are ignored. Also the
small JSON helpers both halves of the tool machinery use (``json_type``, ``json_copy``).
Pure functions, thread-safe.
"""

from __future__ import annotations

import collections.abc
import enum
import json
from collections.abc import Mapping
from typing import Any

__all__ = ["check_arguments", "check_value", "describe", "is_valid", "json_copy", "json_type", "json_strings_restored"]

_JSON_TYPES = (
    ("null", type(None)), ("boolean", bool), ("integer", int), ("number", float),
    ("string", str), ("array", (list, tuple)), ("object", collections.abc.Mapping),
)
#: Deepest nesting json_copy follows (well inside Python's recursion limit).
_MAX_DEPTH = 200



def json_type(value: Any) -> str:
    """The JSON type name of a Python value (its Python type name if it has none)."""
    return next((k for k, t in _JSON_TYPES if isinstance(value, t)), type(value).__name__)


def json_copy(value: Any) -> Any:
    """A deep copy of a JSON value with plain ``dict``/``list`` containers.

    Raises:
        TypeError: the value holds something JSON cannot (a set, an object, a non-str key),
            or contains itself (a cycle).
    """
    return _copy(value, set())


def _copy(value: Any, on_path: set[int]) -> Any:
    if isinstance(value, enum.Enum):
        value = value.value
    if value is None or isinstance(value, (str, bool, int, float)):
        return value
    if not isinstance(value, (list, tuple, collections.abc.Mapping)):
        raise TypeError(f"{type(value).__name__} is not a JSON value: {value!r}")
    if id(value) in on_path:
        raise TypeError(f"a {type(value).__name__} that contains itself is not a JSON value")
    if len(on_path) >= _MAX_DEPTH:
        raise TypeError(f"a JSON value nested more than {_MAX_DEPTH} levels deep is not supported")
    on_path.add(id(value))
    try:
        if isinstance(value, (list, tuple)):
            return [_copy(v, on_path) for v in value]
        if not all(isinstance(k, str) for k in value):
            raise TypeError(f"object keys must be strings, got {list(value)!r}")
        return {k: _copy(v, on_path) for k, v in value.items()}
    finally:
        on_path.discard(id(value))


def describe(schema: Mapping[str, Any]) -> str:
    """Say in words what a schema accepts ("string", "one of 'a', 'b'", "array of integer")."""
    if "const" in schema:
        return f"exactly {_show(schema['const'])}"
    if "enum" in schema:
        return "one of " + ", ".join(_show(v) for v in schema["enum"])
    branches = schema.get("anyOf") or schema.get("oneOf")
    if branches:
        return " or ".join(describe(b) for b in branches)
    if "type" not in schema:
        return "any value"
    words = []
    for kind in _types(schema):
        if kind == "array" and schema.get("items"):
            words.append(f"array of {describe(schema['items'])}")
        else:
            words.append(kind)
    return " or ".join(words)


def _show(value: Any, limit: int = 60) -> str:
    try:
        text = json.dumps(value, default=repr, ensure_ascii=False)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _same(a: Any, b: Any) -> bool:
    """JSON equality: ``true`` is not ``1``."""
    return isinstance(a, bool) == isinstance(b, bool) and a == b


def _type_matches(kind: str, value: Any) -> bool:
    if kind == "integer":
        return json_type(value) == "integer" or (
            isinstance(value, float) and value.is_integer()
        )
    if kind == "number":
        return json_type(value) in ("integer", "number")
    return json_type(value) == kind


def _types(schema: Mapping[str, Any]) -> list[str]:
    kinds = schema.get("type", [])
    return [kinds] if isinstance(kinds, str) else list(kinds)


def _type_matches_any(schema: Mapping[str, Any], value: Any) -> bool:
    return any(_type_matches(k, value) for k in _types(schema))


def _join(path: str, key: Any) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else str(key)


def is_valid(schema: Mapping[str, Any], value: Any) -> bool:
    """Whether ``value`` matches ``schema``."""
    problems: list[str] = []
    check_value(schema, value, "", problems)
    return not problems


def check_value(schema: Mapping[str, Any], value: Any, path: str, problems: list[str]) -> Any:
    """Check ``value`` against ``schema``; append problems (naming ``path``); return the value.

    The returned value is normalised: a whole ``float`` given for an ``integer`` becomes ``int``.
    """
    got = f"got {_show(value)} ({json_type(value)})"
    branches = schema.get("anyOf") or schema.get("oneOf")
    if branches:
        results = []
        for branch in branches:
            branch_problems: list[str] = []
            checked = check_value(branch, value, path, branch_problems)
            if not branch_problems:
                return checked
            if "type" in branch and _type_matches_any(branch, value):
                results.append(branch_problems)
        # Exactly one branch of the value's JSON type (the object of an Optional[dict]): its
        # problems are more precise than "expected object or null".
        if len(results) == 1:
            problems.extend(results[0])
        else:
            problems.append(f"argument '{path}': expected {describe(schema)}, {got}")
        return value
    if "type" in schema:
        if not _type_matches_any(schema, value):
            problems.append(f"argument '{path}': expected {describe(schema)}, {got}")
            return value
        if isinstance(value, float) and "number" not in _types(schema):
            value = int(value)  # a whole float where only integers are allowed
    if ("enum" in schema and not any(_same(value, v) for v in schema["enum"])) or (
            "const" in schema and not _same(value, schema["const"])):
        problems.append(f"argument '{path}': expected {describe(schema)}, {got}")
    elif isinstance(value, (list, tuple)) and isinstance(schema.get("items"), Mapping):
        items = schema["items"]
        value = [check_value(items, v, _join(path, i), problems) for i, v in enumerate(value)]
    elif isinstance(value, collections.abc.Mapping):
        value = _check_object(schema, value, path, problems)
    return value


def _check_object(
    schema: Mapping[str, Any], value: Mapping[str, Any], path: str, problems: list[str]
) -> dict[str, Any]:
    properties = schema.get("properties") or {}
    extra = schema.get("additionalProperties", True)
    out: dict[str, Any] = {}
    for key in schema.get("required") or ():
        if key not in value:
            expected = describe(properties.get(key, {}))
            problems.append(f"missing required argument '{_join(path, key)}' ({expected})")
    for key, item in value.items():
        if key in properties:
            out[key] = check_value(properties[key], item, _join(path, key), problems)
        elif extra is False:
            allowed = ", ".join(properties) or "none"
            problems.append(f"unexpected argument '{_join(path, key)}' (allowed: {allowed})")
        elif isinstance(extra, Mapping):
            out[key] = check_value(extra, item, _join(path, key), problems)
        else:
            out[key] = item
    return out


def check_arguments(
    schema: Mapping[str, Any], arguments: Mapping[str, Any]
) -> tuple[dict[str, Any], list[str]]:
    """Check a tool call's arguments against its (object) input schema.

    A ``null`` given for an optional argument that does not accept ``null`` is dropped, so the
    function's default applies (LLMs often send ``null`` for "not given").

    Returns:
        The normalised arguments and the list of problems (empty when they are valid).
    """
    properties = schema.get("properties") or {}
    required = set(schema.get("required") or ())
    kept = {
        key: value
        for key, value in arguments.items()
        if not (
            value is None
            and key in properties
            and key not in required
            and not is_valid(properties[key], None)
        )
    }
    problems: list[str] = []
    values = _check_object(schema, kept, "", problems)
    return values, problems


def json_strings_restored(schema: Mapping[str, Any], value: Any) -> Any:
    """``value`` with each object or array given where ``schema`` takes only a string made JSON text again.

    The server (3.32.3) reads every string argument of a tool call that looks like JSON (``{...}`` or
    ``[...]``) into an object or list, at any depth, before the tool gets it: a ``str`` parameter that
    was given ``'{"a": 1}'`` arrives as ``{"a": 1}``. This gives it back as ``json.dumps(value,
    ensure_ascii=False)``: the same JSON, in the server's key order.
    """
    if not isinstance(schema, Mapping):
        return value
    kinds = [k for k in _types(schema) if k != "null"]
    if kinds == ["string"] and isinstance(value, (collections.abc.Mapping, list)):
        try:
            return json.dumps(value, ensure_ascii=False)
        except (TypeError, ValueError):
            return value
    branches = schema.get("anyOf") or schema.get("oneOf")
    if isinstance(branches, list) and not any(is_valid(b, value) for b in branches if isinstance(b, Mapping)):
        for branch in branches:
            restored = json_strings_restored(branch, value)
            if restored is not value and is_valid(branch, restored):
                return restored
        return value
    if isinstance(value, collections.abc.Mapping):
        properties = schema.get("properties")
        if isinstance(properties, Mapping):
            return {k: json_strings_restored(properties[k], v) if k in properties else v for k, v in value.items()}
    if isinstance(value, list) and isinstance(schema.get("items"), Mapping):
        return [json_strings_restored(schema["items"], v) for v in value]
    return value
