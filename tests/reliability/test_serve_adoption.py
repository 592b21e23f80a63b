"""runtime.serve(agent): runs outlive the process that served them (issue 19).

Several runtimes in this process stand for several processes (each has its own worker id, its own
presence row and its own leases); the tests with real processes are in ``test_serve_processes.py``.
"""

from __future__ import annotations

import time

import attrs
import pytest

from conductor_agents import AgentDefinitionError, AgentRuntime, RunStatus
from conductor_agents._serving.leases import LeaseBook
from conductor_agents.testing import listener_policy

from ..helpers import eventually, lease_owner, listener
from ..integration.test_stateful_listener import ActionTools, act_on

pytestmark = pytest.mark.reliability


@pytest.fixture
def serve_settings(agent_settings):
    # A short stall threshold: presence rows every 0.75 s, a silent process counts as gone after 6 s.
    return attrs.evolve(agent_settings, liveness_stall_seconds=6.0, liveness_check_interval_seconds=1.0)


def test_a_closing_process_hands_its_listener_over_within_seconds(serve_settings, scripted_llm, unique_name):
    """A serves and starts a listener (lease 0 is A's); B serves the same agent. A closes: B adopts the
    run within 5 s (lease 1 is B's), and the next message is acted on by B; nothing acted on twice."""
    base = serve_settings.server_url
    model = scripted_llm.script(policy=listener_policy(act_on))
    name = unique_name("handover")
    tools_a, tools_b = ActionTools("a"), ActionTools("b")
    adopted = []
    a, b = AgentRuntime(serve_settings), AgentRuntime(serve_settings)
    try:
        a.serve(listener(name, model, tools_a))
        b.serve(listener(name, model, tools_b), on_adopt=adopted.append)
        handle = a.start(listener(name, model, tools_a), "Start listening.")
        assert lease_owner(base, handle.run_id, 0) == a.worker_id
        handle.send_message({"action": "m1"})
        eventually(lambda: tools_a.actions, timeout=60, message="A acted")
        time.sleep(3 * 0.75)  # B's rounds see A present: it adopts nothing
        assert adopted == []
        closed_at = time.monotonic()
        a.close()
        eventually(lambda: adopted, timeout=30, interval=0.05, message="B adopted the run")
        took = time.monotonic() - closed_at
        assert took < 5.0, took
        assert adopted[0].execution_id == handle.execution_id
        assert lease_owner(base, handle.run_id, 1) == b.worker_id
        b.send_message(handle.execution_id, {"action": "m2"})
        eventually(lambda: tools_b.actions, timeout=60, message="B acted")
        b.attach(handle.execution_id).stop()
        assert b.attach(handle.execution_id).wait(timeout=60).status is RunStatus.COMPLETED
    finally:
        a.close()
        b.close()
    assert [x for x, _ in tools_a.actions] == ["m1"]
    assert [x for x, _ in tools_b.actions] == ["m2"]


def test_a_lease_is_won_by_exactly_one_of_many_racers(serve_settings, unique_name):
    """Eight threads create lease 0 of one domain at once: all get the same record, one owner."""
    import threading
    import uuid

    from conductor_agents._wire.api import ConductorApi
    from conductor_agents._wire.transport import Transport

    domain = uuid.uuid4().hex
    results = {}
    barrier = threading.Barrier(8)

    def race(i):
        book = LeaseBook(ConductorApi(Transport(serve_settings.server_url)))
        barrier.wait(10)
        results[i] = book.claim(domain, 0, f"racer-{i}")

    threads = [threading.Thread(target=race, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    owners = {lease.owner for lease in results.values() if lease is not None}
    assert len(results) == 8 and len(owners) == 1, results
    assert lease_owner(serve_settings.server_url, domain, 0) == owners.pop()


def test_serve_refuses_a_stateless_agent(agent_runtime, scripted_llm, unique_name):
    from conductor_agents import Agent

    with pytest.raises(AgentDefinitionError, match="stateful"):
        agent_runtime.serve(Agent(name=unique_name("plain"), model="openai/x", instructions="hi"))
