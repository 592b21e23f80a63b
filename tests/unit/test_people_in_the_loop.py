"""Unit tests for the pure parts of approvals, questions, typed answers, run context and secrets.

The server JSON below is what Conductor 3.32.3 returned in the runs recorded for this feature
(trimmed to the fields the code reads).
"""

from __future__ import annotations

import dataclasses
import json
import logging

import attrs
import pytest

from conductor_agents import (
    Agent,
    AgentDefinitionError,
    AgentTypeError,
    ConfigurationError,
    HumanTool,
    MissingSecretError,
    OutputValidationError,
    PayloadError,
    PendingRequest,
    RunContextError,
    RunStatus,
    ToolContext,
    ToolDefinitionError,
    WaitForMessageTool,
    tool,
)
from conductor_agents._events.polling import events_from_workflow
from conductor_agents._answers.output_type import OutputSpec, typed_result
from conductor_agents._people.pending import approval_decision, consumed_answer, pending_in, stored_answer
from conductor_agents._people.pending import waits_on_person
from conductor_agents._tooldefs.run_state import check_context, merge_updates
from conductor_agents._common.secrets import SecretValues, redact
from conductor_agents.events import WaitingEvent
from conductor_agents.local_server import LocalServer
from conductor_agents.result import AgentResult, AgentStatus
from conductor_agents.testing import LLMRequest

# --- server JSON --------------------------------------------------------------------------------

APPROVAL_HUMAN = {
    "taskId": "h1", "taskType": "HUMAN", "status": "IN_PROGRESS", "seq": 9, "startTime": 1796167516000,
    "referenceTaskName": "bank_approval_human__1", "taskDefName": "bank_approval_human",
    "inputData": {
        "__humanTaskDefinition": {"displayName": "bank Tool Approval"},
        "response_schema": {"type": "object"},
        "tool_calls": [{"taskReferenceName": "call_1", "name": "transfer", "type": "SIMPLE",
                        "inputParameters": {"method": "transfer", "amount": 5}}],
    },
}
QUESTION_HUMAN = {
    "taskId": "h2", "taskType": "HUMAN", "status": "IN_PROGRESS", "seq": 12, "referenceTaskName": "call_1_0__1",
    "taskDefName": "ask_human",
    "inputData": {"_agent_tool_name": "ask_human", "question": "which colour?", "method": "ask_human",
                  "_agent_state": {}, "__humanTaskDefinition": {}, "response_schema": {}, "_description": "Ask"},
}
WAIT = {"taskId": "w1", "taskType": "PULL_WORKFLOW_MESSAGES", "status": "IN_PROGRESS", "seq": 3,
        "referenceTaskName": "call_2_0__2", "inputData": {}}


def process(result: dict, seq: int = 13, ref: str = "bank_approval_human_process__1") -> dict:
    return {"taskId": "p", "taskType": "INLINE", "status": "COMPLETED", "seq": seq, "referenceTaskName": ref,
            "outputData": {"result": result}}


def workflow(*tasks: dict, status: str = "RUNNING") -> dict:
    return {"workflowId": "wf", "status": status, "tasks": list(tasks)}


# --- pending requests ----------------------------------------------------------------------------


def test_pending_lists_approvals_and_questions_in_order_and_ignores_message_waits():
    """An approval gate and a HumanTool call are requests; a wait for a message is not."""
    approval, question = pending_in(workflow(QUESTION_HUMAN, WAIT, APPROVAL_HUMAN), "wf")
    assert (approval.kind, approval.task_id, approval.since) == (PendingRequest.APPROVAL, "h1", 1796167516.0)
    assert [(c.name, dict(c.arguments)) for c in approval.tool_calls] == [("transfer", {"amount": 5})]
    assert approval.question is None
    assert (question.kind, question.tool_name, question.question) == ("question", "ask_human", "which colour?")
    assert dict(question.arguments) == {"question": "which colour?"}
    assert json.loads(json.dumps(question.to_dict()))["question"] == "which colour?"


def test_an_ended_run_waits_for_nobody():
    """A terminal run lists nothing even if a HUMAN task was left IN_PROGRESS."""
    assert pending_in(workflow(APPROVAL_HUMAN, status="TERMINATED"), "wf") == ()


def test_the_answer_the_run_took_is_read_from_what_consumed_it():
    """Approval: the process task (our rejection is approved:true + decision); question: the JOIN."""
    human = {**APPROVAL_HUMAN, "status": "COMPLETED"}
    rejected = process({"approved": True, "reason": "no", "extra": {"decision": "rejected", "answer_id": "a1",
                                                                    "answered_by": "bob"}})
    answer = consumed_answer(workflow(human, rejected), human)
    assert (answer.approved, answer.reason, answer.answer_id, answer.answered_by) == (False, "no", "a1", "bob")
    native = process({"approved": False, "reason": "ui", "extra": {}})
    assert consumed_answer(workflow(human, native), human).approved is False
    assert consumed_answer(workflow(human), human) is None  # not consumed yet

    answered = {**QUESTION_HUMAN, "status": "COMPLETED", "outputData": {"answer": "blue", "answer_id": "q1"}}
    join = {"taskType": "JOIN", "status": "COMPLETED", "seq": 14, "referenceTaskName": "x_fork_join__1",
            "outputData": {"call_1_0__1": {"_agent_tool_output": {"answer": "red", "answer_id": "q2"}}}}
    assert consumed_answer(workflow(answered, join), answered).answer_id == "q2"  # the JOIN decides
    assert consumed_answer(workflow(answered), answered) is None
    assert stored_answer(answered, "wf").answer == "blue"
    ui = {**QUESTION_HUMAN, "status": "COMPLETED", "outputData": {"response": "from the UI"}}
    assert stored_answer(ui, "wf").answer == {"response": "from the UI"}


def test_the_worker_reads_the_latest_decision_before_its_task():
    """A tool task follows the approval of its own turn, not an older one."""
    old = process({"approved": True, "extra": {"decision": "rejected"}}, seq=5, ref="a_approval_human_process__1")
    new = process({"approved": True, "extra": {"decision": "approved"}}, seq=20, ref="a_approval_human_process__2")
    assert approval_decision([old, new], "wf", before_seq=25).approved is True
    assert approval_decision([old, new], "wf", before_seq=10).approved is False
    assert approval_decision([old, new], "wf", before_seq=4) is None


def test_a_status_waits_on_a_person_only_for_a_human_task():
    """The status of a HUMAN wait carries its form or calls; a message wait carries neither."""
    assert waits_on_person({"isWaiting": True, "pendingTool": {"taskRefName": "x", "response_schema": {}}})
    assert waits_on_person({"isWaiting": True, "pendingTool": {"toolCalls": [{"name": "t"}]}})
    assert not waits_on_person({"isWaiting": True, "pendingTool": {"taskRefName": "call_1_0__1"}})
    assert not waits_on_person({"isWaiting": False, "pendingTool": None})


def test_events_rebuilt_by_polling_say_when_a_person_is_awaited():
    """The polling fallback emits the same waiting event the stream sends for a HUMAN task."""
    [event] = [e for e in events_from_workflow(workflow(APPROVAL_HUMAN), "wf") if isinstance(e, WaitingEvent)]
    assert event.for_person and [c.name for c in event.tool_calls] == ["transfer"]
    assert dict(event.tool_calls[0].arguments) == {"amount": 5}
    [message_wait] = [e for e in events_from_workflow(workflow(WAIT), "wf") if isinstance(e, WaitingEvent)]
    assert not message_wait.for_person and message_wait.tool_calls == ()


# --- definitions ---------------------------------------------------------------------------------


def test_tool_options_go_to_the_server_config():
    """approval_required and credentials are sent as the server's approvalRequired and config.credentials."""

    @tool(approval_required=True, credentials=["API_TOKEN", "API_TOKEN", "OTHER"])
    def send(to: str) -> dict:
        """Send."""
        return {}

    config = send.to_config()
    assert (config["approvalRequired"], config["config"]) == (True, {"credentials": ["API_TOKEN", "OTHER"]})
    assert "approvalRequired" not in WaitForMessageTool.create().to_config()
    human = HumanTool.create(name="ask").to_config()
    assert (human["toolType"], human["inputSchema"]["required"]) == ("human", ["question"])


@pytest.mark.parametrize("make", [
    lambda: tool(credentials="API_TOKEN")(lambda: {}),
    lambda: tool(credentials=["has space"])(lambda: {}),
    lambda: attrs.evolve(HumanTool.create(), approval_required=True),
    lambda: attrs.evolve(WaitForMessageTool.create(), credentials=["X"]),
], ids=["str", "bad-name", "human-approval", "server-tool-secret"])
def test_bad_tool_options_are_refused(make):
    """A bare string, a bad name, approval or secrets on a server-side tool: ToolDefinitionError."""
    with pytest.raises(ToolDefinitionError):
        make()


@dataclasses.dataclass
class Weather:
    city: str
    temp: float


def test_agent_output_type_and_credentials():
    """output_type becomes outputType {schema, className} with output_retries=0 (the answer check in the run
    otherwise: see test_output_check.py); credentials go to the agent config."""
    agent = Agent(name="a", model="openai/x", output_type=Weather, credentials=["T"],
                  tools=[HumanTool.create()], output_retries=0)
    config = agent.to_config()
    assert config["outputType"]["className"] == "Weather"
    assert config["outputType"]["schema"]["required"] == ["city", "temp"]
    assert config["credentials"] == ["T"] and agent.waits_for_people
    assert not Agent(name="b", model="openai/x").waits_for_people
    with pytest.raises(AgentDefinitionError) as caught:
        Agent(name="a", model="openai/x", output_type=dict)
    assert caught.value.field == "output_type"
    with pytest.raises(AgentTypeError):
        Agent(name="a", model="openai/x", credentials="T")


def result(raw: dict, status: RunStatus = RunStatus.COMPLETED) -> AgentResult:
    return AgentResult.from_server(AgentStatus(execution_id="wf", status=status, output=raw))


@pytest.mark.parametrize("raw,expected", [
    ({"result": {"city": "Oslo", "temp": 3}}, Weather("Oslo", 3.0)),  # the server parsed it
    ({"result": '{"city": "Oslo", "temp": 3}'}, Weather("Oslo", 3.0)),
    ({"result": '```json\n{"city": "Oslo", "temp": 3}\n```'}, Weather("Oslo", 3.0)),
])
def test_a_fitting_answer_becomes_an_instance(raw, expected):
    """Object or JSON text (fenced or not) → an instance; the text stays available."""
    typed = typed_result(result(raw), OutputSpec.of(Weather))
    assert typed.output == expected
    assert typed.text == (raw["result"] if isinstance(raw["result"], str) else json.dumps(raw["result"]))


@pytest.mark.parametrize("raw,problem", [
    ({"result": {"city": "Oslo"}}, "missing required field 'temp' (number)"),
    ({"result": {"city": "Oslo", "temp": "warm"}}, "field 'temp': expected number"),
    ({"result": {"city": "Oslo", "temp": 3, "wind": 1}}, "unexpected field 'wind'"),
    ({"result": "It is sunny."}, "the answer is not JSON"),
    ({"result": "[1, 2]"}, "the answer: expected object"),
])
def test_an_answer_that_does_not_fit_raises_with_the_raw_text(raw, problem):
    """Each kind of mismatch is named; the raw answer and the untyped result are kept."""
    with pytest.raises(OutputValidationError) as caught:
        typed_result(result(raw), OutputSpec.of(Weather))
    err = caught.value
    assert any(problem in p for p in err.problems), err.problems
    assert err.raw_output == result(raw).text and err.result.output == result(raw).output
    assert err.output_type is Weather


def test_runs_that_did_not_complete_are_not_checked():
    """A FAILED run's result is returned as it is, without an error."""
    failed = result({"result": None}, RunStatus.FAILED)
    assert typed_result(failed, OutputSpec.of(Weather)) is failed


# --- run context ---------------------------------------------------------------------------------


def test_context_limits_are_the_servers():
    """4,096 bytes per value and 32,768 in all, as the server shows them to the model."""
    assert check_context({"a": 1, "b": "x" * 4096}) == {"a": 1, "b": "x" * 4096}
    with pytest.raises(RunContextError) as value:
        check_context({"b": "é" * 2049})  # 4,098 bytes
    assert (value.value.key, value.value.limit) == ("b", 4096)
    with pytest.raises(RunContextError) as total:
        check_context({f"k{i}": "x" * 4000 for i in range(9)})
    assert (total.value.key, total.value.limit) == (None, 32768)
    with pytest.raises(PayloadError):
        check_context({"when": object()})
    with pytest.raises(PayloadError):
        check_context(["not", "a", "mapping"])


def test_a_tool_reads_and_updates_the_run_state():
    """ctx.state is read-only; update_state() goes out as _state_updates next to the tool's own."""
    ctx = ToolContext(execution_id="e", task_id="t", state={"n": 1})
    with pytest.raises(TypeError):
        ctx.state["n"] = 2  # type: ignore[index]
    ctx.update_state({"n": 2}, seen=True)
    assert ctx.state_updates == {"n": 2, "seen": True}
    from conductor_agents._tooldefs.context import state_updates_of

    merged = merge_updates({"ok": 1, "_state_updates": {"other": 1, "n": 9}}, state_updates_of(ctx))
    assert merged == {"ok": 1, "_state_updates": {"other": 1, "n": 2, "seen": True}}
    assert merge_updates({"ok": 1}, state_updates_of(ToolContext(execution_id="e", task_id="t"))) == {"ok": 1}
    with pytest.raises(RunContextError):
        ctx.update_state(big="x" * 5000)


# --- secrets -------------------------------------------------------------------------------------


def test_secrets_of_a_polled_task_and_their_errors():
    """Delivered values are read by name; a declared but absent one and an undeclared one differ."""
    task = {"taskId": "t", "workflowInstanceId": "e", "taskType": "probe",
            "runtimeMetadata": {"API_TOKEN": "tok-123456"},
            "taskDefinition": {"runtimeMetadata": ["API_TOKEN", "ABSENT"]}}
    ctx = ToolContext.of_task(task)
    assert ctx.secret("API_TOKEN") == "tok-123456"
    with pytest.raises(MissingSecretError) as absent:
        ctx.secret("ABSENT")
    assert (absent.value.declared, absent.value.tool_name) == (True, "probe")
    assert "CONDUCTOR_SECRET_ABSENT" in str(absent.value)
    with pytest.raises(MissingSecretError) as undeclared:
        ctx.secret("OTHER")
    assert not undeclared.value.declared
    assert "tok-123456" not in repr(ctx) + repr(SecretValues.of_task(task))


def test_redaction_replaces_values_longest_first():
    """Every delivered value of four characters or more becomes [secret NAME]."""
    values = {"A": "abcd", "AB": "abcdef", "S": "xy"}
    assert redact("abcdef then abcd then xy", values) == "[secret AB] then [secret A] then xy"


def test_local_server_secrets_become_the_servers_environment_and_stay_hidden(tmp_path):
    """secrets= go to CONDUCTOR_SECRET_<name>; bad names or values are refused without echoing them."""
    server = LocalServer(tmp_path, secrets={"API_TOKEN": "tok-9f8e7d6c"})
    assert server._options.secret_env == {"CONDUCTOR_SECRET_API_TOKEN": "tok-9f8e7d6c"}
    assert "tok-9f8e7d6c" not in repr(server._options)
    assert "tok-9f8e7d6c" not in repr(server)
    with pytest.raises(ConfigurationError):
        LocalServer(tmp_path, secrets={"bad name": "v"})
    with pytest.raises(ConfigurationError) as empty:
        LocalServer(tmp_path, secrets={"EMPTY": ""})
    assert "EMPTY" in str(empty.value)


def test_the_executor_scrubs_a_secret_from_a_failure(caplog):
    """A tool that puts its secret in an exception: the posted reason, traceback and log line hide it."""
    from conductor_agents._worker.executor import ToolExecutor

    class Api:
        posted: list = []

        def update_task(self, body):
            self.posted.append(body)

        def get_workflow(self, *a, **k):
            return {"tasks": []}

    @tool(name="leaky", credentials=["API_TOKEN"])
    def leaky(ctx: ToolContext) -> dict:
        """Leak."""
        raise RuntimeError(f"token {ctx.secret('API_TOKEN')} refused")

    api = Api()
    executor = ToolExecutor(api, threads=1, worker_id="w")  # type: ignore[arg-type]
    caplog.set_level(logging.DEBUG)
    try:
        task = {"taskId": "t1", "workflowInstanceId": "e", "taskType": "leaky", "referenceTaskName": "r",
                "inputData": {}, "runtimeMetadata": {"API_TOKEN": "tok-0a1b2c3d"}}
        assert executor.submit(task, leaky)
        assert executor.wait_idle(10)
    finally:
        executor.close(1.0)
    [posted] = api.posted
    assert "[secret API_TOKEN]" in posted["reasonForIncompletion"]
    assert "tok-0a1b2c3d" not in json.dumps(posted)
    assert not [r for r in caplog.records if "tok-0a1b2c3d" in r.getMessage()]


# --- the scripted model's view ---------------------------------------------------------------------


def test_llm_request_shows_rejections_answers_context_media_and_feedback():
    """What the server sent after a rejection, with a context and an image (shapes seen on 3.32.3)."""
    body = {
        "model": "m",
        "instructions": 'hi\nHuman reviewer feedback: Reason: too risky. Additional context: decision: "rejected".',
        "input": [
            {"type": "message", "role": "user", "content": [
                {"type": "input_text",
                 "text": '[TOOL RESULTS]\n[]\n[/TOOL RESULTS]\n\nContext:\n```json\n{\n  "n": "1"\n}\n```\n\ngo'},
                {"type": "input_image", "image_url": "data:image/png;base64,AAAA"}]},
            {"type": "function_call", "call_id": "c_0", "name": "danger", "arguments": '{"method":"danger"}'},
            {"type": "function_call", "call_id": "c_1", "name": "ask", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c_0", "output": '{"rejected":true,"reason":"too risky"}'},
            {"type": "function_call_output", "call_id": "c_1", "output": '{"answer":"blue","answer_id":"x"}'},
        ],
    }
    request = LLMRequest.from_body(body, received_at=0.0)
    rejected, answered = request.tool_outputs
    assert (rejected.rejected, rejected.rejection_reason, rejected.answer) == (True, "too risky", None)
    assert (answered.rejected, answered.rejection_reason, answered.answer) == (False, None, "blue")
    assert (request.prompt, request.context) == ("go", {"n": "1"})
    assert request.media == ["data:image/png;base64,AAAA"]
    assert request.human_feedback == 'Reason: too risky. Additional context: decision: "rejected".'
    plain = LLMRequest.from_body({"model": "m", "input": "go"}, received_at=0.0)
    assert (plain.context, plain.media, plain.human_feedback) == (None, [], None)


# --- the on_pending monitor --------------------------------------------------------------------------


class StatusApi:
    """The two calls the monitor makes, answered from a script of (status, workflow) pairs."""

    def __init__(self, states: list) -> None:
        self.states = list(states)
        self.calls: list = []

    def agent_status(self, execution_id: str) -> dict:
        self.calls.append("status")
        return self.states[0][0]

    def get_workflow(self, execution_id: str, include_tasks: bool = False) -> dict:
        self.calls.append("workflow")
        status, flow = self.states.pop(0)
        return flow


class Handle:
    execution_id = "wf"


def test_the_monitor_reports_each_request_once_and_forgets_ended_runs():
    """A HUMAN wait is read once per sample and reported once; a message wait costs one status only."""
    from conductor_agents._people.pending_watch import PendingMonitor

    human = ({"status": "RUNNING", "isWaiting": True, "pendingTool": {"response_schema": {}}},
             workflow(APPROVAL_HUMAN))
    message = ({"status": "RUNNING", "isWaiting": True, "pendingTool": {"taskRefName": "w"}}, None)
    ended = ({"status": "COMPLETED", "isWaiting": False}, None)
    api = StatusApi([message, human, human, ended])
    seen: list = []

    def callback(handle, request):
        seen.append(request.task_id)
        raise RuntimeError("a broken callback is logged, not raised")

    monitor = PendingMonitor(api, callback, interval=60.0)  # type: ignore[arg-type]
    with monitor._lock:
        monitor._runs["wf"] = Handle()
        monitor._reported["wf"] = set()
    monitor.sample("wf", Handle())
    assert (api.calls, seen) == (["status"], [])
    api.states.pop(0)
    monitor.sample("wf", Handle())
    monitor.sample("wf", Handle())
    assert seen == ["h1"]  # reported once although it is still pending
    monitor.sample("wf", Handle())
    assert monitor.watched == ()  # the run ended: forgotten
    monitor.close()


def test_the_monitor_reads_a_listeners_human_message_wait_once_while_it_waits():
    """A listener waiting on a HUMAN task for messages looks like a person's wait in its status: its task list is
    read once, then only its status while the same wait goes on; a new wait (or a question) is read again."""
    from conductor_agents._common.task_names import MESSAGE_WAIT_MARK
    from conductor_agents._people.pending_watch import PendingMonitor

    def waiting(ref: str) -> dict:
        return {"taskId": ref, "taskType": "HUMAN", "status": "IN_PROGRESS", "seq": 3, "referenceTaskName": ref,
                "inputData": {"response_schema": {}, "_description": f"Waits. {MESSAGE_WAIT_MARK}"}}

    def status(ref: str) -> dict:
        return {"status": "RUNNING", "isWaiting": True, "pendingTool": {"response_schema": {}, "taskRefName": ref}}

    api = StatusApi([(status("w1"), workflow(waiting("w1")))] * 3 + [(status("w2"), workflow(waiting("w2")))])
    monitor = PendingMonitor(api, lambda h, r: None, interval=60.0)  # type: ignore[arg-type]
    with monitor._lock:
        monitor._runs["wf"] = Handle()
        monitor._reported["wf"] = set()
    for _ in range(3):
        monitor.sample("wf", Handle())
    assert api.calls == ["status", "workflow", "status", "status"]
    api.states = [(status("w2"), workflow(waiting("w2")))]
    monitor.sample("wf", Handle())
    assert api.calls[-2:] == ["status", "workflow"]  # a new wait: read once more
    monitor.close()


def test_the_monitor_thread_starts_with_a_run_and_is_joined_on_close():
    """No thread before watch(); close() joins it; a closed monitor takes no run."""
    import threading

    from conductor_agents._people.pending_watch import PendingMonitor

    api = StatusApi([({"status": "RUNNING", "isWaiting": False}, None)] * 10)
    monitor = PendingMonitor(api, lambda h, r: None, interval=0.01)  # type: ignore[arg-type]
    assert not [t for t in threading.enumerate() if t.name == "conductor-agents-pending"]
    monitor.watch(Handle())
    assert [t for t in threading.enumerate() if t.name == "conductor-agents-pending"]
    monitor.close()
    assert not [t for t in threading.enumerate() if t.name == "conductor-agents-pending"]
    monitor.watch(Handle())
    assert monitor.watched == () and not [t for t in threading.enumerate() if t.name == "conductor-agents-pending"]


def test_answers_check_their_arguments_before_any_request():
    """A blank rejection reason, a non-text `by`, a bad timeout or a non-JSON answer send nothing."""
    from conductor_agents._people import approvals as _approvals

    class NoApi:
        def __getattr__(self, name):
            raise AssertionError(f"no request expected ({name})")

    with pytest.raises(ValueError):
        _approvals.reject(NoApi(), "wf", "  ")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        _approvals.approve(NoApi(), "wf", by=3)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        _approvals.approve(NoApi(), "wf", timeout=0)  # type: ignore[arg-type]
    with pytest.raises(PayloadError):
        _approvals.respond(NoApi(), "wf", object())  # type: ignore[arg-type]
