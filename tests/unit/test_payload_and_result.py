"""Unit tests for conductor_agents._wire.payload (message and tool-output normalisation) and result."""

import datetime
import decimal

import pytest
import responses

from conductor_agents._listener.directory import Chain
from conductor_agents._wire.api import ConductorApi
from conductor_agents._wire.payload import ToolOutputError, message_payload, tool_output
from conductor_agents._wire.transport import Transport
from conductor_agents.errors import PayloadError
from conductor_agents.handle import AgentHandle
from conductor_agents.result import (
    AgentResult,
    AgentStatus,
    RunStatus,
    TokenUsage,
    ToolCallRecord,
    tool_calls_from_tasks,
)
from conductor_agents.runtime import AgentRuntime
from conductor_agents.settings import AgentSettings
from tests.unit.fakes import BASE_URL, FakeClock

NAN = float("nan")
INF = float("inf")


# --- message_payload --------------------------------------------------------------------------


@pytest.mark.parametrize("payload,expected", [
    ({"text": "hi", "n": [1, 2]}, {"text": "hi", "n": [1, 2]}),
    ({}, {}),
    ("hello", {"message": "hello"}),
    ("", {"message": ""}),
    (42, {"message": 42}),
    (2.5, {"message": 2.5}),
    (True, {"message": True}),
    (None, {"message": None}),
    ([1, "two", {"three": 3}], {"message": [1, "two", {"three": 3}]}),
    ((1, 2), {"message": [1, 2]}),
    ({"message": "already wrapped"}, {"message": "already wrapped"}),
])
def test_message_payload_normalisation(payload, expected):
    """A dict is sent as is; a string or any other JSON value is wrapped as {"message": value}."""
    assert expected == message_payload(payload)


def test_message_payload_copies_the_mapping():
    """The normalised payload is a copy: later changes to the caller's dict do not leak in."""
    original = {"a": [1]}
    body = message_payload(original)
    original["a"].append(2)
    assert {"a": [1]} == body


@pytest.mark.parametrize("payload", [
    object(),
    {1, 2},
    b"bytes",
    datetime.datetime(2024, 1, 1),
    decimal.Decimal("1.5"),
    {"when": datetime.date(2024, 1, 1)},
    [object()],
])
def test_non_serialisable_payload_is_payload_error(payload):
    """A value JSON cannot encode is a PayloadError, which is also a TypeError."""
    with pytest.raises(PayloadError) as info:
        message_payload(payload)
    assert isinstance(info.value, TypeError)
    assert "JSON" in str(info.value)


@pytest.mark.parametrize("payload", [NAN, INF, -INF, {"x": NAN}, [1, INF]])
def test_nan_and_infinity_are_rejected(payload):
    """NaN and infinities are not JSON and are rejected."""
    with pytest.raises(PayloadError):
        message_payload(payload)


@pytest.mark.parametrize("payload", [{1: "a"}, {None: "a"}, {("a", "b"): 1}, {"ok": 1, 2.5: "b"}])
def test_non_string_keys_are_rejected(payload):
    """A mapping with a non-string key is a PayloadError (JSON would silently turn 1 into "1")."""
    with pytest.raises(PayloadError) as info:
        message_payload(payload)
    assert "keys must be strings" in str(info.value)


@pytest.mark.parametrize("payload", [{"outer": {1: "a"}}, [{True: "x"}], {"list": [{None: 0}]}])
def test_nested_non_string_keys_are_rejected(payload):
    """A non-string key deeper in the payload is rejected too, not silently turned into a string."""
    with pytest.raises(PayloadError):
        message_payload(payload)


@pytest.fixture
def http():
    with responses.RequestsMock(assert_all_requests_are_fired=False) as mock:
        mock.add("POST", f"{BASE_URL}/workflow/wf-1/messages", body="m-1")
        yield mock


@pytest.mark.parametrize("payload", [object(), {"x": NAN}, {1: "a"}])
def test_handle_send_message_sends_nothing_for_a_bad_payload(http, payload):
    """AgentHandle.send_message raises PayloadError before any request is made."""
    handle = AgentHandle(chain=Chain("wf-1"), api=ConductorApi(Transport(BASE_URL)), execution_id="wf-1", agent_name="a",
                         run_id=None, settings=AgentSettings(server_url=BASE_URL), clock=FakeClock())
    with pytest.raises(PayloadError):
        handle.send_message(payload)
    assert 0 == len(http.calls)


@pytest.mark.parametrize("payload", [object(), {"x": NAN}, {1: "a"}])
def test_runtime_send_message_sends_nothing_for_a_bad_payload(http, payload):
    """AgentRuntime.send_message raises PayloadError before any request is made."""
    with AgentRuntime(AgentSettings(server_url=BASE_URL), clock=FakeClock()) as runtime:
        with pytest.raises(PayloadError):
            runtime.send_message("wf-1", payload)
    assert 0 == len(http.calls)


def test_send_message_wraps_a_string(http):
    """A string sent through the runtime arrives as {"message": s}."""
    http.add("GET", f"{BASE_URL}/workflow/wf-1/status", json={"workflowId": "wf-1", "status": "RUNNING"})
    http.add("GET", f"{BASE_URL}/workflow/wf-1", json={"workflowId": "wf-1", "status": "RUNNING"})  # not stateful
    with AgentRuntime(AgentSettings(server_url=BASE_URL), clock=FakeClock()) as runtime:
        assert "m-1" == runtime.send_message("wf-1", "hello")
    assert b'{"message": "hello"}' == http.calls[-1].request.body


# --- tool_output ------------------------------------------------------------------------------


@pytest.mark.parametrize("value,expected", [
    ({"a": 1}, {"a": 1}),
    ({}, {}),
    ("text", {"result": "text"}),
    (7, {"result": 7}),
    (None, {"result": None}),
    ([1, 2], {"result": [1, 2]}),
    ((1, "x"), {"result": [1, "x"]}),
])
def test_tool_output_normalisation(value, expected):
    """A dict is the output itself; anything else is wrapped as {"result": value}."""
    assert expected == tool_output(value)


@pytest.mark.parametrize("value", [object(), {"a": object()}, NAN, {"a": INF}, {1: "x"}, {"a", "b"}])
def test_unusable_tool_output_is_tool_output_error(value):
    """A value the server cannot store is a ToolOutputError."""
    with pytest.raises(ToolOutputError):
        tool_output(value)


# --- RunStatus, AgentStatus -------------------------------------------------------------------


def test_terminal_statuses():
    """COMPLETED, FAILED, TERMINATED and TIMED_OUT are terminal; RUNNING and PAUSED are not."""
    assert {"COMPLETED", "FAILED", "TERMINATED", "TIMED_OUT"} == {s.value for s in RunStatus if s.is_terminal}


@pytest.mark.parametrize("raw,expected", [
    ("COMPLETED", RunStatus.COMPLETED),
    ("TIMED_OUT", RunStatus.TIMED_OUT),
    ("SOMETHING_NEW", RunStatus.RUNNING),
    (None, RunStatus.RUNNING),
    ("completed", RunStatus.RUNNING),
])
def test_run_status_parse(raw, expected):
    """Known names parse to themselves; anything else counts as RUNNING (never terminal by accident)."""
    assert expected is RunStatus.parse(raw)


def test_agent_status_from_dict():
    """AgentStatus reads the status endpoint's camelCase fields."""
    status = AgentStatus.from_dict({
        "executionId": "wf-1", "status": "FAILED", "isWaiting": True,
        "pendingTool": {"name": "t"}, "output": {"result": "x"}, "reasonForIncompletion": "boom",
    })
    expected = AgentStatus(execution_id="wf-1", status=RunStatus.FAILED, is_waiting=True,
                           pending_tool={"name": "t"}, output={"result": "x"}, reason="boom")
    assert expected == status
    assert True is status.is_terminal


# --- AgentResult, tool calls ------------------------------------------------------------------

TASKS = [
    {"taskType": "LLM_CHAT_COMPLETE", "referenceTaskName": "llm_1", "status": "COMPLETED"},
    {"taskType": "SWITCH", "referenceTaskName": "route", "status": "COMPLETED"},
    {"taskType": "lookup", "taskDefName": "lookup", "referenceTaskName": "lookup_1", "status": "COMPLETED",
     "inputData": {"city": "Paris", "method": "lookup", "_agent_state": {}, "_agent_tool_name": "lookup"},
     "outputData": {"temp": 12}},
    {"taskType": "INLINE", "referenceTaskName": "inline", "status": "COMPLETED"},
    {"taskType": "flaky", "referenceTaskName": "flaky_1", "status": "FAILED",
     "inputData": {"n": 1}, "reasonForIncompletion": "ValueError: no"},
]


def test_tool_calls_from_tasks_keeps_tools_in_order_without_server_keys():
    """Only tool tasks become ToolCallRecords, in order, without the server's input keys."""
    expected = (
        ToolCallRecord(name="lookup", task_reference_name="lookup_1", status="COMPLETED",
                       arguments={"city": "Paris"}, output={"temp": 12}, error=None),
        ToolCallRecord(name="flaky", task_reference_name="flaky_1", status="FAILED",
                       arguments={"n": 1}, output={}, error="ValueError: no"),
    )
    assert expected == tool_calls_from_tasks(TASKS)
    assert [call.tool_name for call in expected] == ["lookup", "flaky"]  # as events call it (issue 41)


def test_agent_result_from_server_combines_status_detail_and_tasks():
    """from_server takes output and finish reason from the status, usage from the detail, tools from tasks."""
    status = AgentStatus.from_dict({"executionId": "wf-1", "status": "COMPLETED",
                                    "output": {"result": "done", "finishReason": "STOP"}})
    detail = {"tokenUsage": {"promptTokens": 10, "completionTokens": 5, "totalTokens": 15}}
    result = AgentResult.from_server(status, detail, TASKS)
    assert ("wf-1", RunStatus.COMPLETED, "done", "STOP", None, TokenUsage(10, 5, 15), 2, True) == (
        result.execution_id, result.status, result.output, result.finish_reason, result.error,
        result.token_usage, len(result.tool_calls), result.ok)


def test_agent_result_falls_back_to_the_detail():
    """Without output or reason in the status, the run detail supplies them; a non-text result is stringified."""
    status = AgentStatus.from_dict({"executionId": "wf-1", "status": "FAILED"})
    detail = {"output": {"result": 42}, "reasonForIncompletion": "model error"}
    result = AgentResult.from_server(status, detail)
    assert ("42", "model error", False, (), TokenUsage()) == (
        result.output, result.error, result.ok, result.tool_calls, result.token_usage)


def test_agent_result_with_nothing_but_a_status():
    """A bare terminal status still makes a result (TERMINATED is a result, not an error)."""
    result = AgentResult.from_server(AgentStatus.from_dict({"executionId": "wf-1", "status": "TERMINATED"}))
    assert AgentResult(execution_id="wf-1", status=RunStatus.TERMINATED) == result


def test_token_usage_tolerates_missing_and_null_counts():
    """Missing or null token counts read as 0."""
    assert TokenUsage(3, 0, 0) == TokenUsage.from_dict({"promptTokens": 3, "completionTokens": None})
    assert TokenUsage() == TokenUsage.from_dict(None)


def test_agent_result_duration_is_the_runs_own_time_on_the_server():
    """``duration_seconds`` is the workflow's end minus start, not how long the caller waited (issue 34, point 9)."""
    status = AgentStatus.from_dict({"executionId": "wf-1", "status": "COMPLETED", "output": {"result": "ok"}})
    workflow = {"startTime": 1_700_000_000_000, "endTime": 1_700_000_036_400, "tasks": []}
    assert 36.4 == AgentResult.from_server(status, {}, [], workflow=workflow).duration_seconds
    assert AgentResult.from_server(status, {"startTime": 5, "endTime": 0}).duration_seconds is None


@pytest.mark.parametrize("finish, variables, ended_by, output", [
    ("STOP", {"_stop_requested": False}, "answer", "done"),
    ("TOOL_CALLS", {"_stop_requested": True}, "stop", None),
    ("TOOL_CALLS", {"_stop_requested": False}, "turn_limit", None),
    ("STOP", {"_stop_requested": True}, "stop", "done"),  # the model answered the stop signal first
    ("STOP", {"_stop_requested": False, "signal": True}, "stop", "done"),  # ...and the server cleared the flag
])
def test_agent_result_says_why_a_completed_run_ended(finish, variables, ended_by, output):
    """A run that ended on a turn of tool calls has no answer: ``ended_by`` says stop or turn limit (issue 34,
    points 3 and 5), and ``output`` is None instead of the server's tool-call placeholder."""
    result_text = "done" if finish == "STOP" else '[{"name":"take_note","inputs":{}}]'
    status = AgentStatus.from_dict({"executionId": "wf-1", "status": "COMPLETED",
                                    "output": {"result": result_text, "finishReason": finish}})
    tasks = [{"taskType": "PULL_WORKFLOW_MESSAGES",
              "outputData": {"messages": [{"id": "m1", "payload": {"_signal": "stop"}}], "count": 1}}]
    workflow = {"variables": variables, "tasks": tasks if variables.pop("signal", False) else []}
    result = AgentResult.from_server(status, {}, [], workflow=workflow)
    assert (result.ended_by, result.output, result.raw_output["result"]) == (ended_by, output, result_text)


def test_ended_by_is_unknown_without_the_workflow_or_for_a_run_that_did_not_complete():
    status = AgentStatus.from_dict({"executionId": "wf-1", "status": "COMPLETED",
                                    "output": {"result": "[]", "finishReason": "TOOL_CALLS"}})
    assert AgentResult.from_server(status).ended_by is None
    failed = AgentStatus.from_dict({"executionId": "wf-1", "status": "FAILED", "output": {"finishReason": "TOOL_CALLS"}})
    assert AgentResult.from_server(failed, workflow={"variables": {}}).ended_by is None
