"""A process SIGKILLed in the middle of forwarding a listener's mailbox (issue 30, item 2): the next process
that serves the listener finishes the forward, and every message pushed to the one id is acted on once."""

from __future__ import annotations

import collections

import attrs
import pytest

from conductor_agents import AgentRuntime, Continuation, RunStatus
from conductor_agents.testing import ToolCall, listener_policy

from ..helpers import eventually, push_raw, listener as make_listener
from .crash_child import FileActionTools, read_actions
from .support import Child, kill_all

pytestmark = pytest.mark.reliability


def act_on(payload: dict) -> ToolCall:
    return ToolCall("act", {"action": payload["action"], "tag": payload.get("tag", "")})


def push(base: str, execution_id: str, action: str) -> None:
    response = push_raw(base, execution_id, {"action": action})
    assert response.status_code == 200, (response.status_code, response.text)


# The default wait (human) on both topologies; the older pull on one node only (on the cluster it cost a minute of the
# suite and proved what the single node proves for it).
@pytest.mark.parametrize(("topology", "wait"), [("single", "pull"), ("single", "human"), ("cluster", "human")],
                         indirect=["topology"])
def test_a_process_killed_mid_forward_leaves_nothing_lost_or_twice(agent_settings, scripted_llm, unique_name, tmp_path,
                                                                   wait):
    """Raw pushes to the mailbox's id. Child 1 is killed right after its forward pushed a message (before the
    forward task completed); this process resumes the listener: the forward is delivered again, finds that
    message already taken by the listener and does not push it twice. Child 2 is killed right before a push
    (its mark written); the next resume pushes that message once. Messages pushed while nobody served are
    forwarded too, and the listener is continued meanwhile (a switch every two turns). "Pushed" is the forward's
    hand-over of whichever kind the listener waits in: sent on into its run (``pull``), or its ``HUMAN`` wait
    completed with the message (``human``): ``crash_child.crash_in_forward`` kills at either."""
    agent_settings = attrs.evolve(agent_settings, listener_wait=wait)
    base = agent_settings.server_url
    model = scripted_llm.script(policy=listener_policy(act_on))
    name = unique_name("fwdcrash")
    log = str(tmp_path / "actions.jsonl")
    common = ["--server-url", base, "--name", name, "--model", model, "--log", log, "--continue-every", "2",
              "--listener-wait", wait]
    tools = FileActionTools(log)
    agent = make_listener(name, model, tools, batch_size=5, continuation=Continuation(max_turns=2))
    sent: "list[str]" = []

    def acted(count: int) -> None:
        eventually(lambda: len(read_actions(log)) >= count, timeout=90, interval=0.1,
                   message=f"{count} messages acted on")

    first = Child([*common, "--start", "--crash-in-forward"], stderr_path=str(tmp_path / "first.err"))
    try:
        execution_id = first.read_info(timeout=60)["execution_id"]
        for i in range(3):
            sent.append(f"before-{i}")
            push(base, execution_id, sent[-1])
            acted(len(sent))
        sent.append("crash-after-push")
        push(base, execution_id, sent[-1])
        eventually(lambda: first.proc.poll() is not None, timeout=60, interval=0.1, message="the crash mid-forward")
        assert "killed in the forward after pushing" in first.stderr_tail()
    finally:
        kill_all([first])
    sent.append("while-nobody-serves")
    push(base, execution_id, sent[-1])  # waits in the mailbox behind the forward the dead process held

    with AgentRuntime(agent_settings) as resumer:
        handle = resumer.resume(execution_id, agent, force=True)
        acted(len(sent))
        for i in range(2):
            sent.append(f"after-first-{i}")
            push(base, execution_id, sent[-1])
            acted(len(sent))
        assert handle.execution_id == execution_id

    second = Child([*common, "--resume", execution_id, "--crash-in-forward"], stderr_path=str(tmp_path / "second.err"))
    try:
        second.read_info(timeout=60)
        sent.append("crash-before-push")
        push(base, execution_id, sent[-1])
        eventually(lambda: second.proc.poll() is not None, timeout=60, interval=0.1, message="the crash before a push")
        assert "killed in the forward before pushing" in second.stderr_tail()
    finally:
        kill_all([second])

    with AgentRuntime(agent_settings) as resumer:
        handle = resumer.resume(execution_id, agent, force=True)
        acted(len(sent))
        sent.append("last")
        push(base, execution_id, sent[-1])
        acted(len(sent))
        handle.stop()
        result = handle.wait(timeout=60)
    assert result.status is RunStatus.COMPLETED and result.execution_id == execution_id
    assert result.runs >= 3, result.runs
    counts = collections.Counter(a["action"] for a in read_actions(log))
    assert sorted(counts) == sorted(sent) and set(counts.values()) == {1}, counts
