"""People in the loop across a switch (issue 30, item 3): a request raised in a run that is being continued.

A listener is continued (a new run started, the old one drained, then ended) while the old run waits for a
person. What is proved here: the request is listed for the listener's first id (handle, runtime, the agent's
queue, the CLI) once, ``on_pending`` reports it once, and another process answers it with the listener's
first id (the CLI), exactly once; the switch then comes to rest, the tool ran once, and the listener goes on
to act on later messages. ``Continuation(max_turns=2)`` makes it deterministic: the switch begins at the
second model turn, the one that answers the first message (here: a call that needs approval).
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import threading
from contextlib import redirect_stderr, redirect_stdout
from typing import Optional
from unittest import mock

import attrs
import pytest
import requests

from conductor_agents import (
    Agent,
    AgentRuntime,
    Continuation,
    HumanTool,
    PendingRequest,
    RunStatus,
    ToolContext,
    ToolRegistry,
    WaitForMessageTool,
    tool,
)
from conductor_agents._listener.chain import is_continued
from conductor_agents.cli import main
from conductor_agents.testing import ToolCall, listener_policy

from ..helpers import eventually

pytestmark = pytest.mark.integration


class Ops:
    """A listener's tools: a plain one, one that needs approval, and a question to a person."""

    def __init__(self) -> None:
        self.done: list = []
        self.lock = threading.Lock()

    @tool
    def note(self, text: str, ctx: ToolContext) -> dict:
        """Write a note."""
        with self.lock:
            self.done.append(("note", text))
        return {"noted": text}

    @tool(approval_required=True)
    def deploy(self, version: str, ctx: ToolContext) -> dict:
        """Deploy a version (needs a person's approval)."""
        with self.lock:
            self.done.append(("deploy", version))
        return {"deployed": version}

    def snapshot(self) -> list:
        with self.lock:
            return list(self.done)


ASK = "ask_a_person"


def ops_action(payload: dict) -> ToolCall:
    if payload["do"] == "deploy":
        return ToolCall("deploy", {"version": payload["arg"]})
    if payload["do"] == "ask":
        return ToolCall(ASK, {"question": payload["arg"]})
    return ToolCall("note", {"text": payload["arg"]})


def ops_listener(name: str, model: str, ops: Ops, continuation: Optional[Continuation]) -> Agent:
    return Agent(name=name, model=model, stateful=True, max_turns=10_000, continuation=continuation,
                 tools=[WaitForMessageTool.create(), HumanTool.create(name=ASK), *ToolRegistry.from_instance(ops)],
                 instructions="Listen; act on each message.")


def cli(args: list, settings, timeout: float = 120) -> subprocess.CompletedProcess:
    """A verb of the ``conductor-agents`` command, in a process of its own."""
    env = {**os.environ, "CONDUCTOR_SERVER_URL": settings.server_url}
    return subprocess.run([sys.executable, "-m", "conductor_agents", *args], env=env, capture_output=True,
                          text=True, timeout=timeout)


def cli_here(args: list, settings) -> subprocess.CompletedProcess:
    """The same verb by the CLI's ``main`` in this process: a runtime of its own that holds no handle of the
    listener, as the other process's; it spares an interpreter start and the package's import (seconds on a
    loaded machine) where a loop answers many requests and the first answer came from a process of its own."""
    out, err = io.StringIO(), io.StringIO()
    with mock.patch.dict(os.environ, {"CONDUCTOR_SERVER_URL": settings.server_url}), redirect_stdout(out), \
            redirect_stderr(err):
        code = main([str(arg) for arg in args])
    return subprocess.CompletedProcess(["conductor-agents", *args], code, out.getvalue(), err.getvalue())


def cli_start(args: list, settings) -> subprocess.Popen:
    env = {**os.environ, "CONDUCTOR_SERVER_URL": settings.server_url}
    return subprocess.Popen([sys.executable, "-m", "conductor_agents", *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def run_status(settings, execution_id: str) -> dict:
    response = requests.get(f"{settings.server_url}/workflow/{execution_id}", params={"includeTasks": "false"},
                            timeout=30)
    response.raise_for_status()
    return response.json()


def continued(settings, execution_id: str) -> bool:
    """Whether run ``execution_id`` ended because the listener was continued (its switch came to rest)."""
    flow = run_status(settings, execution_id)
    return flow.get("status") == "TERMINATED" and is_continued(flow.get("reasonForIncompletion"))


def raised_in_switch(runtime: AgentRuntime, handle, kind: str) -> PendingRequest:
    """The one request of ``kind`` the listener waits on, once it is held by a run that is being continued."""
    def found():
        requests_ = [r for r in handle.pending() if r.kind == kind]
        return requests_ if requests_ and handle.status().current_execution_id != requests_[0].held_in else []

    [request] = eventually(found, timeout=120, interval=0.25, message=f"a {kind} held by a run being continued")
    return request


@pytest.mark.both_topologies
def test_an_approval_raised_as_the_listener_is_continued_is_answered_by_its_first_id_from_another_process(
        agent_settings, scripted_llm, unique_name):
    """The switch begins in the turn that asks for approval: the request is listed for the first id once
    (handle, runtime, the agent's queue, the CLI) and reported once; ``conductor-agents approve FIRST_ID``
    answers it; the tool runs once, the switch comes to rest, a second answer is refused, and the listener
    acts on the next message in its new run."""
    settings = attrs.evolve(agent_settings, pending_check_interval_seconds=0.5)
    reported: list = []
    ops = Ops()
    model = scripted_llm.script(policy=listener_policy(ops_action))
    agent = ops_listener(unique_name("ops"), model, ops, Continuation(max_turns=2))
    with AgentRuntime(settings, on_pending=lambda h, r: reported.append((h.execution_id, r))) as runtime:
        handle = runtime.start(agent, "Listen.")
        first = handle.execution_id  # the id callers hold (the listener's mailbox)
        link0 = handle.current_execution_id  # its first run, which holds the request
        handle.send_message({"do": "deploy", "arg": "v2"})
        request = raised_in_switch(runtime, handle, PendingRequest.APPROVAL)
        assert (request.execution_id, request.held_in) == (first, link0)  # named by the id callers hold
        assert [c.name for c in request.tool_calls] == ["deploy"]
        assert runtime.pending(first) == (request,)
        assert runtime.pending_requests(agent) == (request,)  # both runs are running: listed once
        [row] = runtime.running(agent)  # one row for the listener's two running runs, named by its id
        assert (row.execution_id, row.waiting_for) == (first, "person") and row.current_execution_id != link0
        listed = cli(["pending", first, "--json"], settings)
        assert listed.returncode == 0, listed.stderr
        assert [r["taskId"] for r in json.loads(listed.stdout)] == [request.task_id]
        eventually(lambda: reported, timeout=30, message="on_pending was called")
        assert ops.snapshot() == []

        approved = cli(["approve", first, "--by", "ops-oncall", "--json"], settings)
        assert approved.returncode == 0, approved.stderr
        answer = json.loads(approved.stdout)
        assert (answer["approved"], answer["answeredBy"], answer["executionId"], answer["runExecutionId"]) == (
            True, "ops-oncall", first, link0)
        eventually(lambda: ops.snapshot() == [("deploy", "v2")], timeout=60, message="the approved call ran")
        eventually(lambda: continued(settings, link0), timeout=120, interval=0.25, message="the switch at rest")

        again = cli(["approve", first, "--by", "late"], settings)
        assert again.returncode == 3, (again.returncode, again.stderr)  # nothing waits any more
        named = cli(["reject", first, "too late", "--request", request.task_reference_name], settings)
        assert named.returncode == 7 and "ops-oncall" in named.stderr, (named.returncode, named.stderr)

        handle.send_message({"do": "note", "arg": "after"})
        eventually(lambda: ("note", "after") in ops.snapshot(), timeout=120, message="the next message acted on")
        assert ops.snapshot() == [("deploy", "v2"), ("note", "after")]  # the approved call ran once
        assert handle.runs >= 2 and handle.pending() == ()
        assert [(eid, r.execution_id, r.task_id) for eid, r in reported] == [(first, first, request.task_id)]
        handle.stop()
        assert handle.wait(timeout=120).status is RunStatus.COMPLETED
    scripted_llm.assert_no_anomalies(model)


@pytest.mark.both_topologies
def test_a_question_and_racing_answers_across_a_switch_are_taken_once(agent_settings, scripted_llm, unique_name):
    """A HumanTool question raised as the listener is continued is answered with ``conductor-agents respond
    FIRST_ID``; then, in the next run's switch, an approval and a rejection race from two processes by the
    first id: one wins, the other is told (exit 7), and the tool ran exactly when the approval won."""
    ops = Ops()
    model = scripted_llm.script(policy=listener_policy(ops_action))
    agent = ops_listener(unique_name("asker"), model, ops, Continuation(max_turns=2))
    with AgentRuntime(agent_settings) as runtime:
        handle = runtime.start(agent, "Listen.")
        first = handle.execution_id
        handle.send_message({"do": "ask", "arg": "Which colour?"})
        question = raised_in_switch(runtime, handle, PendingRequest.QUESTION)
        assert question.question == "Which colour?"
        answered = cli(["respond", first, "teal", "--by", "carol", "--json"], agent_settings)
        assert answered.returncode == 0, answered.stderr
        assert (json.loads(answered.stdout)["answer"], json.loads(answered.stdout)["executionId"]) == (
            "teal", first)
        assert json.loads(answered.stdout)["runExecutionId"] == question.held_in
        eventually(lambda: continued(agent_settings, question.held_in), timeout=120, interval=0.25,
                   message="the first switch at rest")
        outputs = [o for r in scripted_llm.requests_for(model) for o in r.tool_outputs if o.answer is not None]
        assert [o.answer for o in outputs] == ["teal"]

        # The new run's second turn begins its own switch: the deploy asks for approval in it.
        handle.send_message({"do": "deploy", "arg": "v3"})
        request = raised_in_switch(runtime, handle, PendingRequest.APPROVAL)
        assert request.held_in != question.held_in and request.execution_id == question.execution_id == first
        ref = request.task_reference_name
        racers = [cli_start(["approve", first, "--by", "yes", "--request", ref], agent_settings),
                  cli_start(["reject", first, "no", "--by", "no", "--request", ref], agent_settings)]
        codes = []
        for process in racers:
            try:
                process.communicate(timeout=120)
            finally:
                process.kill()
            codes.append(process.returncode)
        assert sorted(codes) == [0, 7], codes
        approved = codes[0] == 0
        eventually(lambda: continued(agent_settings, request.held_in), timeout=120, interval=0.25,
                   message="the second switch at rest")
        handle.send_message({"do": "note", "arg": "after"})
        eventually(lambda: ("note", "after") in ops.snapshot(), timeout=120, message="the next message acted on")
        assert ops.snapshot() == ([("deploy", "v3")] if approved else []) + [("note", "after")]
        handle.stop()
        assert handle.wait(timeout=120).status is RunStatus.COMPLETED
    scripted_llm.assert_no_anomalies(model)


@pytest.mark.both_topologies
def test_approvals_at_the_default_budget_are_answered_by_the_first_id_across_switches(
        agent_settings, scripted_llm, unique_name):
    """The default continuation budget, messages of 2 KB, each a deploy that the CLI approves by the listener's
    first id (the first from another process, the later ones by its ``main`` here: ``cli_here``): the listener
    is continued every few turns, some approvals are raised in a run being continued, and every one is answered
    and runs once. The server's wait for messages (``listener_wait="pull"``): a message sent as a switch begins
    may be taken by the run being continued."""
    approvals_across_switches(attrs.evolve(agent_settings, listener_wait="pull"), scripted_llm,
                              unique_name("budget"), raised_in_a_switch=2)


@pytest.mark.both_topologies
def test_approvals_at_the_default_budget_are_answered_by_the_first_id_across_switches_of_a_human_wait_listener(
        agent_settings, scripted_llm, unique_name):
    """The same with ``listener_wait="human"``: every approval is answered by the first id, in the run that raised
    it, and runs once, across switches. Its mailbox hands a message only to the newest run, so a run being continued
    takes none, and here every switch begins after a deploy ran; an approval raised as such a listener is continued
    is in ``test_an_approval_raised_as_the_listener_is_continued_...`` (the switch begins in the deploy's turn)."""
    approvals_across_switches(attrs.evolve(agent_settings, listener_wait="human"), scripted_llm,
                              unique_name("budget_human"), raised_in_a_switch=0)


def approvals_across_switches(settings, scripted_llm, name: str, *, raised_in_a_switch: int) -> None:
    """Deploys approved by the first id until the listener has three runs and ``raised_in_a_switch`` approvals were
    held by a run being continued; then a note, and a stop."""
    ops = Ops()
    model = scripted_llm.script(policy=listener_policy(ops_action))
    agent = ops_listener(name, model, ops, None)
    with AgentRuntime(settings) as runtime:
        handle = runtime.start(agent, "Listen.")
        first = handle.execution_id
        across, expected = 0, []
        while (across < raised_in_a_switch) if raised_in_a_switch else (handle.runs < 3):
            assert len(expected) < 40, f"{across} approvals raised during a switch, {handle.runs} runs in " \
                                       f"{len(expected)} messages"
            expected.append(("deploy", f"v{len(expected)}-" + "x" * 2_000))
            handle.send_message({"do": "deploy", "arg": expected[-1][1]})
            request = eventually(lambda: handle.pending(), timeout=120, interval=0.2, message="a pending approval")[0]
            if handle.status().current_execution_id != request.held_in:
                across += 1  # held by a run that is being continued
            # The first answer from a process of its own, the later ones by the same CLI in this process.
            approved = (cli_here if expected[:-1] else cli)(["approve", first, "--json"], settings)
            assert approved.returncode == 0, approved.stderr
            answer = json.loads(approved.stdout)
            assert (answer["executionId"], answer["runExecutionId"]) == (first, request.held_in)
            eventually(lambda: ops.snapshot() == expected, timeout=120, interval=0.1, message="the deploy ran")
        assert handle.runs >= 3
        handle.send_message({"do": "note", "arg": "after"})
        eventually(lambda: ("note", "after") in ops.snapshot(), timeout=120, message="the next message acted on")
        assert ops.snapshot() == expected + [("note", "after")]
        handle.stop()
        assert handle.wait(timeout=120).status is RunStatus.COMPLETED
    scripted_llm.assert_no_anomalies(model)
