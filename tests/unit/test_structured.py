"""Unit tests for structured tool parameters and results (conductor_agents._common.structured via @tool)."""

from __future__ import annotations

import dataclasses
import enum
import sys
from typing import Annotated, Dict, List, NamedTuple, Optional, TypedDict

import attrs
import pydantic  # test extra only: the SDK never imports it
import pytest

from conductor_agents import ToolArgumentsError, tool
from conductor_agents._wire.payload import ToolOutputError, tool_output
from conductor_agents._common.structured import jsonable
from conductor_agents.errors import ToolDefinitionError


class Size(enum.Enum):
    S = "s"
    L = "l"


@dataclasses.dataclass(frozen=True)
class Dims:
    width: float
    height: float = 1.0


@dataclasses.dataclass
class Box:
    """A box to ship."""

    label: Annotated[str, "What is written on it"]
    dims: Dims
    size: Size = Size.S
    tags: List[str] = dataclasses.field(default_factory=list)
    computed: int = dataclasses.field(default=0, init=False)


class Query(TypedDict):
    text: str
    limit: int


class Partial(TypedDict, total=False):
    text: str


class Pair(NamedTuple):
    left: int
    right: int = 0


class Model(pydantic.BaseModel):
    name: str
    inner: Optional["Inner"] = None


class Inner(pydantic.BaseModel):
    value: int = pydantic.Field(gt=0)  # a constraint only pydantic checks


Model.model_rebuild()


@dataclasses.dataclass
class Loop:
    next: Optional["Loop"] = None


class Tree(pydantic.BaseModel):
    children: List["Tree"] = []


Tree.model_rebuild()


@dataclasses.dataclass
class HoldsASet:
    items: set


def test_dataclass_schema_and_conversion():
    @tool
    def ship(box: Box) -> Box:
        """Ship."""
        return box

    schema = ship.input_schema["properties"]["box"]
    assert schema == {
        "type": "object", "description": "A box to ship.", "additionalProperties": False,
        "required": ["label", "dims"],
        "properties": {
            "label": {"type": "string", "description": "What is written on it"},
            "dims": {"type": "object", "properties": {"width": {"type": "number"},
                                                      "height": {"type": "number", "default": 1.0}},
                     "required": ["width"], "additionalProperties": False},
            "size": {"type": "string", "enum": ["s", "l"], "default": "s"},
            "tags": {"type": "array", "items": {"type": "string"}, "default": []},
        },
    }
    box = ship.invoke({"box": {"label": "x", "dims": {"width": 2}, "size": "l"}})
    assert box == Box("x", Dims(2.0), Size.L) and isinstance(box.dims.width, float)


def test_typeddict_and_namedtuple():
    @tool
    def find(query: Query, partial: Partial, pair: Pair) -> dict:
        """Find."""
        return {"query": query, "partial": partial, "pair": pair}

    props = find.input_schema["properties"]
    assert props["query"]["required"] == ["text", "limit"]
    assert props["partial"]["required"] == [] and "default" not in props["partial"]["properties"]["text"]
    assert props["pair"]["properties"]["right"] == {"type": "integer", "default": 0}
    out = find.invoke({"query": {"text": "a", "limit": 1}, "partial": {}, "pair": {"left": 3}})
    assert out == {"query": {"text": "a", "limit": 1}, "partial": {}, "pair": Pair(3, 0)}
    assert tool_output(out) == {"query": {"text": "a", "limit": 1}, "partial": {}, "pair": {"left": 3, "right": 0}}


if sys.version_info >= (3, 11):
    from typing import NotRequired

    class Mixed(TypedDict):
        text: str
        limit: NotRequired[int]


@pytest.mark.skipif(sys.version_info < (3, 11), reason="typing.NotRequired is new in Python 3.11")
def test_typeddict_not_required():
    @tool
    def find(query: Mixed) -> None:
        """Find."""

    assert find.input_schema["properties"]["query"]["required"] == ["text"]
    assert find.input_schema["properties"]["query"]["properties"]["limit"] == {"type": "integer"}


def test_pydantic_models_are_inlined_and_validated_by_pydantic():
    @tool
    def save(model: Model) -> Model:
        """Save."""
        return model

    schema = save.input_schema["properties"]["model"]
    assert "$ref" not in str(schema) and "$defs" not in str(schema) and "title" not in schema
    assert schema["properties"]["inner"]["anyOf"][0]["properties"] == {
        "value": {"type": "integer", "exclusiveMinimum": 0}}
    assert save.invoke({"model": {"name": "a", "inner": {"value": 3}}}) == Model(name="a", inner=Inner(value=3))
    with pytest.raises(ToolArgumentsError) as info:  # the JSON types are checked first, by name
        save.invoke({"model": {"name": "a", "inner": {"value": "three"}}})
    assert "argument 'model.inner.value': expected integer" in str(info.value)
    with pytest.raises(ToolArgumentsError) as info:  # then pydantic's own validation
        save.invoke({"model": {"name": "a", "inner": {"value": -1}}})
    assert "argument 'model'" in str(info.value) and "greater than 0" in str(info.value)


def test_argument_problems_name_the_nested_field():
    @tool
    def ship(box: Box) -> None:
        """Ship."""

    with pytest.raises(ToolArgumentsError) as info:
        ship.invoke({"box": {"label": "x", "dims": {"height": 2}, "extra": 1}})
    assert "missing required argument 'box.dims.width'" in str(info.value)
    assert "unexpected argument 'box.extra'" in str(info.value)


@pytest.mark.parametrize("hint,text", [
    (Loop, "Loop: it contains itself"),
    (Tree, "contains itself"),
    (HoldsASet, "set (in HoldsASet)"),
])
def test_what_cannot_be_described_is_refused_at_decoration(hint, text):
    def f(x):
        """F."""

    f.__annotations__ = {"x": hint}
    with pytest.raises(ToolDefinitionError) as info:
        tool(f)
    assert text in str(info.value)


def test_jsonable_results():
    assert jsonable(Box("x", Dims(2.0))) == {"label": "x", "dims": {"width": 2.0, "height": 1.0}, "size": "s",
                                             "tags": [], "computed": 0}
    assert jsonable([Pair(1, 2), {"m": Model(name="n")}]) == [{"left": 1, "right": 2},
                                                            {"m": {"name": "n", "inner": None}}]
    assert jsonable(Size.L) == "l" and jsonable((1, 2)) == [1, 2]
    assert tool_output(Dims(1.0)) == {"width": 1.0, "height": 1.0}
    with pytest.raises(ToolOutputError):
        tool_output(HoldsASet({1}))


def test_mapping_of_structured_values():
    @tool
    def many(boxes: Dict[str, Dims], pairs: List[Pair]) -> int:
        """Many."""
        return len(boxes) + len(pairs)

    values = many.parse_arguments({"boxes": {"a": {"width": 1}}, "pairs": [{"left": 1}]})
    assert values == {"boxes": {"a": Dims(1.0)}, "pairs": [Pair(1)]}


@attrs.frozen
class Parcel:
    """A parcel."""

    weight: float
    _code: str = "none"  # a private attrs field: set through its __init__ name, "code"
    extras: List[str] = attrs.field(factory=list)


def test_attrs_classes_are_structured_like_dataclasses():
    """An attrs class: properties by __init__ name, defaults advertised, an instance built; results dumped."""

    @tool
    def send(parcel: Parcel) -> Parcel:
        """Send."""
        return parcel

    schema = send.input_schema["properties"]["parcel"]
    assert schema == {"type": "object", "description": "A parcel.", "additionalProperties": False,
                      "required": ["weight"],
                      "properties": {"weight": {"type": "number"}, "code": {"type": "string", "default": "none"},
                                     "extras": {"type": "array", "items": {"type": "string"}, "default": []}}}
    parcel = send.invoke({"parcel": {"weight": 2, "code": "X9"}})
    assert parcel == Parcel(2.0, "X9") and isinstance(parcel.weight, float)
    assert tool_output(parcel) == {"weight": 2.0, "code": "X9", "extras": []}
