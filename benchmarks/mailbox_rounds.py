"""What N idle listener mailboxes cost the server: the round of version 2 against the blocking pull of version 1
(issue 42, step 1).

    PYTHONPATH=. .venv/bin/python benchmarks/mailbox_rounds.py --mailboxes 50 --seconds 45 --repeats 2

Standalone: raw REST on one ``LocalServer`` (SQLite, the SDK's settings), no SDK runtime, no listener: only the
mailbox workflow (``conductor_agents_mailbox``), its forward task routed to a domain nobody polls. Two kinds:

- ``v1``: ``DO_WHILE [PULL_WORKFLOW_MESSAGES (blocking), forward]``, the mailbox until this change;
- ``v2``: ``DO_WHILE [PULL_WORKFLOW_MESSAGES (blocking: false), SWITCH (0 -> WAIT --check s; else forward)]``,
  :func:`conductor_agents._listener.mailbox.definitions`.

Per repeat, the kinds' order rotating, per kind: a window of ``--seconds`` on the empty server, then N mailboxes
started and left ``--settle`` s (after a warm-up of every kind), a window of ``--seconds`` (the server JVM's utime+stime from /proc, per thread
group too), then ``--wakes`` wake-ups one at a time (v1: a push; v2: a push then ``ConductorApi.signal_wait``),
each timed from the push to the mailbox's forward task being SCHEDULED, then the size of one mailbox run and
every mailbox terminated. Medians over the repeats are printed; the raw figures go to ``--out``. Nothing here
asserts anything; a shared machine inflates CPU figures.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import copy
import json
import os
import statistics
import sys
import tempfile
import time

import requests

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import _jvm  # noqa: E402
import _procs  # noqa: E402

from conductor_agents._common.task_names import FORWARD_TASK  # noqa: E402
from conductor_agents._listener import mailbox  # noqa: E402
from conductor_agents._wire.api import ConductorApi  # noqa: E402
from conductor_agents._wire.transport import Transport  # noqa: E402

DOMAIN = "nobody-polls-this"


def definitions() -> list[dict]:
    """Both versions of the mailbox workflow: version 2 as the SDK defines it, version 1 as it was."""
    _, (v2,) = mailbox.definitions()
    v1 = copy.deepcopy(v2)
    loop = v1["tasks"][0]
    pull, switch = loop["loopOver"]
    pull["inputParameters"] = {"batchSize": pull["inputParameters"]["batchSize"]}  # blocking (the default)
    loop["loopOver"] = [pull, switch["defaultCase"][0]]
    loop["loopCondition"] = "$.forward['end'] != true"
    v1.update(version=1, inputParameters=[])
    return [v1, v2]


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mailboxes", type=int, default=50)
    p.add_argument("--seconds", type=float, default=45.0, help="each measuring window")
    p.add_argument("--settle", type=float, default=15.0)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--check", type=int, default=30, help="v2's mailbox_check_seconds")
    p.add_argument("--wakes", type=int, default=10)
    p.add_argument("--kinds", default="v1,v2")
    p.add_argument("--out", default=os.path.join(HERE, "results-mailbox-rounds.json"))
    return p.parse_args(argv)


class Bench:
    def __init__(self, url: str, args: argparse.Namespace) -> None:
        self.url, self.args = url, args
        self.http = requests.Session()
        self.api = ConductorApi(Transport(url))

    def start(self, version: int) -> str:
        body = {"name": mailbox.MAILBOX_WORKFLOW, "version": version, "taskToDomain": {FORWARD_TASK: DOMAIN},
                "input": {"checkEvery": mailbox.check_every(self.args.check)} if version == 2 else {}}
        r = self.http.post(f"{self.url}/workflow", json=body, timeout=30)
        r.raise_for_status()
        return r.text.strip()

    def tasks(self, eid: str) -> list[dict]:
        r = self.http.get(f"{self.url}/workflow/{eid}", params={"includeTasks": "true"}, timeout=30)
        r.raise_for_status()
        return r.json().get("tasks", [])

    def resting(self, eid: str, version: int) -> bool:
        kind = "WAIT" if version == 2 else "PULL_WORKFLOW_MESSAGES"
        return any(t["taskType"] == kind and t["status"] == "IN_PROGRESS" for t in self.tasks(eid))

    def start_all(self, version: int) -> list[str]:
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            ids = list(pool.map(lambda _: self.start(version), range(self.args.mailboxes)))
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and not all(self.resting(eid, version) for eid in ids):
            time.sleep(0.5)
        return ids

    def wake(self, eid: str, version: int, n: int) -> float | None:
        """Seconds from a push to the mailbox's forward SCHEDULED (v2: the push, then the SDK's signal)."""
        t0 = time.monotonic()
        self.http.post(f"{self.url}/workflow/{eid}/messages", json={"n": n}, timeout=30).raise_for_status()
        if version == 2:
            mailbox.wake(self.api, eid, pause=lambda s: time.sleep(s))
        deadline = t0 + self.args.check + 10
        while time.monotonic() < deadline:
            if any(t["referenceTaskName"].startswith("forward") for t in self.tasks(eid)):
                return round(time.monotonic() - t0, 3)
            time.sleep(0.01)
        return None

    def end_all(self, ids: list[str]) -> None:
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            list(pool.map(lambda eid: self.http.delete(f"{self.url}/workflow/{eid}", params={"reason": "bench"},
                                                       timeout=30), ids))


def _window(pid: int, seconds: float) -> dict:
    c0, g0, t0 = _procs.cpu_seconds([pid]).get(pid, 0.0), _jvm.thread_cpu(pid), time.monotonic()
    time.sleep(seconds)
    c1, g1, wall = _procs.cpu_seconds([pid]).get(pid, 0.0), _jvm.thread_cpu(pid), time.monotonic() - t0
    groups = {k: round(v / wall * 1000, 2) for k, v in _jvm.delta(g0, g1).items() if v / wall * 1000 >= 1}
    return {"wall_s": round(wall, 2), "cpu_ms_per_s": round((c1 - c0) / wall * 1000, 2), "groups_ms_per_s": groups}


def measure(bench: Bench, pid: int, kind: str, args: argparse.Namespace) -> dict:
    version = int(kind[1:])
    empty = _window(pid, args.seconds)
    ids = bench.start_all(version)
    time.sleep(args.settle)
    loaded = _window(pid, args.seconds)
    wakes = [bench.wake(ids[i % len(ids)], version, i) for i in range(args.wakes)]
    run = bench.http.get(f"{bench.url}/workflow/{ids[-1]}", params={"includeTasks": "true"}, timeout=30)
    bench.end_all(ids)
    per = (loaded["cpu_ms_per_s"] - empty["cpu_ms_per_s"]) / args.mailboxes
    done = [w for w in wakes if w is not None]
    return {"kind": kind, "empty": empty, "loaded": loaded, "ms_per_mailbox_s": round(per, 3), "wakes_s": wakes,
            "wake_p50_s": statistics.median(done) if done else None, "run_bytes": len(run.content),
            "run_tasks": len(run.json().get("tasks", []))}


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    kinds = [k for k in args.kinds.split(",") if k]
    from conductor_agents.local_server import LocalServer

    rows: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="mailbox-rounds-") as tmp:
        with LocalServer(os.path.join(tmp, "server"), startup_timeout=900, progress=False) as server:
            bench, pid = Bench(server.url, args), int(server.pid)
            task_defs, _ = mailbox.definitions()
            bench.api.register_definitions(task_defs, definitions())
            print(f"server {server.version} pid {pid}; {args.mailboxes} mailboxes, v2 checks every {args.check} s",
                  flush=True)
            for kind in kinds:  # warm-up: the JIT compiles both kinds' paths before any window
                ids = bench.start_all(int(kind[1:]))
                for i in range(3):
                    bench.wake(ids[i], int(kind[1:]), i)
                time.sleep(args.settle)
                bench.end_all(ids)
            time.sleep(args.settle)
            for rep in range(args.repeats):
                order = kinds[rep % len(kinds):] + kinds[:rep % len(kinds)]
                for kind in order:
                    row = measure(bench, pid, kind, args)
                    row["repeat"], row["loadavg"] = rep + 1, [round(x, 2) for x in os.getloadavg()]
                    rows.append(row)
                    print(f"  repeat {rep + 1} {kind}: empty {row['empty']['cpu_ms_per_s']} ms/s, with mailboxes "
                          f"{row['loaded']['cpu_ms_per_s']} ms/s -> {row['ms_per_mailbox_s']} ms per mailbox-second; "
                          f"wake p50 {row['wake_p50_s']} s {row['wakes_s']}; one run {row['run_tasks']} tasks "
                          f"{row['run_bytes']} B; load {row['loadavg']}", flush=True)
                    time.sleep(args.settle)
    print("\nmedians over repeats:")
    for kind in kinds:
        mine = [r for r in rows if r["kind"] == kind]
        wakes = [r["wake_p50_s"] for r in mine if r["wake_p50_s"] is not None]
        print(f"  {kind}: {statistics.median(r['ms_per_mailbox_s'] for r in mine):.3f} ms of server CPU per idle "
              f"mailbox-second; wake p50 {statistics.median(wakes) if wakes else None} s")
    with open(args.out, "w") as f:
        json.dump({"args": vars(args), "rows": rows}, f, indent=1)
    print(f"raw figures: {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
