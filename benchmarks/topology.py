"""The same SDK scenarios on one SQLite node and on the local Redis cluster, side by side.

    .venv/bin/python benchmarks/topology.py                 # both topologies, default sizes
    .venv/bin/python benchmarks/topology.py --only cluster --messages 20 --seeds 2

For each topology (one ``LocalServer`` on SQLite; a ``LocalCluster`` of two nodes on one
Redis behind HAProxy, clients on the balancer's URL) it starts the server(s) once and
measures, with the offline ScriptedLLM:

  seed scenario   start a listener, send one message, the tool runs here, stop, wait(): wall time
  round trip      message sent → the tool it triggers starts in this process (p50 / max)
  pickup          the SDK's pickup latency of those tool tasks (stats().pickup_latency p50 / max)
  events() lag    the run's end on the server (endTime) → the events() iterator ends

Figures are printed, not asserted (docs/operations.md quotes them). Not part of ``make bench``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from typing import Any, Dict, List, Optional

import requests

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from conductor_agents import Agent, AgentRuntime, AgentSettings, RunStatus, WaitForMessageTool, tool  # noqa: E402
from conductor_agents.errors import ConductorAgentsError  # noqa: E402
from conductor_agents.local_server import LocalCluster, LocalServer  # noqa: E402
from conductor_agents.testing import ScriptedLLM, ToolCall, listener_policy  # noqa: E402


class Entries:
    """When each keyed action entered the tool (time.time()), for round trips."""

    def __init__(self) -> None:
        self.times: Dict[str, float] = {}
        self.cond = threading.Condition()

    @tool
    def topo_act(self, key: str = "") -> dict:
        """Act on a message."""
        with self.cond:
            self.times[key] = time.time()
            self.cond.notify_all()
        return {"ok": key}

    def wait_for(self, key: str, timeout: float) -> Optional[float]:
        with self.cond:
            self.cond.wait_for(lambda: key in self.times, timeout)
            return self.times.get(key)


def listener(name: str, model: str, entries: Entries) -> Agent:
    receive = WaitForMessageTool.create(name="wait_for_message", batch_size=1)
    return Agent(name=name, model=model, stateful=True, max_turns=10_000, tools=[receive, entries.topo_act],
                 instructions="Loop: wait_for_message, act on it, repeat until told to stop.")


def act_on(payload: dict) -> ToolCall:
    return ToolCall("topo_act", {"key": payload.get("key", "")})


def seed_once(runtime: AgentRuntime, llm: ScriptedLLM, name: str) -> Dict[str, float]:
    """One seed scenario with an events() reader; returns its wall time and the events() end lag."""
    entries = Entries()
    model = llm.script(policy=listener_policy(act_on))
    began = time.monotonic()
    handle = runtime.start(listener(name, model, entries), "Start listening.")
    ended_at: List[float] = []

    def read_events() -> None:
        with handle.events(timeout=300) as stream:
            for _ in stream:
                pass
        ended_at.append(time.time())

    reader = threading.Thread(target=read_events, name="bench-events", daemon=True)
    reader.start()
    handle.send_message({"key": "seed"})
    assert entries.wait_for("seed", 120) is not None, "the seed tool never ran"
    handle.stop()
    result = handle.wait(timeout=300)
    wall = time.monotonic() - began
    assert result.status is RunStatus.COMPLETED, result
    reader.join(120)
    flow = requests.get(f"{runtime.settings.server_url}/workflow/{handle.execution_id}", timeout=30).json()
    end_ms = flow.get("endTime") or 0  # the server's clock (same host)
    lag = (ended_at[0] - end_ms / 1000.0) if ended_at and end_ms else float("nan")
    return {"seed_s": wall, "events_lag_s": lag}


def round_trips(runtime: AgentRuntime, llm: ScriptedLLM, name: str, messages: int, gap: float) -> List[float]:
    entries = Entries()
    model = llm.script(policy=listener_policy(act_on))
    handle = runtime.start(listener(name, model, entries), "Start listening.")
    time.sleep(1.0)  # let the run reach its first wait
    latencies = []
    for i in range(messages):
        key = f"rt-{i}"
        sent = time.time()
        try:
            handle.send_message({"key": key})
        except ConductorAgentsError as err:  # the run failed (a busy machine): the rest count as lost
            print(f"round trip {i}: {err}", file=sys.stderr, flush=True)
            return latencies
        entered = entries.wait_for(key, 60)
        if entered is not None:
            latencies.append(entered - sent)
        time.sleep(gap)
    handle.stop()
    handle.wait(timeout=300)
    return latencies


def warm_up(runtime: AgentRuntime, llm: ScriptedLLM, topology: str) -> None:
    """One seed scenario, not counted: a JVM that just started compiles its code paths (slow on a busy machine)."""
    for attempt in range(3):
        try:
            seed_once(runtime, llm, f"topo_warm_{topology}_{attempt}_{os.getpid()}")
            return
        except (AssertionError, ConductorAgentsError) as err:
            print(f"warm-up on {topology}: {err}; again", file=sys.stderr, flush=True)


def measure(topology: str, args: argparse.Namespace, llm: ScriptedLLM) -> Dict[str, Any]:
    data_dir = tempfile.mkdtemp(prefix=f"topology-{topology}-")
    if topology == "single":
        server: Any = LocalServer(data_dir, env=llm.server_env(), startup_timeout=600)
    else:
        server = LocalCluster(data_dir, nodes=args.nodes, env=llm.server_env(), startup_timeout=600)
    began = time.monotonic()
    server.start()
    startup = time.monotonic() - began
    try:
        # A long request timeout: the first requests to a JVM that just started are slow on a busy machine.
        settings = AgentSettings.from_env(environ={}, server_url=server.url, http_timeout_seconds=120.0)
        with AgentRuntime(settings) as runtime:
            warm_up(runtime, llm, topology)
            seeds, failed = [], 0
            for i in range(args.seeds):
                try:
                    seeds.append(seed_once(runtime, llm, f"topo_seed_{topology}_{i}_{os.getpid()}"))
                except (AssertionError, ConductorAgentsError) as err:  # printed and counted, not hidden
                    failed += 1
                    print(f"seed scenario {i} on {topology} failed: {err}", file=sys.stderr, flush=True)
            trips = round_trips(runtime, llm, f"topo_rt_{topology}_{os.getpid()}", args.messages, args.gap)
            pickup = runtime.stats().pickup_latency
    finally:
        server.stop()
    nan = float("nan")
    return {
        "startup_s": startup,
        "seed_s": statistics.median(s["seed_s"] for s in seeds) if seeds else nan,
        "seeds_failed": failed,
        "events_lag_s": max(s["events_lag_s"] for s in seeds) if seeds else nan,
        "rt_p50_s": statistics.median(trips) if trips else float("nan"),
        "rt_max_s": max(trips) if trips else float("nan"),
        "rt_lost": args.messages - len(trips),
        "pickup_p50_ms": (pickup.p50 or 0) * 1000,
        "pickup_max_ms": (pickup.max or 0) * 1000,
    }


ROWS = [
    ("server start (s)", "startup_s", "{:.1f}"),
    ("seed scenario (s, median)", "seed_s", "{:.1f}"),
    ("seed scenarios failed", "seeds_failed", "{}"),
    ("round trip p50 (s)", "rt_p50_s", "{:.2f}"),
    ("round trip max (s)", "rt_max_s", "{:.2f}"),
    ("round trips lost", "rt_lost", "{}"),
    ("pickup p50 (ms)", "pickup_p50_ms", "{:.0f}"),
    ("pickup max (ms)", "pickup_max_ms", "{:.0f}"),
    ("events() end lag (s, worst)", "events_lag_s", "{:.2f}"),
]


def main(argv: List[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", choices=("single", "cluster"), default=None)
    p.add_argument("--nodes", type=int, default=2)
    p.add_argument("--seeds", type=int, default=3, help="seed scenarios per topology (median reported)")
    p.add_argument("--messages", type=int, default=30, help="round trips per topology")
    p.add_argument("--gap", type=float, default=0.5, help="seconds between round trips")
    args = p.parse_args(argv)
    topologies = [args.only] if args.only else ["single", "cluster"]
    results: Dict[str, Dict[str, Any]] = {}
    with ScriptedLLM() as llm:
        for topology in topologies:
            print(f"measuring {topology} ...", file=sys.stderr, flush=True)
            results[topology] = measure(topology, args, llm)
    names = [f"{t} ({args.nodes} nodes)" if t == "cluster" else "single (SQLite)" for t in topologies]
    width = max(len(r[0]) for r in ROWS)
    print(f"{'':{width}}  " + "  ".join(f"{n:>18}" for n in names) + ("  cluster/single" if len(names) == 2 else ""))
    for label, key, fmt in ROWS:
        cells = [fmt.format(results[t][key]) for t in topologies]
        ratio = ""
        if len(topologies) == 2 and key not in ("rt_lost", "seeds_failed") and results["single"][key]:
            ratio = f"  {results['cluster'][key] / results['single'][key]:.2f}x"
        print(f"{label:{width}}  " + "  ".join(f"{c:>18}" for c in cells) + ratio)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
