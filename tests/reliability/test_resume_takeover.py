"""resume() refuses to take a run over while another worker still polls its domain (issue 11, point 5).

Three runtimes in this process (each has its own worker id, as separate processes would) take turns
on one run. The freshness window is shortened for the test: the poller's safety poll (60 s) to 2 s
and the margin to 3 s, so "the window passed" takes seconds, not 75 s; the logic is the same.
"""

from __future__ import annotations

import os
import time

import pytest

from conductor_agents import AgentRuntime, ResumeError, RunStatus
from conductor_agents._worker import poller as _poller
from conductor_agents._serving import live_workers
from conductor_agents.testing import listener_policy

from ..helpers import eventually, listener
from ..integration.test_stateful_listener import ActionTools, act_on
from .crash_child import FileActionTools, read_actions
from .crash_child import listener as child_listener
from .support import Child, last_poll_ms, quiescent

pytestmark = pytest.mark.reliability


@pytest.fixture
def short_window(monkeypatch):
    monkeypatch.setattr(_poller, "SAFETY_POLL_SECONDS", 2.0)
    monkeypatch.setattr(live_workers, "_MARGIN_SECONDS", 3.0)
    return live_workers.freshness_window()


def test_resume_is_refused_while_another_worker_polls_then_allowed(agent_settings, scripted_llm, unique_name,
                                                                  short_window):
    base = agent_settings.server_url
    model = scripted_llm.script(policy=listener_policy(act_on))
    name = unique_name("takeover")
    first_tools, second_tools, third_tools = ActionTools("first"), ActionTools("second"), ActionTools("third")

    first = AgentRuntime(agent_settings)
    try:
        handle = first.start(listener(name, model, first_tools), "Start listening.")
        handle.send_message({"action": "m1"})
        eventually(lambda: first_tools.actions, timeout=60, message="the first runtime acted")
        with AgentRuntime(agent_settings) as second:
            # The first runtime is alive and polls the run's domain: no take-over.
            with pytest.raises(ResumeError) as refused:
                second.resume(handle.execution_id, listener(name, model, second_tools))
            message = str(refused.value)
            assert first.worker_id in message and "force=True" in message and "ago" in message
            assert refused.value.execution_id == handle.execution_id
            assert second.stats().active_runs == ()  # it serves nothing of the run
            handle.send_message({"action": "m2"})  # still served by the first runtime alone
            eventually(lambda: len(first_tools.actions) == 2, timeout=60, message="the first runtime acted again")
    finally:
        first.close()

    with AgentRuntime(agent_settings) as second:
        # Closed a moment ago: its last poll is still fresh, so still refused without force ...
        with pytest.raises(ResumeError):
            second.resume(handle.execution_id, listener(name, model, second_tools))
        # ... and taken over with force=True.
        resumed = second.resume(handle.execution_id, listener(name, model, second_tools), force=True)
        assert resumed.workers_attached
        resumed.send_message({"action": "m3"})
        eventually(lambda: second_tools.actions, timeout=60, message="the second runtime acted")

    # Once nobody has polled the domain for the window, resume() takes the run over by itself.
    eventually(lambda: time.time() - last_poll_ms(base, "act", handle.run_id) / 1000.0 > short_window + 1,
               timeout=short_window + 30, interval=0.2, message="the window passed")
    with AgentRuntime(agent_settings) as third:
        resumed = third.resume(handle.execution_id, listener(name, model, third_tools))
        resumed.send_message({"action": "m4"})
        eventually(lambda: third_tools.actions, timeout=60, message="the third runtime acted")
        resumed.stop()
        assert resumed.wait(timeout=60).status is RunStatus.COMPLETED

    assert [a for a, _ in first_tools.actions] == ["m1", "m2"]
    assert [a for a, _ in second_tools.actions] == ["m3"]
    assert [a for a, _ in third_tools.actions] == ["m4"]
    scripted_llm.assert_no_anomalies(model)


def _serving_child(agent_settings, scripted_llm, unique_name, tmp_path):
    base = agent_settings.server_url
    model = scripted_llm.script(policy=listener_policy(act_on))
    name = unique_name("samehost")
    log = str(tmp_path / "actions.jsonl")
    child = Child(["--server-url", base, "--name", name, "--model", model, "--log", log, "--start"],
                  stderr_path=str(tmp_path / "child.err"))
    return child, name, model, log


def test_resume_right_after_the_serving_process_was_killed_on_this_host_needs_no_force(
        agent_settings, scripted_llm, unique_name, tmp_path):
    """Issue 19: the process serving a listener is SIGKILLed; its last poll is a second old, but its
    worker id names this host and a pid that no longer exists: resume() without force takes the run
    over at once, and the next message is acted on here."""
    base = agent_settings.server_url
    child, name, model, log = _serving_child(agent_settings, scripted_llm, unique_name, tmp_path)
    try:
        info = child.read_info(timeout=60)
        execution_id = info["execution_id"]
        with AgentRuntime(agent_settings) as runtime:
            runtime.send_message(execution_id, {"action": "m1"})
            eventually(lambda: read_actions(log) and quiescent(base, execution_id), timeout=60, interval=0.1,
                       message="the child acted and waits again")
            child.kill()  # SIGKILL, reaped
            last = last_poll_ms(base, "act", _domain(base, execution_id))
            assert last and time.time() - last / 1000.0 < live_workers.freshness_window()  # still "fresh"
            started = time.monotonic()
            handle = runtime.resume(execution_id, child_listener(name, model, FileActionTools(log)))
            took = time.monotonic() - started
            assert handle.workers_attached
            assert took < 15, took  # no waiting out the 75 s window (confirming our polls takes a moment)
            handle.send_message({"action": "m2"})
            eventually(lambda: len(read_actions(log)) >= 2, timeout=60, interval=0.05, message="m2 acted on here")
            assert [(a["action"], a["pid"]) for a in read_actions(log)] == [("m1", info["pid"]), ("m2", os.getpid())]
            handle.stop()
            assert handle.wait(timeout=60).status is RunStatus.COMPLETED
    finally:
        child.kill()


def test_a_live_process_on_this_host_is_never_taken_over(agent_settings, scripted_llm, unique_name, tmp_path):
    """The same, with the serving process alive: resume() without force is refused (ResumeError naming
    that worker) and the child goes on serving the run alone."""
    base = agent_settings.server_url
    child, name, model, log = _serving_child(agent_settings, scripted_llm, unique_name, tmp_path)
    try:
        info = child.read_info(timeout=60)
        execution_id = info["execution_id"]
        with AgentRuntime(agent_settings) as runtime:
            with pytest.raises(ResumeError) as refused:
                runtime.resume(execution_id, child_listener(name, model, FileActionTools(log)))
            assert info["worker_id"] in str(refused.value)
            assert runtime.stats().active_runs == ()
            runtime.send_message(execution_id, {"action": "still-theirs"})
            eventually(lambda: read_actions(log), timeout=60, interval=0.05, message="the child acted")
            assert [(a["action"], a["pid"]) for a in read_actions(log)] == [("still-theirs", info["pid"])]
            observed = runtime.attach(execution_id)
            observed.stop()
            assert observed.wait(timeout=60).status is RunStatus.COMPLETED  # the child served the stop
    finally:
        child.kill()


def _domain(base: str, execution_id: str) -> str:
    from .support import workflow

    domains = set((workflow(base, execution_id).get("taskToDomain") or {}).values())
    assert len(domains) == 1, domains
    return domains.pop()
