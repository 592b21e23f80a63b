"""Typed answers on the real server: Agent(output_type=...) gives result.output as an instance.

The server puts the schema in the system prompt (and, without tools, asks for JSON) but does not
check the answer: the SDK does, in wait(); a mismatch is OutputValidationError with the raw text.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from typing import List, NamedTuple, Optional

import attrs
import pydantic
import pytest

from conductor_agents import Agent, OutputValidationError, RunStatus, tool
from conductor_agents.testing import ToolCall

if sys.version_info >= (3, 11):
    from typing import NotRequired, TypedDict
else:  # pragma: no cover - 3.10
    from typing_extensions import NotRequired, TypedDict

pytestmark = pytest.mark.integration


@dataclasses.dataclass
class Forecast:
    """A weather forecast."""

    city: str
    high: float
    tags: List[str] = dataclasses.field(default_factory=list)


@attrs.frozen
class Invoice:
    number: str
    total: float
    paid: bool = False


class Point(NamedTuple):
    x: int
    y: int


class Person(TypedDict):
    name: str
    email: NotRequired[str]


class Order(pydantic.BaseModel):
    sku: str
    quantity: int = pydantic.Field(ge=1)
    note: Optional[str] = None


CASES = [
    (Forecast, '{"city": "Oslo", "high": 3}', Forecast(city="Oslo", high=3.0, tags=[])),
    (Invoice, '{"number": "A-7", "total": 12.5, "paid": true}', Invoice(number="A-7", total=12.5, paid=True)),
    (Point, '```json\n{"x": 1, "y": 2}\n```', Point(x=1, y=2)),
    (Person, '{"name": "Ada"}', {"name": "Ada"}),
    (Order, '{"sku": "X1", "quantity": 2}', Order(sku="X1", quantity=2)),
]


@pytest.mark.both_topologies
@pytest.mark.parametrize("output_type,answer,expected", CASES, ids=[c[0].__name__ for c in CASES])
def test_run_returns_an_instance_of_the_output_type(agent_runtime, scripted_llm, unique_name,
                                                    output_type, answer, expected):
    """dataclass, attrs class, NamedTuple, TypedDict and pydantic model answers come back as instances."""
    model = scripted_llm.script([answer])
    agent = Agent(name=unique_name("typed"), model=model, output_type=output_type)
    result = agent_runtime.run(agent, "Answer.", timeout=90)
    assert result.status is RunStatus.COMPLETED
    assert result.output == expected and type(result.output) is type(expected)
    assert json.loads(result.text) == json.loads(answer.strip("`\njson"))
    [request] = scripted_llm.requests_for(model)
    assert "Respond with a JSON object matching this schema" in request.instructions
    assert request.body.get("text", {}).get("format", {}).get("type") == "json_object"  # no tools: JSON mode


@pytest.mark.both_topologies
def test_wait_checks_the_answer_of_an_agent_with_tools(agent_runtime, scripted_llm, unique_name):
    """With tools the server asks for JSON only in the prompt; wait() on the handle parses the text answer."""
    name = unique_name("lookup")

    @tool(name=name)
    def lookup(city: str) -> dict:
        """Look up the forecast."""
        return {"city": city, "high": 21}

    model = scripted_llm.script([ToolCall(name, {"city": "Rome"}), '{"city": "Rome", "high": 21, "tags": ["sun"]}'])
    handle = agent_runtime.start(Agent(name=unique_name("typed"), model=model, tools=[lookup],
                                       output_type=Forecast), "Forecast for Rome?")
    result = handle.wait(timeout=90)
    assert result.output == Forecast(city="Rome", high=21.0, tags=["sun"])
    assert "JSON object matching this schema" in scripted_llm.requests_for(model)[0].instructions
    assert handle.wait() == result  # again: the same typed result


@pytest.mark.both_topologies
def test_an_answer_that_does_not_fit_is_an_error_that_keeps_the_raw_output(agent_runtime, scripted_llm,
                                                                             unique_name):
    """A missing field, a bad value (pydantic's own check) and prose each raise OutputValidationError."""
    name = unique_name("noop")

    @tool(name=name)
    def noop() -> dict:
        """Do nothing."""
        return {}

    cases = [
        (Forecast, ['{"city": "Oslo"}'], [], "missing required field 'high'"),
        (Order, ['{"sku": "X1", "quantity": 0}'], [], "quantity"),
        (Forecast, [ToolCall(name), "It will be sunny."], [noop], "not JSON"),
    ]
    for output_type, turns, tools, problem in cases:
        model = scripted_llm.script(turns)
        handle = agent_runtime.start(Agent(name=unique_name("typed"), model=model, tools=tools,
                                           output_type=output_type), "Answer.")
        with pytest.raises(OutputValidationError) as caught:
            handle.wait(timeout=90)
        err = caught.value
        raw = turns[-1]
        assert (err.execution_id, err.output_type) == (handle.execution_id, output_type)
        if raw.startswith("{"):
            assert json.loads(err.raw_output) == json.loads(raw)
        else:
            assert err.raw_output == raw
        assert err.result.status is RunStatus.COMPLETED and err.result.text == err.raw_output
        assert any(problem in p for p in err.problems), err.problems
        assert problem in str(err)
        with pytest.raises(OutputValidationError):  # a later wait() says the same
            handle.wait()
