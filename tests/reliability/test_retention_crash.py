"""A crash in the middle of retiring a listener's older runs (issue 30): the serving process is SIGKILLed
between two removals; the next process that takes the listener up finishes the sweep, and the listener
goes on with nothing lost or done twice. On one SQLite node and on the cluster (Redis)."""

from __future__ import annotations

import collections
from typing import Callable, List, TypeVar

import pytest

from conductor_agents import AgentRuntime, Continuation, RunStatus
from conductor_agents.testing import ToolCall, listener_policy

from ..helpers import eventually, listener as make_listener, listener_links
from .crash_child import FileActionTools, read_actions
from .support import Child, current_run, kill_all, quiescent, run_summary

pytestmark = pytest.mark.reliability

T = TypeVar("T")
#: Links the first child leaves: link 0 and 4 ended ones go when ``keep_runs=0`` (the crash comes after 2).
LINKS = 5


def act_on(payload: dict) -> ToolCall:
    return ToolCall("act", {"action": payload["action"], "tag": payload.get("tag", "")})


def explained(children: List[Child], check: Callable[[], T], *, listener: "tuple[str, str] | None" = None,
              **kwargs) -> T:
    """``eventually(check)``, its failure message followed by the children's stderr (their SDK log) and,
    given ``listener`` (server URL, first id), the server's view of the listener's newest run.

    The bounds below are generous (a loaded 2-core CI machine, a server just started): each wait ends as
    soon as its condition holds; none of them waits for a timer of the SDK."""
    try:
        return eventually(check, **kwargs)
    except AssertionError as err:
        tails = "\n".join(f"--- {c.stderr_path} (exit {c.proc.poll()}):\n{c.stderr_tail()}" for c in children)
        if listener is not None:
            try:
                tails += "\n--- the newest run:\n" + run_summary(listener[0], current_run(*listener))
            except Exception as read_err:  # noqa: BLE001 - the message must not hide the failure
                tails += f"\n--- the newest run could not be read: {read_err}"
        raise AssertionError(f"{err}\n{tails}") from None


@pytest.mark.both_topologies
def test_a_process_killed_mid_retirement_leaves_a_listener_the_next_one_finishes_retiring(
        agent_settings, scripted_llm, unique_name, tmp_path):
    """Child 1 keeps every run while the listener is continued four times, and is killed once the last
    switch has come to rest. Child 2 resumes it with ``keep_runs=0``: its take-up sweep removes two
    runs and the process is SIGKILLed in the middle. This process resumes it by its id (the mailbox): the
    sweep is finished (the live run remains: link 0 goes too), every message is acted on once, and the
    totals still count every run."""
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
            while len(listener_links(base, execution_id)) < LINKS:
                assert len(sent) < 30, "no switch for many messages"
                sent.append(f"before-{len(sent)}")
                sender.send_message(execution_id, {"action": sent[-1], "tag": "before"})
                explained([keeper], lambda: len(read_actions(log)) >= len(sent), timeout=120, interval=0.05,
                          listener=(base, execution_id), message="the message acted on")
        # Killed at rest: its last switch committed, no tool in flight. (Killed mid-switch, the next process
        # would first finish that switch, and a tool of the old run left in flight keeps the old run from
        # coming to rest: the switch waits out its drain bound, 60 s, before the sweep even begins.)
        explained([keeper], lambda: quiescent(base, execution_id), timeout=120, interval=0.1,
                  listener=(base, execution_id), message="the keeper at rest after its last switch")
    finally:
        kill_all([keeper])
    links = listener_links(base, execution_id)
    assert [n for n, _ in links] == list(range(len(links))), links  # nothing retired yet (link 0 included)
    newest = links[-1][0]

    crasher = Child([*common, "--resume", execution_id, "--keep-runs", "0", "--crash-after-removals", "2"],
                    stderr_path=str(tmp_path / "crasher.err"))
    try:
        explained([keeper, crasher], lambda: crasher.proc.poll() is not None, timeout=120, interval=0.1,
                  listener=(base, execution_id), message="the crash mid-sweep")
        assert "killed after removing 2 runs" in crasher.stderr_tail(), crasher.stderr_tail()
    finally:
        kill_all([crasher])
    half = [n for n, _ in listener_links(base, execution_id)]
    assert half == [*range(2, newest + 1)], half  # cut short, lowest first (link 0 too: the mailbox is the id)

    tools = FileActionTools(log)
    agent = make_listener(name, model, tools, batch_size=5, continuation=Continuation(max_turns=2, keep_runs=0))
    with AgentRuntime(agent_settings) as resumer:
        handle = resumer.resume(execution_id, agent, force=True)
        explained([keeper, crasher], lambda: [n for n, _ in listener_links(base, execution_id)] == [newest],
                  timeout=60, interval=0.2, message="the sweep finished by the next process")
        for i in range(2):
            sent.append(f"after-{i}")
            resumer.send_message(execution_id, {"action": sent[-1], "tag": "after"})
        eventually(lambda: len(read_actions(log)) >= len(sent), timeout=120, interval=0.2,
                   message=f"all {len(sent)} messages acted on")
        totals = handle.totals()
        assert totals.runs >= newest + 1 and totals.messages >= len(sent), totals
        handle.stop()
        result = handle.wait(timeout=120)
    assert result.status is RunStatus.COMPLETED and result.execution_id == execution_id
    counts = collections.Counter(a["action"] for a in read_actions(log))
    assert sorted(counts) == sorted(sent) and set(counts.values()) == {1}, counts
    held = [n for n, _ in listener_links(base, execution_id)]
    assert 0 not in held and len(held) <= 2, held  # the last run (and an abandoned one at a stop)
