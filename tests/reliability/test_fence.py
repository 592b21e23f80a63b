"""A serving process that cannot reach its server for ¾ of the stall fences itself (issue 44).

The fence: no task of the runs it holds runs in it until it has renewed its presence *and* each run's lease. It keeps
its runs registered meanwhile. Back, it takes each run's next lease: won (nobody adopted the run meanwhile), it serves
the run on as it was; lost (another process adopted it), it lets the run go. Before, a fence let every run go at once,
as if it had ended, and the process had to adopt its own runs again: in a soak (seed 11, three processes, a server
restart of 9.5 s with a 10 s stall) several processes never took some of theirs up again, and nobody else did (their
presence was renewed), so 9 of 12 listeners waited for good.

The outage is one process's alone, made by a loopback proxy between it and the server (``tests/proxy.py``); the
other runtime of the second test reaches the server directly. Two runtimes in this process stand for two serving
processes (each has its own worker id, presence row and leases), as in ``test_serve_adoption.py``.
"""

from __future__ import annotations

import logging
import time

import attrs
import pytest

from conductor_agents import AgentRuntime, Continuation, RunStatus
from conductor_agents.testing import listener_policy

from ..helpers import eventually, lease_owner, listener
from ..integration.test_stateful_listener import ActionTools, act_on
from ..proxy import LoopbackProxy
from .support import quiescent

pytestmark = pytest.mark.reliability

STALL = 6.0  # presence rows every 0.75 s; the fence at 4.5 s without a renewed row; others adopt after 6 s


@pytest.fixture
def serve_settings(agent_settings):
    return attrs.evolve(agent_settings, liveness_stall_seconds=STALL, liveness_check_interval_seconds=1.0)


def _said(caplog, text: str) -> list[str]:
    return [r.getMessage() for r in list(caplog.records) if text in r.getMessage()]


def _fence(caplog, proxy: LoopbackProxy, *, outage: float) -> None:
    """Cut the proxied runtime off the server until it fenced itself and ``outage`` seconds have passed."""
    before = len(_said(caplog, "could not be renewed"))
    began = time.monotonic()
    proxy.refuse(["/api/"], status=0)
    try:
        eventually(lambda: len(_said(caplog, "could not be renewed")) > before, timeout=30, interval=0.1,
                   message="the process fenced itself")
        time.sleep(max(0.0, outage - (time.monotonic() - began)))
    finally:
        proxy.refuse([])


def test_a_process_that_fenced_itself_serves_its_continued_listeners_on_once_back(
        serve_settings, scripted_llm, unique_name, caplog):
    caplog.set_level(logging.INFO, logger="conductor_agents")
    model = scripted_llm.script(policy=listener_policy(act_on))
    name = unique_name("fence-keep")
    tools = ActionTools("a")
    agent = listener(name, model, tools, continuation=Continuation(max_turns=2))
    with LoopbackProxy(serve_settings.server_url) as proxy, \
            AgentRuntime(attrs.evolve(serve_settings, server_url=proxy.url)) as runtime, \
            AgentRuntime(attrs.evolve(serve_settings, auto_start_workers=False)) as sender:
        runtime.serve(agent)
        handles = [runtime.start(agent, "Start listening.") for _ in range(2)]
        for i, handle in enumerate(handles):
            handle.send_message({"action": f"before-{i}"})
        eventually(lambda: {a for a, _ in tools.actions} >= {"before-0", "before-1"}, timeout=90,
                   message="both listeners acted before")
        eventually(lambda: len(_said(caplog, "committed (")) >= 2, timeout=90, message="both continued once")
        base = serve_settings.server_url
        eventually(lambda: all(quiescent(base, h.execution_id) for h in handles), timeout=60, message="at rest")

        _fence(caplog, proxy, outage=STALL * 0.9)  # fenced, and back before the others could count it dead

        for i, handle in enumerate(handles):
            sender.send_message(handle.execution_id, {"action": f"after-{i}"})
        eventually(lambda: {a for a, _ in tools.actions} >= {"after-0", "after-1"}, timeout=90, interval=0.2,
                   message="both listeners acted on a message sent after the outage")
        kept = _said(caplog, "kept serving the runs on domain")
        assert len(kept) == 2, kept  # each run's next lease, won by this process
        assert not _said(caplog, "adopting"), "its own runs were adopted again instead of served on"
        assert not _said(caplog, "its mailbox ended"), "a fence is no end: no mailbox is looked at as ended"
        for handle in handles:
            handle.stop()
        for handle in handles:
            assert handle.wait(timeout=90).status is RunStatus.COMPLETED
    assert sorted(a for a, _ in tools.actions) == ["after-0", "after-1", "before-0", "before-1"]


def test_a_process_that_fenced_itself_lets_go_of_a_run_another_process_adopted_meanwhile(
        serve_settings, scripted_llm, unique_name, caplog):
    caplog.set_level(logging.INFO, logger="conductor_agents")
    model = scripted_llm.script(policy=listener_policy(act_on))
    name = unique_name("fence-lose")
    tools_a, tools_b = ActionTools("a"), ActionTools("b")
    base = serve_settings.server_url
    with LoopbackProxy(base) as proxy, \
            AgentRuntime(attrs.evolve(serve_settings, server_url=proxy.url)) as a, \
            AgentRuntime(serve_settings) as b:
        a.serve(listener(name, model, tools_a))
        b.serve(listener(name, model, tools_b))
        handle = a.start(listener(name, model, tools_a), "Start listening.")
        handle.send_message({"action": "m1"})
        eventually(lambda: tools_a.actions and quiescent(base, handle.execution_id), timeout=60,
                   message="A acted, and its tool's result reached the server")  # else B runs it again: at least once

        _fence(caplog, proxy, outage=STALL + 8.0)  # long enough for B to count A dead and adopt its run

        eventually(lambda: lease_owner(base, handle.run_id, 1) == b.worker_id, timeout=30, interval=0.2,
                   message="B took lease 1")
        eventually(lambda: _said(caplog, "letting them go"), timeout=30, interval=0.2, message="A let the run go")
        b.send_message(handle.execution_id, {"action": "m2"})
        eventually(lambda: tools_b.actions, timeout=60, message="B acted")
        b.attach(handle.execution_id).stop()
        assert b.attach(handle.execution_id).wait(timeout=90).status is RunStatus.COMPLETED
    assert [x for x, _ in tools_a.actions] == ["m1"]
    assert [x for x, _ in tools_b.actions] == ["m2"]
