"""Where the time of a listener's answer goes, stage by stage, on the server's clock.

    .venv/bin/python benchmarks/answer_stages.py --runs 200 --rate 10 --idle 30
    .venv/bin/python benchmarks/answer_stages.py --runs 200 --property conductor.app.systemTaskWorkerThreadCount=16

Starts ``--runs`` listeners of this SDK on a fresh local server (with the given server
properties), lets them idle, sends one message to each at ``--rate`` per second, then reads
every run's tasks and prints, per stage, p50/p95/max in ms:

  message check   message sent → the wait-for-message task completes (server: rechecked once a second)
  join + state    → the next LLM task is scheduled (server: the join after the wait, state tasks)
  LLM queue       → the LLM task starts (server: system-task queue)
  LLM call        → the LLM task ends (the scripted model)
  tool scheduled  → the tool task is scheduled (server: the fork)
  pickup          → the tool task starts (this SDK)

Nothing but the last stage involves an SDK. Used to find what limits the live-runs scenario
of ``run.py``; not part of ``make bench``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from typing import Dict, List, Optional

import requests

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from conductor_agents import Agent, AgentRuntime, WaitForMessageTool, tool  # noqa: E402
from conductor_agents.testing import LocalStack, ToolCall, listener_policy  # noqa: E402

STAGES = ("message check", "join + state", "LLM queue", "LLM call", "tool scheduled", "pickup", "whole answer")


@tool
def stage_act(key: str = "") -> dict:
    """Act on a message."""
    return {"ok": key}


def parse_args(argv: List[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=200)
    p.add_argument("--rate", type=float, default=10.0, help="messages per second (one per run)")
    p.add_argument("--idle", type=float, default=30.0, help="seconds between the last start and the first message")
    p.add_argument("--property", action="append", default=[], metavar="KEY=VALUE", help="a server property")
    return p.parse_args(argv)


def stages_of(tasks: List[dict], sent_ms: float) -> Dict[str, Optional[float]]:
    """The stage durations of the answer to the message sent at ``sent_ms`` (None where missing)."""
    def first(kind: str, after: float, key: str = "scheduledTime") -> Optional[dict]:
        found = [t for t in tasks if t["taskType"] == kind and (t.get(key) or 0) >= after]
        return min(found, key=lambda t: t[key]) if found else None

    wait = next((t for t in tasks if t["taskType"] == "PULL_WORKFLOW_MESSAGES" and (t.get("endTime") or 0) >= sent_ms),
                None)
    llm = first("LLM_CHAT_COMPLETE", wait["endTime"]) if wait else None
    act = first("stage_act", llm["endTime"]) if llm and llm.get("endTime") else None
    marks = [sent_ms, wait and wait.get("endTime"), llm and llm["scheduledTime"], llm and llm.get("startTime"),
             llm and llm.get("endTime"), act and act["scheduledTime"], act and act.get("startTime")]
    out: Dict[str, Optional[float]] = {}
    for name, a, b in zip(STAGES, marks, marks[1:]):
        out[name] = None if a is None or b is None else float(b - a)
    out["whole answer"] = None if marks[-1] is None else float(marks[-1] - sent_ms)
    return out


def main(argv: List[str]) -> int:
    args = parse_args(argv)
    properties = dict(item.split("=", 1) for item in args.property)
    data_dir = tempfile.mkdtemp(prefix="conductor-agents-stages-")
    try:
        with LocalStack(data_dir, properties=properties) as stack:
            model = stack.llm.script(policy=listener_policy(lambda p: ToolCall("stage_act", {"key": p["key"]})))
            receive = WaitForMessageTool.create(name="wait_for_message", description="Wait for the next message.")
            agent = Agent(name="stages_listener", model=model, stateful=True, max_turns=10_000,
                          tools=[receive, stage_act], instructions="Wait for messages and act on each.")
            with AgentRuntime(stack.settings) as runtime, requests.Session() as http:
                began = time.monotonic()
                ids = [runtime.start(agent, "Listen.").execution_id for _ in range(args.runs)]
                print(f"started {len(ids)} runs in {time.monotonic() - began:.1f}s; idle {args.idle:.0f}s", flush=True)
                time.sleep(args.idle)
                sent: Dict[str, float] = {}
                for i, eid in enumerate(ids):
                    time.sleep(max(0.0, (sent[ids[i - 1]] / 1000.0 + 1.0 / args.rate - time.time()) if i else 0.0))
                    sent[eid] = time.time() * 1000.0
                    runtime.send_message(eid, {"key": f"m{i}"})
                time.sleep(min(60.0, 10.0 + args.runs / args.rate))
                rows = []
                for eid in ids:
                    tasks = http.get(f"{stack.url}/workflow/{eid}", params={"includeTasks": "true"},
                                     timeout=30).json().get("tasks", [])
                    rows.append(stages_of(tasks, sent[eid]))
        print(f"{'stage':16s} {'n':>5s} {'p50':>7s} {'p95':>7s} {'max':>7s}  (ms, server clock)")
        for stage in STAGES:
            values = sorted(r[stage] for r in rows if r[stage] is not None)
            if values:
                print(f"{stage:16s} {len(values):5d} {values[len(values) // 2]:7.0f} "
                      f"{values[min(len(values) - 1, int(len(values) * 0.95))]:7.0f} {values[-1]:7.0f}")
        return 0
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
