"""Typed answers on the real server: Agent(output_type=...) gives result.output as an instance.

The server does not check the answer: the SDK does, after each answer in the run (the model is told what
does not fit and asked again, ``output_retries``) and in wait(); a mismatch is OutputValidationError with
the raw text, also when the run FAILED because no answer fit. With ``output_retries=0`` the server puts
the schema in the system prompt and, without tools, asks for JSON (its JSON mode).
"""

from __future__ import annotations

import dataclasses
import json
import sys
from typing import List, NamedTuple, Optional

import attrs
import pydantic
import pytest

from conductor_agents import Agent, Guardrail, GuardrailResult, OutputValidationError, RunStatus, tool
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
    # the answer is checked in the run: no JSON mode, so a prose answer reaches the check
    assert request.body.get("text", {}).get("format", {}).get("type") != "json_object"


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
    """A missing field, a bad value (pydantic's own check) and prose each raise OutputValidationError
    (output_retries=0: the run COMPLETED, wait() checks its answer)."""
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
                                           output_type=output_type, output_retries=0), "Answer.")
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


# --- issue 31: the answer checked in the run, the model asked again -----------------------------------------


@pytest.mark.both_topologies
def test_a_bad_answer_is_asked_again_and_the_good_one_comes_back_typed(agent_runtime, scripted_llm, unique_name):
    """A missing field, then prose: each time the model is told what does not fit; the third answer fits."""
    model = scripted_llm.script(['{"city": "Oslo"}', "It will be cold in Oslo.",
                                 '{"city": "Oslo", "high": -2.5, "tags": ["cold"]}'])
    agent = Agent(name=unique_name("typed"), model=model, output_type=Forecast)  # output_retries=2
    result = agent_runtime.run(agent, "Forecast for Oslo?", timeout=120)
    assert result.status is RunStatus.COMPLETED, result.error
    assert result.output == Forecast(city="Oslo", high=-2.5, tags=["cold"])
    first, second, third = scripted_llm.requests_for(model)
    assert "missing required field 'high' (number)" in second.user_text
    assert "the answer is not JSON" in third.user_text and "double-quoted" in third.user_text
    assert result.tool_calls == ()  # the check is no tool call


def test_a_function_guardrail_gets_json_text_and_passes_a_valid_retry(agent_runtime, scripted_llm, unique_name):
    """The server reads a JSON answer into an object: the guardrail gets it as JSON text, never a repr."""
    seen: list = []

    def has_tags(answer: str) -> GuardrailResult:
        seen.append(answer)
        return GuardrailResult(bool(json.loads(answer).get("tags")), message="name at least one tag")

    model = scripted_llm.script(['{"city": "Zürich", "high": 3}', '{"city": "Zürich", "high": 3, "tags": ["cold"]}'])
    agent = Agent(name=unique_name("typed"), model=model, output_type=Forecast,
                  guardrails=[Guardrail.function(has_tags, name=unique_name("tags"), max_retries=2)])
    result = agent_runtime.run(agent, "Forecast for Zürich?", timeout=120)
    assert result.status is RunStatus.COMPLETED, result.error
    assert result.output == Forecast(city="Zürich", high=3.0, tags=["cold"])
    assert [json.loads(a) for a in seen] == [{"city": "Zürich", "high": 3},
                                              {"city": "Zürich", "high": 3, "tags": ["cold"]}]
    assert "Zürich" in seen[0] and "Zürich" in result.text  # not \u00fc
    assert "name at least one tag" in scripted_llm.requests_for(model)[1].user_text


@pytest.mark.both_topologies
def test_an_answer_that_never_fits_fails_the_run_with_a_typed_error(agent_runtime, scripted_llm, unique_name):
    """output_retries=1: prose, then a missing field: the run FAILED, its reason names the failure, and
    wait() raises OutputValidationError with the last answer and what does not fit."""
    model = scripted_llm.script(["It will be sunny in Oslo.", '{"city": "Oslo"}'])
    handle = agent_runtime.start(Agent(name=unique_name("typed"), model=model, output_type=Forecast,
                                       output_retries=1), "Forecast?")
    with pytest.raises(OutputValidationError) as caught:
        handle.wait(timeout=120)
    err = caught.value
    assert err.result.status is RunStatus.FAILED and err.output_type is Forecast
    assert json.loads(err.raw_output) == {"city": "Oslo"}
    assert err.problems == ("missing required field 'high' (number)",)
    reason = agent_runtime._api.get_workflow(handle.execution_id)["reasonForIncompletion"]
    assert reason == err.result.error == \
        "Answer does not fit output_type Forecast after 2 answers: missing required field 'high' (number)"
    assert len(scripted_llm.requests_for(model)) == 2
    with pytest.raises(OutputValidationError):
        handle.wait()


def test_turns_of_tool_calls_do_not_count_as_answers(agent_runtime, scripted_llm, unique_name):
    """With tools the check counts the answers it refused in the run, not the loop's turns."""
    name = unique_name("lookup")

    @tool(name=name)
    def lookup(city: str) -> dict:
        """Look up the forecast."""
        return {"city": city, "high": 21}

    model = scripted_llm.script([ToolCall(name, {"city": "Rome"}), "Sunny, 21 degrees.",
                                 ToolCall(name, {"city": "Rome"}), ToolCall(name, {"city": "Rome"}),
                                 '{"city": "Rome"}'])
    handle = agent_runtime.start(Agent(name=unique_name("typed"), model=model, tools=[lookup],
                                       output_type=Forecast, output_retries=1), "Forecast for Rome?")
    with pytest.raises(OutputValidationError) as caught:
        handle.wait(timeout=120)
    assert "after 2 answers" in caught.value.result.error
    assert caught.value.problems == ("missing required field 'high' (number)",)
    assert [c.name for c in caught.value.result.tool_calls] == [name] * 3
    assert "the answer is not JSON" in scripted_llm.requests_for(model)[2].user_text


def test_prose_in_json_mode_is_a_typed_error(agent_runtime, scripted_llm, unique_name):
    """output_retries=0 keeps the server's JSON mode: prose fails the model call (the server retries it
    blindly, about 14 s), and wait() raises OutputValidationError with the model's text."""
    model = scripted_llm.script(["It will be sunny in Oslo."] * 4)
    handle = agent_runtime.start(Agent(name=unique_name("typed"), model=model, output_type=Forecast,
                                       output_retries=0), "Forecast?")
    with pytest.raises(OutputValidationError) as caught:
        handle.wait(timeout=120)
    err = caught.value
    assert err.result.status is RunStatus.FAILED
    assert err.raw_output == "It will be sunny in Oslo." and err.problems == ("the answer is not JSON",)
    assert "It will be sunny in Oslo." in err.result.error  # the server's reason carries the model's text
    assert "JSON mode" in str(err)
