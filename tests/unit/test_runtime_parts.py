"""Unit tests for the runtime's owned parts (one ``close()`` each, closed as a list in order) and for the main
paths without repeated work (``resume`` reads the run once, ``start`` compiles the agent once)."""

from __future__ import annotations

import logging
import threading
from typing import Any

import pytest

from conductor_agents import Agent, AgentRuntime, AgentSettings, WaitForMessageTool
from conductor_agents._common.loops import THREAD_PREFIX
from conductor_agents._common.parts import Part, close_in_order
from conductor_agents._liveness.watchdog import RunWatchdog
from conductor_agents._people.pending_watch import PendingMonitor
from conductor_agents._serving.adoption import Adopter
from conductor_agents._serving.presence import Presence
from conductor_agents._wire.api import ConductorApi
from conductor_agents._wire.transport import Transport
from conductor_agents._worker.executor import ToolExecutor
from conductor_agents._worker.poller import DomainPoller
from conductor_agents._worker.watcher import QueueWatcher
from tests.unit.fakes import BASE_URL, count_compiles

MODEL = "openai/gpt-4o-mini"
log = logging.getLogger("tests.parts")


def sdk_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith(THREAD_PREFIX) and t.is_alive()]


class Recorder:
    """A part that records its close (and may fail)."""

    def __init__(self, name: str, closed: list[str], error: BaseException | None = None) -> None:
        self.name, self.closed, self.error = name, closed, error

    def close(self) -> None:
        self.closed.append(self.name)
        if self.error is not None:
            raise self.error


def test_close_in_order_closes_every_part_and_raises_the_first_error_at_the_end(caplog):
    closed: list[str] = []
    first, second = RuntimeError("first"), ValueError("second")
    parts = [Recorder("a", closed), Recorder("b", closed, first), Recorder("c", closed, second),
             Recorder("d", closed)]
    with pytest.raises(RuntimeError, match="first"):
        close_in_order(parts, log)
    assert ["a", "b", "c", "d"] == closed
    assert 2 == sum("closing" in r.getMessage() for r in caplog.records)


def test_a_ctrl_c_while_closing_a_part_propagates_at_once_and_closes_nothing_after_it(caplog):
    closed: list[str] = []
    parts = [Recorder("a", closed), Recorder("b", closed, KeyboardInterrupt()), Recorder("c", closed)]
    with pytest.raises(KeyboardInterrupt):
        close_in_order(parts, log)
    assert ["a", "b"] == closed
    with pytest.raises(SystemExit):
        close_in_order([Recorder("d", closed, SystemExit(3)), Recorder("e", closed)], log)
    assert ["a", "b", "d"] == closed
    assert not [r for r in caplog.records if "closing" in r.getMessage()]


class Loop(Recorder):
    """A poller or queue watcher: stopped (all together) before it is closed."""

    def stop(self) -> None:
        self.closed.append(f"stop {self.name}")


def test_workers_close_every_part_when_the_switch_driver_fails_to_close(monkeypatch):
    from conductor_agents._tracing import hooks
    from conductor_agents._worker.workers import WorkerSet

    closed: list[str] = []
    monkeypatch.setattr(hooks, "runs_closed", lambda owner: closed.append(f"spans of {owner}"))
    workers = WorkerSet(ConductorApi(Transport(BASE_URL)), AgentSettings(server_url=BASE_URL), worker_id="w")
    workers._driver = Recorder("driver", closed, RuntimeError("driver failed"))  # type: ignore[assignment]
    workers._watchdog = Recorder("watchdog", closed, ValueError("watchdog failed"))  # type: ignore[assignment]
    workers._pollers["d1"] = Loop("poller", closed)  # type: ignore[assignment]
    workers._watcher = Loop("watcher", closed)  # type: ignore[assignment]
    workers._executor = Recorder("tool pool", closed)  # type: ignore[assignment]
    with pytest.raises(RuntimeError, match="driver failed"):
        workers.close()
    assert ["driver", "watchdog", "stop watcher", "stop poller", "poller", "watcher", "tool pool",
            "spans of w"] == closed
    workers.close()  # idempotent
    assert 8 == len(closed)


def test_every_owned_part_has_the_one_shape():
    api = ConductorApi(Transport(BASE_URL))
    executor = ToolExecutor(api, threads=1, worker_id="w", grace=0.5)
    with AgentRuntime(AgentSettings(server_url=BASE_URL)) as runtime:
        process = runtime._process
        parts: list[Any] = [process.handles, process.serving.adoption, process.workers, process.serving.presence,
                            runtime._observer, runtime._transport, executor,
                            RunWatchdog(api, interval=1.0, stall_seconds=5.0, on_ended=lambda e: None),
                            PendingMonitor(api, lambda h, r: None, interval=1.0, runs_of=lambda e: (e,))]
        assert all(isinstance(part, Part) for part in parts)
        assert all(callable(getattr(cls, "close", None)) for cls in (Adopter, Presence, DomainPoller, QueueWatcher))
        for part in parts[6:]:  # safe before start, idempotent
            part.close()
            part.close()
    assert not [n for n in sdk_threads() if "tool" in n]


class FakeService:
    def __init__(self, closed: list[str]) -> None:
        self.adopter = Recorder("adoption", closed)
        self.presence = Recorder("presence", closed)


def recorded_runtime(closed: list[str], *, failing: str | None = None) -> AgentRuntime:
    runtime = AgentRuntime(AgentSettings(server_url=BASE_URL))
    process = runtime._process
    process.serving._service = FakeService(closed)  # type: ignore[assignment]
    for name, owner, attribute in [("pending monitor", process, "handles"), ("workers", process, "workers"),
                                   ("observer", runtime, "_observer"), ("transport", runtime, "_transport")]:
        part = getattr(owner, attribute)
        real = part.close

        def close(real: Any = real, name: str = name) -> None:
            closed.append(name)
            real()
            if name == failing:
                raise RuntimeError(f"{name} failed")

        part.close = close  # type: ignore[method-assign]
    return runtime


def test_close_stops_the_parts_in_order_adopting_before_the_workers_and_the_hand_over_after():
    closed: list[str] = []
    before = set(sdk_threads())  # another test of this worker process may have left one of its own running
    runtime = recorded_runtime(closed)
    runtime.close()
    assert ["pending monitor", "adoption", "workers", "presence", "observer", "transport"] == closed
    runtime.close()  # idempotent: nothing closed twice
    assert 6 == len(closed)
    assert set() == set(sdk_threads()) - before


def test_a_part_that_fails_to_close_does_not_keep_the_next_ones_open():
    closed: list[str] = []
    runtime = recorded_runtime(closed, failing="workers")
    with pytest.raises(RuntimeError, match="workers failed"):
        runtime.close()
    assert ["pending monitor", "adoption", "workers", "presence", "observer", "transport"] == closed


def test_the_serving_parts_close_the_service_a_concurrent_first_serve_made_after_the_list_was_built():
    closed: list[str] = []
    with AgentRuntime(AgentSettings(server_url=BASE_URL)) as runtime:
        serving = runtime._process.serving
        adoption, presence = serving.adoption, serving.presence  # the close list is built: no Service yet
        adoption.close()
        assert [] == closed
        serving._service = FakeService(closed)  # type: ignore[assignment]  # a serve() in between made it
        adoption.close()
        presence.close()
        assert ["adoption", "presence"] == closed
        serving._service = None


def test_a_runtime_given_its_transport_does_not_close_it():
    transport = Transport(BASE_URL)
    closes: list[str] = []
    transport.close = lambda: closes.append("transport")  # type: ignore[method-assign]
    with AgentRuntime(AgentSettings(server_url=BASE_URL), transport=transport):
        pass
    assert [] == closes


def test_resume_reads_the_run_once(http):
    run = "run-1"
    http.add("GET", f"{BASE_URL}/workflow/{run}", json={
        "workflowId": run, "workflowName": "listener", "status": "COMPLETED", "taskToDomain": {"t": "dom-1"}})
    agent = Agent(name="listener", model=MODEL, stateful=True, tools=[WaitForMessageTool.create()])
    assert agent.is_listener
    with AgentRuntime(AgentSettings(server_url=BASE_URL)) as runtime:
        handle = runtime.resume(run, agent)
    assert (handle.execution_id, handle.run_id, handle.workers_attached) == (run, "dom-1", False)
    assert [f"{BASE_URL}/workflow/{run}?includeTasks=false"] == [c.request.url for c in http.calls]


def test_start_compiles_the_agent_once(http, monkeypatch):
    http.add("POST", f"{BASE_URL}/agent/start", json={"executionId": "run-1"})
    compiled = count_compiles(monkeypatch)
    agent = Agent(name="helper", model=MODEL, instructions="Help.")
    with AgentRuntime(AgentSettings(server_url=BASE_URL)) as runtime:
        handle = runtime.start(agent, "hi")
    assert "run-1" == handle.execution_id
    assert ["helper"] == compiled
    assert 1 == len(http.calls)
