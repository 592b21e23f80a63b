"""Drives the peer SDK (``conductor-agent-sdk`` 0.4.4) through the scenarios of ``_scenarios.py``.

Run by ``benchmarks/run.py`` with the interpreter of ``benchmarks/.venv-peer``.

The peer runs each tool worker as an OS process per (tool, domain), started through
conductor-python's TaskHandler. That module selects the ``spawn`` start method at import,
under which the peer's tool wrappers cannot be pickled (``Can't pickle <function ...>:
attribute lookup ... on conductor.ai.agents.runtime._dispatch failed``); so this driver
selects ``fork`` first, as on the platforms where the peer works out of the box.
"""

from __future__ import annotations

import multiprocessing

multiprocessing.set_start_method("fork")

import os  # noqa: E402
import sys  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _scenarios  # noqa: E402

from conductor.ai.agents import Agent, AgentRuntime, tool, wait_for_message_tool  # noqa: E402
from conductor.ai.agents.runtime.config import AgentConfig  # noqa: E402


@tool
def bench_tool_peer(i: int = 0) -> dict:
    """Benchmark tool: returns at once."""
    _scenarios.record_entry(f"pick-{i}")
    return {"ok": i}


@tool
def bench_act_peer(key: str = "") -> dict:
    """Benchmark tool: acts on a message."""
    _scenarios.record_entry(key)
    return {"ok": key}


class PeerAdapter:
    def __init__(self, cfg: dict) -> None:
        config = AgentConfig(server_url=cfg["server_url"], auto_start_server=False, log_level="WARNING")
        self.runtime = AgentRuntime(config=config)
        self.receive = wait_for_message_tool(
            name="wait_for_message", description="Wait for the next external message, then return its content.")

    def start_pickup(self, model: str, stateful: bool) -> str:
        agent = Agent(name="bench_pick_peer", model=model, stateful=stateful, max_turns=10_000,
                      tools=[bench_tool_peer], instructions="Call the tool until told otherwise.")
        return self.runtime.start(agent, "Go.").execution_id

    def start_listener(self, model: str) -> str:
        agent = Agent(name="bench_listen_peer", model=model, stateful=True, max_turns=10_000,
                      tools=[self.receive, bench_act_peer],
                      instructions="Loop: wait_for_message, act on it, repeat until told to stop.")
        return self.runtime.start(agent, "Start listening.").execution_id

    def send(self, execution_id: str, payload: dict) -> None:
        self.runtime.send_message(execution_id, payload)

    def close(self) -> None:
        self.runtime.shutdown()


if __name__ == "__main__":
    raise SystemExit(_scenarios.main(PeerAdapter))
