"""What a run that merely waits costs the server, and how fast a wake call moves it on, by kind of wait (issue 42).

    PYTHONPATH=. .venv/bin/python benchmarks/idle_waits.py --runs 200 --seconds 30 --repeats 2
    PYTHONPATH=. .venv/bin/python benchmarks/idle_waits.py --shape fork --runs 200 --seconds 60 --park-seconds 30

Standalone: raw REST with ``requests`` on one ``LocalServer`` (SQLite, the SDK's settings; ``--property`` adds
-D properties), no SDK runtime. Three tiny workflow definitions, each ``[wait, SIMPLE after]``, where the wait is

- ``pull``:  ``PULL_WORKFLOW_MESSAGES`` (a listener's wait today), woken by ``POST /workflow/{id}/messages``;
- ``human``: ``HUMAN``, woken by ``POST /tasks/{id}/wait/COMPLETED`` (completion by reference name);
- ``wait``:  ``WAIT`` without a duration, woken by ``POST /tasks/{id}/COMPLETED/signal`` (3.32).

First a warm-up (20 runs of each kind, 10 woken, all terminated, 20 s of rest). Per repeat, the order of the kinds
rotating, per kind: a window of ``--seconds`` on the empty server (its baseline), then N runs started, left to
settle, a window of ``--seconds`` with nothing else happening (the server JVM's
utime+stime from /proc, per thread group too; the waits' ``pollCount`` on ``--sample`` runs (10) before and after =
how often the server evaluates each; the decider queue's size), then ``--wakes`` wake-ups one at a time among those
N waiting runs, each timed from the wake call to the ``after`` task of that run being SCHEDULED (read back by polling
``GET /workflow/{id}`` every 10 ms), then every run terminated. Medians over the repeats are printed; the raw
figures go to ``--out`` (JSON). Nothing here asserts anything; a shared machine inflates CPU figures.

``--shape fork`` is the agent's shape: one definition ``[FORK_JOIN_DYNAMIC (one branch: the wait), JOIN, SIMPLE
after]``, the wait's reference name ``wait``, and these kinds:

- ``pull``:         ``PULL_WORKFLOW_MESSAGES`` (a listener's wait today), woken by the push alone;
- ``pull-parked``:  the PULL and the JOIN parked (``POST /tasks`` IN_PROGRESS with ``callbackAfterSeconds``
  ``--park-seconds``); woken by the push, a nudge of the PULL (``callbackAfterSeconds`` 0), a wait for the PULL
  COMPLETED (``GET /tasks/{taskId}`` every 5 ms), a nudge of the JOIN;
- ``human-parked``: ``HUMAN``, the JOIN parked; woken by completing the HUMAN by reference name + a nudge of the JOIN;
- ``human``:        ``HUMAN``, the JOIN not parked; woken by the completion alone.

For a parked kind a re-park loop (``Parker``) runs beside the measuring, as a serving process would: it re-parks
each run ``--repark-early`` s before its park expires, with one ``GET /workflow/{id}/tasks?status=IN_PROGRESS`` and
one update per parked task, so the window pays for keeping them parked (``--park-seconds`` shorter than
``--seconds`` puts re-parks in it). For an unparked kind the JOINs are first left (at most ``--join-settle`` s) to
pass their first 200 evaluations, which the server makes with no delay (what that phase cost is kept). Also kept:
the JOINs' ``pollCount`` growth, the machine's load average, and each wake's server CPU (from the wake call to
``after`` seen, less the idle window's rate over that time; it includes the benchmark's own read polling).
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
import threading
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
# --shape fork: the agent's shape, [FORK_JOIN_DYNAMIC (one branch: the wait), JOIN, SIMPLE after]
FORK_KINDS = ("pull", "pull-parked", "human-parked", "human")
PARKED = {"pull-parked": ("wait", "join"), "human-parked": ("join",)}  # the tasks a parked kind keeps parked
FORK_WF = "idle_fork"
JOIN_FAST_POLLS = 205  # past systemTaskPostponeThreshold (200) and the first steps of the JOIN's backoff


def base_kind(kind: str) -> str:
    """``pull-parked`` -> ``pull``: the wait task a kind waits on."""
    return kind.split("-", 1)[0]


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=200, help="waiting runs per kind (200)")
    p.add_argument("--seconds", type=float, default=30.0, help="each measuring window (30)")
    p.add_argument("--repeats", type=int, default=2, help="repeats, the kinds' order rotating (2)")
    p.add_argument("--wakes", type=int, default=10, help="wake-ups per kind per repeat (10)")
    p.add_argument("--settle", type=float, default=8.0, help="seconds after the runs wait, before a window (8)")
    p.add_argument("--sample", type=int, default=10, help="runs whose pollCounts are read around a window (10)")
    p.add_argument("--kinds", default=None, help=f"flat: {','.join(KINDS)}; fork: {','.join(FORK_KINDS)} (all)")
    p.add_argument("--shape", choices=("flat", "fork"), default="flat",
                   help="flat: [wait, after]; fork: [FORK_JOIN_DYNAMIC (the wait), JOIN, after] (flat)")
    p.add_argument("--park-seconds", type=int, default=60,
                   help="fork, *-parked: callbackAfterSeconds of a park, and the re-park period (60)")
    p.add_argument("--join-settle", type=float, default=180.0,
                   help="fork, unparked kinds: at most this long for the JOINs' first 200 evaluations (180)")
    p.add_argument("--repark-early", type=float, default=1.0,
                   help="fork, *-parked: re-park a run this many seconds before its park expires (1)")
    p.add_argument("--property", action="append", default=[], metavar="NAME=VALUE", help="a server -D property")
    p.add_argument("--out", default=None, help="results-idle-waits.json (flat), results-idle-waits-fork.json (fork)")
    args = p.parse_args(argv)
    if args.kinds is None:
        args.kinds = ",".join(FORK_KINDS if args.shape == "fork" else KINDS)
    if args.out is None:
        args.out = os.path.join(HERE, "results-idle-waits-fork.json" if args.shape == "fork"
                                else "results-idle-waits.json")
    return args


class Api:
    def __init__(self, url: str, shape: str = "flat") -> None:
        self.url = url.rstrip("/")
        self.shape = shape
        self.http = requests.Session()
        self.requests = 0  # calls made, to count a wake's

    def call(self, method: str, path: str, **kw) -> requests.Response:
        kw.setdefault("timeout", 60)
        self.requests += 1
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
            self._put_workflow(body)
        self._put_workflow({
            "name": FORK_WF, "version": 1, "schemaVersion": 2, "ownerEmail": "bench@example.com", "timeoutSeconds": 0,
            "tasks": [{"name": "fork", "taskReferenceName": "fork", "type": "FORK_JOIN_DYNAMIC",
                       "inputParameters": {"dynamicTasks": "${workflow.input.tasks}",
                                           "dynamicTasksInput": "${workflow.input.inputs}"},
                       "dynamicForkTasksParam": "dynamicTasks", "dynamicForkTasksInputParamName": "dynamicTasksInput"},
                      {"name": "join", "taskReferenceName": "join", "type": "JOIN"},
                      {"name": AFTER, "taskReferenceName": "after", "type": "SIMPLE"}]})

    def _put_workflow(self, body: dict) -> None:
        r = self.call("POST", "/metadata/workflow", json=body)
        if r.status_code == 409:
            r = self.call("PUT", "/metadata/workflow", json=[body])
        r.raise_for_status()

    def start(self, kind: str) -> str:
        if self.shape == "fork":  # one branch, the wait (reference name "wait"), as the agent's tool fork
            body = {"name": FORK_WF, "version": 1,
                    "input": {"tasks": [WAIT_TASK[base_kind(kind)]], "inputs": {"wait": {"batchSize": 1}}}}
        else:
            body = {"name": f"idle_{kind}", "version": 1, "input": {}}
        r = self.call("POST", "/workflow", json=body)
        r.raise_for_status()
        return r.text.strip().strip('"')

    def in_progress(self, eid: str) -> dict[str, dict]:
        """The run's IN_PROGRESS tasks by reference name: one ``GET /workflow/{id}/tasks?status=IN_PROGRESS``."""
        r = self.call("GET", f"/workflow/{eid}/tasks", params={"status": "IN_PROGRESS", "count": 50})
        r.raise_for_status()
        return {t["referenceTaskName"]: t for t in r.json().get("results", [])}

    def task(self, task_id: str) -> dict:
        r = self.call("GET", f"/tasks/{task_id}")
        r.raise_for_status()
        return r.json()

    def postpone(self, eid: str, task_id: str, seconds: int) -> requests.Response:
        """IN_PROGRESS with ``callbackAfterSeconds``: a park (``seconds`` > 0) or a nudge (0) of a system task."""
        return self.call("POST", "/tasks", json={
            "workflowInstanceId": eid, "taskId": task_id, "status": "IN_PROGRESS", "callbackAfterSeconds": seconds,
            "workerId": "idle-waits", "outputData": {}})

    def run(self, eid: str) -> dict:
        r = self.call("GET", f"/workflow/{eid}", params={"includeTasks": "true"})
        r.raise_for_status()
        return r.json()

    def wait_task(self, eid: str) -> dict | None:
        for t in self.run(eid).get("tasks", []):
            if t.get("referenceTaskName") == "wait":
                return t
        return None

    def wake(self, kind: str, eid: str, i: int, parked: dict[str, str] | None = None) -> requests.Response:
        """The kind's wake call; for a parked kind (``parked``: reference name -> task id) also its nudges."""
        base = base_kind(kind)
        if base == "pull":
            r = self.call("POST", f"/workflow/{eid}/messages", json={"i": i})
        elif base == "human":
            r = self.call("POST", f"/tasks/{eid}/wait/COMPLETED", json={"i": i})
        else:
            r = self.call("POST", f"/tasks/{eid}/COMPLETED/signal", json={"i": i})
        if not r.ok or not parked:
            return r
        if "wait" in parked:  # the PULL: evaluate it now, and the JOIN once it has the message
            self.postpone(eid, parked["wait"], 0)
            deadline = time.monotonic() + 30
            while self.task(parked["wait"]).get("status") != "COMPLETED" and time.monotonic() < deadline:
                time.sleep(0.005)
        return self.postpone(eid, parked["join"], 0)

    def terminate(self, ids: list[str]) -> None:
        for k in range(0, len(ids), 500):
            chunk = ids[k:k + 500]
            r = self.call("POST", "/workflow/bulk/terminate", params={"reason": "idle_waits done"}, json=chunk,
                          timeout=300)
            if not r.ok:
                for eid in chunk:
                    self.call("DELETE", f"/workflow/{eid}", params={"reason": "idle_waits done"})

    def running(self, kind: str) -> list[str]:
        name = FORK_WF if self.shape == "fork" else f"idle_{kind}"
        r = self.call("GET", f"/workflow/running/{name}", params={"version": 1})
        return r.json() if r.ok else []

    def queues(self) -> dict[str, int]:
        r = self.call("GET", "/tasks/queue/all")
        return r.json() if r.ok else {}


class Parker:
    """What a serving process would do to keep its waiting runs parked: a loop that re-parks each run of a parked
    kind just before its park expires, each time with one read (``GET /workflow/{id}/tasks?status=IN_PROGRESS``)
    and one ``callbackAfterSeconds: period`` update per parked task (the PULL and the JOIN, or the JOIN)."""

    def __init__(self, url: str, shape: str, refs: tuple[str, ...], period: int, early: float) -> None:
        self.api = Api(url, shape)  # its own session: it runs beside the measuring thread
        self.refs, self.period, self.early = refs, period, early
        self.due: dict[str, float] = {}  # run -> monotonic time its park expires
        self.task_ids: dict[str, dict[str, str]] = {}  # run -> reference name -> task id
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.reads = self.updates = self.late = 0  # late: renewed after its park had expired
        self.late_max_s = 0.0
        self.errors: list[str] = []
        self.thread = threading.Thread(target=self._loop, name="re-park", daemon=True)

    def park(self, eid: str) -> None:
        with self.lock:
            self._park(eid)

    def _park(self, eid: str) -> None:
        if eid in self.due and time.monotonic() > self.due[eid]:
            self.late += 1
            self.late_max_s = max(self.late_max_s, time.monotonic() - self.due[eid])
        self.due.pop(eid, None)
        tasks = self.api.in_progress(eid)
        self.reads += 1
        ids = {ref: tasks[ref]["taskId"] for ref in self.refs if ref in tasks}
        if len(ids) != len(self.refs):
            self.errors.append(f"{eid}: IN_PROGRESS {sorted(tasks)}, wanted {self.refs}")
            return
        sent = time.monotonic()
        for tid in ids.values():
            r = self.api.postpone(eid, tid, self.period)
            self.updates += 1
            if not r.ok:
                self.errors.append(f"{eid}: park {r.status_code} {r.text[:200]}")
        self.task_ids[eid] = ids
        self.due[eid] = sent + self.period

    def counts(self) -> dict[str, int]:
        return {"reads": self.reads, "updates": self.updates, "late": self.late, "errors": len(self.errors),
                "late_max_ms": round(self.late_max_s * 1000)}

    def release(self, eid: str) -> dict[str, str]:
        """Stop re-parking ``eid`` (it is about to be woken); its parked tasks' ids."""
        with self.lock:
            self.due.pop(eid, None)
            return self.task_ids[eid]

    def _loop(self) -> None:
        while not self.stopping.is_set():
            with self.lock:
                eid, due = min(self.due.items(), key=lambda kv: kv[1], default=(None, 0.0))
                if eid is not None and due - self.early <= time.monotonic():
                    self._park(eid)
                    continue
            self.stopping.wait(0.05)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.stopping.set()
        if self.thread.is_alive():
            self.thread.join(timeout=120)


def _window(pid: int, seconds: float) -> dict:
    c0, g0, t0 = _procs.cpu_seconds([pid]).get(pid, 0.0), _jvm.thread_cpu(pid), time.monotonic()
    time.sleep(seconds)
    c1, g1, wall = _procs.cpu_seconds([pid]).get(pid, 0.0), _jvm.thread_cpu(pid), time.monotonic() - t0
    groups = {k: round(v / wall * 1000, 2) for k, v in _jvm.delta(g0, g1).items()}
    return {"wall_s": round(wall, 2), "cpu_ms_per_s": round((c1 - c0) / wall * 1000, 2), "groups_ms_per_s": groups}


def _poll_counts(api: Api, ids: list[str], refs: tuple[str, ...]) -> dict[str, dict[str, int]]:
    """``pollCount`` of each of ``refs`` (the wait; the JOIN in the fork shape) in each run: ref -> run -> count."""
    out: dict[str, dict[str, int]] = {ref: {} for ref in refs}
    for eid in ids:
        for t in api.run(eid).get("tasks", []):
            if t.get("referenceTaskName") in out:
                out[t["referenceTaskName"]][eid] = int(t.get("pollCount") or 0)
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


def _rates(before: dict[str, int], after: dict[str, int], seconds: float) -> list[float]:
    return sorted(round((after[k] - before[k]) / seconds, 3) for k in before if k in after)


def _jvm_cpu(pid: int) -> float:
    return _procs.cpu_seconds([pid]).get(pid, 0.0)


def _join_fast_phase(api: Api, pid: int, sample: list[str], args: argparse.Namespace, base: dict) -> dict:
    """Wait (at most ``--join-settle`` s) until the sample's JOINs are past their first JOIN_FAST_POLLS evaluations.

    A JOIN is evaluated with no delay while its ``pollCount`` <= ``systemTaskPostponeThreshold`` (200), then every
    min(2^(n-200) s, ``systemTaskWorkerCallbackDuration``) (``Join.getEvaluationOffset``): a listener that waits
    for months is measured past that phase; what the phase costs is kept here."""
    c0, t0 = _jvm_cpu(pid), time.monotonic()
    least = 0
    while time.monotonic() - t0 < args.join_settle:
        counts = _poll_counts(api, sample, ("join",))["join"]
        least = min(counts.values(), default=0)
        if least > JOIN_FAST_POLLS:
            break
        time.sleep(2)
    wall = time.monotonic() - t0
    cpu = (_jvm_cpu(pid) - c0) / wall * 1000
    return {"seconds": round(wall, 1), "least_join_poll_count": least, "cpu_ms_per_s": round(cpu, 1),
            "above_baseline_ms_per_s": round(cpu - base["cpu_ms_per_s"], 1)}


def measure_kind(api: Api, pid: int, kind: str, args: argparse.Namespace, base: dict) -> dict:
    fork = api.shape == "fork"
    refs = ("wait", "join") if fork else ("wait",)
    queue_names = ("PULL_WORKFLOW_MESSAGES", "JOIN") if fork else (TASK_TYPE[kind],)
    t0 = time.monotonic()
    ids = _start_all(api, kind, args.runs)
    parker = None
    if kind in PARKED:  # parked once, one run after another (so their expiries spread as they would), then kept so
        parker = Parker(api.url, api.shape, PARKED[kind], args.park_seconds, args.repark_early)
        for eid in ids:
            parker.park(eid)
        parker.start()
    started_s = time.monotonic() - t0
    try:
        sample = ids[:args.sample]
        fast = _join_fast_phase(api, pid, sample, args, base) if fork and parker is None else None
        time.sleep(args.settle)
        q0, pc0, p0 = api.queues(), _poll_counts(api, sample, refs), time.monotonic()
        k0 = parker.counts() if parker else None
        win = _window(pid, args.seconds)
        k1 = parker.counts() if parker else None
        q1, pc1, p_s = api.queues(), _poll_counts(api, sample, refs), time.monotonic() - p0
        polls = {ref: _rates(pc0[ref], pc1[ref], p_s) for ref in refs}
        extra = win["cpu_ms_per_s"] - base["cpu_ms_per_s"]  # the empty window just before
        row = {"kind": kind, "shape": api.shape, "runs": args.runs, "start_s": round(started_s, 1), **win,
               "above_baseline_ms_per_s": round(extra, 2),
               "ms_per_waiter_s": round(extra / args.runs, 3),
               "evaluations_per_s_of_a_wait": polls["wait"],
               "polls_per_s": polls,
               "decider_queue": [q0.get("_deciderQueue"), q1.get("_deciderQueue")],
               "own_queue": [q0.get(queue_names[0]), q1.get(queue_names[0])],
               "queues": {q: [q0.get(q), q1.get(q)] for q in queue_names}}
        if fast:
            row["join_fast_phase"] = fast
        if parker and k0 and k1:
            row["reparks_in_window"] = {k: k1[k] - k0[k] for k in k0 if k != "late_max_ms"}
            row["reparks_in_window"]["late_max_ms_so_far"] = k1["late_max_ms"]
            row["park_seconds"] = args.park_seconds
        # wake-ups, one at a time, at random phases; the server's CPU from each wake call to its `after` seen
        lat, errors, wake_cpu, wake_wall, wake_calls = [], [], 0.0, 0.0, 0
        for i, eid in enumerate(random.sample(ids, min(args.wakes, len(ids)))):
            parked = parker.release(eid) if parker else None
            time.sleep(random.uniform(0.3, 1.3))  # noqa: S311 (a phase, not a secret)
            c0, n0, sent = _jvm_cpu(pid), api.requests, time.monotonic()
            r = api.wake(kind, eid, i, parked)
            if not r.ok:
                errors.append(f"{r.status_code} {r.text[:200]}")
                continue
            seen = _scheduled_after(api, eid, sent + 90)
            lat.append(None if seen is None else round(seen - sent, 4))
            wake_cpu += _jvm_cpu(pid) - c0
            wake_wall += time.monotonic() - sent
            wake_calls += api.requests - n0
        row["wake_s"] = lat
        row["wake_errors"] = errors
        n = max(1, len(lat))
        row["wake_cpu"] = {  # above the idle window's rate; includes the 10 ms read polling (calls, per wake)
            "ms_per_wake": round((wake_cpu - win["cpu_ms_per_s"] / 1000 * wake_wall) * 1000 / n, 1),
            "raw_ms_per_wake": round(wake_cpu * 1000 / n, 1), "wall_s_per_wake": round(wake_wall / n, 3),
            "requests_per_wake": round(wake_calls / n, 1)}
        if parker:
            row["park_errors"] = parker.errors[:5]
        return row
    finally:
        if parker:
            parker.stop()
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
        parker = Parker(api.url, api.shape, PARKED[kind], args.park_seconds, 0) if kind in PARKED else None
        for i, eid in enumerate(ids[:10]):
            if parker:
                parker.park(eid)
            api.wake(kind, eid, i, parker.release(eid) if parker else None)
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
    print(f"{'kind':12} {'server ms/s':>18} {'above base':>16} {'ms/waiter-s':>11} {'wait polls/s':>12} "
          f"{'JOIN polls/s':>12} {'wake p50':>9} {'p95':>7} {'max':>7} {'wake ms CPU':>11} n")
    for kind in kinds:
        rs = [r for r in rows if r["kind"] == kind]
        wakes = [w for r in rs for w in r["wake_s"] if w is not None]
        lost = sum(1 for r in rs for w in r["wake_s"] if w is None) + sum(len(r["wake_errors"]) for r in rs)
        pc = percentiles(wakes)
        evals = _med([e for r in rs for e in r["evaluations_per_s_of_a_wait"]])
        joins = _med([e for r in rs for e in r.get("polls_per_s", {}).get("join", [])])
        wake_cpu = _med([r["wake_cpu"]["ms_per_wake"] for r in rs if "wake_cpu" in r])
        print(f"{kind:12} {[r['cpu_ms_per_s'] for r in rs]!s:>18} {[r['above_baseline_ms_per_s'] for r in rs]!s:>16} "
              f"{_med([r['ms_per_waiter_s'] for r in rs]):>11} {evals!s:>12} {joins if joins is not None else '-':>12} "
              f"{pc['p50'] if pc['p50'] is not None else '-':>9} {pc['p95'] if pc['p95'] is not None else '-':>7} "
              f"{max(wakes) if wakes else '-':>7} {wake_cpu!s:>11} {len(wakes)}{f' ({lost} failed)' if lost else ''}")
    print("\nserver CPU by thread group, ms per second (median over repeats; groups above 2 ms/s anywhere):")
    groups = sorted({g for r in rows + bases for g, v in r["groups_ms_per_s"].items() if v > 2})
    cols = ["empty", *kinds]
    print(f"  {'group':18}" + "".join(f"{c:>13}" for c in cols))
    for g in groups:
        vals = [_med([b["groups_ms_per_s"].get(g, 0.0) for b in bases])]
        vals += [_med([r["groups_ms_per_s"].get(g, 0.0) for r in rows if r["kind"] == k]) for k in kinds]
        print(f"  {g:18}" + "".join(f"{v:>13.1f}" for v in vals))
    print("\nqueues around each window (decider queue size, system-task queue sizes), re-parks within it, load:")
    for r in rows:
        queues = r.get("queues") or {TASK_TYPE[r["kind"]]: r["own_queue"]}
        print(f"  {r['kind']:12} _deciderQueue {r['decider_queue']}  "
              + "  ".join(f"{q} {v}" for q, v in queues.items())
              + (f"  re-parks {r['reparks_in_window']}" if "reparks_in_window" in r else "")
              + f"  load {r.get('loadavg')}  start of {r['runs']} runs took {r['start_s']} s")
    errs = [e for r in rows for e in r["wake_errors"]] + [e for r in rows for e in r.get("park_errors", [])]
    if errs:
        print(f"\nwake/park errors: {errs[:5]}")


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
            api = Api(server.url, args.shape)
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
                    row["loadavg"] = [round(x, 2) for x in os.getloadavg()]  # the machine's, after the window
                    rows.append(row)
                    print(f"  {kind}: empty {base['cpu_ms_per_s']} ms/s, with runs {row['cpu_ms_per_s']} ms/s, "
                          f"{row['ms_per_waiter_s']} ms/waiter-s, polls/s "
                          f"{ {k: v[:3] for k, v in row['polls_per_s'].items()} }..., wakes {row['wake_s']}, "
                          f"wake CPU {row['wake_cpu']}, load {row['loadavg']}"
                          + (f", JOIN fast phase {row['join_fast_phase']}" if "join_fast_phase" in row else "")
                          + (f", re-parks {row['reparks_in_window']}" if "reparks_in_window" in row else ""),
                          flush=True)
                    time.sleep(args.settle)
    report(rows, bases, kinds)
    with open(args.out, "w") as f:
        json.dump({"args": vars(args), "config": cfg, "baselines": bases, "rows": rows}, f, indent=1)
    print(f"\nraw figures: {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
