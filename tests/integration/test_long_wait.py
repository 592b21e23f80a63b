"""A listener that has waited a long time still acts on a message at once.

The join after a waiting ``WaitForMessageTool`` re-checks at a growing interval once it has
been checked ``systemTaskPostponeThreshold`` times (200 by default: a few minutes of
waiting), up to ``systemTaskWorkerCallbackDuration``. The server's default of 30 s made a
listener idle for five minutes take 10-30 s to act on a message; ``LocalServer`` caps it at
1 s. This server starts the backoff at the first check, so minutes of waiting take seconds. That is the
server's wait for messages (``listener_wait="pull"``); a listener that waits on a ``HUMAN`` task (``listener_wait="human"``) has
its join parked by its serving process instead, and woken when its wait is answered.
"""

from __future__ import annotations

import logging
import threading

import attrs
import pytest
import requests

from conductor_agents import Agent, AgentRuntime, AgentSettings, WaitForMessageTool, tool
from conductor_agents._common.task_names import is_message_wait
from conductor_agents._listener.parking import PARK_SECONDS
from conductor_agents.testing import ToolCall, listener_policy

from ..helpers import eventually
from .test_human_wait import _held

pytestmark = pytest.mark.integration

class Stack:
    def __init__(self, server, llm) -> None:
        self.url, self.llm = server.url, llm
        self.settings = AgentSettings.from_env(environ={}, server_url=server.url)


@pytest.fixture
def stack(restartable_servers, scripted_llm) -> Stack:
    """A server started with ``conductor.app.systemTaskPostponeThreshold=0`` (the restart tests'
    shared one: each JVM start costs 20-50 s here)."""
    server = restartable_servers.get("sqlite")
    assert "-Dconductor.app.systemTaskPostponeThreshold=0" in server.log_path.read_text()
    return Stack(server, scripted_llm)


class Listener:
    """A listener that acts on each message with ``act``."""

    def __init__(self, llm, name: str) -> None:
        self.seen: list = []
        self.done = threading.Event()

        @tool
        def act(note: str) -> dict:
            """Act on a message."""
            self.seen.append(note)
            self.done.set()
            return {"ok": note}

        self.model = llm.script(policy=listener_policy(lambda p: ToolCall("act", {"note": p["note"]})))
        receive = WaitForMessageTool.create(name="wait_for_message", description="Wait for the next message.")
        self.agent = Agent(name=name, model=self.model, stateful=True, max_turns=100,
                           tools=[receive, act], instructions="Wait for messages and act on each.")


def test_the_join_after_a_long_wait_never_backs_off_past_one_second(stack):
    listening = Listener(stack.llm, "long_wait_listener")
    agent, seen, done = listening.agent, listening.seen, listening.done
    http = requests.Session()
    with AgentRuntime(attrs.evolve(stack.settings, listener_wait="pull")) as runtime:  # the server's own wait
        handle = runtime.start(agent, "Listen.")

        def waiting_join() -> "dict | None":
            tasks = http.get(f"{stack.url}/workflow/{handle.current_execution_id}", params={"includeTasks": "true"},
                             timeout=10).json()["tasks"]
            joins = [t for t in tasks if t["taskType"] == "JOIN" and t["status"] == "IN_PROGRESS"]
            return joins[0] if joins and joins[0]["pollCount"] >= 8 else None

        # Eight checks in: without the cap the server would now wait 2-4 s between checks, growing to 30 s.
        join = eventually(waiting_join, timeout=60, interval=0.5, message="the join was never checked 8 times")
        assert join["callbackAfterSeconds"] <= 1, join

        handle.send_message({"note": "after a long wait"})
        assert done.wait(30), "the listener never acted on the message"
        assert seen == ["after a long wait"]
        handle.cancel()
    http.close()


def test_a_listener_waiting_on_a_human_task_keeps_its_join_parked_and_still_acts_on_a_message_at_once(stack, caplog):
    """``listener_wait="human"``: the join around the wait is parked (this server would otherwise back it off from
    its first check), not evaluated while it waits, and the answer of the wait wakes it: on this server a parked join
    nobody woke would wait out its park (an hour)."""
    caplog.set_level(logging.DEBUG, logger="conductor_agents.continuation")  # a failure shows each park's story
    listening = Listener(stack.llm, "long_wait_human_listener")
    http = requests.Session()
    with AgentRuntime(attrs.evolve(stack.settings, listener_wait="human")) as runtime:
        handle = runtime.start(listening.agent, "Listen.")

        def parked_join() -> "dict | None":
            tasks = http.get(f"{stack.url}/workflow/{handle.current_execution_id}", params={"includeTasks": "true"},
                             timeout=10).json()["tasks"]
            waits = [t for t in tasks if is_message_wait(t) and t["status"] == "IN_PROGRESS"]
            joins = [t for t in tasks if t["taskType"] == "JOIN" and t["status"] == "IN_PROGRESS"]
            if not (waits and joins and waits[0]["taskType"] == "HUMAN"):
                return None
            return joins[-1] if joins[-1]["callbackAfterSeconds"] == PARK_SECONDS else None

        join = eventually(parked_join, timeout=60, interval=0.5, message="the join parked")

        eventually(lambda: _held(stack.url, join["taskId"]), timeout=120, interval=0.1,  # loaded: over a minute seen
                   message="the join parked for good")

        handle.send_message({"note": "after a long wait"})
        assert listening.done.wait(30), "the listener never acted on the message"
        assert listening.seen == ["after a long wait"]
        handle.cancel()
    http.close()
