"""Retention (issue 30): a listener continued many times keeps a bounded number of runs on the server, and
its first id keeps answering everything (status, wait, events, send_message, attach, resume, totals).

A tiny budget (a switch every couple of turns) so that one test goes through many switches.
"""

from __future__ import annotations

import collections
import time
from datetime import timedelta

import attrs
import pytest
import requests

from conductor_agents import AgentRuntime, Continuation, RunStatus
from conductor_agents.testing import listener_policy

from conductor_agents._listener.chain import link_id, link_key, parse_link_key, parse_mailbox_key

from ..helpers import eventually, listener, listener_links
from .test_long_listeners import ActionTools, act_on

pytestmark = pytest.mark.integration

KEEP = 1


def held_runs(base: str, execution_id: str, upto: int) -> "list[int]":
    """The link numbers 0..``upto`` the server still holds (one ``GET /workflow/{id}`` each)."""
    held = []
    for number in range(upto + 1):
        if requests.get(f"{base}/workflow/{link_of(base, execution_id, number)}", params={"includeTasks": "false"},
                        timeout=10).status_code == 200:
            held.append(number)
    return held


def link_of(base: str, execution_id: str, number: int) -> str:
    """The execution id of link ``number`` of the listener ``execution_id`` names (its mailbox or first run)."""
    correlation = requests.get(f"{base}/workflow/{execution_id}", timeout=10).json()["correlationId"]
    key = parse_mailbox_key(correlation) or parse_link_key(correlation)
    return link_id(key.agent_name, link_key(key.run_id, number, key.agent_name))


def send_and_act(runtime: AgentRuntime, execution_id: str, tools: ActionTools, action: str) -> None:
    runtime.send_message(execution_id, {"action": action})
    eventually(lambda: action in tools.snapshot(), timeout=60, interval=0.05, message=f"{action} acted on")


@pytest.mark.both_topologies
def test_a_listener_continued_many_times_keeps_its_newest_runs(
        agent_settings, scripted_llm, unique_name, topology_server):
    """Three switches with ``keep_runs=1``: the server holds one ended link and the live one (and the
    listener's mailbox, the id callers hold: link 0 is retired like the others); a process that takes it up
    with ``keep_for=1s`` retires that ended link too (older than the age); a fresh runtime holding only that
    id reads status, totals and events, sends a message that is acted on once, resumes the listener (its
    take-up sweeps again), and the result's totals count every run, including the ones removed."""
    base = getattr(topology_server, "url")
    tools = ActionTools()
    model = scripted_llm.script(policy=listener_policy(act_on))
    agent = listener(unique_name("retain"), model, tools, continuation=Continuation(max_turns=2, keep_runs=KEEP))
    sent: "list[str]" = []
    with AgentRuntime(agent_settings) as first:
        handle = first.start(agent, "Start listening.")
        execution_id = handle.execution_id
        # Three switches: links 0 and 1 retired while link 2 is kept and link 3 lives (the suite ran five until
        # issue 44; each switch is two model turns, and the two more retired nothing new).
        while handle.runs < 4:
            assert len(sent) < 60, "no switch for many messages"
            sent.append(f"m{len(sent)}")
            send_and_act(first, execution_id, tools, sent[-1])
        newest = handle.runs - 1
        # Once the last switch's sweep is done: the newest KEEP ended ones, the live one (and the one being
        # started if a switch is under way).
        eventually(lambda: held_runs(base, execution_id, newest + 1)[:KEEP + 1] == [*range(newest - KEEP, newest + 1)],
                   timeout=30, interval=0.2, message="older runs retired")
        held = held_runs(base, execution_id, newest + 1)
        assert len(held) <= KEEP + 2 and 0 not in held and 1 not in held, held

    # Retention by age: a process that takes the listener up with keep_for=1s retires the ended run that
    # keep_runs=1 keeps, once it ended more than a second ago (no message is sent: no switch meanwhile).
    ended_ms = requests.get(f"{base}/agent/{link_of(base, execution_id, newest - 1)}/status", timeout=10).json()["endTime"]
    eventually(lambda: time.time() * 1000 > ended_ms + 1500, timeout=10, message="the ended run a second old")
    aged = attrs.evolve(agent, continuation=Continuation(max_turns=2, keep_runs=KEEP, keep_for=timedelta(seconds=1)))
    with AgentRuntime(agent_settings) as taker:
        taker.resume(execution_id, aged, force=True)
        eventually(lambda: held_runs(base, execution_id, newest + 1) == [newest], timeout=30, interval=0.2,
                   message="the ended run older than keep_for retired")

    # Nobody serves it now. A fresh runtime holding only the first id:
    with AgentRuntime(agent_settings) as other:
        watched = other.attach(execution_id)
        status = watched.status()
        assert (status.execution_id, status.runs, status.is_terminal) == (execution_id, newest + 1, False)
        assert status.current_execution_id == listener_links(base, execution_id)[-1][1]
        totals = watched.totals()
        assert totals.runs == newest + 1 and totals.messages >= len(sent) and totals.turns >= len(sent)
        assert "act(" in totals.history  # the compact history of the runs removed

        sent.append("while-nobody-serves")
        other.send_message(execution_id, {"action": sent[-1]})  # queued in the live run
        resumed = other.resume(execution_id, agent, force=True)  # the first runtime closed a moment ago
        eventually(lambda: sent[-1] in tools.snapshot(), timeout=60, message="the queued message acted on")
        events = resumed.events(timeout=120)
        for _ in range(4):  # two more switches, served here: the sweep goes on from this process
            sent.append(f"m{len(sent)}")
            send_and_act(other, execution_id, tools, sent[-1])
        later = resumed.runs - 1
        assert later > newest
        eventually(lambda: KEEP + 2 >= len(held_runs(base, execution_id, later + 1)), timeout=30, interval=0.2,
                   message="older runs retired after the resume")
        resumed.stop()
        result = resumed.wait(timeout=120)
        kinds = collections.Counter()
        continued_to = []
        with events:
            for event in events:
                kinds[event.kind] += 1
                if event.kind == "continued":
                    continued_to.append(event.run)
    assert (result.status, result.execution_id) == (RunStatus.COMPLETED, execution_id)
    assert result.totals is not None and result.totals.runs == result.runs >= later
    assert result.totals.messages >= len(sent)
    counts = collections.Counter(tools.snapshot())
    assert sorted(counts) == sorted(sent) and set(counts.values()) == {1}, counts.most_common(3)
    assert kinds["done"] == 1 and continued_to and continued_to == sorted(continued_to), (kinds, continued_to)
    scripted_llm.assert_no_anomalies(model)
