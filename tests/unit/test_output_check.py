"""Issue 31: what a Python check gets for an answer the server parsed (JSON text, never a repr), and the
answer check of ``Agent(output_type=..., output_retries=N)``: its verdicts, its config, and the typed error of
a run that failed on its answer."""

from __future__ import annotations

import dataclasses
import json
from typing import List

import pytest

from conductor_agents import (Agent, Gate, Guardrail, Handoff, OutputValidationError, PendingRequest, RunStatus,
                              Termination, tool)
from conductor_agents._answers.output_check import EARLIER_FAILURES_INPUT, rejection_of
from conductor_agents._answers.output_type import FAILED_PREFIX, OutputSpec, Rejection, typed_result
from conductor_agents._common.answer_text import answer_text
from conductor_agents._common.json_check import json_strings_restored
from conductor_agents.errors import AgentDefinitionError
from conductor_agents.result import AgentResult, AgentStatus, tool_calls_from_tasks

MODEL = "openai/m"


@dataclasses.dataclass
class Forecast:
    city: str
    high: float
    tags: List[str] = dataclasses.field(default_factory=list)


@tool
def look(key: str) -> str:
    """Look."""
    return key


# --- the text a check gets ----------------------------------------------------------------------


@pytest.mark.parametrize("value,text", [
    ("It is sunny.", "It is sunny."),
    ('{"city": "Oslo"}', '{"city": "Oslo"}'),  # text stays as the model wrote it
    ({"city": "Zürich", "high": 3.5, "tags": ["cold"]}, '{"city": "Zürich", "high": 3.5, "tags": ["cold"]}'),
    ([], ""),  # the server's answer of a turn of tool calls
    (None, ""),
    ([1, "a"], '[1, "a"]'),
    (True, "true"),
    (3, "3"),
])
def test_answer_text_is_the_text_or_json_never_a_repr(value, text):
    assert answer_text(value) == text


def test_every_python_check_gets_json_text_for_a_parsed_answer():
    """Function guardrails, stop_when, termination, handoff conditions, gates and a review get JSON text."""
    parsed = {"city": "Zürich", "high": 3}
    seen = []

    def record(*args):
        seen.append(args[0].result if hasattr(args[0], "result") else args[0])
        return False

    guard = Guardrail.function(lambda text: seen.append(text) or json.loads(text)["city"] == "Zürich", name="g")
    assert guard.worker.invoke({"content": parsed}) == {"passed": True}
    assert guard.worker.invoke({"content": []}) == {"passed": True} and len(seen) == 1  # a tool turn: not asked
    walker = Agent(name="w", model=MODEL, tools=[look], stop_when=lambda text, turn: record(text),
                   termination=Termination.text_mention('"high": 3'))
    workers = {t.name: t for t in walker.worker_tools}
    assert workers["w_stop_when"].invoke({"result": parsed, "iteration": 1}) == {"should_continue": True}
    assert workers["w_termination"].invoke({"result": parsed, "iteration": 1}) == {"should_continue": False}
    other = Agent(name="other", model=MODEL)
    swarm = Agent(name="s", model=MODEL, agents=[other], strategy="swarm",
                  handoffs=[Handoff.on_condition("other", record)])
    [handoff] = [t for t in swarm.worker_tools if t.name == "s_handoff_0"]
    handoff.invoke({"result": parsed, "active_agent": "0"})
    staged = Agent(name="one", model=MODEL, gate=Gate.function(record))
    team = Agent(name="t", model=MODEL, agents=[staged, other], strategy="sequential")
    [gate] = [t for t in team.worker_tools if t.name == "t_gate_0"]
    gate.invoke({"result": parsed})
    texts = [s for s in seen if s]
    assert texts and all(json.loads(s) == parsed for s in texts), seen
    review = PendingRequest.from_task(
        {"taskId": "r", "taskType": "HUMAN", "status": "IN_PROGRESS", "referenceTaskName": "a_guardrail_human__1",
         "inputData": {"llm_output": parsed, "guardrail_name": "g"}}, "wf")
    assert json.loads(review.output) == parsed and "Zürich" in review.output


def test_result_text_keeps_non_ascii():
    result = AgentResult.from_server(AgentStatus("wf", RunStatus.COMPLETED, output={"result": {"city": "Zürich"}}))
    assert result.text == '{"city": "Zürich"}'


def test_a_str_argument_the_server_read_as_json_is_text_again():
    """The server turns a string argument that looks like JSON into an object: the tool gets the text back."""
    @tool
    def save(text: str, tags: List[str], count: int = 0) -> str:
        """Save."""
        return text

    args = save.parse_arguments({"text": {"a": 1}, "tags": [["x"], "y"], "count": 2})
    assert args == {"text": '{"a": 1}', "tags": ['["x"]', "y"], "count": 2}
    with pytest.raises(ValueError, match="expected integer"):
        save.parse_arguments({"text": "t", "tags": [], "count": {"n": 1}})  # only where a string is wanted
    assert json_strings_restored({"anyOf": [{"type": "string"}, {"type": "null"}]}, [1]) == "[1]"


def test_guardrail_workers_are_not_tool_calls():
    tasks = [{"taskType": "a_output_type", "referenceTaskName": "a_output_guardrail_a_output_type_worker__1"},
             {"taskType": "polite", "referenceTaskName": "a_output_guardrail_polite_worker"},
             {"taskType": "look", "referenceTaskName": "call_1__1"}]
    assert [c.name for c in tool_calls_from_tasks(tasks)] == ["look"]


# --- the answer check ---------------------------------------------------------------------------


def check_of(agent: Agent):
    [worker] = [t for t in agent.worker_tools if t.name == f"{agent.name}_output_type"]
    return worker


def test_the_check_passes_a_fitting_answer_and_a_tool_turn():
    check = check_of(Agent(name="a", model=MODEL, output_type=Forecast))
    assert check.invoke({"content": {"city": "Oslo", "high": 3}, "iteration": 1}) == {"passed": True}
    assert check.invoke({"content": '```json\n{"city": "Oslo", "high": 3}\n```', "iteration": 1}) == {"passed": True}
    assert check.invoke({"content": [], "iteration": 4}) == {"passed": True}


@pytest.mark.parametrize("content,problem", [
    ({"city": "Oslo"}, "missing required field 'high' (number)"),
    ({"city": "Oslo", "high": "warm"}, "field 'high': expected number"),
    ("It will be sunny in Oslo.", "the answer is not JSON"),
])
def test_a_misfit_is_retried_with_what_does_not_fit(content, problem):
    check = check_of(Agent(name="a", model=MODEL, output_type=Forecast))
    verdict = check.invoke({"content": content, "iteration": 1})
    assert verdict["passed"] is False and verdict["on_fail"] == "retry"
    assert problem in verdict["message"] and "Forecast" in verdict["message"]
    assert "double-quoted" in verdict["message"]
    assert not verdict["message"].endswith(".")  # the server appends ". Please revise your response."


def test_the_check_gives_up_after_output_retries_more_answers():
    """No tools: the turn counts the answers; with a count of earlier refusals (the executor's), that count."""
    check = check_of(Agent(name="a", model=MODEL, output_type=Forecast, output_retries=2))
    bad = {"content": {"city": "Oslo"}}
    assert check.invoke({**bad, "iteration": 2})["on_fail"] == "retry"
    final = check.invoke({**bad, "iteration": 3})
    assert final["on_fail"] == "raise"
    assert final["message"] == f"{FAILED_PREFIX} Forecast after 3 answers: missing required field 'high' (number)"
    # turns of tool calls between: the refusals counted from the run, not the turn number
    assert check.invoke({**bad, "iteration": 7, EARLIER_FAILURES_INPUT: lambda: 1})["on_fail"] == "retry"
    assert check.invoke({**bad, "iteration": 9, EARLIER_FAILURES_INPUT: lambda: 2})["on_fail"] == "raise"
    # the loop's last turn: no turn is left to ask again
    last = check_of(Agent(name="b", model=MODEL, output_type=Forecast, output_retries=5, max_turns=2))
    assert last.invoke({**bad, "iteration": 2, EARLIER_FAILURES_INPUT: lambda: 1})["on_fail"] == "raise"


def test_the_config_puts_the_check_first_and_the_schema_in_the_instructions():
    guard = Guardrail.function(lambda text: True, name="mine")
    config = Agent(name="a", model=MODEL, instructions="Be brief.", output_type=Forecast, guardrails=[guard],
                   max_turns=7).to_config()
    assert config["outputType"] == {"className": "Forecast"}  # no schema: no JSON mode on the server
    assert [g["name"] for g in config["guardrails"]] == ["a_output_type", "mine"]
    assert config["guardrails"][0] == {"name": "a_output_type", "guardrailType": "custom", "position": "output",
                                       "onFail": "retry", "maxRetries": 7, "taskName": "a_output_type"}
    first, sentence = config["instructions"].split("\n\n")
    assert first == "Be brief." and sentence.startswith("Respond with a JSON object matching this schema: {")
    assert '"required": ["city", "high"]' in sentence
    with_tools = Agent(name="b", model=MODEL, tools=[look], output_type=Forecast).to_config()
    assert with_tools["instructions"].startswith("When you give your final answer, respond with a JSON object")


def test_no_check_with_output_retries_0_or_on_a_team():
    plain = Agent(name="a", model=MODEL, output_type=Forecast, output_retries=0)
    assert plain.to_config()["outputType"]["schema"]["required"] == ["city", "high"]
    assert "guardrails" not in plain.to_config() and plain.worker_tools == ()
    team = Agent(name="t", model=MODEL, output_type=Forecast, agents=[Agent(name="x", model=MODEL)])
    assert "schema" in team.to_config()["outputType"] and "guardrails" not in team.to_config()
    with pytest.raises(AgentDefinitionError):
        Agent(name="a", model=MODEL, output_type=Forecast, output_retries=-1)


# --- a run that failed on its answer ------------------------------------------------------------


def failed(error: str) -> AgentResult:
    return AgentResult.from_server(AgentStatus("wf", RunStatus.FAILED, reason=error))


def test_a_run_the_check_failed_raises_the_typed_error():
    reason = f"{FAILED_PREFIX} Forecast after 3 answers: missing required field 'high' (number)"
    tasks = [{"taskType": "a_output_type", "status": "COMPLETED", "inputData": {"content": {"city": c}},
              "outputData": {"passed": False, "on_fail": "raise" if c == "Rome" else "retry"}}
             for c in ("Oslo", "Bergen", "Rome")]
    rejection = rejection_of(tasks, "a")
    assert rejection == Rejection("check", {"city": "Rome"}, 3)
    with pytest.raises(OutputValidationError) as caught:
        typed_result(failed(reason), OutputSpec.of(Forecast), rejection)
    err = caught.value
    assert err.raw_output == '{"city": "Rome"}' and err.problems == ("missing required field 'high' (number)",)
    assert err.result.status is RunStatus.FAILED and err.result.error == reason
    assert "FAILED" in str(err) and "after 3 answers" in str(err)
    # a run that failed otherwise is returned as it was
    assert rejection_of(tasks[:2], "a") is None
    assert typed_result(failed("a tool broke"), OutputSpec.of(Forecast), None).error == "a tool broke"


def test_a_prose_answer_in_json_mode_is_the_typed_error():
    """output_retries=0: the server's JSON mode fails the model call; its reason carries the model's text."""
    detail = json.dumps({"error": "Unrecognized token 'It'", "response": "It will be sunny in Oslo."})
    task_reason = f"Task execution failed: {detail}"
    tasks = [{"taskType": "LLM_CHAT_COMPLETE", "referenceTaskName": "a_llm", "status": "FAILED",
              "inputData": {"jsonOutput": True}, "reasonForIncompletion": task_reason}]
    rejection = rejection_of(tasks, "a")
    assert rejection == Rejection("json_mode", "It will be sunny in Oslo.")
    with pytest.raises(OutputValidationError) as caught:
        typed_result(failed(f"Task 7 failed with status: FAILED and reason: '{task_reason}'"),
                     OutputSpec.of(Forecast), rejection)
    assert caught.value.raw_output == "It will be sunny in Oslo."
    assert caught.value.problems == ("the answer is not JSON",)
    # the server said nothing: still the typed error, without the text
    tasks[0]["reasonForIncompletion"] = ""
    with pytest.raises(OutputValidationError, match="gave no details"):
        typed_result(failed("Task 7 failed with status: FAILED and reason: "), OutputSpec.of(Forecast),
                     rejection_of(tasks, "a"))
