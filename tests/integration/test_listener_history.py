"""A continued listener reads as one history (issue 41): ``wait()``'s result, ``events()`` (also from another
runtime that holds only its id) and the CLI's ``events`` and ``wait`` cover every run the server still holds, oldest
first, say where retired runs were, and never count the SDK's own stop message as a sender's.

Small budgets: a switch every two turns, a handful of messages. The listener waits as
``CONDUCTOR_AGENT_LISTENER_WAIT`` says (the settings' default without it).
"""

from __future__ import annotations

import asyncio
import json
import re

import attrs
import pytest

from conductor_agents import AgentRuntime, AgentSettings, AsyncAgentRuntime, Continuation, RunStatus
from conductor_agents.continuation import KEEP_ALL_RUNS
from conductor_agents.testing import listener_policy

from ..helpers import eventually, listener
from .test_cli_watch import cli
from .test_listener_retention import held_runs, send_and_act
from .test_long_listeners import ActionTools, act_on

pytestmark = pytest.mark.integration


def with_env_wait(settings: AgentSettings) -> AgentSettings:
    """``settings`` with the listener wait the environment asks for (``CONDUCTOR_AGENT_LISTENER_WAIT``)."""
    return attrs.evolve(settings, listener_wait=AgentSettings.from_env().listener_wait)


def acts(calls) -> list[str]:
    return [c.arguments["action"] for c in calls if c.name == "act"]


def event_acts(events) -> list[str]:
    return [e.arguments["action"] for e in events if e.kind == "tool_call" and e.tool_name == "act"]


@pytest.mark.both_topologies
def test_a_continued_listener_reads_as_one_history_from_another_runtime(
        agent_settings, scripted_llm, unique_name, topology_server):
    """Continued every two turns, every run kept, four messages, then stop: the result lists the four ``act``
    calls in order and the tokens of every run (the totals' own), counts four messages (not the stop), and
    another runtime holding only the id replays the four calls across the runs (its async face too)."""
    settings = with_env_wait(agent_settings)
    tools = ActionTools()
    model = scripted_llm.script(policy=listener_policy(act_on))
    agent = listener(unique_name("history"), model, tools,
                     continuation=Continuation(max_turns=2, keep_runs=KEEP_ALL_RUNS))
    sent = [f"h{i}" for i in range(4)]
    with AgentRuntime(settings) as runtime:
        handle = runtime.start(agent, "Start listening.")
        for action in sent:
            send_and_act(runtime, handle.execution_id, tools, action)
        handle.stop()
        result = handle.wait(timeout=120)
    assert (result.status, result.retired_runs) == (RunStatus.COMPLETED, 0) and result.runs >= 3, result
    assert acts(result.tool_calls) == sent
    assert result.totals is not None and result.token_usage == result.totals.token_usage
    assert result.token_usage.total_tokens > 0 and result.totals.messages == len(sent)
    assert "_signal" not in repr(result)

    with AgentRuntime(settings) as other, other.attach(handle.execution_id).events(timeout=60) as reader:
        events = list(reader)
    assert event_acts(events) == sent
    assert [e.run for e in events if e.kind == "continued"] == list(range(2, result.runs + 1))
    assert events[-1].kind == "done" and not any(e.kind in ("error", "retired") for e in events)

    async def read_async() -> list:
        async with AsyncAgentRuntime(settings) as runtime:
            watched = await runtime.attach(handle.execution_id)
            async with watched.events(timeout=60) as reader:
                return [event async for event in reader]

    assert [e.kind for e in asyncio.run(read_async())] == [e.kind for e in events]  # the async face: the same


@pytest.mark.both_topologies
def test_a_listener_whose_older_runs_were_retired_says_where_they_were(
        agent_settings, scripted_llm, unique_name, topology_server):
    """Continued every two turns keeping one ended run, five messages: once its first runs are retired and it
    is stopped, the result covers the runs still held (and says how many were retired; the totals count all),
    and the events of another runtime and of ``conductor-agents events`` begin with a ``retired`` event for
    the runs removed; ``conductor-agents wait`` says what its counts cover."""
    settings = with_env_wait(agent_settings)
    base = topology_server.url
    tools = ActionTools()
    model = scripted_llm.script(policy=listener_policy(act_on))
    agent = listener(unique_name("retired"), model, tools, continuation=Continuation(max_turns=2, keep_runs=1))
    sent = [f"r{i}" for i in range(5)]
    with AgentRuntime(settings) as runtime:
        handle = runtime.start(agent, "Start listening.")
        for action in sent:
            send_and_act(runtime, handle.execution_id, tools, action)
        newest = handle.runs - 1
        eventually(lambda: 0 not in held_runs(base, handle.execution_id, newest), timeout=30, interval=0.2,
                   message="the first runs retired")
        handle.stop()
        result = handle.wait(timeout=120)
    assert result.status is RunStatus.COMPLETED and result.totals is not None, result
    assert 1 <= result.retired_runs < result.runs == result.totals.runs
    held_acts = acts(result.tool_calls)
    assert held_acts == sent[len(sent) - len(held_acts):] and len(held_acts) < len(sent)
    assert 0 < result.token_usage.total_tokens < result.totals.token_usage.total_tokens
    assert result.totals.messages == len(sent)

    # (A sweep of the last switch may still retire a run before the runtime closes: the reads below may see
    # more runs retired than the result did, never fewer, and the same runs in all.)
    with AgentRuntime(settings) as other, other.attach(handle.execution_id).events(timeout=60) as reader:
        events = list(reader)
    retired = events[0]
    assert retired.kind == "retired" and retired.first_run == 1 and retired.execution_id == handle.execution_id
    assert retired.last_run >= result.retired_runs
    held = sum(1 for e in events if e.kind == "continued") + 1
    assert retired.last_run + held == result.runs  # the retired runs, then every held run's events
    seen = event_acts(events)
    assert seen == held_acts[len(held_acts) - len(seen):] and seen and events[-1].kind == "done"

    printed = cli(base, "events", handle.execution_id, "--json", "--timeout", "60")
    assert printed.returncode == 0, printed.stderr
    lines = [json.loads(line) for line in printed.stdout.splitlines()]
    assert (lines[0]["kind"], lines[0]["firstRun"]) == ("retired", 1) and lines[0]["lastRun"] >= retired.last_run
    printed_acts = [e["arguments"]["action"] for e in lines if e["kind"] == "tool_call" and e["toolName"] == "act"]
    assert printed_acts == seen[len(seen) - len(printed_acts):] and printed_acts
    waited = cli(base, "wait", handle.execution_id, "--timeout", "60")
    assert waited.returncode == 0, waited.stderr
    summary = re.search(r"(\d+) tool calls, (\d+) tokens over the (\d+) runs? still held \((\d+) older runs? retired "
                        r"from the server; all (\d+) runs: (\d+) tokens\)", waited.stderr)
    assert summary is not None, waited.stderr
    calls, tokens, held_runs_, retired_runs, runs, all_tokens = map(int, summary.groups())
    assert (held_runs_ + retired_runs, runs, all_tokens) == (result.runs, result.runs,
                                                             result.totals.token_usage.total_tokens)
    assert 0 < calls <= len(result.tool_calls) and 0 < tokens <= result.token_usage.total_tokens
