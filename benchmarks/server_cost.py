"""What each kind of SDK request costs the Conductor server, in CPU, with N idle listeners on it.

    .venv/bin/python benchmarks/server_cost.py --n 50 --rate 20 --seconds 15
    .venv/bin/python benchmarks/server_cost.py --n 50 --property conductor.app.systemTaskWorkerThreadCount=2

One LocalStack (a real SQLite server and a ScriptedLLM). N stateful listeners are started with
no workers (``auto_start_workers=False``): they wait for messages on the server and this
process sends nothing for them, so the server's CPU with them idle is the server's own cost
(the message checks of their wait-for-message tasks, its sweeper). Then each request type is
driven at a fixed rate for a window, each window preceded by an idle window of the same length;
the server JVM's CPU (utime+stime from /proc) above the idle window, divided by the requests
sent, is that request's cost. Long polls are driven by ``rate`` threads polling back to back.

Results: a table on stdout and ``benchmarks/results-server-cost.json`` (``--out``). Noisy on a
shared machine: the idle windows interleave with the driven ones for that reason. Nothing
here asserts anything.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from typing import Callable, Dict, List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import requests  # noqa: E402

import _procs  # noqa: E402
from _harness import percentiles  # noqa: E402
from conductor_agents import Agent, AgentRuntime, AgentSettings, WaitForMessageTool, tool  # noqa: E402
from conductor_agents.testing import LocalStack, ToolCall, listener_policy  # noqa: E402

ACT = "bench_cost_act"


@tool(name=ACT)
def act(key: str = "") -> dict:
    """Acts on a message (never called: nobody sends one)."""
    return {"ok": key}


def parse_args(argv: "list[str]") -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=50, help="idle listeners on the server")
    p.add_argument("--rate", type=float, default=20.0, help="requests per second while a type is driven")
    p.add_argument("--seconds", type=float, default=15.0, help="length of each window")
    p.add_argument("--kinds", default=",".join(KINDS), help=f"comma-separated subset of {','.join(KINDS)}")
    p.add_argument("--property", action="append", default=[], metavar="NAME=VALUE",
                   help="a server -D property (repeatable), e.g. conductor.app.systemTaskWorkerThreadCount=2")
    p.add_argument("--server-url", help="use this running server (its OpenAI provider pointed at --llm-port) "
                                        "instead of starting one; needs --server-pid")
    p.add_argument("--server-pid", type=int, help="with --server-url: the server JVM's pid (for its CPU)")
    p.add_argument("--llm-port", type=int, default=0, help="with --server-url: where the ScriptedLLM listens")
    p.add_argument("--out", default=os.path.join(HERE, "results-server-cost.json"))
    return p.parse_args(argv)


class Target:
    """The ids and names the requests are about (round-robin over the N runs)."""

    def __init__(self, base: str, ids: List[str], domains: List[str]) -> None:
        self.base = base
        self.ids = ids
        self.domains = domains
        self._i = 0
        self._lock = threading.Lock()

    def next(self) -> int:
        with self._lock:
            self._i = (self._i + 1) % len(self.ids)
            return self._i


def _get(path: str, **params: object) -> Callable[[requests.Session, Target], None]:
    def call(http: requests.Session, t: Target) -> None:
        i = t.next()
        filled = {k: (v.format(domain=t.domains[i]) if isinstance(v, str) else v) for k, v in params.items()}
        http.get(t.base + path.format(id=t.ids[i]), params=filled, timeout=60).raise_for_status()

    return call


#: request type -> (how to send one, True when it is a long poll driven by threads)
KINDS: Dict[str, "tuple[Callable[[requests.Session, Target], None], bool]"] = {
    "status": (_get("/agent/{id}/status"), False),
    "workflow": (_get("/workflow/{id}", includeTasks="false"), False),
    "workflow_tasks": (_get("/workflow/{id}", includeTasks="true"), False),
    "queue_all": (_get("/tasks/queue/all"), False),
    "queue_sizes_1": (_get("/tasks/queue/sizes", taskType=f"{ACT}"), False),
    "poll_empty": (_get(f"/tasks/poll/batch/{ACT}", workerid="cost", count=1, timeout=0, domain="{domain}"), False),
    "poll_long_1s": (_get(f"/tasks/poll/batch/{ACT}", workerid="cost", count=1, timeout=1000, domain="{domain}"),
                     True),
}


#: request type -> the URI template the server's own metrics count it under
URIS = {"status": "/api/agent/{executionId}/status", "workflow": "/api/workflow/{workflowId}",
        "workflow_tasks": "/api/workflow/{workflowId}", "queue_all": "/api/tasks/queue/all",
        "queue_sizes_1": "/api/tasks/queue/sizes", "poll_empty": "/api/tasks/poll/batch/{tasktype}",
        "poll_long_1s": "/api/tasks/poll/batch/{tasktype}"}


def server_timers(root: str) -> Dict[str, "tuple[float, float]"]:
    """URI template -> (requests answered, seconds spent answering them), from the server's own metrics."""
    out: Dict[str, "tuple[float, float]"] = {}
    text = requests.get(f"{root}/actuator/prometheus", timeout=30).text
    for line in text.splitlines():
        for suffix, index in (("_count{", 0), ("_sum{", 1)):
            head = "http_server_requests_seconds" + suffix
            if line.startswith(head) and 'uri="' in line:
                uri = line.split('uri="', 1)[1].split('"', 1)[0]
                value = float(line.rsplit(" ", 1)[1])
                pair = list(out.get(uri, (0.0, 0.0)))
                pair[index] += value
                out[uri] = (pair[0], pair[1])
    return out


def server_cpu(pid: int) -> float:
    return _procs.cpu_seconds([pid]).get(pid, 0.0)


def window(pid: int, seconds: float, drive: Optional[Callable[[threading.Event], List[float]]] = None) -> dict:
    stop = threading.Event()
    lat: List[float] = []
    worker = None
    if drive is not None:
        worker = threading.Thread(target=lambda: lat.extend(drive(stop)), name="cost-driver")
    c0, t0 = server_cpu(pid), time.monotonic()
    if worker is not None:
        worker.start()
    stop.wait(seconds)
    stop.set()
    c1, t1 = server_cpu(pid), time.monotonic()
    if worker is not None:
        worker.join(120)
    return {"cpu_s": c1 - c0, "wall_s": t1 - t0, "requests": len(lat), "latency_ms": percentiles(lat)}


def paced(kind: str, target: Target, rate: float) -> Callable[[threading.Event], List[float]]:
    send, long_poll = KINDS[kind]

    def one_thread(stop: threading.Event, interval: Optional[float], out: List[float]) -> None:
        with requests.Session() as http:
            next_at = time.monotonic()
            while not stop.is_set():
                began = time.monotonic()
                try:
                    send(http, target)
                    out.append((time.monotonic() - began) * 1000.0)
                except requests.RequestException as err:
                    print(f"  {kind}: {err}", file=sys.stderr)
                if interval is not None:
                    next_at += interval
                    stop.wait(max(0.0, next_at - time.monotonic()))

    def drive(stop: threading.Event) -> List[float]:
        threads = int(round(rate)) if long_poll else 2
        interval = None if long_poll else threads / rate
        outs: List[List[float]] = [[] for _ in range(threads)]
        workers = [threading.Thread(target=one_thread, args=(stop, interval, outs[i]), name=f"cost-{kind}-{i}")
                   for i in range(threads)]
        for w in workers:
            w.start()
        for w in workers:
            w.join(120)
        return [x for out in outs for x in out]

    return drive


class _External:
    """A server started elsewhere, and a ScriptedLLM on the port its OpenAI provider points at."""

    def __init__(self, url: str, pid: int, llm_port: int) -> None:
        from conductor_agents.testing import ScriptedLLM

        self.url = url.rstrip("/")
        self.server = type("Server", (), {"pid": pid})()
        self.llm = ScriptedLLM(port=llm_port)

    def __enter__(self) -> "_External":
        self.llm.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.llm.stop()


def main(argv: "list[str]") -> int:
    args = parse_args(argv)
    kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
    unknown = sorted(set(kinds) - set(KINDS))
    if unknown:
        print(f"unknown kinds {unknown}; choose from {sorted(KINDS)}", file=sys.stderr)
        return 2
    properties = dict(p.split("=", 1) for p in args.property)
    workdir = tempfile.mkdtemp(prefix="conductor-agents-server-cost-")
    results: dict = {"n": args.n, "rate": args.rate, "seconds": args.seconds, "properties": properties,
                     "loadavg_start": os.getloadavg(), "kinds": {}}
    if args.server_url and (args.server_pid is None or properties):
        print("--server-url needs --server-pid and takes no --property (the server runs already)", file=sys.stderr)
        return 2
    stack = _External(args.server_url, args.server_pid, args.llm_port) if args.server_url else \
        LocalStack(os.path.join(workdir, "server"), properties=properties, startup_timeout=900)
    with stack:
        pid = int(stack.server.pid)
        url = stack.url
        root = url[: -len("/api")]
        model = stack.llm.script(policy=listener_policy(lambda payload: ToolCall(ACT, {"key": "x"})))
        settings = AgentSettings.from_env(server_url=url, auto_start_workers=False)
        with AgentRuntime(settings) as runtime:
            receive = WaitForMessageTool.create(name="wait_for_message")
            began = time.monotonic()
            handles = [runtime.start(Agent(name="bench_cost_listener", model=model, stateful=True, max_turns=1000,
                                           tools=[receive, act], instructions="Wait for messages."), "Listen.")
                       for _ in range(args.n)]
            results["start_s"] = time.monotonic() - began
            target = Target(url, [h.execution_id for h in handles], [str(h.run_id) for h in handles])
            time.sleep(10.0)  # every run reaches its wait-for-message task
            idle = []
            for kind in kinds:
                base = window(pid, args.seconds)
                m0 = server_timers(root)
                driven = window(pid, args.seconds, paced(kind, target, args.rate))
                m1 = server_timers(root)
                uri = URIS[kind]
                answered = m1.get(uri, (0.0, 0.0))[0] - m0.get(uri, (0.0, 0.0))[0]
                spent = m1.get(uri, (0.0, 0.0))[1] - m0.get(uri, (0.0, 0.0))[1]
                idle.append(base)
                extra = driven["cpu_s"] - base["cpu_s"] * driven["wall_s"] / base["wall_s"]
                row = {"idle_cpu_pct": 100.0 * base["cpu_s"] / base["wall_s"],
                       "driven_cpu_pct": 100.0 * driven["cpu_s"] / driven["wall_s"],
                       "requests": driven["requests"], "req_per_s": driven["requests"] / driven["wall_s"],
                       "cpu_ms_per_request": 1000.0 * extra / max(1, driven["requests"]),
                       "latency_p50_ms": driven["latency_ms"]["p50"], "latency_p99_ms": driven["latency_ms"]["p99"],
                       "server_ms_per_request": 1000.0 * spent / answered if answered else None}
                results["kinds"][kind] = row
                print(f"{kind:>15}: {row['cpu_ms_per_request']:6.2f} ms CPU/request at {row['req_per_s']:5.1f}/s "
                      f"(server {row['idle_cpu_pct']:5.1f}% idle -> {row['driven_cpu_pct']:5.1f}%), "
                      f"server time {row['server_ms_per_request']} ms, p50 {row['latency_p50_ms']} ms", flush=True)
            cpu = sum(w["cpu_s"] for w in idle)
            wall = sum(w["wall_s"] for w in idle)
            results["idle_server_cpu_pct"] = 100.0 * cpu / wall
            results["idle_server_cpu_pct_per_run"] = 100.0 * cpu / wall / max(1, args.n)
            print(f"idle: server {results['idle_server_cpu_pct']:.1f}% of a core for {args.n} waiting listeners "
                  f"({results['idle_server_cpu_pct_per_run']:.3f}% per run)", flush=True)
            for handle in handles:
                try:
                    handle.cancel("cost measurement over")
                except Exception:
                    pass
    results["loadavg_end"] = os.getloadavg()
    with open(args.out, "w") as f:
        json.dump(results, f, indent=1)
    print(f"written: {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
