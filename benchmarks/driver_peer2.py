"""Drives the official peer SDK (``conductor-python`` 2.0.0, ``conductor.ai.agents``) through ``_scenarios.py``.

Run by ``benchmarks/server_share.py`` with the interpreter of ``benchmarks/.venv-peer2``.

Its tool workers run with ``CONDUCTOR_WORKER_ISOLATION=thread`` (a thread per (tool, domain)
instead of a process): the requests the server sees are the same (each worker polls its task
type on its run's domain every ``worker_poll_interval_ms``, 100 ms by default), and a process per
listener would hold gigabytes at N=50 on this machine.
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("CONDUCTOR_WORKER_ISOLATION", "thread")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _scenarios  # noqa: E402

from conductor.ai.agents import Agent, AgentRuntime, tool, wait_for_message_tool  # noqa: E402
from conductor.ai.agents.runtime.config import AgentConfig  # noqa: E402
from conductor.client.configuration.configuration import Configuration  # noqa: E402


@tool
def bench_act_peer2(key: str = "") -> dict:
    """Benchmark tool: acts on a message."""
    _scenarios.record_entry(key)
    return {"ok": key}


class Peer2Adapter:
    def __init__(self, cfg: dict) -> None:
        self.runtime = AgentRuntime(Configuration(server_api_url=cfg["server_url"]),
                                    settings=AgentConfig(streaming_enabled=False))
        self.receive = wait_for_message_tool(
            name="wait_for_message", description="Wait for the next external messages, then return them.")

    def start_listener(self, model: str) -> str:
        agent = Agent(name="bench_listen_peer2", model=model, stateful=True, max_turns=10_000,
                      tools=[self.receive, bench_act_peer2],
                      instructions="Loop: wait_for_message, act on it, repeat until told to stop.")
        return self.runtime.start(agent, "Start listening.").execution_id

    def send(self, execution_id: str, payload: dict) -> None:
        self.runtime.send_message(execution_id, payload)

    def close(self) -> None:
        self.runtime.shutdown()


if __name__ == "__main__":
    raise SystemExit(_scenarios.main(Peer2Adapter))
