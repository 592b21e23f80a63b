"""Benchmark: one listener, thousands of messages (issue 18, long-lived listeners), this SDK beside the peer.

    .venv/bin/python benchmarks/long_listener.py                       # 10,000 messages on one SQLite node
    .venv/bin/python benchmarks/long_listener.py --server cluster --messages 2000
    .venv/bin/python benchmarks/long_listener.py --messages 300 --window 100    # a short look

Messages of ``--size`` bytes (300) are sent through a counting proxy, at most ``--in-flight`` of them
(8) sent and not yet acted on at any time, so that the listener takes up to ``--batch`` (20) per wait
and acts on each with one tool call (``--in-flight 1``: each sent once the previous one was acted on,
which the server's once-a-second check of a waiting message task paces at about one per second). Per window of ``--window`` messages (1,000) it reports
the round trip (send to the tool's start) p50/p99, the server's CPU per message (its JVMs' user+system
time), the server's store (the SQLite database and its WAL, or Redis's used memory), the SDK's bytes on
the wire per message (requests and responses through the proxy), how many runs the listener had, and
the stored size of a few of its finished runs, the growth of the server's store over the window, and how
many of the listener's runs the server still holds (retention, ``Continuation.keep_runs``: link 0, the
newest ended ones, the live one); below the table, the store after the first half of the messages and at
the end (a listener whose store is bounded grows by a small constant over the second half). The peer SDK (``conductor-agent-sdk`` 0.4.4, never
continues a run) goes first, until its listener fails (``--peer-messages`` at most). Results:
``benchmarks/results-long-listener*.json`` and a section for ``benchmarks/results.md``.
Nothing here asserts a timing; compare the windows of one run with each other.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from typing import Any, Dict, List, Optional

import requests

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

from _harness import Bench, percentiles, redis_used_memory  # noqa: E402

from conductor_agents._common.task_names import is_message_wait  # noqa: E402
from conductor_agents._listener.chain import parse_link_key, parse_mailbox_key  # noqa: E402
from conductor_agents._listener.directory import Chain  # noqa: E402


def parse_args(argv: "list[str]") -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--messages", type=int, default=10_000)
    p.add_argument("--size", type=int, default=300, help="bytes per message")
    p.add_argument("--window", type=int, default=1000)
    p.add_argument("--in-flight", type=int, default=8, help="most messages sent and not yet acted on")
    p.add_argument("--batch", type=int, default=20, help="most messages the listener takes per wait")
    p.add_argument("--server", choices=("sqlite", "cluster"), default="sqlite")
    p.add_argument("--sdk", choices=("both", "ours", "peer"), default="both")
    p.add_argument("--peer-messages", type=int, default=500, help="most messages the peer is sent")
    p.add_argument("--peer-python", default=os.path.join(HERE, ".venv-peer", "bin", "python"))
    p.add_argument("--out", default=None, help="JSON results (default benchmarks/results-long-listener-<server>.json)")
    p.add_argument("--wait-stats", action="store_true",
                   help="sample the listener's waits on the server (ours): how long each waited with messages sent "
                        "and not acted on, how many it took, how long each turn between two waits lasted")
    return p.parse_args(argv)


def cpu_seconds(pids: List[int]) -> float:
    """User + system CPU time of the server processes so far."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / ticks
        except (OSError, IndexError, ValueError):
            pass
    return total


def store_bytes(bench: Bench) -> Optional[int]:
    """The server's store: the SQLite files of the node, or Redis's used memory for the cluster."""
    if bench.server_kind == "cluster":
        return redis_used_memory(getattr(getattr(bench.server, "redis", None), "port", None))
    data_dir = getattr(bench.server, "data_dir", None) or os.path.join(bench.workdir, "server")
    total = 0
    for root, _, files in os.walk(str(data_dir)):
        total += sum(os.path.getsize(os.path.join(root, f)) for f in files if ".db" in f)
    return total


def held_runs(url: str, execution_id: str, runs: int) -> Optional[int]:
    """How many runs of the listener the server holds: link 0, and from its newest link (``runs - 1``, or
    further if it moved on) down to the first one retention removed (one small read each)."""
    chain = _chain_of(url, execution_id)
    if chain is None:
        return None

    def exists(number: int) -> bool:
        link = chain.link(number).execution_id
        return requests.get(f"{url}/workflow/{link}/status", timeout=30).status_code == 200

    top = max(0, runs - 1)
    while exists(top + 1):
        top += 1
    held, number = 1, top  # link 0, or the mailbox (then link 0 is counted if it is still there)
    while number > (-1 if chain.mailbox else 0) and exists(number):
        held, number = held + 1, number - 1
    return held


def _chain_of(url: str, execution_id: str) -> Optional[Chain]:
    """The listener ``execution_id`` names (its first run, or its mailbox), or None."""
    status = requests.get(f"{url}/workflow/{execution_id}/status", timeout=30).json()
    box = parse_mailbox_key(status.get("correlationId"))
    if box is not None:
        return Chain(execution_id, box.run_id, box.agent_name, 0, mailbox=True)
    key = parse_link_key(status.get("correlationId"))
    return Chain(execution_id, key.run_id, key.agent_name, key.number) if key is not None else None


def link_sizes(url: str, execution_id: str, runs: int, sample: int = 5) -> List[int]:
    """Stored sizes (bytes of the whole task list) of the last ``sample`` finished runs of the listener
    that the server still holds."""
    chain = _chain_of(url, execution_id)
    if chain is None or runs < 2:
        return []
    sizes = []
    for number in range(max(0, runs - 1 - sample), runs - 1):
        link = chain.link(number).execution_id
        response = requests.get(f"{url}/workflow/{link}", params={"includeTasks": "true"}, timeout=60)
        if response.status_code == 200:  # (404: retired already)
            sizes.append(len(response.content))
    return sizes


class WaitSampler:
    """Reads the listener's newest two links every ``every`` seconds and keeps each wait for messages it saw (a
    ``HUMAN`` wait or the server's ``PULL_WORKFLOW_MESSAGES``): scheduled, ended, how many messages it took. Bounded
    by ``stop``; reads that fail are skipped."""

    def __init__(self, url: str, execution_id: str, every: float = 1.0) -> None:
        self.url, self.execution_id, self.every = url, execution_id, every
        self.waits: Dict[str, Dict[str, Any]] = {}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="wait-sampler", daemon=True)

    def _run(self) -> None:
        chain, newest = None, 0
        while not self.stop.wait(self.every):
            try:
                chain = chain or _chain_of(self.url, self.execution_id)
                if chain is None:
                    continue
                while requests.get(f"{self.url}/workflow/{chain.link(newest + 1).execution_id}/status",
                                   timeout=30).status_code == 200:
                    newest += 1
                for number in range(max(0, newest - 1), newest + 1):
                    response = requests.get(f"{self.url}/workflow/{chain.link(number).execution_id}",
                                            params={"includeTasks": "true"}, timeout=60)
                    if response.status_code != 200:
                        continue
                    for task in response.json().get("tasks") or ():
                        if is_message_wait(task):
                            out = task.get("outputData") or {}
                            self.waits[str(task["taskId"])] = {
                                "link": number, "scheduled": task.get("scheduledTime"), "end": task.get("endTime"),
                                "status": task.get("status"), "count": out.get("count", len(out.get("messages") or ()))}
            except (requests.RequestException, ValueError):
                continue

    def summary(self) -> Dict[str, Any]:
        done = sorted((w for w in self.waits.values() if w["status"] == "COMPLETED" and w["end"]),
                      key=lambda w: w["scheduled"])
        waited = [(w["end"] - w["scheduled"]) / 1000 for w in done]
        turns = [(b["scheduled"] - a["end"]) / 1000 for a, b in zip(done, done[1:]) if b["link"] == a["link"]]
        counts = [int(w["count"] or 0) for w in done]
        return {"waits": len(done), "messages": sum(counts), "per_wait": percentiles(counts),
                "empty_waits": sum(1 for c in counts if c == 0), "waited_s": percentiles(waited),
                "waited_total_s": round(sum(waited), 1), "turn_s": percentiles(turns),
                "turns_total_s": round(sum(turns), 1)}


def drive(bench: Bench, sdk: str, python_sdk: str, messages: int, args: argparse.Namespace) -> Dict[str, Any]:
    proxy = bench.proxy()
    cfg = dict(model=bench.models[sdk]["listen"], messages=messages, size=args.size, window=args.window,
               message_timeout=120.0, server_url=proxy.url,
               in_flight=args.in_flight, batch=args.batch)  # every request of the SDK through the proxy
    driver = bench.driver(sdk, "long", **cfg)
    windows: List[Dict[str, Any]] = []
    try:
        started = driver.expect("started", timeout=600)
        eid = started["ids"][0]
        sampler = WaitSampler(bench.url, eid) if args.wait_stats and sdk == "ours" else None
        if sampler is not None:
            sampler.thread.start()
        last: Dict[str, Any] = {"cpu": cpu_seconds(bench.server_pids), "bytes": proxy.bytes, "t": time.monotonic(),
                                "done": 0, "runs": 1, "store": store_bytes(bench)}
        last_runs = 1
        while True:
            event = _next_event(driver, timeout=max(600.0, args.window * 10.0))
            if event["event"] not in ("window", "result"):
                continue
            done = int(event.get("done") or 0)
            count = done - last["done"]
            if count > 0:
                now_cpu, now_bytes = cpu_seconds(bench.server_pids), proxy.bytes
                lat = percentiles(event.get("latencies") or event.get("latencies_tail") or [])
                window = {"upto": done, "count": count, "rt_p50_s": lat.get("p50"), "rt_p99_s": lat.get("p99"),
                          "server_cpu_ms_per_msg": 1000 * (now_cpu - last["cpu"]) / count,
                          "sdk_bytes_per_msg": (now_bytes - last["bytes"]) / count,
                          "seconds": time.monotonic() - last["t"], "store_bytes": store_bytes(bench),
                          "runs": event.get("runs"), "repeats": event.get("repeats")}
                if window["store_bytes"] is not None and last.get("store") is not None:
                    window["store_growth_bytes"] = window["store_bytes"] - last["store"]
                if sdk == "ours" and event.get("runs"):
                    runs = int(event["runs"])  # every run that ended since the last window, read whole
                    sizes = link_sizes(bench.url, eid, runs, sample=max(1, runs - last.get("runs", 1)))
                    window["ended_runs_read"] = len(sizes)
                    window["largest_ended_run_bytes"] = max(sizes, default=None)
                    window["last_run_sizes"] = sizes[-5:]
                    window["runs_held"] = held_runs(bench.url, eid, runs)
                    last_runs = runs
                windows.append(window)
                print(f"[{sdk}] {json.dumps(window)}", flush=True)
                last = {"cpu": now_cpu, "bytes": now_bytes, "t": time.monotonic(), "done": done,
                        "runs": last_runs, "store": window["store_bytes"]}
            if event["event"] == "result":
                status = bench.workflow(eid).get("status")
                waits = None
                if sampler is not None:
                    sampler.stop.set()
                    sampler.thread.join(120)
                    waits = sampler.summary()
                    print(f"[{sdk}] waits {json.dumps(waits)}", flush=True)
                sends = event.get("send_seconds") or []
                send_s = {**percentiles(sends), "total": round(sum(sends), 1)}  # how long each send call took
                print(f"[{sdk}] send {json.dumps(send_s)}", flush=True)
                return {"sdk": sdk, "waits": waits, "send_s": send_s, "execution_id": eid, "done": event.get("done"), "failure": event.get("failure"),
                        "repeats": event.get("repeats"),
                        "final_status": status, "windows": windows}
    finally:
        driver.finish()
        proxy.stop()


def _next_event(driver: Any, timeout: float) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        try:
            return driver._events.get(timeout=max(0.1, min(5.0, deadline - time.monotonic())))
        except Exception:
            if time.monotonic() > deadline:
                raise TimeoutError("the driver went quiet")


def markdown(run: Dict[str, Any]) -> str:
    """The table of one SDK's windows, for ``benchmarks/results.md``."""
    rows = ["| messages | round trip p50 (s) | p99 (s) | server CPU ms/msg | SDK kB/msg | runs so far | runs held "
            "| largest run ended in the window (MB) | server store (MB) | store growth in the window (MB) "
            "| acted on twice |",
            "|---|---|---|---|---|---|---|---|---|---|---|"]
    first = 0
    for w in run.get("windows", []):
        largest = w.get("largest_ended_run_bytes")
        growth = w.get("store_growth_bytes")
        rows.append("| {}-{} | {:.2f} | {:.2f} | {:.0f} | {:.0f} | {} | {} | {} | {} | {} | {} |".format(
            first + 1, w["upto"], w["rt_p50_s"] or 0, w["rt_p99_s"] or 0, w["server_cpu_ms_per_msg"],
            w["sdk_bytes_per_msg"] / 1000, w.get("runs") or "-", w.get("runs_held") or "-",
            f"{largest / 1e6:.2f}" if largest else "-",
            f"{w['store_bytes'] / 1e6:.1f}" if w.get("store_bytes") else "-",
            f"{growth / 1e6:+.1f}" if growth is not None else "-", w.get("repeats", "-")))
        first = w["upto"]
    summary = store_summary(run)
    if summary:
        rows.append("")
        rows.append(summary)
    return "\n".join(rows)


def store_summary(run: Dict[str, Any]) -> str:
    """One line: the store after the first half of the messages and at the end (the growth over the
    second half), and the largest it was after the first window (what retention bounds)."""
    windows = [w for w in run.get("windows", []) if w.get("store_bytes") is not None]
    if len(windows) < 2:
        return ""
    total = windows[-1]["upto"]
    half = min(windows, key=lambda w: abs(w["upto"] - total / 2))
    after_first = max(w["store_bytes"] for w in windows[1:])
    runs_held = [w["runs_held"] for w in windows if w.get("runs_held")]
    return (f"Store after message {half['upto']}: {half['store_bytes'] / 1e6:.1f} MB; after message {total}: "
            f"{windows[-1]['store_bytes'] / 1e6:.1f} MB (growth over messages {half['upto'] + 1}-{total}: "
            f"{(windows[-1]['store_bytes'] - half['store_bytes']) / 1e6:+.2f} MB); largest after the first window: "
            f"{after_first / 1e6:.1f} MB" + (f"; runs held at most {max(runs_held)}" if runs_held else "") + ".")


def main(argv: "list[str]") -> int:
    args = parse_args(argv)
    out = args.out or os.path.join(HERE, f"results-long-listener-{args.server}.json")
    results: Dict[str, Any] = {"args": vars(args), "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    with tempfile.TemporaryDirectory(prefix="bench-long-") as workdir:
        with Bench(workdir, sys.executable, args.peer_python, pickup_turns=1, server=args.server) as bench:
            results["server_version"] = bench.server_version
            if args.sdk in ("both", "peer") and os.path.exists(args.peer_python):
                results["peer"] = drive(bench, "peer", args.peer_python, args.peer_messages, args)
            if args.sdk in ("both", "ours"):
                results["ours"] = drive(bench, "ours", sys.executable, args.messages, args)
    results["ended"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    with open(out, "w") as fh:
        json.dump(results, fh, indent=1)
    print(f"wrote {out}")
    for sdk in ("peer", "ours"):
        if sdk in results:
            print(f"\n{sdk}: {results[sdk].get('done')} messages, failure: {results[sdk].get('failure')}\n")
            print(markdown(results[sdk]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
