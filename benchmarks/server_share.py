"""The server's work for one listener agent, side by side: this SDK, the peer SDK, and the REST calls alone.

    .venv/bin/python benchmarks/server_share.py --quick          # a few minutes
    .venv/bin/python benchmarks/server_share.py --n 50 --repeats 3
    .venv/bin/python benchmarks/server_share.py --property conductor.app.systemTaskWorkerThreadCount=4

One server (``--server``) and one ScriptedLLM serve every driver; each driver is the same agent (a
wait-for-message tool and one worker tool, the model calling the tool once per message):
``ours`` (this repository, ``driver_ours.py``), ``peer2`` (the official ``conductor-python`` 2.0.0,
``conductor.ai.agents``, in ``benchmarks/.venv-peer2``, ``driver_peer2.py``) and ``floor``
(``driver_floor.py``: ``POST /agent/start``, ``POST /workflow/{id}/messages``, one batch long poll of
the tool's type and ``POST /tasks``, nothing else). Per driver, in turn, the order rotating every
repeat: a window with no listener (the server's own baseline), N listeners started and left idle
for a window, then ``messages`` messages round-robin over them at ``rate`` a second.

Per driver: server CPU (the JVM(s)' utime+stime from /proc) per idle listener-second above the
baseline, per message above the idle rate, requests the server answered per idle listener-second
and per message (its own counters), and tasks and bytes stored per message (the listeners' runs
read with their tasks before and after the messages; bytes = the JSON the server returns for them).
Results: ``benchmarks/results-server-share.json``, and a section of ``benchmarks/results.md``.
CPU time is counted on the server, not wall time, but a loaded machine still inflates it: compare
the ratios of one run, and their spread over the repeats. Nothing here asserts anything.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
from typing import Dict, List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import _jvm  # noqa: E402
import _procs  # noqa: E402
from _harness import SERVERS, Bench, percentiles, server_unavailable  # noqa: E402

from conductor_agents._listener.chain import parse_mailbox_key  # noqa: E402
from conductor_agents._listener.directory import Chain  # noqa: E402

DRIVERS = ("ours", "peer2", "floor")
PRESETS = {"full": dict(n=50, idle_s=30.0, base_s=15.0, messages=60, rate=2.0, repeats=3),
           "quick": dict(n=20, idle_s=15.0, base_s=10.0, messages=20, rate=2.0, repeats=2)}
#: Seconds after the last message was acted on that still count as its work (the model's turn
#: after the tool, the next wait for a message).
TAIL_S = 4.0
SECTION = "<!-- server-share -->"


def parse_args(argv: "list[str]") -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="small counts: a few minutes")
    p.add_argument("--server", choices=SERVERS, default="sqlite")
    p.add_argument("--drivers", default=",".join(DRIVERS), help=f"comma-separated subset of {','.join(DRIVERS)}")
    p.add_argument("--n", type=int, help="idle listeners per driver (full: 50)")
    p.add_argument("--idle-seconds", type=float, dest="idle_s")
    p.add_argument("--messages", type=int)
    p.add_argument("--rate", type=float, help="messages per second")
    p.add_argument("--repeats", type=int)
    p.add_argument("--property", action="append", default=[], metavar="NAME=VALUE", help="a server -D property")
    p.add_argument("--against", action="append", default=[], metavar="NAME=VALUE",
                   help="also start a second server with this -D property (repeatable) and measure every driver "
                        "on it too (driver#B): a server setting side by side with the first server's")
    p.add_argument("--jstack", action="store_true",
                   help="sample the server's stacks (jstack, every 2 s) in the idle and message windows: the "
                        "server code its busy threads run (it pauses the JVM briefly: not for cost figures)")
    p.add_argument("--baseline", metavar="DIR",
                   help="also measure ours with conductor_agents imported from DIR (driver ours@base), e.g. a "
                        "commit unpacked with `git archive COMMIT conductor_agents | tar -x -C DIR`")
    p.add_argument("--variant", action="append", default=[], metavar="TAG:MODULE:NAME=VALUE[,MODULE:NAME=VALUE]",
                   help="also measure ours with these module constants set (driver ours@TAG), e.g. "
                        "w50:conductor_agents._worker.watcher:_FAST_SECONDS=0.05")
    p.add_argument("--peer2-python", default=os.path.join(HERE, ".venv-peer2", "bin", "python"))
    p.add_argument("--out", default=os.path.join(HERE, "results-server-share.json"))
    p.add_argument("--md", default=os.path.join(HERE, "results.md"), help="the report its section goes into")
    return p.parse_args(argv)


def _first_run_behind(execution_id: str, correlation_id: Optional[str]) -> Optional[str]:
    """The first run of the listener whose mailbox is ``execution_id`` (None: not a mailbox)."""
    listener = parse_mailbox_key(correlation_id)
    if listener is None:
        return None
    return Chain(execution_id, listener.run_id, listener.agent_name, mailbox=True).link(0).execution_id


def _tasks_and_bytes(bench: Bench, ids: List[str]) -> "tuple[int, int]":
    """Tasks and bytes the server stores for runs ``ids``; a listener's mailbox (the id ours hands out) counts
    with the listener's first run behind it (the windows here are too short for a continuation)."""
    def read(eid: str) -> "tuple[int, int, Optional[str]]":
        r = bench.http.get(f"{bench.url}/workflow/{eid}", params={"includeTasks": "true"}, timeout=60)
        if not r.ok:
            return 0, 0, None
        body = r.json()
        return len(body.get("tasks", [])), len(r.content), body.get("correlationId")

    def one(eid: str) -> "tuple[int, int]":
        tasks, size, correlation = read(eid)
        first = _first_run_behind(eid, correlation)
        if first is not None:
            more_tasks, more_bytes, _ = read(first)
            tasks, size = tasks + more_tasks, size + more_bytes
        return tasks, size

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        pairs = list(pool.map(one, ids))
    return sum(a for a, _ in pairs), sum(b for _, b in pairs)


def _listeners_behind(bench: Bench, ids: List[str]) -> List[str]:
    """The first run of each listener whose mailbox is one of ``ids`` (ours hands out the mailbox's id). Cancelled
    with the mailboxes: a listener left running after its driver ended would add its waits' evaluations to every
    later window's baseline (it did: the empty server's CPU rose from 9 % to 26 % over three repeats)."""
    def one(eid: str) -> Optional[str]:
        r = bench.http.get(f"{bench.url}/workflow/{eid}", params={"includeTasks": "false"}, timeout=60)
        return _first_run_behind(eid, r.json().get("correlationId")) if r.ok else None

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        return [run for run in pool.map(one, ids) if run is not None]


def _cpu(bench: Bench) -> "tuple[float, float]":
    """CPU seconds so far of the server: its JVM(s), and Redis behind them when there is one."""
    return sum(_procs.cpu_seconds(bench.server_pids + bench.store_pids).values()), time.monotonic()


def _threads(bench: Bench) -> Dict[str, float]:
    """CPU seconds so far of each thread group, summed over the server's nodes."""
    out: Dict[str, float] = {}
    for pid in bench.server_pids:
        for name, cpu in _jvm.thread_cpu(pid).items():
            out[name] = out.get(name, 0.0) + cpu
    return out


def _by_thread(before: Dict[str, float], after: Dict[str, float], per: float) -> Dict[str, float]:
    """Milliseconds of CPU per ``per`` of each thread group that used any (the largest first)."""
    used = _jvm.delta(before, after)
    return {k: round(1000.0 * v / per, 3) for k, v in sorted(used.items(), key=lambda kv: -kv[1]) if v >= 0.02}


def _jit_seconds(before: Dict[str, float], after: Dict[str, float]) -> float:
    """CPU seconds the JVM's JIT compiler threads used between two thread readings: compiling is a new
    server's (or new code path's) one-time cost, and in windows this short it is most of the noise."""
    return sum(v for k, v in _jvm.delta(before, after).items() if "Compiler" in k)


def _requests(before: Dict[str, int], after: Dict[str, int]) -> Dict[str, int]:
    delta = {k: after.get(k, 0) - before.get(k, 0) for k in after}
    return {k: v for k, v in sorted(delta.items()) if v > 0 and "/actuator/" not in k}


def measure(bench: Bench, driver_name: str, s: dict) -> dict:
    """One driver: baseline window, N idle listeners, a burst of messages (see the module docstring)."""
    c0, t0, hb0 = *_cpu(bench), _threads(bench)
    time.sleep(s["base_s"])
    c1, t1, hb1 = *_cpu(bench), _threads(bench)
    base_rate = (c1 - c0) / (t1 - t0)
    base_jit = _jit_seconds(hb0, hb1) / (t1 - t0)
    base, _, tag = driver_name.partition("@")
    driver = bench.driver(base, "share", model=bench.models[base]["listen"], n=s["n"], messages=s["messages"],
                          rate=s["rate"], start_budget_s=600.0, patch=s["variants"].get(tag, {}),
                          code=s["baseline"] if tag == "base" else None)
    ids: List[str] = []
    try:
        started = driver.expect("started", timeout=900)
        ids = started["ids"]
        if len(ids) < s["n"]:
            return {"error": f"started {len(ids)} of {s['n']}: {started.get('stopped')}"}
        time.sleep(5.0)  # every run reaches its wait for a message; start-up traffic settles
        r0 = bench.server_requests()
        c0, t0, h0 = *_cpu(bench), _threads(bench)
        sampler = _jvm.StackSampler(bench.server_pids[0], interval=2.0).start() if s["jstack"] else None
        time.sleep(s["idle_s"])
        idle_stacks = sampler.stop() if sampler else None
        c1, t1, h1 = *_cpu(bench), _threads(bench)
        r1 = bench.server_requests()
        idle_rate = (c1 - c0) / (t1 - t0)
        idle_jit = _jit_seconds(h0, h1) / (t1 - t0)
        tasks0, bytes0 = _tasks_and_bytes(bench, ids)
        r2 = bench.server_requests()
        c2, t2, h2 = *_cpu(bench), _threads(bench)
        sampler = _jvm.StackSampler(bench.server_pids[0], interval=2.0).start() if s["jstack"] else None
        driver.send("burst")
        done = driver.expect("burst_done", timeout=120 + s["messages"] / s["rate"])
        time.sleep(TAIL_S)
        burst_stacks = sampler.stop() if sampler else None
        c3, t3, h3 = *_cpu(bench), _threads(bench)
        r3 = bench.server_requests()
        tasks1, bytes1 = _tasks_and_bytes(bench, ids)
        # Idle again, the runs now longer by the messages' tasks: each 1 s evaluation of a run's
        # wait for a message loads the run (PullWorkflowMessages), so its cost may grow with them.
        c4, t4 = _cpu(bench)
        time.sleep(s["idle_s"])
        c5, t5 = _cpu(bench)
        m, n, idle_s = s["messages"], len(ids), t1 - t0
        idle_req = _requests(r0, r1)
        burst_req = _requests(r2, r3)
        lat = percentiles(done["latencies"])
        burst_no_jit = (c3 - c2) - _jit_seconds(h2, h3)
        return {
            "listeners": n, "base_cpu_pct": 100.0 * base_rate, "idle_cpu_pct": 100.0 * idle_rate,
            "idle_ms_per_listener_s": 1000.0 * (idle_rate - base_rate) / n,
            "idle_after_ms_per_listener_s": 1000.0 * ((c5 - c4) / (t5 - t4) - base_rate) / n,
            "tasks_per_run_before": tasks0 / n, "tasks_per_run_after": tasks1 / n,
            "idle_req_per_listener_s": sum(idle_req.values()) / n / idle_s,
            "idle_req_by_kind": {k: v / n / idle_s for k, v in idle_req.items()},
            "burst_cpu_pct": 100.0 * (c3 - c2) / (t3 - t2),
            "cpu_ms_per_message": 1000.0 * ((c3 - c2) - idle_rate * (t3 - t2)) / m,
            "all_in_ms_per_message": 1000.0 * ((c3 - c2) - base_rate * (t3 - t2)) / m,
            "cpu_ms_per_message_no_jit": 1000.0 * (burst_no_jit - (idle_rate - idle_jit) * (t3 - t2)) / m,
            "all_in_ms_per_message_no_jit": 1000.0 * (burst_no_jit - (base_rate - base_jit) * (t3 - t2)) / m,
            "req_per_message": (sum(burst_req.values()) - sum(idle_req.values()) / idle_s * (t3 - t2)) / m,
            "req_per_message_by_kind": {k: v / m for k, v in burst_req.items()},
            "tasks_per_message": (tasks1 - tasks0) / m, "kb_per_message": (bytes1 - bytes0) / 1024.0 / m,
            "idle_stacks_by_frame": idle_stacks, "burst_stacks_by_frame": burst_stacks,
            "idle_ms_per_s_by_thread": _by_thread(h0, h1, idle_s),
            "burst_ms_per_message_by_thread": _by_thread(h2, h3, m),
            "answered": len(done["latencies"]), "answer_p50_s": lat["p50"], "answer_p95_s": lat["p95"],
        }
    finally:
        bench.cancel(ids + _listeners_behind(bench, ids))
        driver.finish()


def summarise(repeats: List[Dict[str, dict]], drivers: List[str]) -> dict:
    """Per driver the median of each figure; per ratio (ours/peer2, ours/floor) its median and min-max."""
    fields = ("idle_ms_per_listener_s", "cpu_ms_per_message", "idle_req_per_listener_s", "req_per_message",
              "tasks_per_message", "kb_per_message", "answer_p50_s", "answer_p95_s", "idle_cpu_pct", "base_cpu_pct",
              "idle_after_ms_per_listener_s", "tasks_per_run_before", "tasks_per_run_after", "all_in_ms_per_message",
              "burst_cpu_pct", "cpu_ms_per_message_no_jit", "all_in_ms_per_message_no_jit")
    out: dict = {"median": {}, "ratios": {}}
    for d in drivers:
        good = [rep[d] for rep in repeats if d in rep and not rep[d].get("error")]
        out["median"][d] = {f: statistics.median(r[f] for r in good) if good else None for f in fields}
        out["median"][d]["range"] = {f: (min(r[f] for r in good), max(r[f] for r in good)) if good else None
                                     for f in fields}
    pairs = [("ours", other) for other in ("peer2", "floor")] + \
        [(d, other) for d in drivers if d.startswith("ours@") for other in ("ours", "peer2", "floor")] + \
        [(d, d[:-2]) for d in drivers if d.endswith("#B")]
    for mine, other in pairs:
        if mine not in drivers or other not in drivers:
            continue
        for f in fields[:6] + ("all_in_ms_per_message", "cpu_ms_per_message_no_jit", "all_in_ms_per_message_no_jit"):
            ratios = [rep[mine][f] / rep[other][f] for rep in repeats
                      if not rep.get(mine, {}).get("error") and not rep.get(other, {}).get("error")
                      and rep[other].get(f)]
            if ratios:
                out["ratios"][f"{mine}/{other} {f}"] = {"median": statistics.median(ratios), "min": min(ratios),
                                                        "max": max(ratios), "n": len(ratios)}
    return out


def render(results: dict) -> str:
    s, summary = results["settings"], results["summary"]
    drivers = results["drivers"]
    names = {"ours": "ours", "peer2": "peer (conductor-python 2.0.0)", "floor": "floor (REST only)"}
    names = {d: names.get(d.split("#")[0], d.split("#")[0]) + (" on server B" if d.endswith("#B") else "")
             for d in drivers}
    lines = [SECTION, "## The server's share: ours, the peer and the floor (`benchmarks/server_share.py`)", "",
             f"{results['started']}; `{results['command']}`; server {results.get('server_version')} "
             f"({s['server']}{', ' + str(s['properties']) if s['properties'] else ''}); {s['n']} listeners per "
             f"driver, idle window {s['idle_s']:.0f} s, {s['messages']} messages at {s['rate']}/s; {s['repeats']} "
             f"repeats, the drivers' order rotated; load average {results['loadavg_start'][0]:.1f} at start, "
             f"{results['loadavg_end'][0]:.1f} at end. "
             f"{'`ours@base`: conductor_agents from ' + s['baseline'] + '. ' if s['baseline'] else ''}"
             f"{_variants(s['variants'])}{_against(s['against'])}Each cell: median (min–max over the repeats). Server CPU is "
             f"the JVM's utime+stime: ms per idle listener-second above the empty server's, ms per message above "
             f"the idle listeners'.", "",
             "| | " + " | ".join(names[d] for d in drivers) + " |", "|---|" + "---:|" * len(drivers)]
    rows = [("server CPU ms per idle listener-second", "idle_ms_per_listener_s", 2),
            ("server CPU ms per message (above the idle listeners)", "cpu_ms_per_message", 1),
            ("server CPU ms per message, all in (above the empty server)", "all_in_ms_per_message", 1),
            ("the same, the JIT compiler's threads left out: above the idle listeners", "cpu_ms_per_message_no_jit", 1),
            ("the same, the JIT compiler's threads left out: all in", "all_in_ms_per_message_no_jit", 1),
            ("server CPU % while the messages come", "burst_cpu_pct", 1),
            ("requests per idle listener-second", "idle_req_per_listener_s", 2),
            ("requests per message", "req_per_message", 1), ("tasks stored per message", "tasks_per_message", 1),
            ("KB stored per message", "kb_per_message", 1), ("answer p50 s", "answer_p50_s", 2),
            ("answer p95 s", "answer_p95_s", 2), ("server CPU % with the listeners idle", "idle_cpu_pct", 1),
            ("server CPU % with none (baseline)", "base_cpu_pct", 1),
            ("tasks per run while idle, before the messages", "tasks_per_run_before", 0),
            ("tasks per run while idle, after them", "tasks_per_run_after", 0),
            ("server CPU ms per idle listener-second, after the messages", "idle_after_ms_per_listener_s", 2)]
    for label, key, digits in rows:
        cells = []
        for d in drivers:
            med, rng = summary["median"][d].get(key), summary["median"][d]["range"].get(key)
            cells.append("—" if med is None else f"{med:.{digits}f} ({rng[0]:.{digits}f}–{rng[1]:.{digits}f})")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    if summary["ratios"]:
        lines += ["", "| ratio | median | min–max |", "|---|---:|---:|"]
        for key, r in summary["ratios"].items():
            lines.append(f"| {key} | {r['median']:.2f} | {r['min']:.2f}–{r['max']:.2f} |")
    errors = [f"{d}: {rep[d]['error']}" for rep in results["repeats"] for d in rep if rep[d].get("error")]
    lines += ["", "- *Above the idle listeners* is what the messages add to the listeners' idle cost; the peer's "
              "idle polls (one per (tool, run) every 100 ms, backing off when empty) slow down while messages "
              "come, so its figure there and its requests per message come out too low, even negative: compare "
              "the peer on the *all in* row. Server CPU by thread group, requests by kind: the JSON.",
              "- *Requests* are the server's own counts (`/actuator/prometheus`), the harness's reads left out; "
              "*KB stored* is the JSON of the listeners' runs with their tasks."]
    lines += [f"- error: {e}" for e in errors] + [SECTION]
    return "\n".join(lines)


def _variants(variants: dict) -> str:
    if not variants:
        return ""
    return "Variants of ours: " + "; ".join(f"`ours@{t}`: " + ", ".join(f"`{k}={v}`" for k, v in p.items())
                                            for t, p in variants.items()) + ". "


def _against(against: dict) -> str:
    if not against:
        return ""
    return ("Server B, started beside the first and measured in turn with it: "
            + ", ".join(f"`{k}={v}`" for k, v in against.items()) + ". ")


def write_section(path: str, text: str) -> None:
    """Put ``text`` in place of the report's server-share section (appended when it has none)."""
    old = open(path).read() if os.path.exists(path) else ""
    if old.count(SECTION) >= 2:
        head, _, rest = old.partition(SECTION)
        _, _, tail = rest.partition(SECTION)
        new = head + text + tail
    else:
        new = old.rstrip("\n") + "\n\n" + text + "\n"
    with open(path, "w") as f:
        f.write(new)


def main(argv: "list[str]") -> int:
    if argv[:1] == ["--render"]:  # write the report's section again from a results JSON
        write_section(argv[2] if len(argv) > 2 else os.path.join(HERE, "results.md"), render(json.load(open(argv[1]))))
        return 0
    args = parse_args(argv)
    s = dict(PRESETS["quick" if args.quick else "full"])
    s.update({k: getattr(args, k) for k in ("n", "idle_s", "messages", "rate", "repeats") if getattr(args, k)})
    s["server"], s["properties"] = args.server, dict(p.split("=", 1) for p in args.property)
    s["jstack"] = args.jstack
    s["variants"] = {}
    for spec in args.variant:
        tag, _, assignments = spec.partition(":")
        s["variants"][tag] = {k: json.loads(v) for k, v in (a.split("=", 1) for a in assignments.split(","))}
    drivers = [d.strip() for d in args.drivers.split(",") if d.strip()] + [f"ours@{t}" for t in s["variants"]]
    s["baseline"] = os.path.abspath(args.baseline) if args.baseline else None
    if s["baseline"]:
        drivers.append("ours@base")
    s["against"] = dict(p.split("=", 1) for p in args.against)
    if s["against"]:
        drivers += [f"{d}#B" for d in drivers]
    if server_unavailable(args.server):
        print(server_unavailable(args.server), file=sys.stderr)
        return 2
    if "peer2" in drivers and not os.path.exists(args.peer2_python):
        print(f"no peer interpreter at {args.peer2_python}; run `make bench` (it creates benchmarks/.venv-peer2)",
              file=sys.stderr)
        return 2
    results: dict = {"settings": s, "drivers": drivers, "loadavg_start": os.getloadavg(), "repeats": [],
                     "started": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                     "command": "benchmarks/server_share.py " + " ".join(argv)}
    workdir = tempfile.mkdtemp(prefix="conductor-agents-share-")
    print(f"share: logs in {workdir}", flush=True)
    for sub in ("a", "b"):
        os.makedirs(os.path.join(workdir, sub))
    with contextlib.ExitStack() as stack:
        benches = {"": stack.enter_context(Bench(os.path.join(workdir, "a"), sys.executable, args.peer2_python,
                                                 pickup_turns=1, server=args.server, peer2_python=args.peer2_python,
                                                 properties=s["properties"]))}
        if s["against"]:
            benches["B"] = stack.enter_context(Bench(
                os.path.join(workdir, "b"), sys.executable, args.peer2_python, pickup_turns=1, server=args.server,
                peer2_python=args.peer2_python, properties={**s["properties"], **s["against"]}))
        results["server_version"] = benches[""].server_version
        for d in drivers:  # a fresh server is slow for its first runs (JIT): warm it with every driver
            name, _, tag = d.partition("#")
            measure(benches[tag], name, {**s, "n": 2, "messages": 4, "idle_s": 1.0, "base_s": 1.0})
        for r in range(s["repeats"]):
            order = drivers[r % len(drivers):] + drivers[:r % len(drivers)]
            rep: Dict[str, dict] = {}
            for d in order:
                began = time.monotonic()
                name, _, tag = d.partition("#")
                try:
                    rep[d] = measure(benches[tag], name, s)
                except Exception as err:  # one failed driver is reported, the others still run
                    rep[d] = {"error": f"{type(err).__name__}: {err}"}
                print(f"share: repeat {r + 1} {d} ({time.monotonic() - began:.0f}s): "
                      f"{json.dumps({k: v for k, v in rep[d].items() if 'by_' not in k})}", flush=True)
            results["repeats"].append(rep)
    results["loadavg_end"] = os.getloadavg()
    results["summary"] = summarise(results["repeats"], drivers)
    text = render(results)
    print(text)
    with open(args.out, "w") as f:
        json.dump(results, f, indent=1)
    write_section(args.md, text)
    print(f"written: {args.out}, {args.md}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
