"""Unit tests for handles that cost nothing and the by-id verbs written once.

``AgentRuntime.get_handle(id)`` sends no request and starts no thread; the handle learns the agent's name and
run id on first read. The runtime's verbs by execution id (and the async twins) are the handle's: the same
requests, results and errors.
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
from typing import Any

import pytest
import responses

from conductor_agents import AgentRuntime, AgentSettings
from conductor_agents._common.loops import THREAD_PREFIX
from conductor_agents.aio import AsyncAgentRuntime
from conductor_agents.errors import ConductorAgentsError, ExecutionNotFoundError, RuntimeClosedError
from tests.unit.fakes import BASE_URL

ANY_URL = re.compile(re.escape(BASE_URL) + r"/.*")
RUN = "run-1"


def sdk_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name.startswith(THREAD_PREFIX) and t.is_alive()}


@pytest.fixture
def runtime():
    with AgentRuntime(AgentSettings(server_url=BASE_URL)) as rt:
        yield rt


def test_get_handle_sends_no_request_and_starts_no_thread(http, runtime):
    """Nothing is registered with ``responses``: any request would raise a ConnectionError."""
    before = sdk_threads()
    handle = runtime.get_handle(RUN)
    assert handle.execution_id == RUN and not handle.workers_attached and handle.stall is None
    assert "status=" not in repr(handle) and handle.stats().execution_id == RUN  # no request either
    assert [] == list(http.calls)
    assert sdk_threads() <= before


def test_get_handle_learns_the_agent_name_and_run_id_on_first_read_with_one_request(http, runtime):
    http.add("GET", f"{BASE_URL}/workflow/{RUN}", json={
        "workflowId": RUN, "workflowName": "helper", "status": "RUNNING", "taskToDomain": {"t": "dom-1"}})
    handle = runtime.get_handle(RUN)
    assert ("helper", "dom-1") == (handle.agent_name, handle.run_id)
    assert ("helper", "dom-1") == (handle.agent_name, handle.run_id)  # known now: no second read
    assert 1 == len(http.calls)
    assert "agent='helper'" in repr(handle) and "run_id='dom-1'" in repr(handle)


def test_an_unknown_id_is_found_out_by_the_first_verb_not_by_get_handle(http, runtime):
    http.add(responses.GET, ANY_URL, status=404, json={"message": "not found"})
    handle = runtime.get_handle("nope")  # no request, no error
    with pytest.raises(ExecutionNotFoundError):
        handle.pending()
    with pytest.raises(ExecutionNotFoundError):
        runtime.attach("nope")  # attach reads at once


def test_get_handle_of_a_closed_runtime_raises():
    runtime = AgentRuntime(AgentSettings(server_url=BASE_URL))
    runtime.close()
    with pytest.raises(RuntimeClosedError):
        runtime.get_handle(RUN)
    with pytest.raises(RuntimeClosedError):
        runtime.send_message(RUN, "hi")


class FakeServer:
    """Answers every request from a table of (method, path regex) -> (status, body), recording each one."""

    def __init__(self, http: responses.RequestsMock, table: list[tuple[str, str, int, Any]]) -> None:
        self.table = table
        self.seen: list[tuple[str, str, Any]] = []
        for method in ("GET", "POST", "PUT", "DELETE"):
            http.add_callback(method, ANY_URL, callback=self._answer)

    def _answer(self, request: Any) -> tuple[int, dict[str, str], str]:
        path = request.path_url[len("/api"):]
        self.seen.append((request.method, path, json.loads(request.body) if request.body else None))
        for method, pattern, status, body in self.table:
            if method == request.method and re.fullmatch(pattern, path.split("?")[0]):
                return status, {"Content-Type": "application/json"}, json.dumps(body)
        return 404, {}, json.dumps({"message": f"no route {path}"})

    def take(self) -> list[tuple[str, str, Any]]:
        seen, self.seen = self.seen, []
        return seen


#: A running run that is no listener, waits for nobody, and takes messages.
RUNNING = [
    ("GET", f"/workflow/{RUN}/status", 200, {"workflowId": RUN, "status": "RUNNING"}),
    ("GET", f"/workflow/{RUN}", 200, {"workflowId": RUN, "workflowName": "helper", "status": "RUNNING",
                                      "tasks": []}),
    ("GET", f"/workflow/{RUN}/tasks", 200, {"results": [], "totalHits": 0}),
    ("POST", f"/workflow/{RUN}/messages", 200, "m-1"),
]


def outcome(call: Any) -> tuple[str, Any]:
    try:
        return "ok", call()
    except ConductorAgentsError as err:
        return type(err).__name__, str(err)
    except (TypeError, ValueError) as err:
        return type(err).__name__, str(err)


#: Each verb by id: (the runtime's call, the handle's call), with the same arguments.
VERBS = {
    "send_message": (lambda rt: rt.send_message(RUN, {"text": "hi"}), lambda h: h.send_message({"text": "hi"})),
    "send_message(bad payload)": (lambda rt: rt.send_message(RUN, object()), lambda h: h.send_message(object())),
    "pending": (lambda rt: rt.pending(RUN), lambda h: h.pending()),
    "approve": (lambda rt: rt.approve(RUN, timeout=0.01), lambda h: h.approve(timeout=0.01)),
    "reject": (lambda rt: rt.reject(RUN, "no", timeout=0.01), lambda h: h.reject("no", timeout=0.01)),
    "respond": (lambda rt: rt.respond(RUN, "yes", timeout=0.01), lambda h: h.respond("yes", timeout=0.01)),
    "signal(bad text)": (lambda rt: rt.signal(RUN, 3), lambda h: h.signal(3)),
    "wait_delivered(bad id)": (lambda rt: rt.wait_delivered(RUN, " "), lambda h: h.wait_delivered(" ")),
    "wait_delivered(bad timeout)": (lambda rt: rt.wait_delivered(RUN, "m-1", timeout=0),
                                    lambda h: h.wait_delivered("m-1", timeout=0)),
}


@pytest.mark.parametrize("verb", sorted(VERBS))
def test_the_runtime_verb_by_id_is_the_handle_verb(http, verb):
    """Same result or error, same requests: a fresh runtime each, so that neither learns from the other."""
    server = FakeServer(http, RUNNING)
    by_runtime, by_handle = VERBS[verb]
    with AgentRuntime(AgentSettings(server_url=BASE_URL)) as rt:
        first = outcome(lambda: by_runtime(rt))
        first_requests = server.take()
    with AgentRuntime(AgentSettings(server_url=BASE_URL)) as rt:
        second = outcome(lambda: by_handle(rt.get_handle(RUN)))
        second_requests = server.take()
    assert first == second
    assert first_requests == second_requests


@pytest.mark.parametrize("verb", ["send_message", "pending", "approve"])
def test_the_async_runtime_verb_by_id_is_the_async_handle_verb(http, verb):
    server = FakeServer(http, RUNNING)
    calls = {
        "send_message": (lambda rt: rt.send_message(RUN, "hi"), lambda h: h.send_message("hi")),
        "pending": (lambda rt: rt.pending(RUN), lambda h: h.pending()),
        "approve": (lambda rt: rt.approve(RUN, timeout=0.01), lambda h: h.approve(timeout=0.01)),
    }[verb]

    async def both() -> list[tuple[tuple[str, Any], list[Any]]]:
        found = []
        for pick in (lambda rt: calls[0](rt), lambda rt: calls[1](rt.get_handle(RUN))):
            async with AsyncAgentRuntime(AgentSettings(server_url=BASE_URL)) as rt:
                try:
                    result: tuple[str, Any] = ("ok", await pick(rt))
                except ConductorAgentsError as err:
                    result = (type(err).__name__, str(err))
                found.append((result, server.take()))
        return found

    by_runtime, by_handle = asyncio.run(both())
    assert by_runtime == by_handle
