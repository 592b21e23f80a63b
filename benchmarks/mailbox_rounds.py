"""What N idle listener mailboxes cost the server, by how the mailbox rests (issue 42).

    PYTHONPATH=. .venv/bin/python benchmarks/mailbox_rounds.py --mailboxes 50 --seconds 45 --repeats 2
    PYTHONPATH=. .venv/bin/python benchmarks/mailbox_rounds.py --kinds v3,h,h-rounds --mailboxes 500 --check 30

Standalone: raw REST on one ``LocalServer`` (SQLite, the SDK's settings), no SDK runtime, no listener: only the
mailbox workflow (``conductor_agents_mailbox``), its forward task routed to a domain nobody polls. The kinds:

- ``v1``: ``DO_WHILE [PULL_WORKFLOW_MESSAGES (blocking), forward]``, the mailbox before the round;
- ``v3``: ``DO_WHILE [PULL_WORKFLOW_MESSAGES (blocking: false), SWITCH (empty -> WAIT --check s; else forward)]``,
  :func:`conductor_agents._listener.mailbox.definitions`, the SDK's;
- ``h``: v3 with its rests ``HUMAN`` tasks (the server evaluates nothing while one waits, and takes the run out of
  its decider queue), woken by completing the rest (``POST /tasks/{id}/rest/COMPLETED``) after the push;
- ``ht``: ``h`` with each rest optional and timed out after a second (``timeoutSeconds: 1``): the server does not
  look at it while it waits, but the decide it runs after every push to the run times out a rest older than a
  second, and the round goes on: a raw push with no wake is taken at once (a push within a second of a rest's start
  waits for the next decide);
- ``h-rounds``: ``h``, and this script completes every mailbox's rest every ``--check`` s (spread evenly), as a
  serving process would so that raw pushes without a wake are taken within that;
- ``ht-rounds``: ``ht``, and this script has the server decide every mailbox every ``--check`` s
  (``PUT /workflow/decide/{id}``, which ends a rest over a second old): the same safety net, by decides only.

Per repeat, the kinds' order rotating, per kind: a window of ``--seconds`` on the empty server, then N mailboxes
started and left ``--settle`` s (after a warm-up of every kind), a window of ``--seconds`` (the server JVM's
utime+stime from /proc, per thread group too), then ``--wakes`` wake-ups one at a time, each timed from the push to
the mailbox's forward task being SCHEDULED, then the size of one mailbox run and every mailbox terminated. Medians
over the repeats are printed; the raw figures go to ``--out``. Nothing here asserts anything; a shared machine
inflates CPU figures.
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


#: The kinds' workflow versions.
VERSIONS = {"v1": 1, "v3": 3, "h": 40, "h-rounds": 40, "ht": 4, "ht-rounds": 4}


def definitions() -> list[dict]:
    """The mailbox workflow as the SDK defines it (version 4: its rest a HUMAN task that a decide ends once it has
    rested a second), and as it was: version 3 (the rest a WAIT of ``checkEvery``), version 1 (a blocking pull, then
    the forward); and version 40: the SDK's with a plain HUMAN rest (ended only by completing it)."""
    _, (v4,) = mailbox.definitions()

    def with_rest(version: int, **rest: object) -> dict:
        made = copy.deepcopy(v4)
        for case in made["tasks"][0]["loopOver"][1]["decisionCases"].values():
            for key in ("optional", "taskDefinition"):
                case[0].pop(key, None)
            case[0].update(rest)
        made.update(version=version)
        return made

    v3 = with_rest(3, type="WAIT", inputParameters={"duration": "${workflow.input.checkEvery}"})
    v1 = copy.deepcopy(v3)
    loop = v1["tasks"][0]
    pull, switch = loop["loopOver"]
    pull["inputParameters"] = {"batchSize": pull["inputParameters"]["batchSize"]}  # blocking (the default)
    loop["loopOver"] = [pull, switch["defaultCase"][0]]
    loop["loopCondition"] = "$.forward['end'] != true"
    v1.update(version=1, inputParameters=[])
    return [v1, v3, with_rest(VERSIONS["h"], type="HUMAN", inputParameters={}), v4]


def rests_in_wait(kind: str) -> bool:
    return kind == "v3"


def rests_in_human(kind: str) -> bool:
    return kind.startswith("h")


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mailboxes", type=int, default=50)
    p.add_argument("--seconds", type=float, default=45.0, help="each measuring window")
    p.add_argument("--settle", type=float, default=15.0)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--check", type=int, default=30,
                   help="v3's mailbox_check_seconds; h-rounds: how often this script completes each mailbox's rest")
    p.add_argument("--wakes", type=int, default=10)
    p.add_argument("--kinds", default="v1,v3",
                   help="v1 (blocking pull), v3 (the SDK's: WAIT P), h (rests in a HUMAN task, woken only by a "
                        "sender), h-rounds (h, and every rest completed every --check s, as a serving process would "
                        "to take raw pushes)")
    p.add_argument("--out", default=os.path.join(HERE, "results-mailbox-rounds.json"))
    return p.parse_args(argv)


class Bench:
    def __init__(self, url: str, args: argparse.Namespace) -> None:
        self.url, self.args = url, args
        self.http = requests.Session()
        self.api = ConductorApi(Transport(url))

    def start(self, kind: str) -> str:
        body = {"name": mailbox.MAILBOX_WORKFLOW, "version": VERSIONS[kind], "taskToDomain": {FORWARD_TASK: DOMAIN},
                "input": {"checkEvery": f"{int(self.args.check)}s"} if rests_in_wait(kind) else {}}
        r = self.http.post(f"{self.url}/workflow", json=body, timeout=30)
        r.raise_for_status()
        return r.text.strip()

    def tasks(self, eid: str) -> list[dict]:
        r = self.http.get(f"{self.url}/workflow/{eid}", params={"includeTasks": "true"}, timeout=30)
        r.raise_for_status()
        return r.json().get("tasks", [])

    def resting(self, eid: str, kind: str) -> bool:
        task_type = "WAIT" if rests_in_wait(kind) else "HUMAN" if rests_in_human(kind) else "PULL_WORKFLOW_MESSAGES"
        return any(t["taskType"] == task_type and t["status"] == "IN_PROGRESS" for t in self.tasks(eid))

    def start_all(self, kind: str) -> list[str]:
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            ids = list(pool.map(lambda _: self.start(kind), range(self.args.mailboxes)))
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and not all(self.resting(eid, kind) for eid in ids):
            time.sleep(0.5)
        return ids

    def complete_rest(self, eid: str) -> bool:
        """Complete the mailbox's resting HUMAN task by reference name (either of the two); whether one was."""
        for ref in ("rest", "rest_after"):
            r = self.http.post(f"{self.url}/tasks/{eid}/{ref}/COMPLETED", json={}, timeout=30)
            if r.ok:
                return True
        return False

    def decide(self, eid: str) -> bool:
        """``PUT /workflow/decide/{id}``: the server decides the run now (ht: ends a rest over a second old)."""
        return self.http.put(f"{self.url}/workflow/decide/{eid}", timeout=30).ok

    def wake(self, eid: str, kind: str, n: int) -> float | None:
        """Seconds from a push to the mailbox's forward SCHEDULED (v3: the push, then the SDK's signal; h: the push,
        then the completion of its rest)."""
        t0 = time.monotonic()
        self.http.post(f"{self.url}/workflow/{eid}/messages", json={"n": n}, timeout=30).raise_for_status()
        if rests_in_wait(kind):
            mailbox.wake(self.api, eid, pause=lambda s: time.sleep(s))
        elif rests_in_human(kind) and not kind.startswith("ht"):  # ht: the push's own decide ends a rest over 1 s old
            self.complete_rest(eid)
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


class Rounds:
    """h-rounds: completes every mailbox's rest every ``check`` seconds, spread evenly, on a thread of its own (what a
    serving process would do so that raw pushes with no wake are taken within ``check``)."""

    def __init__(self, bench: Bench, ids: list[str], check: float, kind: str) -> None:
        import threading
        self._bench, self._ids, self._check = bench, ids, check
        self.end_rest = bench.decide if kind == "ht-rounds" else bench.complete_rest
        self._stop = threading.Event()
        self.completed = 0
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        gap = self._check / max(1, len(self._ids))
        while not self._stop.is_set():
            for eid in self._ids:
                if self._stop.wait(gap):
                    return
                self.completed += self.end_rest(eid)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)


def measure(bench: Bench, pid: int, kind: str, args: argparse.Namespace) -> dict:
    empty = _window(pid, args.seconds)
    ids = bench.start_all(kind)
    rounds = Rounds(bench, ids, args.check, kind) if kind.endswith("-rounds") else None
    time.sleep(args.settle)
    loaded = _window(pid, args.seconds)
    if rounds is not None:
        rounds.stop()
    wakes = [bench.wake(ids[i % len(ids)], kind, i) for i in range(args.wakes)]
    run = bench.http.get(f"{bench.url}/workflow/{ids[-1]}", params={"includeTasks": "true"}, timeout=30)
    bench.end_all(ids)
    per = (loaded["cpu_ms_per_s"] - empty["cpu_ms_per_s"]) / args.mailboxes
    done = [w for w in wakes if w is not None]
    return {"kind": kind, "empty": empty, "loaded": loaded, "ms_per_mailbox_s": round(per, 3), "wakes_s": wakes,
            "wake_p50_s": statistics.median(done) if done else None, "run_bytes": len(run.content),
            "run_tasks": len(run.json().get("tasks", [])), "rounds": rounds.completed if rounds else None}


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
            print(f"server {server.version} pid {pid}; {args.mailboxes} mailboxes, v3 checks every {args.check} s",
                  flush=True)
            for kind in kinds:  # warm-up: the JIT compiles every kind's paths before any window
                ids = bench.start_all(kind)
                for i in range(3):
                    bench.wake(ids[i], kind, i)
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
                          f"{row['run_bytes']} B; rounds driven {row['rounds']}; load {row['loadavg']}", flush=True)
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
