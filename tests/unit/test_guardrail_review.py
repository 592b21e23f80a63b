"""Unit tests for a guardrail's review by a person (``on_fail="human"``) and its answers.

The task JSON follows what Conductor 3.32.3 compiles for the ``human`` case of a guardrail
(``GuardrailCompiler.compileHumanCase`` + ``HumanTaskBuilder``): a HUMAN task
``<agent>_guardrail_human__<turn>`` with ``guardrail_name``, ``guardrail_message`` and
``llm_output``, an INLINE ``..._validate`` reading the answer, an INLINE ``..._process`` whose
``{action, result, reason}`` the run routes on.
"""

from __future__ import annotations

from typing import Any, List

import pytest

from conductor_agents import (
    AnswerConflictError,
    ExecutionNotRunningError,
    Guardrail,
    NothingPendingError,
    PendingRequest,
)
from conductor_agents._people import approvals as _approvals
from conductor_agents._people.pending import consumed_answer, pending_in, request_kind, stored_answer
from conductor_agents.result import tool_calls_from_tasks

REF = "desk_guardrail_human__1"


def review_task(status: str = "IN_PROGRESS", output: Any = None) -> dict:
    task = {"taskId": "r1", "taskType": "HUMAN", "status": status, "seq": 7, "startTime": 1796167516000,
            "referenceTaskName": REF, "taskDefName": "desk_guardrail_human",
            "inputData": {"__humanTaskDefinition": {"displayName": "desk Guardrail Review"},
                          "response_schema": {"type": "object"}, "guardrail_message": "No keys.",
                          "guardrail_name": "no_keys", "llm_output": "key sk-1"}}
    if output is not None:
        task["outputData"] = output
    return task


def server_scripts(answer: dict) -> dict:
    """What 3.32.3's validate + process scripts make of an answer with a boolean ``approved``."""
    validated = {"needs_normalize": False, "approved": answer["approved"],
                 "edited_output": answer.get("edited_output") or None, "reason": answer.get("reason") or None}
    if validated["approved"]:
        return {"action": "approve", "result": "key sk-1"}
    if validated["edited_output"]:
        return {"action": "edit", "result": validated["edited_output"]}
    return {"action": "reject", "reason": validated["reason"] or "Rejected by human reviewer"}


def answered(answer: dict, *, run_status: str = "RUNNING") -> dict:
    validate = {"taskId": "v", "taskType": "INLINE", "status": "COMPLETED", "seq": 8,
                "referenceTaskName": "desk_guardrail_human_validate__1", "inputData": {"human_output": answer}}
    process = {"taskId": "p", "taskType": "INLINE", "status": "COMPLETED", "seq": 9,
               "referenceTaskName": "desk_guardrail_human_process__1",
               "outputData": {"result": server_scripts(answer)}}
    return {"workflowId": "wf", "status": run_status,
            "tasks": [review_task("COMPLETED", answer), validate, process]}


class FakeServer:
    """Holds one run waiting on a review; an update plays the server's scripts."""

    def __init__(self, first_answer: Any = None) -> None:
        self.updates: List[dict] = []
        self.workflow = {"workflowId": "wf", "status": "RUNNING", "tasks": [review_task()]}
        if first_answer is not None:
            self.workflow = answered(first_answer)

    def get_workflow(self, execution_id: str, include_tasks: bool = True) -> dict:
        return self.workflow

    def update_task(self, body: dict) -> None:
        self.updates.append(body)
        answer = body["outputData"]
        status = "FAILED" if server_scripts(answer)["action"] == "reject" else "COMPLETED"
        self.workflow = answered(answer, run_status=status)


def test_a_review_is_its_own_kind_of_request_with_the_answer_under_review():
    (request,) = pending_in({"status": "RUNNING", "tasks": [review_task()]}, "wf")
    assert request.kind == PendingRequest.REVIEW == request_kind(review_task())
    assert (request.output, request.guardrail, request.guardrail_message) == ("key sk-1", "no_keys", "No keys.")
    assert request.question is None and request.tool_calls == ()
    assert request.to_dict()["guardrailMessage"] == "No keys." and request.to_dict()["kind"] == "review"


def test_the_review_is_no_tool_call_of_the_model():
    assert tool_calls_from_tasks([review_task("COMPLETED", {"approved": True})]) == ()


@pytest.mark.parametrize("answer, action, approved, text, reason", [
    ({"approved": True, "answer_id": "a"}, "approve", True, None, None),
    ({"approved": False, "edited_output": "No key here.", "answer_id": "a"}, "edit", False, "No key here.", None),
    ({"approved": False, "reason": "leak", "answer_id": "a"}, "reject", False, None, "leak"),
])
def test_the_answer_the_run_took_and_the_stored_one_agree(answer, action, approved, text, reason):
    workflow = answered(answer)
    human = workflow["tasks"][0]
    for found in (consumed_answer(workflow, human), stored_answer(human, "wf")):
        assert found is not None
        assert (found.kind, found.action, found.approved, found.answer, found.reason, found.answer_id) == \
            ("review", action, approved, text, reason, "a")
    assert consumed_answer({"workflowId": "wf", "tasks": [review_task()]}, review_task()) is None


def test_approve_edit_and_reject_send_what_the_servers_scripts_read():
    server = FakeServer()
    assert _approvals.approve(server, "wf", by="ann").action == "approve"  # type: ignore[arg-type]
    assert server.updates[-1]["outputData"]["approved"] is True and server.updates[-1]["taskId"] == "r1"
    assert "decision" not in server.updates[-1]["outputData"]

    server = FakeServer()
    edited = _approvals.respond(server, "wf", "No key here.")  # type: ignore[arg-type]
    assert (edited.action, edited.answer) == ("edit", "No key here.")
    assert server.updates[-1]["outputData"]["approved"] is False

    server = FakeServer()
    rejected = _approvals.reject(server, "wf", "it leaks")  # type: ignore[arg-type]
    assert (rejected.action, rejected.reason, rejected.approved) == ("reject", "it leaks", False)


def test_a_review_edit_must_be_text_and_is_refused_before_any_update():
    server = FakeServer()
    for bad in ("  ", {"text": "x"}, 3):
        with pytest.raises(ValueError, match="non-empty str"):
            _approvals.respond(server, "wf", bad)  # type: ignore[arg-type]
    assert server.updates == []


def test_a_review_answered_before_is_a_conflict_and_an_ended_run_is_told():
    server = FakeServer(first_answer={"approved": True, "answer_id": "first", "answered_by": "bob"})
    with pytest.raises(AnswerConflictError) as err:
        _approvals.approve(server, "wf", request=REF)  # type: ignore[arg-type]
    assert err.value.winner.answered_by == "bob"
    with pytest.raises(NothingPendingError) as nothing:
        _approvals.respond(server, "wf", "x")  # type: ignore[arg-type]
    assert nothing.value.last_answer is not None and nothing.value.last_answer.action == "approve"
    server.workflow = {**server.workflow, "status": "FAILED"}
    with pytest.raises(ExecutionNotRunningError):
        _approvals.approve(server, "wf")  # type: ignore[arg-type]


def test_a_review_guardrail_config():
    guard = Guardrail.regex("no_keys", [r"sk-\d"], on_fail="human")
    assert guard.to_config()["onFail"] == "human"


def test_a_waiting_event_says_when_a_review_is_awaited():
    from conductor_agents.events import WaitingEvent

    review = WaitingEvent(execution_id="wf", id="1", task_reference_name=REF,
                          pending_tool={"taskRefName": REF, "response_schema": {"type": "object"}})
    question = WaitingEvent(execution_id="wf", id="2", task_reference_name="call_1__1",
                            pending_tool={"taskRefName": "call_1__1", "response_schema": {}})
    assert review.for_person and review.for_review
    assert question.for_person and not question.for_review


# --- tool guardrails ------------------------------------------------------------------------------


def test_tool_guardrails_go_to_the_tools_config_and_their_functions_are_served():
    from conductor_agents import Agent, tool

    block = Guardrail.regex("no_rm", [r"rm -rf"], message="No deletions.", on_fail="raise")
    polite = Guardrail.function(lambda text: "please" in text, name="polite_calls")

    @tool(guardrails=[block, polite])
    def shell(cmd: str) -> str:
        """Run a command."""
        return cmd

    config = shell.to_config()["guardrails"]
    assert [(g["name"], g["guardrailType"], g["position"], g["onFail"]) for g in config] == [
        ("no_rm", "regex", "input", "raise"), ("polite_calls", "custom", "input", "retry")]
    agent = Agent(name="ops", model="openai/m", tools=[shell])
    assert {t.name for t in agent.worker_tools} == {"shell", "polite_calls"}
    assert agent.to_config()["tools"][0]["guardrails"] == config

    @tool
    def plain(cmd: str) -> str:
        """Run a command."""
        return cmd

    assert "guardrails" not in plain.to_config() and plain.guardrails == ()


@pytest.mark.parametrize("guardrails, problem", [
    (["no"], "guardrails holds Guardrail values"),
    ([Guardrail.function(lambda t: True, name="g", on_fail="fix")], "on_fail='fix' is not supported on a tool"),
    ([Guardrail.regex("g", "a"), Guardrail.regex("g", "b")], "share a name"),
])
def test_bad_tool_guardrails_are_refused(guardrails, problem):
    from conductor_agents import ToolDefinitionError, tool

    with pytest.raises(ToolDefinitionError, match=problem):
        @tool(guardrails=guardrails)
        def shell(cmd: str) -> str:
            """Run a command."""
            return cmd


def test_an_agent_with_a_human_guardrail_can_wait_for_people():
    from conductor_agents import Agent, tool

    @tool(guardrails=[Guardrail.regex("g", "x", on_fail="human")])
    def act(cmd: str) -> str:
        """Act."""
        return cmd

    assert Agent(name="a", model="openai/m", guardrails=[Guardrail.regex("g", "x", on_fail="human")]).waits_for_people
    assert Agent(name="b", model="openai/m", tools=[act]).waits_for_people
    assert not Agent(name="c", model="openai/m", guardrails=[Guardrail.regex("g", "x")]).waits_for_people
