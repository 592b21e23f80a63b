"""A web app's shape: 50 request threads on one shared runtime, each starting its own listener,
sending it two messages, stopping it and waiting for it (issue 11, point 12).

All 50 start the same brand-new agent at the same moment (the first burst after a deploy). Zero
errors, zero crossovers (each run's tool sees its own messages only), and afterwards no thread per
run is left: with the runtime still open only its bounded tool pool remains, and after close()
exactly the threads there were before.
"""

from __future__ import annotations

import threading
import time

import pytest

from conductor_agents import AgentRuntime, RunStatus
from conductor_agents.testing import listener_policy

from ..helpers import eventually, listener
from .test_stateful_listener import ActionTools, act_on

pytestmark = pytest.mark.integration

REQUESTS = 50


def test_fifty_request_threads_each_drive_their_own_listener(agent_settings, scripted_llm, unique_name):
    model = scripted_llm.script(policy=listener_policy(act_on))
    name = unique_name("web_app")
    before = {t.ident for t in threading.enumerate()}
    runtime = AgentRuntime(agent_settings)
    barrier = threading.Barrier(REQUESTS)
    tools = [ActionTools(f"r{i}") for i in range(REQUESTS)]
    statuses: dict = {}
    errors: list = []

    def request(i: int) -> None:
        handle = None
        try:
            barrier.wait(timeout=60)
            handle = runtime.start(listener(name, model, tools[i]), "Start listening.")
            for n in (1, 2):
                handle.send_message({"action": f"r{i}-m{n}", "tag": f"r{i}"})
            eventually(lambda: len(tools[i].actions) >= 2, timeout=240, interval=0.2,
                       message=f"request {i}: both messages acted on")
            handle.stop()
            statuses[i] = handle.wait(timeout=240).status
        except Exception as err:  # collected: the test reports every failure at once
            errors.append(f"request {i}: {err!r}, acted on {tools[i].actions}{_server_side(runtime, handle)}")

    began = time.monotonic()
    threads = [threading.Thread(target=request, args=(i,), name=f"test-request-{i}") for i in range(REQUESTS)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(400)
        took = time.monotonic() - began
        print(f"\n{REQUESTS} listeners started, driven and ended in {took:.1f}s")
        assert [] == errors
        assert {i: RunStatus.COMPLETED for i in range(REQUESTS)} == statuses
        for i, own in enumerate(tools):
            assert sorted(own.actions) == [(f"r{i}-m1", f"r{i}"), (f"r{i}-m2", f"r{i}")], f"request {i}"

        def per_run_threads():
            return [t.name for t in threading.enumerate() if t.ident not in before
                    and not t.name.startswith(("conductor-agents-tool", "conductor-agents-lease"))]

        # The runtime stays open (a web app's does): no thread of any run is left, only the tool pool.
        eventually(lambda: not per_run_threads(), timeout=30, message="every per-run thread ended")
        pool = [t for t in threading.enumerate() if t.name.startswith("conductor-agents-tool")]
        assert len(pool) <= agent_settings.worker_threads
    finally:
        runtime.close()
    eventually(lambda: {t.ident for t in threading.enumerate() if t.is_alive()} <= before, timeout=30,
               message="the threads of before, and no other")
    scripted_llm.assert_no_anomalies(model)


def _server_side(runtime, handle) -> str:
    """The server's own account of a run that went wrong (e.g. its database timed out under load): the current run's
    status, and the tasks in flight of it and of the listener's mailbox (the id the handle holds)."""
    if handle is None:
        return ""
    try:
        run = runtime._api.get_workflow(handle.current_execution_id)
        said = f" (server: {run.get('status')}, {run.get('reasonForIncompletion') or 'no reason'}"
        now_ms = time.time() * 1000
        for label, run_id in (("run", handle.current_execution_id), ("mailbox", handle.execution_id)):
            tasks = runtime._api.workflow_tasks(run_id, statuses=("SCHEDULED", "IN_PROGRESS"), count=20).tasks
            said += f"; {label} {run_id} in flight: " + ", ".join(
                f"{t.get('referenceTaskName')} {t.get('taskType')} {t.get('status')} polls {t.get('pollCount')} "
                f"callback {t.get('callbackAfterSeconds')} started {_ago(now_ms, t.get('startTime'))} "
                f"updated {_ago(now_ms, t.get('updateTime'))}" for t in tasks)
        return said + ")"
    except Exception as err:  # a diagnostic only
        return f" (server: unreadable, {err!r})"


def _ago(now_ms: float, at) -> str:
    return f"{(now_ms - at) / 1000:.1f}s ago" if isinstance(at, (int, float)) and at > 0 else "never"
