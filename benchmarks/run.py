"""Benchmarks: conductor-agents against the peer SDK (conductor-agent-sdk 0.4.4), same server, one run.

    make bench                                          # full run (~45 min)
    make bench BENCH_ARGS="--quick"                     # small counts (a few minutes)
    make bench BENCH_ARGS="--server redis"              # one Redis-backed node (or: cluster, 2 nodes)

One server (``--server``: a SQLite node, a Redis-backed node, or two Redis-backed nodes behind a
balancer) and a ScriptedLLM serve both SDKs; each SDK runs in a driver subprocess of its own
interpreter (``driver_ours.py``, ``driver_peer.py``). Latency scenarios run ``--repeats`` times,
ours and the peer's interleaved (see ``_repeats.py``); the live scenario stops the peer at
``--memory-cap-mb``. Results are printed and written to ``benchmarks/results.md`` (and
``results.json``). Timings on a shared 2-core machine are noisy: compare the ratios and their
spread. Nothing here asserts a timing.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import platform
import re
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import _procs  # noqa: E402
import _repeats  # noqa: E402
from _harness import SERVERS, Bench, MemoryGuard, percentiles, server_unavailable  # noqa: E402
from _report import render  # noqa: E402

PRESETS = {
    "full": dict(pickup_runs=3, pickup_turns=100, messages=50, live_n=[1, 50, 200, 1000], idle_s=30.0,
                 cost_n=10, cost_s=30.0, start_budget_s=600.0, repeats=3),
    "quick": dict(pickup_runs=2, pickup_turns=25, messages=12, live_n=[1, 10, 25], idle_s=10.0,
                  cost_n=5, cost_s=10.0, start_budget_s=90.0, repeats=2),
}
SDKS = ("ours", "peer")


def parse_args(argv: "list[str]") -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="small counts: a few minutes")
    p.add_argument("--server", choices=SERVERS, default="sqlite",
                   help="sqlite: one SQLite node (default); redis: one Redis-backed node; cluster: 2 Redis-backed "
                        "nodes behind a balancer")
    p.add_argument("--repeats", type=int, help="runs of each latency scenario, the SDKs interleaved (full: 3)")
    p.add_argument("--sdk", choices=("both", *SDKS), default="both")
    p.add_argument("--scenarios", default="pickup,roundtrip,cost,live",
                   help="comma-separated subset of pickup,roundtrip,cost,live")
    p.add_argument("--live-n", help="comma-separated N for the live-runs scenario (e.g. 1,10,200)")
    p.add_argument("--idle-seconds", type=float, help="idle window of the live scenario")
    p.add_argument("--pickup-runs", type=int)
    p.add_argument("--pickup-turns", type=int, help="tool calls per pickup run (one per model turn)")
    p.add_argument("--messages", type=int, help="messages in the round-trip scenario")
    p.add_argument("--peer-python", default=os.path.join(HERE, ".venv-peer", "bin", "python"))
    p.add_argument("--answer-rate", type=float, default=10.0,
                   help="messages per second in the live scenario's answer phase (one per run)")
    p.add_argument("--memory-cap-mb", "--pss-cap-mb", dest="pss_cap_mb", type=float, default=4000.0,
                   help="live scenario: a driver starts no more runs once its processes' summed PSS passes this, "
                        "and is killed past 1.25 times it (the peer runs a process per worker: 9.5 GB RSS at "
                        "N=200); default 4000")
    p.add_argument("--property", action="append", default=[], metavar="NAME=VALUE",
                   help="a server -D property (repeatable), e.g. conductor.app.systemTaskWorkerPollInterval=200ms")
    p.add_argument("--out", default=os.path.join(HERE, "results.md"))
    return p.parse_args(argv)


def settings_from(args: argparse.Namespace) -> dict:
    s = dict(PRESETS["quick" if args.quick else "full"])
    if args.live_n:
        s["live_n"] = [int(x) for x in args.live_n.split(",") if x.strip()]
    for key, value in (("idle_s", args.idle_seconds), ("pickup_runs", args.pickup_runs),
                       ("pickup_turns", args.pickup_turns), ("messages", args.messages), ("repeats", args.repeats)):
        if value is not None:
            s[key] = value
    if s["repeats"] < 1:
        raise SystemExit("--repeats must be at least 1")
    s["pss_cap_mb"] = args.pss_cap_mb
    s["server"] = args.server
    s["answer_rate"] = args.answer_rate
    return s


# -- scenarios ------------------------------------------------------------------------


def run_pickup(bench: Bench, sdk: str, stateful: bool, s: dict, warmup: bool = False) -> dict:
    model = bench.models[sdk]["warm" if warmup else "pick"]
    driver = bench.driver(sdk, "pickup", model=model, stateful=stateful, runs=s["pickup_runs"])
    stop_probe, probe = threading.Event(), concurrent.futures.ThreadPoolExecutor(1)
    try:
        started = driver.expect("started", timeout=120)
        ids = started["ids"]
        probed = probe.submit(bench.probe_polls, stop_probe)
        bench.wait_terminal(ids, timeout=60 + s["pickup_turns"] * s["pickup_runs"] * 3.0)
        stop_probe.set()
        floor = percentiles(probed.result(timeout=60))
        steady, first = [], []
        for eid in ids:
            tasks = [t for t in bench.workflow(eid, tasks=True).get("tasks", [])
                     if t.get("taskType") == f"bench_tool_{sdk}" and t.get("startTime")]
            tasks.sort(key=lambda t: t.get("seq", 0))
            for i, t in enumerate(tasks):
                (first if i == 0 else steady).append(float(t["startTime"] - t["scheduledTime"]))
        return {"calls": len(steady) + len(first), **percentiles(steady), "first_call_ms": percentiles(first)["p50"],
                "start_s": started["start_s"], "empty_poll_p50_ms": floor["p50"], "empty_poll_p99_ms": floor["p99"]}
    finally:
        stop_probe.set()
        probe.shutdown(wait=True)
        driver.finish()


def run_roundtrip(bench: Bench, sdk: str, s: dict) -> dict:
    driver = bench.driver(sdk, "roundtrip", model=bench.models[sdk]["listen"], messages=s["messages"])
    try:
        ids = driver.expect("started", timeout=120)["ids"]
        result = driver.expect("result", timeout=60 + s["messages"] * 35)
        bench.cancel(ids)
        lat = [x * 1000.0 for x in result["latencies"]]
        return {"messages": len(lat), "missing": result["missing"], **percentiles(lat)}
    finally:
        driver.finish()


def run_cost(bench: Bench, sdk: str, s: dict) -> dict:
    """Requests per second one idle stateful run costs, counted by a proxy in front of the server."""
    proxy = bench.proxy()
    driver = bench.driver(sdk, "live", model=bench.models[sdk]["listen"], n=s["cost_n"],
                          start_budget_s=s["start_budget_s"], server_url=proxy.url)
    try:
        started = driver.expect("started", timeout=s["start_budget_s"] + 120)
        n = len(started["ids"])
        time.sleep(3.0)  # let start-up traffic settle
        proxy.reset()
        time.sleep(s["cost_s"])
        counts = proxy.snapshot()
        bench.cancel(started["ids"])
        total = sum(counts.values())
        per_run = {k: v / s["cost_s"] / max(1, n) for k, v in counts.items()}
        return {"runs": n, "window_s": s["cost_s"], "req_per_s_per_run": total / s["cost_s"] / max(1, n),
                "by_kind": per_run}
    finally:
        driver.finish()
        proxy.stop()


def run_live(bench: Bench, sdk: str, n: int, s: dict) -> dict:
    driver = bench.driver(sdk, "live", model=bench.models[sdk]["listen"], n=n, answer_rate=s["answer_rate"],
                          start_budget_s=s["start_budget_s"], pss_cap_mb=s["pss_cap_mb"])
    guard = MemoryGuard(driver, cap_mb=1.25 * s["pss_cap_mb"]).start()
    ids = []
    try:
        started = driver.expect("started", timeout=s["start_budget_s"] + 180)
        ids = started["ids"]
        time.sleep(3.0)
        pids = _procs.tree(driver.pid)
        server_pids = bench.server_pids
        r0 = bench.server_requests()
        c0, s0, t0 = _procs.cpu_seconds(pids), _procs.cpu_seconds(server_pids), time.monotonic()
        probe = bench.probe_status(ids[0] if ids else None, s["idle_s"])
        c1, s1, t1 = _procs.cpu_seconds(pids), _procs.cpu_seconds(server_pids), time.monotonic()
        r1 = bench.server_requests()
        mem = _procs.memory(_procs.tree(driver.pid))
        window = t1 - t0
        idle = _idle_requests(r0, r1, probes=probe.get("n") or 0, runs=len(ids), seconds=window)
        out = {
            "requested": n, "started": len(ids), "stopped": started.get("stopped"), "start_s": started["start_s"],
            **mem, "client_cpu_pct": 100.0 * _procs.cpu_delta(c0, c1) / window,
            "server_cpu_pct": 100.0 * _procs.cpu_delta(s0, s1) / window,
            "status_ms": probe, **idle,
        }
        driver.send("answer")
        answered = driver.expect("answered", timeout=120 + n * 2 / s["answer_rate"])
        lat = answered["latencies"]
        out.update(answered_2s=sum(1 for x in lat if x <= 2.0), answered=len(lat),
                   answer_p50_s=percentiles(lat)["p50"], answer_max_s=max(lat) if lat else None)
        split = bench.answer_split(answered.get("sent_by_run") or {}, f"bench_act_{sdk}")
        server, pickup = percentiles(split["server_ms"]), percentiles(split["pickup_ms"])
        out.update(server_path_p50_s=_seconds(server["p50"]),
                   server_path_max_s=_seconds(max(split["server_ms"]) if split["server_ms"] else None),
                   answer_pickup_p50_ms=pickup["p50"], answer_pickup_p99_ms=pickup["p99"],
                   answer_pickup_max_ms=max(split["pickup_ms"]) if split["pickup_ms"] else None)
        out["holds"] = out["started"] == n and out["answered_2s"] == n
        return out
    except Exception as err:
        if guard.killed_at_mb is not None:
            return {"requested": n, "started": len(ids), "error": f"killed at {guard.killed_at_mb:.0f} MB PSS "
                    f"(memory cap {guard.cap_mb:.0f} MB)", "stopped": "memory cap"}
        raise err
    finally:
        guard.stop()
        bench.cancel(ids)
        driver.finish()


def _idle_requests(before: dict, after: dict, *, probes: int, runs: int, seconds: float) -> dict:
    """Requests per second per run the server answered during the idle window, by kind (the harness's
    own status probes taken out)."""
    delta = {k: after.get(k, 0) - before.get(k, 0) for k in after}
    delta = {k: v for k, v in delta.items() if v > 0 and "/actuator/" not in k}
    status = "GET /api/agent/{executionId}/status"
    if status in delta:
        delta[status] = max(0, delta[status] - probes)
    per = max(1, runs) * max(seconds, 1e-9)
    return {"idle_req_per_s_per_run": sum(delta.values()) / per,
            "idle_req_by_kind": {k: v / per for k, v in sorted(delta.items()) if v}}


# -- main -----------------------------------------------------------------------------


def main(argv: "list[str]") -> int:
    args = parse_args(argv)
    s = settings_from(args)
    sdks = SDKS if args.sdk == "both" else (args.sdk,)
    scenarios = [x.strip() for x in args.scenarios.split(",") if x.strip()]
    unavailable = server_unavailable(args.server)
    if unavailable:
        print(unavailable, file=sys.stderr)
        return 2
    if "peer" in sdks and not os.path.exists(args.peer_python):
        print(f"no peer interpreter at {args.peer_python}; run `make bench` (it creates benchmarks/.venv-peer)",
              file=sys.stderr)
        return 2
    results: dict = {"mode": "quick" if args.quick else "full", "settings": s, "sdks": list(sdks),
                     "env": {"cores": os.cpu_count(), "loadavg_start": os.getloadavg(),
                             "python": platform.python_version(), "started": time.strftime("%Y-%m-%d %H:%M:%S")}}
    workdir = tempfile.mkdtemp(prefix="conductor-agents-bench-")
    print(f"bench: {results['mode']} run, logs in {workdir}", flush=True)
    s["properties"] = dict(p.split("=", 1) for p in args.property)
    with Bench(workdir, sys.executable, args.peer_python, pickup_turns=s["pickup_turns"], server=args.server,
               properties=s["properties"]) as bench:
        results["env"]["server_version"] = bench.server_version
        # A fresh server is slow for its first runs (JIT, first compiles): warm it up with both
        # SDKs first, so that neither pays for it in the measurements.
        for sdk in sdks:
            _step(f"warm-up {sdk}", lambda: run_pickup(bench, sdk, True, {**s, "pickup_runs": 1}, warmup=True))
        latency = []
        if "pickup" in scenarios:
            latency += [("pickup_stateful", lambda sdk: run_pickup(bench, sdk, True, s)),
                        ("pickup_plain", lambda sdk: run_pickup(bench, sdk, False, s))]
        if "roundtrip" in scenarios:
            latency.append(("roundtrip", lambda sdk: run_roundtrip(bench, sdk, s)))
        repeats: dict = {key: [] for key, _ in latency}
        for r in range(s["repeats"]):  # each repeat runs every latency scenario once per SDK, order flipped
            for key, scenario in latency:
                repeats[key].append({sdk: _step(f"{key} {sdk} (repeat {r + 1}/{s['repeats']})",
                                                lambda: scenario(sdk)) for sdk in _repeats.order(sdks, r)})
        for key, _ in latency:
            results[key] = _repeats.combine(repeats[key], sdks)
        if "cost" in scenarios:
            results["cost"] = {sdk: _step(f"idle cost {sdk}", lambda: run_cost(bench, sdk, s)) for sdk in sdks}
        if "live" in scenarios:
            results["live"] = {sdk: {} for sdk in sdks}
            for n in s["live_n"]:
                for sdk in sdks:
                    previous = [r for r in results["live"][sdk].values() if isinstance(r, dict)]
                    if previous and (previous[-1].get("stopped") or previous[-1].get("error")):
                        results["live"][sdk][str(n)] = {"skipped": f"stopped at N={previous[-1].get('requested')}"}
                        continue
                    results["live"][sdk][str(n)] = _step(f"live N={n} {sdk}", lambda: run_live(bench, sdk, n, s))
    results["env"]["loadavg_end"] = os.getloadavg()
    text = render(results)
    print(text)
    with open(args.out, "w") as f:
        f.write(text + _share_section(args.out))
    with open(os.path.splitext(args.out)[0] + ".json", "w") as f:
        json.dump(results, f, indent=1)
    print(f"written: {args.out}")
    return 0


def _share_section(path: str) -> str:
    """The sections other tools keep in the report (``server_share.py``'s, written by ``make bench`` before
    this; ``answer_stages.py``'s, by hand), each between two equal ``<!-- name -->`` markers: kept as they are."""
    old = open(path).read() if os.path.exists(path) else ""
    kept = []
    for name in dict.fromkeys(re.findall(r"<!-- ([a-z0-9-]+) -->", old)):
        marker = f"<!-- {name} -->"
        if old.count(marker) >= 2:
            kept.append(marker + old.split(marker)[1] + marker + "\n")
    return "".join("\n\n" + block for block in kept)


def _seconds(ms: "float | None") -> "float | None":
    return None if ms is None else ms / 1000.0


def _step(label: str, fn) -> dict:
    began = time.monotonic()
    print(f"bench: {label} ...", flush=True)
    try:
        out = fn()
    except Exception as err:  # one failed scenario is reported, the others still run
        out = {"error": f"{type(err).__name__}: {err}"}
    print(f"bench: {label} done in {time.monotonic() - began:.0f}s: {json.dumps(out)[:300]}", flush=True)
    return out


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
