"""What a run that merely waits costs the server, and how fast a wake call moves it on, by kind of wait (issue 42).

    PYTHONPATH=. .venv/bin/python benchmarks/idle_waits.py --runs 200 --seconds 30 --repeats 2

Standalone: raw REST with ``requests`` on one ``LocalServer`` (SQLite, the SDK's settings; ``--property`` adds
-D properties), no SDK runtime. Three tiny workflow definitions, each ``[wait, SIMPLE after]``, where the wait is

- ``pull``:  ``PULL_WORKFLOW_MESSAGES`` (a listener's wait today), woken by ``POST /workflow/{id}/messages``;
- ``human``: ``HUMAN``, woken by ``POST /tasks/{id}/wait/COMPLETED`` (completion by reference name);
- ``wait``:  ``WAIT`` without a duration, woken by ``POST /tasks/{id}/COMPLETED/signal`` (3.32).

First a warm-up (20 runs of each kind, 10 woken, all terminated, 20 s of rest). Per repeat, the order of the kinds
rotating, per kind: a window of ``--seconds`` on the empty server (its baseline), then N runs started, left to
settle, a window of ``--seconds`` with nothing else happening (the server JVM's
utime+stime from /proc, per thread group too; the waits' ``pollCount`` on 10 runs before and after = how often
the server evaluates each; the decider queue's size), then ``--wakes`` wake-ups one at a time among those N waiting
runs, each timed from the wake call to the ``after`` task of that run being SCHEDULED (read back by polling
``GET /workflow/{id}`` every 10 ms), then every run terminated. Medians over the repeats are printed; the raw
figures go to ``--out`` (JSON). Nothing here asserts anything; a shared machine inflates CPU figures.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import random
import statistics
import sys
import tempfile
import time

import requests

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import _jvm  # noqa: E402
import _procs  # noqa: E402
from _harness import percentiles  # noqa: E402

KINDS = ("pull", "human", "wait")
WAIT_TASK = {
    "pull": {"name": "pull", "taskReferenceName": "wait", "type": "PULL_WORKFLOW_MESSAGES",
             "inputParameters": {"batchSize": 1}},
    "human": {"name": "human", "taskReferenceName": "wait", "type": "HUMAN"},
    "wait": {"name": "wait", "taskReferenceName": "wait", "type": "WAIT"},
}
TASK_TYPE = {"pull": "PULL_WORKFLOW_MESSAGES", "human": "HUMAN", "wait": "WAIT"}
AFTER = "idle_after"


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=200, help="waiting runs per kind (200)")
    p.add_argument("--seconds", type=float, default=30.0, help="each measuring window (30)")
    p.add_argument("--repeats", type=int, default=2, help="repeats, the kinds' order rotating (2)")
    p.add_argument("--wakes", type=int, default=10, help="wake-ups per kind per repeat (10)")
    p.add_argument("--settle", type=float, default=8.0, help="seconds after the runs wait, before a window (8)")
    p.add_argument("--kinds", default=",".join(KINDS))
    p.add_argument("--property", action="append", default=[], metavar="NAME=VALUE", help="a server -D property")
    p.add_argument("--out", default=os.path.join(HERE, "results-idle-waits.json"))
    return p.parse_args(argv)


class Api:
    def __init__(self, url: str) -> None:
        self.url = url.rstrip("/")
        self.http = requests.Session()

    def call(self, method: str, path: str, **kw) -> requests.Response:
        kw.setdefault("timeout", 60)
        return self.http.request(method, f"{self.url}{path}", **kw)

    def define(self) -> None:
        r = self.call("POST", "/metadata/taskdefs", json=[{
            "name": AFTER, "ownerEmail": "bench@example.com", "retryCount": 0, "timeoutSeconds": 0,
            "responseTimeoutSeconds": 3600, "timeoutPolicy": "TIME_OUT_WF"}])
        r.raise_for_status()
        for kind in KINDS:
            body = {"name": f"idle_{kind}", "version": 1, "schemaVersion": 2, "ownerEmail": "bench@example.com",
                    "timeoutSeconds": 0, "tasks": [WAIT_TASK[kind],
                                                   {"name": AFTER, "taskReferenceName": "after", "type": "SIMPLE"}]}
            r = self.call("POST", "/metadata/workflow", json=body)
            if r.status_code == 409:
                r = self.call("PUT", "/metadata/workflow", json=[body])
            r.raise_for_status()

    def start(self, kind: str) -> str:
        r = self.call("POST", "/workflow", json={"name": f"idle_{kind}", "version": 1, "input": {}})
        r.raise_for_status()
        return r.text.strip().strip('"')

    def run(self, eid: str) -> dict:
        r = self.call("GET", f"/workflow/{eid}", params={"includeTasks": "true"})
        r.raise_for_status()
        return r.json()

    def wait_task(self, eid: str) -> dict | None:
        for t in self.run(eid).get("tasks", []):
            if t.get("referenceTaskName") == "wait":
                return t
        return None

    def wake(self, kind: str, eid: str, i: int) -> requests.Response:
        if kind == "pull":
            return self.call("POST", f"/workflow/{eid}/messages", json={"i": i})
        if kind == "human":
            return self.call("POST", f"/tasks/{eid}/wait/COMPLETED", json={"i": i})
        return self.call("POST", f"/tasks/{eid}/COMPLETED/signal", json={"i": i})

    def terminate(self, ids: list[str]) -> None:
        for k in range(0, len(ids), 500):
            chunk = ids[k:k + 500]
            r = self.call("POST", "/workflow/bulk/terminate", params={"reason": "idle_waits done"}, json=chunk,
                          timeout=300)
            if not r.ok:
                for eid in chunk:
                    self.call("DELETE", f"/workflow/{eid}", params={"reason": "idle_waits done"})

    def running(self, kind: str) -> list[str]:
        r = self.call("GET", f"/workflow/running/idle_{kind}", params={"version": 1})
        return r.json() if r.ok else []

    def queues(self) -> dict[str, int]:
        r = self.call("GET", "/tasks/queue/all")
        return r.json() if r.ok else {}


def _window(pid: int, seconds: float) -> dict:
    c0, g0, t0 = _procs.cpu_seconds([pid]).get(pid, 0.0), _jvm.thread_cpu(pid), time.monotonic()
    time.sleep(seconds)
    c1, g1, wall = _procs.cpu_seconds([pid]).get(pid, 0.0), _jvm.thread_cpu(pid), time.monotonic() - t0
    groups = {k: round(v / wall * 1000, 2) for k, v in _jvm.delta(g0, g1).items()}
    return {"wall_s": round(wall, 2), "cpu_ms_per_s": round((c1 - c0) / wall * 1000, 2), "groups_ms_per_s": groups}


def _poll_counts(api: Api, ids: list[str]) -> dict[str, int]:
    out = {}
    for eid in ids:
        t = api.wait_task(eid)
        if t is not None:
            out[eid] = int(t.get("pollCount") or 0)
    return out


def _scheduled_after(api: Api, eid: str, deadline: float) -> float | None:
    """Monotonic time at which the run's ``after`` task was first seen (SCHEDULED or later); None past deadline."""
    while time.monotonic() < deadline:
        for t in api.run(eid).get("tasks", []):
            if t.get("referenceTaskName") == "after":
                return time.monotonic()
        time.sleep(0.01)
    return None


def _start_all(api: Api, kind: str, n: int) -> list[str]:
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        ids = list(pool.map(lambda _: api.start(kind), range(n)))
    deadline = time.monotonic() + 300
    pending = list(ids)
    while pending and time.monotonic() < deadline:  # every run's wait IN_PROGRESS
        pending = [eid for eid in pending if (api.wait_task(eid) or {}).get("status") != "IN_PROGRESS"]
        if pending:
            time.sleep(0.5)
    if pending:
        raise RuntimeError(f"{len(pending)} {kind} runs never reached an IN_PROGRESS wait")
    return ids


def measure_kind(api: Api, pid: int, kind: str, args: argparse.Namespace, base: dict) -> dict:
    t0 = time.monotonic()
    ids = _start_all(api, kind, args.runs)
    started_s = time.monotonic() - t0
    try:
        time.sleep(args.settle)
        sample = ids[:10]
        q0, pc0, p0 = api.queues(), _poll_counts(api, sample), time.monotonic()
        win = _window(pid, args.seconds)
        q1, pc1, p_s = api.queues(), _poll_counts(api, sample), time.monotonic() - p0
        evals = sorted(round((pc1[k] - pc0[k]) / p_s, 2) for k in pc0 if k in pc1)
        extra = win["cpu_ms_per_s"] - base["cpu_ms_per_s"]  # the empty window just before
        row = {"kind": kind, "runs": args.runs, "start_s": round(started_s, 1), **win,
               "above_baseline_ms_per_s": round(extra, 2),
               "ms_per_waiter_s": round(extra / args.runs, 3),
               "evaluations_per_s_of_a_wait": evals,
               "decider_queue": [q0.get("_deciderQueue"), q1.get("_deciderQueue")],
               "own_queue": [q0.get(TASK_TYPE[kind]), q1.get(TASK_TYPE[kind])]}
        # wake-ups, one at a time, at random phases
        lat, errors = [], []
        for i, eid in enumerate(random.sample(ids, min(args.wakes, len(ids)))):
            time.sleep(random.uniform(0.3, 1.3))  # noqa: S311 (a phase, not a secret)
            sent = time.monotonic()
            r = api.wake(kind, eid, i)
            if not r.ok:
                errors.append(f"{r.status_code} {r.text[:200]}")
                continue
            seen = _scheduled_after(api, eid, sent + 90)
            lat.append(None if seen is None else round(seen - sent, 4))
        row["wake_s"] = lat
        row["wake_errors"] = errors
        return row
    finally:
        api.terminate(ids)
        left = api.running(kind)
        if left:
            api.terminate(left)
        row_left = len(api.running(kind))
        if row_left:
            print(f"  warning: {row_left} {kind} runs still RUNNING after terminate", flush=True)


def warm_up(api: Api, kinds: list[str], args: argparse.Namespace) -> None:
    """Every path once before anything is measured (a fresh JVM's compiler threads took ~0.4 s of CPU a second)."""
    t0 = time.monotonic()
    for kind in kinds:
        ids = _start_all(api, kind, 20)
        for i, eid in enumerate(ids[:10]):
            api.wake(kind, eid, i)
        for eid in ids[:10]:
            _scheduled_after(api, eid, time.monotonic() + 30)
        api.terminate(ids)
    time.sleep(20)
    print(f"warm-up {time.monotonic() - t0:.0f} s", flush=True)


def _config(api: Api) -> dict:
    r = api.call("GET", "/admin/config")
    cfg = r.json() if r.ok else {}
    keys = ("conductor.workflow-message-queue.enabled", "conductor.app.humanTaskPreventsDeciderQueue",
            "conductor.app.systemTaskWorkerCallbackDuration", "conductor.app.systemTaskWorkerThreadCount",
            "conductor.app.systemTaskMaxPollCount", "conductor.app.workflowOffsetTimeout", "version")
    return {k: cfg.get(k, "(not listed)") for k in keys}


def _med(values: list[float]) -> float | None:
    values = [v for v in values if v is not None]
    return round(statistics.median(values), 3) if values else None


def report(rows: list[dict], bases: list[dict], kinds: list[str]) -> None:
    empty = [b["cpu_ms_per_s"] for b in bases]
    print(f"\nempty server: {empty} ms CPU/s (median {_med(empty)})")
    print(f"{'kind':6} {'server ms/s':>24} {'above base':>18} {'ms/waiter-s (med)':>18} "
          f"{'evals/s of a wait':>18} {'wake p50':>9} {'p95':>7} {'max':>7} n")
    for kind in kinds:
        rs = [r for r in rows if r["kind"] == kind]
        wakes = [w for r in rs for w in r["wake_s"] if w is not None]
        lost = sum(1 for r in rs for w in r["wake_s"] if w is None) + sum(len(r["wake_errors"]) for r in rs)
        pc = percentiles(wakes)
        evals = _med([e for r in rs for e in r["evaluations_per_s_of_a_wait"]])
        print(f"{kind:6} {[r['cpu_ms_per_s'] for r in rs]!s:>24} {[r['above_baseline_ms_per_s'] for r in rs]!s:>18} "
              f"{_med([r['ms_per_waiter_s'] for r in rs]):>18} {evals!s:>18} "
              f"{pc['p50'] if pc['p50'] is not None else '-':>9} {pc['p95'] if pc['p95'] is not None else '-':>7} "
              f"{max(wakes) if wakes else '-':>7} {len(wakes)}{f' ({lost} failed)' if lost else ''}")
    print("\nserver CPU by thread group, ms per second (median over repeats; groups above 2 ms/s anywhere):")
    groups = sorted({g for r in rows + bases for g, v in r["groups_ms_per_s"].items() if v > 2})
    cols = ["empty", *kinds]
    print(f"  {'group':18}" + "".join(f"{c:>9}" for c in cols))
    for g in groups:
        vals = [_med([b["groups_ms_per_s"].get(g, 0.0) for b in bases])]
        vals += [_med([r["groups_ms_per_s"].get(g, 0.0) for r in rows if r["kind"] == k]) for k in kinds]
        print(f"  {g:18}" + "".join(f"{v:>9.1f}" for v in vals))
    print("\nqueues around each window (decider queue size, own system-task queue size):")
    for r in rows:
        print(f"  {r['kind']:6} _deciderQueue {r['decider_queue']}  {TASK_TYPE[r['kind']]} {r['own_queue']}"
              f"  start of {r['runs']} runs took {r['start_s']} s")
    errs = [e for r in rows for e in r["wake_errors"]]
    if errs:
        print(f"\nwake errors: {errs[:5]}")


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    kinds = [k for k in args.kinds.split(",") if k]
    from conductor_agents.local_server import LocalServer

    props = dict(p.split("=", 1) for p in args.property)
    rows: list[dict] = []
    bases: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="idle-waits-") as tmp:
        server = LocalServer(os.path.join(tmp, "server"), startup_timeout=900, progress=False,
                             **({"properties": props} if props else {}))
        with server:
            api = Api(server.url)
            pid = int(server.pid)
            cfg = _config(api)
            print(f"server {server.version} pid {pid}; {cfg}", flush=True)
            api.define()
            warm_up(api, kinds, args)
            for rep in range(args.repeats):
                order = kinds[rep % len(kinds):] + kinds[:rep % len(kinds)]
                print(f"repeat {rep + 1}: order {order}", flush=True)
                for kind in order:
                    time.sleep(args.settle)
                    base = _window(pid, args.seconds)  # the empty server, just before this kind's runs
                    base["repeat"], base["before"] = rep + 1, kind
                    bases.append(base)
                    row = measure_kind(api, pid, kind, args, base)
                    row["repeat"] = rep + 1
                    rows.append(row)
                    print(f"  {kind}: empty {base['cpu_ms_per_s']} ms/s, with runs {row['cpu_ms_per_s']} ms/s, "
                          f"{row['ms_per_waiter_s']} ms/waiter-s, evals/s "
                          f"{row['evaluations_per_s_of_a_wait'][:3]}..., wakes {row['wake_s']}", flush=True)
                    time.sleep(args.settle)
    report(rows, bases, kinds)
    with open(args.out, "w") as f:
        json.dump({"args": vars(args), "config": cfg, "baselines": bases, "rows": rows}, f, indent=1)
    print(f"\nraw figures: {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
