"""A crash in the middle of retiring a listener's older runs (issue 30): the serving process is SIGKILLed
between two removals; the next process that takes the listener up finishes the sweep, and the listener
goes on with nothing lost or done twice."""

from __future__ import annotations

import collections

import pytest

from conductor_agents import AgentRuntime, Continuation, RunStatus
from conductor_agents.testing import ToolCall, listener_policy

from ..helpers import eventually, listener as make_listener, listener_links
from .crash_child import FileActionTools, read_actions
from .support import Child, kill_all

pytestmark = pytest.mark.reliability


def act_on(payload: dict) -> ToolCall:
    return ToolCall("act", {"action": payload["action"], "tag": payload.get("tag", "")})


def test_a_process_killed_mid_retirement_leaves_a_listener_the_next_one_finishes_retiring(
        agent_settings, scripted_llm, unique_name, tmp_path):
    """Child 1 keeps every run while the listener is continued six times, and is killed. Child 2 resumes
    it with ``keep_runs=0``: its take-up sweep removes two runs and the process is SIGKILLed in the middle.
    This process resumes it by its id (the mailbox): the sweep is finished (the live run remains), every
    message is acted on once, and the totals still count every run."""
    base = agent_settings.server_url
    model = scripted_llm.script(policy=listener_policy(act_on))
    name = unique_name("retirecrash")
    log = str(tmp_path / "actions.jsonl")
    common = ["--server-url", base, "--name", name, "--model", model, "--log", log, "--continue-every", "2"]
    sent: "list[str]" = []
    keeper = Child([*common, "--start", "--keep-runs", "all"], stderr_path=str(tmp_path / "keeper.err"))
    try:
        execution_id = keeper.read_info(timeout=60)["execution_id"]
        with AgentRuntime(agent_settings) as sender:
            while len(listener_links(base, execution_id)) < 7:
                assert len(sent) < 40, "no switch for many messages"
                sent.append(f"before-{len(sent)}")
                sender.send_message(execution_id, {"action": sent[-1], "tag": "before"})
                eventually(lambda: len(read_actions(log)) >= len(sent), timeout=60, interval=0.05,
                           message="the message acted on")
    finally:
        kill_all([keeper])
    links = listener_links(base, execution_id)
    assert [n for n, _ in links] == list(range(len(links))), links  # nothing retired yet (link 0 included)

    crasher = Child([*common, "--resume", execution_id, "--keep-runs", "0", "--crash-after-removals", "2"],
                    stderr_path=str(tmp_path / "crasher.err"))
    try:
        eventually(lambda: crasher.proc.poll() is not None, timeout=60, interval=0.1, message="the crash mid-sweep")
        assert "killed after removing 2 runs" in crasher.stderr_tail()
    finally:
        kill_all([crasher])
    half = [n for n, _ in listener_links(base, execution_id)]
    newest = half[-1]
    # Cut short, lowest first (link 0 too: the mailbox is the id callers hold):
    assert 0 not in half and 1 not in half and 2 in half, half

    tools = FileActionTools(log)
    agent = make_listener(name, model, tools, batch_size=5, continuation=Continuation(max_turns=2, keep_runs=0))
    with AgentRuntime(agent_settings) as resumer:
        handle = resumer.resume(execution_id, agent, force=True)
        eventually(lambda: [n for n, _ in listener_links(base, execution_id)] == [newest], timeout=30,
                   interval=0.2, message="the sweep finished by the next process")
        for i in range(3):
            sent.append(f"after-{i}")
            resumer.send_message(execution_id, {"action": sent[-1], "tag": "after"})
        eventually(lambda: len(read_actions(log)) >= len(sent), timeout=90, interval=0.2,
                   message=f"all {len(sent)} messages acted on")
        totals = handle.totals()
        assert totals.runs >= newest + 1 and totals.messages >= len(sent), totals
        handle.stop()
        result = handle.wait(timeout=60)
    assert result.status is RunStatus.COMPLETED and result.execution_id == execution_id
    counts = collections.Counter(a["action"] for a in read_actions(log))
    assert sorted(counts) == sorted(sent) and set(counts.values()) == {1}, counts
    held = [n for n, _ in listener_links(base, execution_id)]
    assert 0 not in held and len(held) <= 2, held  # the last run (and an abandoned one at a stop)
