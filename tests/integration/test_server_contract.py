"""The server contract the SDK relies on, checked with raw HTTP against the real server."""

from __future__ import annotations

import time
import uuid

import pytest
import requests

from conductor_agents.testing import ToolCall

pytestmark = pytest.mark.integration


def _until(fetch, done, timeout: float = 60.0, interval: float = 0.2):
    deadline = time.monotonic() + timeout
    value = fetch()
    while not done(value):
        assert time.monotonic() < deadline, f"not reached within {timeout}s: {value!r}"
        time.sleep(interval)
        value = fetch()
    return value


def test_worker_tool_task_is_routed_to_the_run_domain(conductor_server, scripted_llm, unique_name):
    """POST /agent/start with runId: the worker task is only visible to a poll with domain=runId."""
    api = conductor_server.url
    tool_name = unique_name("lookup")
    model = scripted_llm.script([ToolCall(tool_name, {"city": "Oslo"}), "It is sunny in Oslo."])
    run_id = uuid.uuid4().hex
    body = {
        "agentConfig": {
            "name": unique_name("raw_agent"), "model": model, "instructions": "Answer.", "maxTurns": 5,
            "tools": [{"name": tool_name, "description": "Look up the weather", "toolType": "worker",
                       "stateful": True, "inputSchema": {"type": "object",
                                                         "properties": {"city": {"type": "string"}}}}],
        },
        "prompt": "Weather in Oslo?",
        "runId": run_id,
    }
    started = requests.post(f"{api}/agent/start", json=body, timeout=30)
    assert started.status_code == 200, started.text
    execution_id = started.json()["executionId"]
    assert started.json()["requiredWorkers"] == [tool_name]

    def poll(domain):
        params = {"workerid": "raw-test", "count": 1, "timeout": 1000}
        if domain:
            params["domain"] = domain
        response = requests.get(f"{api}/tasks/poll/batch/{tool_name}", params=params, timeout=30)
        assert response.status_code == 200
        return response.json()

    assert poll(None) == []  # without the domain the task is invisible
    tasks = _until(lambda: poll(run_id), bool, timeout=30)
    task = tasks[0]
    assert task["domain"] == run_id and task["inputData"]["city"] == "Oslo"
    workflow = requests.get(f"{api}/workflow/{execution_id}", timeout=30).json()
    assert workflow["taskToDomain"] == {tool_name: run_id}

    done = requests.post(f"{api}/tasks", json={
        "workflowInstanceId": execution_id, "taskId": task["taskId"], "status": "COMPLETED",
        "outputData": {"forecast": "sunny"}, "workerId": "raw-test"}, timeout=30)
    assert done.status_code == 200
    status = _until(lambda: requests.get(f"{api}/agent/{execution_id}/status", timeout=30).json(),
                    lambda s: s["isComplete"])
    assert status["status"] == "COMPLETED"
    assert status["output"]["result"] == "It is sunny in Oslo."
    second_turn = scripted_llm.requests_for(model)[1]
    assert [(o.name, o.output) for o in second_turn.tool_outputs] == [(tool_name, {"forecast": "sunny"})]


def test_pushed_message_reaches_the_model_through_pull_workflow_messages(conductor_server, scripted_llm,
                                                                         unique_name):
    """A message pushed with POST /workflow/{id}/messages is what the wait tool hands the model."""
    api = conductor_server.url
    model = scripted_llm.script([ToolCall("wait_for_message"), "Got it."])
    body = {
        "agentConfig": {
            "name": unique_name("raw_listener"), "model": model, "maxTurns": 5,
            "tools": [{"name": "wait_for_message", "description": "Wait for a message",
                       "toolType": "pull_workflow_messages", "config": {"batchSize": 1},
                       "inputSchema": {"type": "object", "properties": {}}}],
        },
        "prompt": "Wait for instructions.",
    }
    execution_id = requests.post(f"{api}/agent/start", json=body, timeout=30).json()["executionId"]
    _until(lambda: requests.get(f"{api}/agent/{execution_id}/status", timeout=30).json(),
           lambda s: s.get("isWaiting"), timeout=30)
    pushed = requests.post(f"{api}/workflow/{execution_id}/messages", json={"action": "generate-report"},
                           timeout=30)
    assert pushed.status_code == 200, pushed.text
    status = _until(lambda: requests.get(f"{api}/agent/{execution_id}/status", timeout=30).json(),
                    lambda s: s["isComplete"])
    assert status["status"] == "COMPLETED" and status["output"]["result"] == "Got it."
    assert scripted_llm.requests_for(model)[1].messages == [{"action": "generate-report"}]
    late = requests.post(f"{api}/workflow/{execution_id}/messages", json={"late": 1}, timeout=30)
    assert late.status_code == 409
    unknown = requests.post(f"{api}/workflow/{uuid.uuid4()}/messages", json={"x": 1}, timeout=30)
    assert unknown.status_code == 404
