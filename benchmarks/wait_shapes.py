"""A listener's wait in the agent's own shape, by kind of wait: server CPU while idle, and how fast a wake moves it.

    PYTHONPATH=. .venv/bin/python benchmarks/wait_shapes.py --runs 50 --seconds 30 --repeats 2

Issue 42's design input (``docs/idle-listeners.md``). Unlike ``idle_waits.py`` (bare two-task workflows), these are
real agent runs compiled by the server's agent API: a model loop whose turn's tool calls run in a
``FORK_JOIN_DYNAMIC`` + ``JOIN``, the scripted model calling the wait tool each turn. One ``LocalServer`` (the SDK's
settings) and the project's scripted model; agents with no worker tool and continuation off, so nothing but the
server works while they wait. Kinds:

- ``pull``: today's :class:`~conductor_agents.WaitForMessageTool` (``PULL_WORKFLOW_MESSAGES``), woken by a push
  (``POST /workflow/{id}/messages``);
- ``human``: a ``human`` tool named ``wait_for_message`` (the server compiles it to a ``HUMAN`` task), woken by
  completing that task with ``{messages, count}``, the output a wait for messages gives;
- ``human_parked``: the same, and the fork's ``JOIN`` parked (a task update ``IN_PROGRESS`` with
  ``callbackAfterSeconds`` 3600) once the run waits; woken by completing the ``HUMAN`` task, then nudging the
  ``JOIN`` (``callbackAfterSeconds`` 0).

Per repeat and kind (the order rotating): a window of ``--seconds`` on the server with no run (its baseline), then
N runs started by a runtime that is then closed (so the window sees no request of the SDK's), left to wait until
the joins of 10 of them are past their first 200 quick evaluations (at most 3 minutes) and ``--settle`` seconds
more (the starts' own after-effects), a window of ``--seconds``
(the server JVM's utime+stime from /proc; the wait's and the join's ``pollCount`` on 10 runs before and after),
then ``--wakes`` wakes one at a time, each timed from the wake call to the run's next wait being seen (the model
called the wait tool again: one whole turn), then every run cancelled. Medians over repeats are printed; raw
figures go to ``--out``. Nothing asserts; on a shared machine read the kinds side by side.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import statistics
import sys
import time
from typing import Any

import requests

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import _jvm  # noqa: E402
import _procs  # noqa: E402

from conductor_agents import Agent, AgentRuntime, AgentSettings, WaitForMessageTool  # noqa: E402
from conductor_agents.local_server import LocalServer  # noqa: E402
from conductor_agents.testing import ScriptedLLM, listener_policy  # noqa: E402
from conductor_agents.tools import ToolDef  # noqa: E402

KINDS = ("pull", "human", "human_parked")
TASK_TYPE = {"pull": "PULL_WORKFLOW_MESSAGES", "human": "HUMAN", "human_parked": "HUMAN"}
PARK_SECONDS = 3600


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=50, help="waiting listeners per kind (50)")
    p.add_argument("--seconds", type=float, default=30.0, help="each measuring window (30)")
    p.add_argument("--repeats", type=int, default=2, help="repeats, the kinds' order rotating (2)")
    p.add_argument("--wakes", type=int, default=8, help="wakes per kind per repeat (8)")
    p.add_argument("--kinds", default=",".join(KINDS))
    p.add_argument("--settle", type=float, default=30.0, help="seconds of rest after the runs wait, before a window")
    p.add_argument("--out", default=os.path.join(HERE, "results-wait-shapes.json"))
    return p.parse_args(argv)


class Server:
    """Raw REST reads and task updates on the server the agents run on."""

    def __init__(self, url: str) -> None:
        self.url = url.rstrip("/")
        self.http = requests.Session()

    def wait_and_join(self, eid: str, task_type: str) -> tuple[dict, dict] | None:
        r = self.http.get(f"{self.url}/workflow/{eid}/tasks", params={"status": ["IN_PROGRESS"], "count": 100},
                          timeout=30)
        r.raise_for_status()
        tasks = r.json()["results"]
        waits = [t for t in tasks if t["taskType"] == task_type]
        joins = [t for t in tasks if t["taskType"] == "JOIN"]
        return (waits[0], joins[0]) if waits and joins else None

    def update(self, task: dict, status: str, *, callback: int = 0, output: dict | None = None) -> None:
        r = self.http.post(f"{self.url}/tasks", json={
            "workflowInstanceId": task["workflowInstanceId"], "taskId": task["taskId"], "status": status,
            "callbackAfterSeconds": callback, "workerId": "wait-shapes", "outputData": output or {}}, timeout=30)
        r.raise_for_status()

    def push(self, eid: str, body: dict) -> None:
        self.http.post(f"{self.url}/workflow/{eid}/messages", json=body, timeout=30).raise_for_status()


def _cpu_ms_per_s(pid: int, seconds: float, groups: dict[str, float] | None = None) -> float:
    """The server JVM's CPU ms per second over a window of ``seconds``; ``groups`` gets it per thread group."""
    c0, g0, t0 = _procs.cpu_seconds([pid]).get(pid, 0.0), _jvm.thread_cpu(pid), time.monotonic()
    time.sleep(seconds)
    wall = time.monotonic() - t0
    if groups is not None:
        groups.update({k: round(v / wall * 1000, 2) for k, v in _jvm.delta(g0, _jvm.thread_cpu(pid)).items()})
    return (_procs.cpu_seconds([pid]).get(pid, 0.0) - c0) / wall * 1000


def _human_wait() -> ToolDef:
    return ToolDef(name="wait_for_message", description="Wait for the next message.",
                   input_schema={"type": "object", "properties": {}}, tool_type="human")


def _start_waiting(runtime: AgentRuntime, agent: Agent, server: Server, kind: str, n: int) -> list[str]:
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        ids = [h.execution_id for h in pool.map(lambda _: runtime.start(agent, "Listen."), range(n))]
    deadline = time.monotonic() + 300
    pending = list(ids)
    while pending and time.monotonic() < deadline:
        pending = [eid for eid in pending if server.wait_and_join(eid, TASK_TYPE[kind]) is None]
        if pending:
            time.sleep(1.0)
    if pending:
        raise RuntimeError(f"{len(pending)} {kind} runs never reached their wait")
    return ids


def _wake(server: Server, kind: str, eid: str, i: int) -> float | None:
    found = server.wait_and_join(eid, TASK_TYPE[kind])
    if found is None:
        return None
    wait, join = found
    t0 = time.monotonic()
    if kind == "pull":
        server.push(eid, {"i": i})
    else:
        server.update(wait, "COMPLETED", output={"messages": [{"id": f"m{i}", "payload": {"i": i}}], "count": 1})
        if kind == "human_parked":
            server.update(join, "IN_PROGRESS", callback=0)
    while time.monotonic() - t0 < 60:
        now = server.wait_and_join(eid, TASK_TYPE[kind])
        if now is not None and now[0]["taskId"] != wait["taskId"]:
            return time.monotonic() - t0
        time.sleep(0.01)
    return None


def measure(settings: AgentSettings, llm: ScriptedLLM, server: Server, pid: int, kind: str,
            args: argparse.Namespace, repeat: int) -> dict[str, Any]:
    base_groups: dict[str, float] = {}
    base = _cpu_ms_per_s(pid, args.seconds, base_groups)
    model = llm.script(policy=listener_policy(lambda payload: None))
    tool = WaitForMessageTool.create() if kind == "pull" else _human_wait()
    agent = Agent(f"shape_{kind}_{repeat}", model, tools=[tool], max_turns=1000)
    # Started by a runtime that is then closed: the window sees the server's own work, not the SDK's reads.
    with AgentRuntime(settings) as runtime:
        ids = _start_waiting(runtime, agent, server, kind, args.runs)
    try:
        if kind == "human_parked":
            for eid in ids:
                found = server.wait_and_join(eid, TASK_TYPE[kind])
                if found is not None:
                    server.update(found[1], "IN_PROGRESS", callback=PARK_SECONDS)
        sample = ids[:10]
        settled = time.monotonic() + 180  # a join's first 200 evaluations (every 50 ms), slower on a busy server
        while time.monotonic() < settled:
            joins = [server.wait_and_join(eid, TASK_TYPE[kind]) for eid in sample]
            if kind == "human_parked" or all(j is not None and j[1]["pollCount"] > 205 for j in joins):
                break
            time.sleep(2.0)
        time.sleep(args.settle)  # the starts' own after-effects (the JIT, the collector) die down

        def polls() -> dict[str, int]:
            out = {}
            for eid in sample:
                found = server.wait_and_join(eid, TASK_TYPE[kind])
                if found is not None:
                    out[eid] = found[0]["pollCount"] + found[1]["pollCount"]
            return out

        p0, t0 = polls(), time.monotonic()
        groups: dict[str, float] = {}
        idle = _cpu_ms_per_s(pid, args.seconds, groups)
        p1, span = polls(), time.monotonic() - t0
        evals = [(p1[e] - p0[e]) / span for e in p0 if e in p1]
        wakes = [_wake(server, kind, eid, i) for i, eid in enumerate(ids[:args.wakes])]
    finally:
        for eid in ids:
            r = server.http.delete(f"{server.url}/workflow/{eid}", params={"reason": "wait_shapes done"}, timeout=30)
            if not r.ok:
                print(f"  terminate {eid}: {r.status_code} {r.text[:100]}", file=sys.stderr)
    done = [w for w in wakes if w is not None]
    row = {"kind": kind, "repeat": repeat, "runs": args.runs, "empty_ms_per_s": round(base, 2),
           "with_runs_ms_per_s": round(idle, 2), "ms_per_listener_s": round((idle - base) / args.runs, 3),
           "evaluations_per_listener_s": round(statistics.median(evals), 3) if evals else None,
           "wakes_s": [round(w, 4) for w in done], "wakes_lost": len(wakes) - len(done),
           "groups_above_empty_ms_per_s": {k: round(v - base_groups.get(k, 0.0), 2) for k, v in groups.items()
                                           if abs(v - base_groups.get(k, 0.0)) >= 1.0}}
    print(f"  {kind}: {row}", flush=True)
    time.sleep(5.0)
    return row


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    kinds = [k for k in args.kinds.split(",") if k]
    llm = ScriptedLLM()
    llm.start()
    server_proc = LocalServer(env={**llm.server_env(), "CONDUCTOR_SCRIPT_MAX_EXECUTION_SECONDS": "30"}, progress=False)
    server_proc.start()
    rows: list[dict[str, Any]] = []
    try:
        pid = server_proc.pid
        assert pid is not None
        server = Server(server_proc.url)
        settings = AgentSettings.from_env(environ={}, server_url=server_proc.url, continuation_enabled=False)
        for repeat in range(args.repeats):
            order = kinds[repeat % len(kinds):] + kinds[:repeat % len(kinds)]
            print(f"repeat {repeat + 1}: order {order}", flush=True)
            rows.extend(measure(settings, llm, server, pid, kind, args, repeat) for kind in order)
    finally:
        server_proc.stop()
        llm.stop()
    print(f"{'kind':14} {'ms/listener-s':>14} {'evals/listener-s':>17} {'wake p50':>9} {'p95':>7} {'lost':>5}")
    summary = {}
    for kind in kinds:
        mine = [r for r in rows if r["kind"] == kind]
        wakes = sorted(w for r in mine for w in r["wakes_s"])
        cost = statistics.median(r["ms_per_listener_s"] for r in mine)
        evals = statistics.median(r["evaluations_per_listener_s"] or 0 for r in mine)
        p50 = wakes[len(wakes) // 2] if wakes else None
        p95 = wakes[min(len(wakes) - 1, int(len(wakes) * 0.95))] if wakes else None
        summary[kind] = {"ms_per_listener_s": cost, "evaluations_per_listener_s": evals, "wake_p50_s": p50,
                         "wake_p95_s": p95, "wakes_lost": sum(r["wakes_lost"] for r in mine)}
        print(f"{kind:14} {cost:14.3f} {evals:17.3f} {p50 or float('nan'):9.3f} {p95 or float('nan'):7.3f} "
              f"{summary[kind]['wakes_lost']:5d}")
    with open(args.out, "w") as f:
        json.dump({"args": vars(args), "load_average": os.getloadavg(), "rows": rows, "summary": summary}, f,
                  indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
