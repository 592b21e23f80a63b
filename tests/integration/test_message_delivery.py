"""``wait_delivered``: a sender finds out whether its message reached the run, on the real server.

Delivered (alone, in a batch, from another runtime), lost because the run ended first, and the
CLI's ``send --wait-delivered`` with its exit codes. The loss across a server restart is in
tests/reliability/test_message_delivery_restart.py.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import threading

import attrs
import pytest

from conductor_agents import AgentRuntime, MessageLostError, RunStatus, WaitTimeoutError, tool
from conductor_agents._common.task_names import FORWARD_TASK, is_message_wait
from conductor_agents.testing import ToolCall, listener_policy

from ..helpers import eventually, listener
from ..reliability.support import current_run, server_get, workflow
from .test_cli_agents import Cli, cli  # noqa: F401 (the fixture)

pytestmark = pytest.mark.integration


def act_on(payload: dict) -> ToolCall:
    return ToolCall("act", {"action": payload["action"]})


class HeldTools:
    """``act("hold")`` blocks until the test opens the gate; other actions return at once."""

    def __init__(self) -> None:
        self.actions: list = []
        self.lock = threading.Lock()
        self.holding = threading.Event()
        self.gate = threading.Event()

    @tool
    def act(self, action: str) -> dict:
        """Carry out an action requested by an external message."""
        if action == "hold":
            self.holding.set()
            if not self.gate.wait(900):  # bounded: every test opens it (one after a server restart)
                raise TimeoutError("the gate was never opened")
        with self.lock:
            self.actions.append(action)
        return {"done": action}


@pytest.fixture
def tools():
    held = HeldTools()
    yield held
    held.gate.set()


def message_waits(base_url: str, execution_id: str) -> "list[dict]":
    """The waits for messages of a run, of either kind (``listener_wait`` "pull" or "human")."""
    return [t for t in workflow(base_url, execution_id).get("tasks") or () if is_message_wait(t)]


def waiting_idle(base_url: str, execution_id: str) -> bool:
    """Whether the listener's current run waits for a message, with no ``act`` call pending or running."""
    tasks = workflow(base_url, current_run(base_url, execution_id)).get("tasks") or ()
    if any(t.get("taskType") == "act" and t.get("status") in ("SCHEDULED", "IN_PROGRESS") for t in tasks):
        return False
    waits = [t for t in tasks if is_message_wait(t)]
    return bool(waits) and waits[-1].get("status") == "IN_PROGRESS"


def test_a_pulled_message_is_reported_delivered(agent_runtime, scripted_llm, unique_name, tools):
    model = scripted_llm.script(policy=listener_policy(act_on))
    handle = agent_runtime.start(listener(unique_name("delivered"), model, tools), "Start listening.")
    message_id = handle.send_message({"action": "report"})
    delivery = handle.wait_delivered(message_id, timeout=60)
    # The run that pulled it: the listener's current run (the id callers hold is its mailbox).
    assert delivery.message_id == message_id and delivery.execution_id == handle.current_execution_id
    pulled = [t for t in message_waits(agent_runtime.settings.server_url, handle.current_execution_id)
              if t["taskId"] == delivery.task_id]
    assert pulled and pulled[0]["referenceTaskName"] == delivery.task_reference_name
    assert [m["id"] for m in pulled[0]["outputData"]["messages"]] == [message_id]
    assert delivery.received_at and delivery.batch_count == 1
    eventually(lambda: tools.actions == ["report"], timeout=60, message="the tool ran")
    assert handle.wait_delivered(message_id, timeout=5) == delivery  # asking again: same answer
    handle.stop()
    assert handle.wait(timeout=60).status is RunStatus.COMPLETED
    # After the run ended the delivery is still on record, from another runtime too.
    with AgentRuntime(agent_runtime.settings) as other:
        assert other.wait_delivered(handle.execution_id, message_id, timeout=10) == delivery


@contextlib.contextmanager
def sent_while_busy(settings, wait, scripted_llm, unique_name, tools, after_first=lambda handle: None):
    """A listener (``listener_wait=wait``) sent three messages while busy in a tool: their deliveries, once the
    tool returns (nothing is known while it is busy, and ``wait_delivered`` says so in time); stopped after.
    ``after_first(handle)`` runs between the first of the three and the other two."""
    model = scripted_llm.script(policy=listener_policy(act_on))
    with AgentRuntime(attrs.evolve(settings, listener_wait=wait)) as runtime:
        handle = runtime.start(listener(unique_name("batch"), model, tools, batch_size=5), "Start listening.")
        handle.send_message({"action": "hold"})
        assert tools.holding.wait(60)
        ids = [handle.send_message({"action": "queued-0"})]
        after_first(handle)
        ids += [handle.send_message({"action": f"queued-{n}"}) for n in (1, 2)]
        with pytest.raises(WaitTimeoutError):
            handle.wait_delivered(ids[0], timeout=2)
        tools.gate.set()
        yield [handle.wait_delivered(i, timeout=60) for i in ids]
        handle.stop()
        handle.wait(timeout=60)


def test_messages_pulled_in_one_batch_while_the_run_was_busy(agent_settings, scripted_llm, unique_name, tools):
    """The server's wait for messages (``listener_wait="pull"``): what was pushed into the run while it was busy is
    taken by its next wait, all at once."""
    with sent_while_busy(agent_settings, "pull", scripted_llm, unique_name, tools) as deliveries:
        assert {d.task_id for d in deliveries} == {deliveries[0].task_id}  # one wait task pulled all three
        assert [d.batch_count for d in deliveries] == [3, 3, 3]


def _held_by_a_forward(base_url: str, mailbox_id: str) -> bool:
    """Whether a forward of the mailbox completed holding messages for its busy listener (mailbox version 3)."""
    tasks = server_get(base_url, f"/workflow/{mailbox_id}", includeTasks="true").get("tasks") or ()
    return any(t.get("taskDefName") == FORWARD_TASK and t.get("status") == "COMPLETED"
               and (t.get("outputData") or {}).get("holding") for t in tasks)


def test_messages_sent_while_a_human_wait_listener_was_busy_are_handed_in_order_in_one_batch(
        agent_settings, scripted_llm, unique_name, tools):
    """A listener that waits on a HUMAN task (``listener_wait="human"``): messages sent while it is busy wait in its
    mailbox. The forward that took the first one finds the listener busy and completes holding it; the next rounds'
    forwards are given what was held first, then what their pull took: so the listener's next wait is handed all
    three at once, in the order sent, each once (as the server's own wait takes everything queued)."""
    base = agent_settings.server_url

    def held_first(handle) -> None:
        eventually(lambda: _held_by_a_forward(base, handle.execution_id), timeout=60, message="a forward held it")

    with sent_while_busy(agent_settings, "human", scripted_llm, unique_name, tools, held_first) as deliveries:
        assert {d.task_id for d in deliveries} == {deliveries[0].task_id}  # one wait was handed all three
        assert [d.batch_count for d in deliveries] == [3, 3, 3]
        wait = server_get(base, f"/tasks/{deliveries[0].task_id}")
        assert [m["payload"]["action"] for m in wait["outputData"]["messages"]] == [
            "queued-0", "queued-1", "queued-2"]
        # A batch's messages are acted on by parallel tool calls, in no kept order; each once.
        eventually(lambda: sorted(tools.actions) == ["hold", "queued-0", "queued-1", "queued-2"], timeout=60,
                   message="all acted on")


def test_a_run_that_ends_before_pulling_reports_the_message_lost(agent_runtime, scripted_llm, unique_name, tools):
    model = scripted_llm.script(policy=listener_policy(act_on))
    handle = agent_runtime.start(listener(unique_name("ended"), model, tools), "Start listening.")
    handle.send_message({"action": "hold"})
    assert tools.holding.wait(60)
    message_id = handle.send_message({"action": "never-read"})
    outcome: dict = {}

    def wait_for_it() -> None:
        try:
            outcome["delivery"] = handle.wait_delivered(message_id, timeout=90)
        except Exception as err:  # handed to the test thread
            outcome["error"] = err

    waiter = threading.Thread(target=wait_for_it, name="test-delivery-waiter")
    waiter.start()
    handle.cancel("the test ends the run before it reads its message")
    waiter.join(120)
    assert not waiter.is_alive()
    err = outcome.get("error")
    assert isinstance(err, MessageLostError), outcome
    assert (err.reason, err.run_status, err.message_id, err.execution_id) == (
        MessageLostError.RUN_ENDED, "TERMINATED", message_id, handle.execution_id)
    assert "never-read" not in tools.actions


def test_cli_send_wait_delivered(cli: Cli, agent_runtime, scripted_llm, unique_name, tools):
    model = scripted_llm.script(policy=listener_policy(act_on))
    handle = agent_runtime.start(listener(unique_name("cli-delivery"), model, tools), "Start listening.")
    sent = cli("send", handle.execution_id, '{"action": "from-cli"}', "--wait-delivered", "--timeout", "60")
    assert sent.returncode == 0, sent.stderr
    message_id = sent.stdout.strip()
    # Which run read it, in the user's terms: no internal task name (issue 34, point 12)
    assert f"delivered: run {handle.execution_id} read it" in sent.stderr and "pulled by" not in sent.stderr
    assert agent_runtime.wait_delivered(handle.execution_id, message_id, timeout=5).message_id == message_id

    eventually(lambda: waiting_idle(agent_runtime.settings.server_url, handle.execution_id), timeout=60,
               message="waiting again")
    handle.send_message({"action": "hold"})
    assert tools.holding.wait(60)
    busy = cli("send", handle.execution_id, '{"action": "later"}', "--wait-delivered", "--timeout", "1")
    assert busy.returncode == 5 and "may still arrive" in busy.stderr, busy.stderr

    waiting = subprocess.Popen(
        [sys.executable, "-m", "conductor_agents", "send", handle.execution_id, '{"action": "too-late"}',
         "--wait-delivered", "--timeout", "90"],
        cwd=cli.cwd, env=cli.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert waiting.stdout is not None
        lost_id = waiting.stdout.readline().strip()  # printed before it starts waiting
        assert lost_id
        handle.cancel("the test ends the run before it reads its message")
        _, stderr = waiting.communicate(timeout=120)
    finally:
        if waiting.poll() is None:
            waiting.kill()
            waiting.wait(10)
    assert waiting.returncode == 6, stderr
    assert stderr.startswith("conductor-agents: error: ") and lost_id in stderr and "ended TERMINATED" in stderr
