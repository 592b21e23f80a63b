"""A listener that has waited a long time still acts on a message at once.

The join after a waiting ``WaitForMessageTool`` re-checks at a growing interval once it has
been checked ``systemTaskPostponeThreshold`` times (200 by default: a few minutes of
waiting), up to ``systemTaskWorkerCallbackDuration``. The server's default of 30 s made a
listener idle for five minutes take 10-30 s to act on a message; ``LocalServer`` caps it at
1 s. This server starts the backoff at the first check, so minutes of waiting take seconds.
"""

from __future__ import annotations

import threading

import pytest
import requests

from conductor_agents import Agent, AgentRuntime, AgentSettings, WaitForMessageTool, tool
from conductor_agents.testing import ToolCall, listener_policy

from ..helpers import eventually

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


def test_the_join_after_a_long_wait_never_backs_off_past_one_second(stack):
    seen: list = []
    done = threading.Event()

    @tool
    def act(note: str) -> dict:
        """Act on a message."""
        seen.append(note)
        done.set()
        return {"ok": note}

    model = stack.llm.script(policy=listener_policy(lambda p: ToolCall("act", {"note": p["note"]})))
    receive = WaitForMessageTool.create(name="wait_for_message", description="Wait for the next message.")
    agent = Agent(name="long_wait_listener", model=model, stateful=True, max_turns=100, tools=[receive, act],
                  instructions="Wait for messages and act on each.")
    http = requests.Session()
    with AgentRuntime(stack.settings) as runtime:
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
