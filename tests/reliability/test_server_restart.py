"""The Conductor server restarts while a stateful run is in progress and one of its tools runs.

The test restarts a LocalServer of its own (restarting the session's would disturb every other
test; the restart tests share it), wired to the session's ScriptedLLM. A tool body is held inside while the server is stopped
and started again on the same data directory; it is released while the server is *down*, so
its result cannot be posted at first. The executor must keep retrying until the server is
back, the server must accept the result, and the domain poller must recover by itself: a
message sent after the restart is acted on, and the run completes.

A documented server limitation shapes the design: on a SQLite server the workflow message
queue lives in the server's memory, so a message pushed and not yet consumed when the server
stops is lost (a Redis-backed server keeps it). Here no message is queued across the restart:
the one the held tool acts on was consumed before, the next is sent after.
"""

from __future__ import annotations

import logging
import socket
import threading
import time

import pytest

from conductor_agents import AgentRuntime, AgentSettings, LocalServer, RunStatus, tool
from conductor_agents.testing import listener_policy

from ..helpers import eventually, listener, sdk_threads
from ..integration.test_stateful_listener import act_on
from .support import quiescent, run_summary, tasks_of

pytestmark = pytest.mark.reliability


class GatedTools:
    """``act("hold")`` blocks until the test opens the gate; every other action returns at once."""

    def __init__(self) -> None:
        self.actions: list = []
        self.lock = threading.Lock()
        self.holding = threading.Event()
        self.gate = threading.Event()

    @tool
    def act(self, action: str, tag: str = "") -> dict:
        """Carry out an action requested by an external message."""
        if action == "hold":
            self.holding.set()
            if not self.gate.wait(300):  # bounded: the test opens it within a minute or fails
                raise TimeoutError("the gate was never opened")
        with self.lock:
            self.actions.append(action)
        return {"done": action}


def refuses_connections(server: LocalServer) -> bool:
    """True once the old server process is gone and the new one does not listen yet."""
    try:
        socket.create_connection(("127.0.0.1", server.port), timeout=0.5).close()
    except ConnectionRefusedError:
        return True
    except OSError:
        return False
    return False


def quick_join_check(monkeypatch) -> None:
    """The SDK's look at a run's joins 8 s after a tool's result instead of 45 s: a restart leaves the JOIN after the
    tool leased by the old process (an hour), and that look is what has it evaluated again (``_liveness/nudges.py``).
    45 s is for a stock server, which evaluates a waiting JOIN every 30 s; the tests' servers do it every second."""
    monkeypatch.setattr("conductor_agents._liveness.nudges.JOIN_CHECK_SECONDS", 8.0)


@pytest.fixture
def own_server(restartable_servers) -> LocalServer:
    """A server of this test's (shared with the other restart tests), never the session's."""
    return restartable_servers.get("sqlite")


def test_a_run_survives_a_server_restart_during_a_tool(own_server, scripted_llm, unique_name, caplog, monkeypatch):
    base = own_server.url
    quick_join_check(monkeypatch)
    model = scripted_llm.script(policy=listener_policy(act_on))
    tools = GatedTools()
    before = sdk_threads()
    caplog.set_level(logging.INFO, logger="conductor_agents.worker")
    with AgentRuntime(AgentSettings.from_env(environ={}, server_url=base)) as runtime:
        handle = runtime.start(listener(unique_name("restart"), model, tools), "Start listening.")
        handle.send_message({"action": "before"})
        eventually(lambda: tools.actions == ["before"] and quiescent(base, handle.execution_id), timeout=60,
                   message="the first action")
        handle.send_message({"action": "hold"})
        assert tools.holding.wait(60), "the held tool never started"

        def open_gate_once_down() -> None:
            deadline = time.monotonic() + 120
            while not refuses_connections(own_server) and time.monotonic() < deadline:
                threading.Event().wait(0.05)
            tools.gate.set()  # the tool returns now: its result cannot reach the server yet

        opener = threading.Thread(target=open_gate_once_down, name="test-gate-opener", daemon=True)
        opener.start()
        restarted_at = time.monotonic()
        own_server.restart()  # same data dir and port; ~15 s
        print(f"\nserver restarted in {time.monotonic() - restarted_at:.1f}s")
        opener.join(10)
        assert tools.gate.is_set() and tools.actions == ["before", "hold"]

        # The result posted after the server came back is accepted (not dropped)... It was first
        # posted while the server was down, so the executor logs how many attempts it took.
        def logged(text: str) -> bool:
            return any(text in r.getMessage() for r in list(caplog.records))

        eventually(lambda: logged("accepted after"), timeout=60, interval=0.2,
                   message="the held tool's result accepted after retries")
        assert [t["status"] for t in tasks_of(base, handle.execution_id, "act")] == ["COMPLETED", "COMPLETED"]
        assert logged("posting the result of task") and not logged("DROPPED")

        # ...and the poller recovered by itself: a message sent now is acted on here. The server
        # itself does not move on after a restart: the JOIN after the tool stays leased by the old
        # process until the SDK's look at the run's joins has it evaluated (``quick_join_check``).
        try:
            eventually(lambda: quiescent(base, handle.execution_id), timeout=150, interval=0.2,
                       message="waiting again")
        except AssertionError as err:
            raise AssertionError(f"{err}\n{run_summary(base, handle.execution_id)}") from None
        handle.send_message({"action": "after"})
        eventually(lambda: tools.actions == ["before", "hold", "after"], timeout=60,
                   message="the action after the restart")
        handle.stop()
        result = handle.wait(timeout=60)
    assert result.status is RunStatus.COMPLETED
    held = [c for c in result.tool_calls if c.name == "act" and c.arguments.get("action") == "hold"]
    assert len(held) == 1 and held[0].status == "COMPLETED" and held[0].output == {"done": "hold"}
    assert sdk_threads() == before
