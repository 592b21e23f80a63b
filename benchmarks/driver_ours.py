"""Drives conductor-agents (this repository) through the scenarios of ``_scenarios.py``.

Run by ``benchmarks/run.py`` with the project's interpreter; not meant to be run by hand.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _scenarios  # noqa: E402


def use_code_from(cfg: dict) -> None:
    """``cfg["code"]``: import conductor_agents from that directory instead (e.g. the commit a change
    is measured against, unpacked with ``git archive``), ahead of this checkout's editable install."""
    code = cfg.get("code")
    if code:
        sys.meta_path[:] = [f for f in sys.meta_path if "__editable__" not in getattr(f, "__module__", "")]
        sys.path.insert(0, code)


use_code_from(__import__("json").loads(sys.argv[1]) if len(sys.argv) > 1 else {})

from conductor_agents import Agent, AgentRuntime, AgentSettings, Continuation, WaitForMessageTool, tool  # noqa: E402

#: Whether a listener gets its mailbox (the default); ``--variant nomb:__main__:MAILBOX=false`` measures one
#: without it beside the default, which is what the mailbox's own wait costs the server.
MAILBOX = True


@tool
def bench_tool_ours(i: int = 0) -> dict:
    """Benchmark tool: returns at once."""
    _scenarios.record_entry(f"pick-{i}")
    return {"ok": i}


@tool
def bench_act_ours(key: str = "") -> dict:
    """Benchmark tool: acts on a message."""
    _scenarios.record_entry(key)
    return {"ok": key}


def apply_patches(patches: dict) -> None:
    """Set module constants before the runtime is built: ``{"package.module:NAME": value}`` (a variant
    of ours measured beside the unpatched one, e.g. ``server_share.py --variant``)."""
    import importlib

    for target, value in patches.items():
        module, _, name = target.partition(":")
        mod = importlib.import_module(module)
        if not hasattr(mod, name):
            raise SystemExit(f"--variant: {module} has no {name}")
        setattr(mod, name, value)


#: What its listeners wait in (``AgentSettings.listener_wait``) when set; ``--variant human:__main__:LISTENER_WAIT="human"``
#: measures listeners that wait on a HUMAN task beside the default (issue 42).
LISTENER_WAIT = None


class OursAdapter:
    def __init__(self, cfg: dict) -> None:
        apply_patches(cfg.get("patch") or {})
        wait = {"listener_wait": LISTENER_WAIT} if LISTENER_WAIT else {}
        self.runtime = AgentRuntime(AgentSettings.from_env(server_url=cfg["server_url"], **wait))
        self.receive = WaitForMessageTool.create(
            name="wait_for_message", description="Wait for the next external messages, then return them.",
            batch_size=int(cfg.get("batch", 1)))

    def start_pickup(self, model: str, stateful: bool) -> str:
        agent = Agent(name="bench_pick_ours", model=model, stateful=stateful, max_turns=10_000,
                      tools=[bench_tool_ours], instructions="Call the tool until told otherwise.")
        return self.runtime.start(agent, "Go.").execution_id

    def start_listener(self, model: str) -> str:
        agent = Agent(name="bench_listen_ours", model=model, stateful=True, max_turns=10_000,
                      tools=[self.receive, bench_act_ours], continuation=Continuation(mailbox=MAILBOX),
                      instructions="Loop: wait_for_message, act on it, repeat until told to stop.")
        return self.runtime.start(agent, "Start listening.").execution_id

    def send(self, execution_id: str, payload: dict) -> None:
        self.runtime.send_message(execution_id, payload)

    def status(self, execution_id: str) -> str:
        return self.runtime.attach(execution_id).status().status.value

    def describe(self, execution_id: str) -> dict:
        """How many runs the listener has had, and its current one (for the long-listener scenario)."""
        handle = self.runtime.attach(execution_id)
        return {"runs": handle.runs, "current": handle.current_execution_id}

    def close(self) -> None:
        self.runtime.close()


if __name__ == "__main__":
    raise SystemExit(_scenarios.main(OursAdapter))
