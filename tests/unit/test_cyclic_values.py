"""Values that contain themselves: a typed error at once, never a walk that does not end (issue 11)."""

from __future__ import annotations

import json
import threading

import pytest

from conductor_agents import tool
from conductor_agents._wire.api import ConductorApi
from conductor_agents._worker.executor import ToolExecutor
from conductor_agents._common.json_check import json_copy
from conductor_agents._wire.payload import ToolOutputError, message_payload, tool_output
from conductor_agents._wire.transport import Transport
from conductor_agents.errors import PayloadError, ToolDefinitionError
from conductor_agents.runtime import AgentRuntime
from conductor_agents.settings import AgentSettings
from tests.helpers import eventually
from tests.unit.fakes import BASE_URL

#: A check that has not returned by then is walking a cycle for ever (the pre-fix behaviour).
RETURN_WITHIN = 5.0


def outcome_within(call, timeout=RETURN_WITHIN):
    """Run ``call`` on a daemon thread; return ("raised", exc) / ("returned", value), or fail if it hangs."""
    box = []

    def run():
        try:
            box.append(("returned", call()))
        except BaseException as err:  # the test inspects whatever came out
            box.append(("raised", err))

    # Daemon: on the old code the walk never ends; the thread must not keep pytest alive.
    thread = threading.Thread(target=run, name="test-cycle-walk", daemon=True)
    thread.start()
    thread.join(timeout)
    assert box, f"the call did not return within {timeout}s (it walks a cycle for ever)"
    return box[0]


def cyclic_dict():
    d = {"a": 1}
    d["self"] = d
    return d


def cyclic_list():
    items = [1, 2]
    items.append({"back": items})
    return items


@pytest.mark.parametrize("make", [cyclic_dict, cyclic_list], ids=["dict", "list"])
def test_cyclic_message_payload_is_a_payload_error_at_once(make):
    kind, err = outcome_within(lambda: message_payload(make()))
    assert kind == "raised" and isinstance(err, PayloadError) and isinstance(err, TypeError)
    assert "contains itself" in str(err)


def test_shared_but_acyclic_values_are_fine():
    """The same list twice (a DAG, not a cycle) is valid JSON."""
    shared = [1, 2]
    assert message_payload({"a": shared, "b": [shared, shared]}) == {"a": [1, 2], "b": [[1, 2], [1, 2]]}
    assert tool_output((shared, shared)) == {"result": [[1, 2], [1, 2]]}


def test_deeply_nested_payload_is_a_payload_error_not_a_recursion_error():
    value: object = "leaf"
    for _ in range(5000):
        value = [value]
    with pytest.raises(PayloadError):
        message_payload({"deep": value})


def test_runtime_send_message_with_a_cyclic_payload_sends_nothing(http):
    runtime = AgentRuntime(AgentSettings(server_url=BASE_URL))
    try:
        kind, err = outcome_within(lambda: runtime.send_message("wf-1", cyclic_dict()))
    finally:
        runtime.close()
    assert kind == "raised" and isinstance(err, PayloadError)
    assert [] == list(http.calls)


@pytest.mark.parametrize("make", [cyclic_dict, cyclic_list], ids=["dict", "list"])
def test_cyclic_tool_output_is_a_tool_output_error_at_once(make):
    kind, err = outcome_within(lambda: tool_output(make()))
    assert kind == "raised" and isinstance(err, ToolOutputError)
    assert "contains itself" in str(err)


def test_json_copy_refuses_a_cycle_with_a_type_error():
    kind, err = outcome_within(lambda: json_copy(cyclic_dict()))
    assert kind == "raised" and isinstance(err, TypeError) and "contains itself" in str(err)


def test_tool_with_a_cyclic_default_is_a_definition_error():
    def define():
        @tool
        def pick(options: dict = cyclic_dict()) -> str:  # noqa: B008 - the point of the test
            """Pick one."""
            return "x"

        return pick

    kind, err = outcome_within(define)
    # A default that is not JSON is left out of the schema or refused; either way it returns at once.
    assert kind in ("raised", "returned")
    if kind == "raised":
        assert isinstance(err, ToolDefinitionError)


def test_tool_returning_a_cyclic_value_fails_its_task_and_frees_the_thread(http):
    """The task is reported FAILED_WITH_TERMINAL_ERROR with the reason, and the pool thread is free again."""
    http.add("POST", BASE_URL + "/tasks", body="")

    @tool
    def loop(city: str) -> dict:
        """Return a value that contains itself."""
        return cyclic_dict()

    executor = ToolExecutor(ConductorApi(Transport(BASE_URL)), threads=1, worker_id="w-1")
    try:
        task = {"taskId": "t-1", "workflowInstanceId": "wf-1", "taskType": "loop", "referenceTaskName": "loop_ref",
                "inputData": {"city": "Oslo"}}
        assert executor.submit(task, loop)
        eventually(lambda: executor.in_flight_count == 0, timeout=RETURN_WITHIN, message="the pool thread to be free")
    finally:
        executor.close(grace=1.0)
    [body] = [json.loads(c.request.body) for c in http.calls]
    assert body["status"] == "FAILED_WITH_TERMINAL_ERROR"
    assert "contains itself" in body["reasonForIncompletion"]
