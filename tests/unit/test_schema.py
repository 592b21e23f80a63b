"""Unit tests for conductor_agents._tooldefs.schema: hints -> JSON schema, docstrings, argument checks.

This module uses postponed annotations on purpose: every hint below is a string that the
schema derivation has to resolve.
"""

from __future__ import annotations

import collections.abc  # noqa: F401 - used by hints written as strings
import enum
from typing import (  # noqa: F401 - several are used only by hints written as strings
    Annotated,
    Any,
    Callable,
    Dict,
    List,
    Literal,
    Mapping,
    NewType,
    Optional,
    Sequence,
    Tuple,
    Union,
)

import pytest

from conductor_agents._tooldefs import schema as _schema
from conductor_agents.errors import ToolDefinitionError
from conductor_agents.tools import tool

SUPPORTED = (
    "supported: str, int, float, bool, None, Any, Optional[X] / X | None, Union[X, Y], list[X], "
    "Sequence[X], tuple[X, ...], dict[str, X], Mapping[str, X], Literal[...], Enum subclasses "
    "with str/int/float/bool values, Annotated[X, 'description'], dataclasses, TypedDict, NamedTuple, "
    "pydantic v2 models"
)


class Color(enum.Enum):
    RED = "red"
    GREEN = "green"


class Priority(enum.IntEnum):
    LOW = 1
    HIGH = 2


class Mixed(enum.Enum):
    A = "a"
    ONE = 1


class Pair(enum.Enum):
    ORIGIN = (0, 0)


class Point:
    pass


UserId = NewType("UserId", str)
COLOR = {"type": "string", "enum": ["red", "green"]}
NULL = {"type": "null"}


def schema_of(annotation: str, **kwargs: Any) -> dict:
    """The property schema of a one-parameter tool whose hint is the string ``annotation``."""

    def f(x):  # annotations set below, as strings, like `from __future__ import annotations`
        return x

    f.__annotations__ = {"x": annotation}
    return tool(f).input_schema["properties"]["x"]


HINTS = [
    ("str", {"type": "string"}),
    ("int", {"type": "integer"}),
    ("float", {"type": "number"}),
    ("bool", {"type": "boolean"}),
    ("None", NULL),
    ("Any", {}),
    ("Optional[int]", {"anyOf": [{"type": "integer"}, NULL]}),
    ("int | None", {"anyOf": [{"type": "integer"}, NULL]}),
    ("Union[int, str]", {"anyOf": [{"type": "integer"}, {"type": "string"}]}),
    ("list[int]", {"type": "array", "items": {"type": "integer"}}),
    ("List[str]", {"type": "array", "items": {"type": "string"}}),
    ("list", {"type": "array", "items": {}}),
    ("List", {"type": "array", "items": {}}),
    ("Sequence[float]", {"type": "array", "items": {"type": "number"}}),
    ("collections.abc.Sequence[bool]", {"type": "array", "items": {"type": "boolean"}}),
    ("tuple[int, ...]", {"type": "array", "items": {"type": "integer"}}),
    ("Tuple[str, ...]", {"type": "array", "items": {"type": "string"}}),
    ("tuple", {"type": "array", "items": {}}),
    ("dict[str, int]", {"type": "object", "additionalProperties": {"type": "integer"}}),
    ("Dict[str, Any]", {"type": "object"}),
    ("dict", {"type": "object"}),
    ("Mapping[str, float]", {"type": "object", "additionalProperties": {"type": "number"}}),
    ("collections.abc.Mapping[str, str]", {"type": "object", "additionalProperties": {"type": "string"}}),
    ("Literal['a', 'b']", {"type": "string", "enum": ["a", "b"]}),
    ("Literal[1, 2]", {"type": "integer", "enum": [1, 2]}),
    ("Literal[True]", {"type": "boolean", "enum": [True]}),
    ("Literal['a', 1]", {"type": ["string", "integer"], "enum": ["a", 1]}),
    ("Literal['a', None]", {"type": ["string", "null"], "enum": ["a", None]}),
    ("Color", COLOR),
    ("Priority", {"type": "integer", "enum": [1, 2]}),
    ("Mixed", {"type": ["string", "integer"], "enum": ["a", 1]}),
    ("Optional[Color]", {"anyOf": [COLOR, NULL]}),
    ("UserId", {"type": "string"}),
    ("Annotated[int, 'How many.']", {"type": "integer", "description": "How many."}),
    ("Annotated[int, 42, 'Second metadata.']", {"type": "integer", "description": "Second metadata."}),
    ("Annotated[int, 42]", {"type": "integer"}),
    ("Optional[Annotated[int, 'Maybe.']]", {"anyOf": [{"type": "integer"}, NULL], "description": "Maybe."}),
    (
        "list[dict[str, Optional[Color]]]",
        {"type": "array", "items": {"type": "object", "additionalProperties": {"anyOf": [COLOR, NULL]}}},
    ),
    (
        "dict[str, list[Literal[1, 2]] | None]",
        {
            "type": "object",
            "additionalProperties": {
                "anyOf": [{"type": "array", "items": {"type": "integer", "enum": [1, 2]}}, NULL]
            },
        },
    ),
    ("list[Annotated[str, 'A tag.']]", {"type": "array", "items": {"type": "string", "description": "A tag."}}),
]


class TestHintSchemas:
    """Every supported hint, resolved from strings."""

    @pytest.mark.parametrize("annotation,expected", HINTS, ids=[h for h, _ in HINTS])
    def test_hint(self, annotation, expected):
        """The hint becomes the expected JSON schema."""
        assert schema_of(annotation) == expected

    def test_postponed_annotations_in_source(self):
        """A function written in this (postponed-annotations) module is fully resolved."""

        @tool
        def plan(
            colors: list[Color],
            limit: int | None = None,
            labels: Mapping[str, str] = {},  # noqa: B006 - never mutated
            level: Priority = Priority.LOW,
        ) -> None:
            """Plan."""

        assert plan.input_schema == {
            "type": "object",
            "properties": {
                "colors": {"type": "array", "items": COLOR},
                "limit": {"anyOf": [{"type": "integer"}, NULL], "default": None},
                "labels": {"type": "object", "additionalProperties": {"type": "string"}, "default": {}},
                "level": {"type": "integer", "enum": [1, 2], "default": 1},
            },
            "required": ["colors"],
            "additionalProperties": False,
        }

    def test_defaults_advertised(self):
        """Defaults make a parameter optional; JSON defaults are advertised (Enum by value)."""
        sentinel = object()

        def f(a: int, b: str = "x", c: Color = Color.GREEN, d: tuple[int, ...] = (1, 2), e: Any = sentinel):
            pass

        schema = tool(f).input_schema
        assert schema["required"] == ["a"]
        props = schema["properties"]
        assert (props["b"]["default"], props["c"]["default"], props["d"]["default"]) == ("x", "green", [1, 2])
        assert props["e"] == {}  # not JSON: no default advertised

    def test_none_default_makes_optional(self):
        """`x: int = None` accepts null (the same on every Python version)."""
        def f(x: int = None):  # type: ignore[assignment]
            pass

        assert tool(f).input_schema["properties"]["x"] == {
            "anyOf": [{"type": "integer"}, NULL], "default": None,
        }

    def test_annotated_beats_docstring(self):
        """An Annotated description wins over the Args: section."""

        @tool
        def f(x: Annotated[int, "From the hint."], y: int) -> None:
            """Do.

            Args:
                x: From the docstring.
                y: Also from the docstring.
            """

        props = f.input_schema["properties"]
        assert props["x"]["description"] == "From the hint."
        assert props["y"]["description"] == "Also from the docstring."


UNSUPPORTED = [
    ("set[int]", "set[int]", ""),
    ("bytes", "bytes", ""),
    ("frozenset", "frozenset", ""),
    ("complex", "complex", ""),
    ("Point", "Point", ""),
    ("Callable[[int], int]", "Callable[[int], int]", ""),
    ("tuple[int, str]", "tuple[int, str]", ": only variable-length tuples (tuple[X, ...]) are supported"),
    ("dict[int, str]", "dict[int, str]", ": JSON object keys are strings, so the key type must be str"),
    ("list[set[int]]", "set[int] (in list[set[int]])", ""),
    ("Optional[Point]", "Point (in Optional[Point])", ""),
    ("Literal['a.b', 1j]", "Literal['a.b', 1j]", ": value 1j is not a JSON string, number or boolean"),
    ("Pair", "Pair", ": value (0, 0) is not a JSON string, number or boolean"),
]


class TestRejectedHints:
    """Hints without a JSON-schema equivalent are rejected at decoration time."""

    @pytest.mark.parametrize("annotation,shown,reason", UNSUPPORTED, ids=[u[0] for u in UNSUPPORTED])
    def test_unsupported(self, annotation, shown, reason):
        """The error names the function, the parameter and the hint, and lists what works."""
        with pytest.raises(ToolDefinitionError) as info:
            schema_of(annotation)
        assert str(info.value) == (
            f"schema_of.<locals>.f: parameter 'x' has the unsupported type hint {shown}{reason}; "
            f"{SUPPORTED}"
        )

    def test_object_hint(self):
        """`object` is not `Any`: it is rejected."""
        with pytest.raises(ToolDefinitionError, match="unsupported type hint object"):
            schema_of("object")

    def test_unresolvable_forward_reference(self):
        """A hint naming something undefined is reported as such."""
        with pytest.raises(ToolDefinitionError) as info:
            schema_of("Undefined")
        assert str(info.value) == (
            "cannot read the type hints of schema_of.<locals>.f: name 'Undefined' is not defined "
            "(every name in a tool's hints must be defined at module level in the function's module)"
        )


class TestParseDocstring:
    """parse_docstring: summary and Google-style Args."""

    def test_empty(self):
        """No docstring, no description."""
        assert _schema.parse_docstring(None) == (None, {})
        assert _schema.parse_docstring("   \n  ") == (None, {})

    def test_summary_is_first_paragraph(self):
        """The summary is the first paragraph with its lines joined."""
        doc = """First line
            second line.

            Second paragraph.
            """
        assert _schema.parse_docstring(doc) == ("First line second line.", {})

    def test_summary_stops_at_section(self):
        """A section header right after the summary ends it."""
        doc = """Summary.
        Args:
            a: The a.
        """
        assert _schema.parse_docstring(doc) == ("Summary.", {"a": "The a."})

    def test_args_section(self):
        """Entries with types, continuation lines, star names; the section ends at the next one."""
        doc = """Summary.

        Args:
            city (str): The city
                to look up.
            days: Days ahead: at most 7.
            *rest: Ignored extras.

            empty:
        Returns:
            days: not an argument.
        """
        assert _schema.parse_docstring(doc) == (
            "Summary.",
            {"city": "The city to look up.", "days": "Days ahead: at most 7.", "rest": "Ignored extras."},
        )

    def test_only_args(self):
        """A docstring that is only an Args section has no summary."""
        doc = """Args:
                a: The a.
            """
        assert _schema.parse_docstring(doc) == (None, {"a": "The a."})


class TestCheckValue:
    """check_value / check_arguments on hand-written schemas (the supported subset)."""

    def check(self, schema: dict, value: Any) -> tuple:
        problems: list = []
        result = _schema.check_value(schema, value, "v", problems)
        return result, problems

    def test_integer_and_number(self):
        """Whole floats are integers (and become int); ints are numbers; bools are neither."""
        assert self.check({"type": "integer"}, 2.0) == (2, [])
        assert self.check({"type": "number"}, 2) == (2, [])
        assert self.check({"type": "number"}, 2.5) == (2.5, [])
        assert self.check({"type": ["integer", "number"]}, 2.0) == (2.0, [])
        assert self.check({"type": "integer"}, True)[1] == ["argument 'v': expected integer, got true (boolean)"]

    def test_enum_is_type_strict(self):
        """true is not 1 and 1 is not true."""
        assert self.check({"enum": [1]}, True)[1] == ["argument 'v': expected one of 1, got true (boolean)"]
        assert self.check({"enum": [True]}, 1)[1] == ["argument 'v': expected one of true, got 1 (integer)"]
        assert self.check({"enum": [1.0]}, 1) == (1, [])

    def test_const_and_one_of(self):
        """const and oneOf are understood."""
        assert self.check({"const": "x"}, "y")[1] == ["argument 'v': expected exactly \"x\", got \"y\" (string)"]
        assert self.check({"oneOf": [{"type": "string"}, {"type": "integer"}]}, 1) == (1, [])

    def test_nested_objects(self):
        """properties, required and additionalProperties apply at every depth, naming the path."""
        schema = {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {"id": {"type": "integer"}},
                "required": ["id"],
                "additionalProperties": {"type": "string"},
            },
        }
        assert self.check(schema, [{"id": 1, "x": "a"}, {"x": 2}])[1] == [
            "missing required argument 'v[1].id' (integer)",
            "argument 'v[1].x': expected string, got 2 (integer)",
        ]

    def test_union_reports_the_matching_branch(self):
        """For Optional[dict] a wrong item is reported precisely, not as "object or null"."""
        schema = {"anyOf": [{"type": "object", "additionalProperties": {"type": "integer"}}, NULL]}
        assert self.check(schema, {"a": "1"})[1] == ["argument 'v.a': expected integer, got \"1\" (string)"]

    def test_unknown_keywords_ignored(self):
        """Keywords outside the subset do not fail validation."""
        assert self.check({"type": "string", "maxLength": 1, "format": "email"}, "long") == ("long", [])

    def test_check_arguments_drops_null_for_optional(self):
        """null for an optional, non-nullable argument means "use the default"."""
        schema = {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"anyOf": [{"type": "integer"}, NULL]}},
            "required": [],
        }
        assert _schema.check_arguments(schema, {"a": None, "b": None}) == ({"b": None}, [])

    def test_describe(self):
        """Schemas are described in short words."""
        assert _schema.describe({}) == "any value"
        assert _schema.describe({"type": ["string", "null"]}) == "string or null"
        assert _schema.describe({"type": "array", "items": {"type": "array", "items": {"type": "integer"}}}) == (
            "array of array of integer"
        )


class TestJsonCopy:
    """json_copy."""

    def test_copies_and_normalises(self):
        """Containers are copied; tuples become lists and Enum members their values."""
        source = {"a": [1, (2, 3)], "b": {"c": Color.RED}}
        copy = _schema.json_copy(source)
        assert copy == {"a": [1, [2, 3]], "b": {"c": "red"}}
        copy["a"].append(9)
        assert source["a"] == [1, (2, 3)]

    @pytest.mark.parametrize("value", [{1, 2}, {1: "a"}, Point(), b"x"])
    def test_rejects_non_json(self, value):
        """Values JSON cannot carry are a TypeError."""
        with pytest.raises(TypeError):
            _schema.json_copy(value)

