"""Where the time of a listener's answer goes, stage by stage, on the server's clock.

    .venv/bin/python benchmarks/answer_stages.py --runs 200 --rate 10 --idle 30
    .venv/bin/python benchmarks/answer_stages.py --runs 200 --property conductor.app.systemTaskWorkerThreadCount=16

Starts ``--runs`` listeners of this SDK on a fresh local server (with the given server
properties), lets them idle, sends one message to each at ``--rate`` per second, then reads
every run's tasks and prints, per stage, p50/p95/max in ms:

  message check   message sent → the wait-for-message task completes (server: rechecked once a second)
  join + state    → the turn task is scheduled (server: the join after the wait, state tasks)
  turn pickup     → the turn task starts (this SDK: the ``before_model`` callback of a continued listener)
  turn done       → the turn task ends (this SDK)
  turn → LLM      → the next LLM task is scheduled (server)
  LLM queue       → the LLM task starts (server: system-task queue)
  LLM call        → the LLM task ends (the scripted model)
  tool scheduled  → the tool task is scheduled (server: the fork)
  pickup          → the tool task starts (this SDK)
  tool → joined   the tool task ends → its fork's JOIN completes (server), after the answer

Only the turn stages and the pickup involve the SDK (a listener without continuation has no turn task:
its join + state then runs to the LLM task). Used to find what limits the live-runs scenario
of ``run.py``; not part of ``make bench``.
"""

from __future__ import annotations

import argparse
import collections
import importlib
import os
import re
import shutil
import sys
import tempfile
import threading
import time
from typing import Dict, List, Optional

import attrs
import requests

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import _jvm  # noqa: E402
import _procs  # noqa: E402
from conductor_agents import Agent, AgentRuntime, Continuation, WaitForMessageTool, tool  # noqa: E402
from conductor_agents._common.task_names import TURN_TASK, is_message_wait  # noqa: E402
from conductor_agents.testing import LocalStack, ToolCall, listener_policy  # noqa: E402

STAGES = ("message check", "join + state", "turn pickup", "turn done", "turn → LLM", "LLM queue", "LLM call",
          "tool scheduled", "pickup", "whole answer")


def print_tally(counts: "collections.Counter[str]", seconds: float) -> None:
    total = sum(counts.values())
    print(f"the SDK's requests: {total / seconds:.1f} a second", flush=True)
    for path, n in counts.most_common(12):
        print(f"  {n / seconds:8.2f}/s  {path}", flush=True)


_ID = re.compile(r"/[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}|/[0-9a-f]{32}")


class RequestTally:
    """Counts the SDK's requests by method and path (ids made ``{id}``), for ``--tally``: what an idle fleet sends."""

    def __init__(self) -> None:
        self.counts: "collections.Counter[str]" = collections.Counter()
        self.lock = threading.Lock()
        transport = importlib.import_module("conductor_agents._wire.transport").Transport
        sent, direct = transport._send, transport._direct_get
        tally = self

        def counted_send(self, method, path, *args, **kwargs):  # type: ignore[no-untyped-def]
            tally.note(method, path)
            return sent(self, method, path, *args, **kwargs)

        def counted_direct(self, direct_gets, path, *args, **kwargs):  # type: ignore[no-untyped-def]
            tally.note("GET", path)
            return direct(self, direct_gets, path, *args, **kwargs)

        transport._send, transport._direct_get = counted_send, counted_direct

    def note(self, method: str, path: str) -> None:
        with self.lock:
            self.counts[f"{method} {_ID.sub('/{id}', path)}"] += 1

    def snapshot(self) -> "collections.Counter[str]":
        with self.lock:
            return collections.Counter(self.counts)


@tool
def stage_act(key: str = "") -> dict:
    """Act on a message."""
    return {"ok": key}


def parse_args(argv: List[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=200)
    p.add_argument("--rate", type=float, default=10.0, help="messages per second (one per run)")
    p.add_argument("--idle", type=float, default=30.0, help="seconds between the last start and the first message")
    p.add_argument("--mailbox-check-max", type=int, default=None,
                   help="AgentSettings.mailbox_check_max_seconds (30: the checks of an idle mailbox never spread out)")
    p.add_argument("--settle", type=float, default=None,
                   help="seconds of the idle window left out of its measure, or before --profile begins "
                        "(default: a third of it, at most 10; before a profile, half of it, at most 10)")
    p.add_argument("--tally", action="store_true",
                   help="count the SDK's requests by path over the idle measure (or the profile) and print the rates")
    p.add_argument("--property", action="append", default=[], metavar="KEY=VALUE", help="a server property")
    p.add_argument("--no-mailbox", action="store_true", help="listeners without a mailbox (Continuation(mailbox=False))")
    p.add_argument("--listener-wait", choices=("human", "pull"), default=None,
                   help="what the listeners wait in (AgentSettings.listener_wait; default: the SDK's)")
    p.add_argument("--baseline", type=float, default=15.0, metavar="SECONDS",
                   help="the empty server's CPU is read for this long before the listeners start (after as long again)")
    p.add_argument("--profile", type=float, default=0.0, metavar="SECONDS",
                   help="sample the server's threads and stacks for this long in the idle window (_jvm.py)")
    return p.parse_args(argv)


def stages_of(tasks: List[dict], sent_ms: float) -> Dict[str, Optional[float]]:
    """The stage durations of the answer to the message sent at ``sent_ms`` (None where missing)."""
    def first(kind: str, after: float, key: str = "scheduledTime") -> Optional[dict]:
        found = [t for t in tasks if t["taskType"] == kind and (t.get(key) or 0) >= after]
        return min(found, key=lambda t: t[key]) if found else None

    wait = next((t for t in tasks if is_message_wait(t) and (t.get("endTime") or 0) >= sent_ms), None)
    llm = first("LLM_CHAT_COMPLETE", wait["endTime"]) if wait else None
    act = first("stage_act", llm["endTime"]) if llm and llm.get("endTime") else None
    turn = first(TURN_TASK, wait["endTime"]) if wait else None
    if turn is not None and llm is not None and (turn.get("endTime") or 0) > llm["scheduledTime"]:
        turn = None  # not this answer's
    turn_marks = [turn["scheduledTime"], turn.get("startTime"), turn.get("endTime")] if turn else [None, None, None]
    marks = [sent_ms, wait and wait.get("endTime"), *turn_marks, llm and llm["scheduledTime"], llm and llm.get("startTime"),
             llm and llm.get("endTime"), act and act["scheduledTime"], act and act.get("startTime")]
    out: Dict[str, Optional[float]] = {}
    for name, a, b in zip(STAGES, marks, marks[1:]):
        out[name] = None if a is None or b is None else float(b - a)
    if turn is None and marks[1] is not None and marks[5] is not None:
        out["join + state"] = float(marks[5] - marks[1])
    out["whole answer"] = None if marks[-1] is None else float(marks[-1] - sent_ms)
    # After the answer: the tool's fork is joined (a JOIN is rechecked by the server's system task worker).
    suffix = act["referenceTaskName"].rsplit("__", 1)[-1] if act else None
    join = next((t for t in tasks if t["taskType"] == "JOIN" and suffix
                 and t["referenceTaskName"].endswith(f"__{suffix}")), None)
    out["tool → joined"] = (float(join["endTime"] - act["endTime"])
                            if join and join.get("endTime") and act.get("endTime") else None)
    return out


def evaluation_counts(http: requests.Session, url: str, ids: List[str]) -> Dict[str, int]:
    """Evaluations so far (``pollCount``) of the waiting system tasks of runs ``ids``, by task type."""
    out: Dict[str, int] = {}
    for eid in ids:
        tasks = http.get(f"{url}/workflow/{eid}", params={"includeTasks": "true"}, timeout=30).json().get("tasks", [])
        for t in tasks:
            if t.get("status") == "IN_PROGRESS" and (t.get("taskType") == "JOIN" or is_message_wait(t)):
                out[t["taskType"]] = out.get(t["taskType"], 0) + int(t.get("pollCount") or 0)
    return out


def print_evaluations(before: Dict[str, Dict[str, int]], after: Dict[str, Dict[str, int]], seconds: float,
                      listeners: int) -> None:
    print(f"server evaluations per second in the window, per listener ({listeners} listeners):")
    for kind in before:
        for task_type in sorted(set(before[kind]) | set(after[kind])):
            rate = (after[kind].get(task_type, 0) - before[kind].get(task_type, 0)) / seconds / listeners
            print(f"  {kind:9s} {task_type:24s} {rate:5.2f}")


def main(argv: List[str]) -> int:
    args = parse_args(argv)
    properties = dict(item.split("=", 1) for item in args.property)
    data_dir = tempfile.mkdtemp(prefix="conductor-agents-stages-")
    try:
        with LocalStack(data_dir, properties=properties) as stack:
            model = stack.llm.script(policy=listener_policy(lambda p: ToolCall("stage_act", {"key": p["key"]})))
            receive = WaitForMessageTool.create(name="wait_for_message", description="Wait for the next message.")
            agent = Agent(name="stages_listener", model=model, stateful=True, max_turns=10_000,
                          tools=[receive, stage_act], instructions="Wait for messages and act on each.",
                          continuation=Continuation(mailbox=False) if args.no_mailbox else None)
            settings = stack.settings
            if args.listener_wait:
                settings = attrs.evolve(settings, listener_wait=args.listener_wait)
            if args.mailbox_check_max is not None:
                settings = attrs.evolve(settings, mailbox_check_max_seconds=args.mailbox_check_max)
            server_pids = _procs.tree(stack.server.pid)
            time.sleep(args.baseline)  # the JVM's warm-up after the start is not the empty server's cost
            cpu_before, base_began = _procs.cpu_seconds(server_pids), time.monotonic()
            time.sleep(args.baseline)
            base_share = _procs.cpu_delta(cpu_before, _procs.cpu_seconds(server_pids)) / (time.monotonic() - base_began)
            print(f"empty server: {100 * base_share:.1f} % of a core ({args.baseline:.0f} s)", flush=True)
            tally = RequestTally() if args.tally else None
            with AgentRuntime(settings) as runtime, requests.Session() as http:
                began = time.monotonic()
                handles = [runtime.start(agent, "Listen.") for _ in range(args.runs)]
                ids = [h.execution_id for h in handles]
                print(f"started {len(ids)} runs in {time.monotonic() - began:.1f}s; idle {args.idle:.0f}s", flush=True)
                if args.profile:
                    idle_end = time.monotonic() + args.idle
                    time.sleep(min(args.idle / 2, 10.0) if args.settle is None else min(args.settle, args.idle / 2))
                    sample = [(handle.current_execution_id, handle.execution_id) for handle in handles[:20]]

                    def counts() -> Dict[str, Dict[str, int]]:
                        return {"listener": evaluation_counts(http, stack.url, [a for a, _ in sample]),
                                "mailbox": evaluation_counts(http, stack.url, [b for a, b in sample if b != a])}
                    before, began = counts(), time.monotonic()
                    tallied = tally.snapshot() if tally else None
                    _jvm.main([str(stack.server.pid), str(args.profile)])
                    after, took = counts(), time.monotonic() - began
                    if tally and tallied is not None:
                        print_tally(tally.snapshot() - tallied, took)
                    print_evaluations(before, after, took, len(sample))
                    time.sleep(max(0.0, idle_end - time.monotonic()))
                else:
                    settle = min(10.0, args.idle / 3) if args.settle is None else min(args.settle, args.idle - 1.0)
                    time.sleep(settle)
                    cpu_before, idle_began = _procs.cpu_seconds(server_pids), time.monotonic()
                    tallied = tally.snapshot() if tally else None
                    idle_end = idle_began + args.idle - settle
                    while time.monotonic() < idle_end - 1.0:  # a share per minute: how it moves as the wait lasts
                        slice_cpu, slice_began = _procs.cpu_seconds(server_pids), time.monotonic()
                        time.sleep(min(60.0, idle_end - slice_began))
                        slice_share = (_procs.cpu_delta(slice_cpu, _procs.cpu_seconds(server_pids))
                                       / (time.monotonic() - slice_began))
                        print(f"  idle {slice_began - began:.0f}-{time.monotonic() - began:.0f} s after the first "
                              f"start: {100 * slice_share:.1f} % of a core", flush=True)
                    share = _procs.cpu_delta(cpu_before, _procs.cpu_seconds(server_pids)) / (time.monotonic() - idle_began)
                    print(f"idle server with {len(ids)} listeners: {100 * share:.1f} % of a core "
                          f"({1000 * (share - base_share) / len(ids):.3f} ms per idle listener-second above the empty "
                          f"server's {100 * base_share:.1f} %; the last {args.idle - settle:.0f} s of the idle window)",
                          flush=True)
                    if tally and tallied is not None:
                        print_tally(tally.snapshot() - tallied, time.monotonic() - idle_began)
                sent: Dict[str, float] = {}
                for i, eid in enumerate(ids):
                    time.sleep(max(0.0, (sent[ids[i - 1]] / 1000.0 + 1.0 / args.rate - time.time()) if i else 0.0))
                    sent[eid] = time.time() * 1000.0
                    runtime.send_message(eid, {"key": f"m{i}"})
                time.sleep(min(60.0, 10.0 + args.runs / args.rate))
                rows = []
                for eid, handle in zip(ids, handles):  # the handle's id is the mailbox's: read the listener's run
                    tasks = http.get(f"{stack.url}/workflow/{handle.current_execution_id}", params={"includeTasks": "true"},
                                     timeout=30).json().get("tasks", [])
                    rows.append(stages_of(tasks, sent[eid]))
        print(f"{'stage':16s} {'n':>5s} {'p50':>7s} {'p95':>7s} {'max':>7s}  (ms, server clock)")
        for stage in (*STAGES, "tool → joined"):
            values = sorted(r[stage] for r in rows if r[stage] is not None)
            if values:
                print(f"{stage:16s} {len(values):5d} {values[len(values) // 2]:7.0f} "
                      f"{values[min(len(values) - 1, int(len(values) * 0.95))]:7.0f} {values[-1]:7.0f}")
        return 0
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
