"""Soak: listeners, senders, a person and faults for a while, then an invariant checker (issue 44).

    .venv/bin/python benchmarks/soak.py --minutes 10 --topology sqlite --seed 1
    .venv/bin/python benchmarks/soak.py --minutes 5 --topology cluster --seed 2 --listeners 12
    make soak SOAK_ARGS="--minutes 60 --topology cluster --seed 7"

Starts the topology (one ``LocalServer`` on SQLite, or a ``LocalCluster``: two nodes on Redis behind
HAProxy) with the offline ``ScriptedLLM`` as the server's model, ``--processes`` serving processes
(``soak_child.py serve``: ``runtime.serve()`` for every agent of the population), and ``--listeners``
listeners of four kinds: plain, continued every ``--continue-every`` turns, with a tool that needs
approval (approved here through the SDK), and paused and unpaused now and then. An SDK sender process
(``soak_child.py send``) and a raw REST sender (``POST /workflow/{id}/messages``) send messages to the ids
this process holds; each message carries its sender, the sender's sequence number and a unique id, and
the listeners' recording tool journals each message it acts on (fsync'ed). A fault schedule drawn from
``--seed`` (printed at the start: same seed, same schedule) SIGKILLs and restarts serving processes,
recycles them gracefully (SIGTERM, a new process), restarts the server (the SQLite node on its data
directory and port; a cluster node, or Redis), freezes it (SIGSTOP, then SIGCONT: a slow server), and cuts
or slows the serving processes' connections (they reach the server through ``proxy.FaultyProxy``);
``--faults`` picks some kinds only. After ``--minutes`` the senders and faults stop, every serving process
is up again, and the soak drains (at most ``--drain`` s) before ``soak_check.check`` reads the journals,
the senders' logs, the approvals, the pauses, the faults and the server's view (each listener's status
and newest lease, sampled twice).

Results: ``--out`` (default ``benchmarks/results-soak-<topology>.json``) and a printed summary. Everything
runs on loopback; every process started here is killed at the end (also on Ctrl-C or an error); the
journals and logs (the server's too, in ``server-logs/``) stay in the printed work directory.
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

import attrs
import requests

HERE = os.path.dirname(os.path.abspath(__file__))
#: Task types every listener's domain is polled for by the process that serves it (its mailbox's forward, its turn
#: gate), and how long a live owner may go without polling any of them before its runs count as unserved (a poller
#: polls each type at least every 60 s, ``SAFETY_POLL_SECONDS``).
SERVED_TASK_TYPES = ("conductor_agents_forward", "conductor_agents_turn")
UNPOLLED_SECONDS = 90.0
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

import soak_check  # noqa: E402
from _harness import redis_memory_by_kind, redis_used_memory  # noqa: E402
from proxy import FaultyProxy  # noqa: E402
from soak_child import KINDS, JsonLines, population  # noqa: E402

from conductor_agents import AgentRuntime, AgentSettings  # noqa: E402
from conductor_agents.errors import (  # noqa: E402
    AnswerConflictError,
    ExecutionNotRunningError,
    NothingPendingError,
)
from conductor_agents.testing import ScriptedLLM, ToolCall, listener_policy  # noqa: E402

#: Fault kinds per topology, with their weights in the schedule.
FAULT_WEIGHTS = {
    "sqlite": {"kill_serve": 3, "recycle_serve": 2, "restart_server": 1, "cut_connections": 2, "slow_connections": 1,
               "freeze_server": 1},
    "cluster": {"kill_serve": 3, "recycle_serve": 2, "restart_node": 1, "restart_redis": 1, "cut_connections": 2,
                "slow_connections": 1, "freeze_server": 1},
}
#: Seconds a server may take to start on a busy 2-core machine.
STARTUP_TIMEOUT = 900.0


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--minutes", type=float, default=10.0, help="traffic and faults for this long")
    p.add_argument("--topology", choices=("sqlite", "cluster"), default="sqlite")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--listeners", type=int, default=12)
    p.add_argument("--processes", type=int, default=3, help="serving processes")
    p.add_argument("--interval", type=float, default=3.0, help="seconds between two messages of one sender")
    p.add_argument("--continue-every", type=int, default=4, help="turn budget of the continued listeners")
    p.add_argument("--listener-wait", choices=("pull", "human"), default=None,
                   help="the serving processes' listener_wait (default: the SDK's)")
    p.add_argument("--stall-seconds", type=float, default=10.0, help="the serving processes' liveness stall")
    p.add_argument("--fault-gap", type=float, nargs=2, default=(35.0, 80.0), help="seconds between faults")
    p.add_argument("--faults", default="", help="comma-separated fault kinds (default: every kind of the topology)")
    p.add_argument("--drain", type=float, default=240.0, help="most seconds to wait for the last messages")
    p.add_argument("--wedge-bound", type=float, default=None,
                   help="seconds without progress while a message waits (default: 2 x stall + 60)")
    p.add_argument("--out", default=None)
    return p.parse_args(argv)


def fault_schedule(seed: int, minutes: float, topology: str, processes: int, gap: tuple[float, float],
                   kinds: list[str] | None = None) -> list[dict[str, Any]]:
    """The faults at their times (seconds after the traffic starts): a pure function of its arguments."""
    rng = random.Random(seed)  # noqa: S311 - seeded, not a secret
    weights = {k: w for k, w in FAULT_WEIGHTS[topology].items() if not kinds or k in kinds}
    names = sorted(weights)
    out: list[dict[str, Any]] = []
    at = rng.uniform(*gap)
    while at < minutes * 60 - 20 and len(out) < 10_000:
        kind = rng.choices(names, weights=[weights[n] for n in names])[0]
        out.append({"at": round(at, 1), "kind": kind, "index": rng.randrange(processes if "serve" in kind else 2),
                    "down_s": round(rng.uniform(1.0, 8.0), 1)})
        at += rng.uniform(*gap)
    return out


def pause_schedule(seed: int, minutes: float, paused: int) -> list[dict[str, Any]]:
    """When each pausable listener (by index) is paused, and for how long."""
    rng = random.Random(seed * 7919 + 1)  # noqa: S311 - seeded, not a secret
    out: list[dict[str, Any]] = []
    at = rng.uniform(20, 60)
    while paused and at < minutes * 60 - 30 and len(out) < 10_000:
        hold = round(rng.uniform(5, 25), 1)
        out.append({"at": round(at, 1), "index": rng.randrange(paused), "hold_s": hold})
        at += hold + rng.uniform(15, 50)
    return out


def acting(tool_name: str) -> Callable[[Any], Any]:
    def on_message(payload: Any) -> Any:
        if not isinstance(payload, dict) or "uid" not in payload:
            return None  # not one of ours (ignored)
        return ToolCall(tool_name, {k: payload.get(k) for k in ("to", "uid", "sender", "seq")})

    return on_message


class Child:
    """A ``soak_child.py`` process in its own session; stdin a pipe (it exits when this process dies)."""

    def __init__(self, mode: str, cfg: dict[str, Any], log_path: str) -> None:
        env = {**os.environ, "PYTHONPATH": os.path.dirname(HERE) + os.pathsep + os.environ.get("PYTHONPATH", "")}
        self.out_path = log_path + ".out"
        self.mode = mode
        with open(log_path, "ab") as log, open(self.out_path, "ab") as out:
            self.proc = subprocess.Popen([sys.executable, os.path.join(HERE, "soak_child.py"), mode, json.dumps(cfg)],
                                         stdin=subprocess.PIPE, stdout=out, stderr=log, env=env,
                                         start_new_session=True)
        self.started = time.time()

    @property
    def worker_id(self) -> str | None:
        """The worker id a serving process printed once it served (None before)."""
        for record in _read_lines([self.out_path]):
            if record.get("worker_id"):
                return str(record["worker_id"])
        return None

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self._reap(10)

    def term(self, timeout: float = 60.0) -> int | None:
        """SIGTERM and wait (then SIGKILL); its exit code."""
        if self.alive():
            self.proc.send_signal(signal.SIGTERM)
        code = self._reap(timeout)
        if code is None:
            self.kill()
        return code

    def close_stdin(self) -> None:
        try:
            if self.proc.stdin is not None:
                self.proc.stdin.close()
        except OSError:
            pass

    def _reap(self, timeout: float) -> int | None:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None


class Soak:
    """The run: the stack, the population, the traffic, the faults, and what they recorded."""

    def __init__(self, args: argparse.Namespace, workdir: str) -> None:
        self.args = args
        self.workdir = workdir
        self.tag = f"s{args.seed}"
        self.stop = threading.Event()  # the traffic and the faults stop
        self.llm = ScriptedLLM()
        self.server: Any = None
        self.proxy: FaultyProxy | None = None
        self.data_dir = tempfile.mkdtemp(prefix=f"soak-{args.topology}-server-")
        self.runtime: AgentRuntime | None = None
        self.serving: list[Child] = []
        self.children: list[Child] = []  # every child ever started (all killed at the end)
        self.listeners: dict[str, dict[str, Any]] = {}
        self.events = JsonLines(os.path.join(workdir, "events.jsonl"))
        self.rest_log = JsonLines(os.path.join(workdir, "sends-rest.jsonl"))
        self.lock = threading.Lock()
        self.faults: list[dict[str, Any]] = []
        self.pauses: list[dict[str, Any]] = []
        self.approvals: list[dict[str, Any]] = []
        self.errors: list[str] = []
        self.serve_cfg: dict[str, Any] = {}
        self.models: dict[str, str] = {}
        self._leases: dict[str, int] = {}  # the newest lease epoch seen per listener

    # -- the stack ------------------------------------------------------------------------

    def start_stack(self) -> None:
        from conductor_agents.local_server import LocalCluster, LocalServer

        self.llm.start()
        env = self.llm.server_env()
        if self.args.topology == "cluster":
            self.server = LocalCluster(self.data_dir, nodes=2, env=env, startup_timeout=STARTUP_TIMEOUT)
        else:
            self.server = LocalServer(self.data_dir, env=env, startup_timeout=STARTUP_TIMEOUT)
        self.server.start()
        self.proxy = FaultyProxy(self.url).start()  # the serving processes' way to the server
        tools = {"gate": "record_gated"}
        self.models = {kind: self.llm.script(policy=listener_policy(acting(tools.get(kind, "record"))))
                       for kind in KINDS}
        settings = AgentSettings.from_env(environ={}, server_url=self.url, http_timeout_seconds=60.0,
                                          auto_start_workers=False)
        if self.args.listener_wait:
            settings = attrs.evolve(settings, listener_wait=self.args.listener_wait)
        self.runtime = AgentRuntime(settings)
        self.serve_cfg = {"server_url": self.proxy.url, "models": self.models, "tag": self.tag,
                          "continue_every": self.args.continue_every, "stall_seconds": self.args.stall_seconds,
                          "listener_wait": self.args.listener_wait,
                          "max_seconds": self.args.minutes * 60 + self.args.drain + 3600}

    @property
    def url(self) -> str:
        return str(self.server.url)

    def start_serving(self, slot: int) -> Child:
        cfg = {**self.serve_cfg, "journal": os.path.join(self.workdir, f"journal-{slot}-{len(self.children)}.jsonl")}
        child = Child("serve", cfg, os.path.join(self.workdir, f"serve-{slot}-{len(self.children)}.log"))
        self.children.append(child)
        return child

    def start_population(self) -> None:
        assert self.runtime is not None
        agents = population(self.models, self.tag, None, self.args.continue_every)
        kinds = [KINDS[i % len(KINDS)] for i in range(self.args.listeners)]  # as many of each kind
        for kind in kinds:
            handle = self.runtime.start(agents[kind], "Start listening.")
            self.listeners[handle.execution_id] = {"kind": kind, "run_id": handle.run_id}
        print(f"listeners: {json.dumps({k: sum(1 for v in self.listeners.values() if v['kind'] == k) for k in KINDS})}",
              flush=True)

    def of_kind(self, kind: str) -> list[str]:
        return [eid for eid, info in self.listeners.items() if info["kind"] == kind]

    # -- what was recorded ----------------------------------------------------------------

    def journal(self) -> list[dict[str, Any]]:
        return _read_lines(glob.glob(os.path.join(self.workdir, "journal-*.jsonl")))

    def sends(self) -> list[dict[str, Any]]:
        return _read_lines(glob.glob(os.path.join(self.workdir, "sends-*.jsonl")))

    def note(self, event: str, **fields: Any) -> dict[str, Any]:
        record = {**fields, "event": event, "t_noted": time.time()}
        self.events.write(record)
        return record

    # -- the warm-up and the traffic --------------------------------------------------------

    def warm_up(self, timeout: float = 600.0) -> None:
        """One message per listener, through the SDK, until each is acted on: every listener served."""
        assert self.runtime is not None
        warm = JsonLines(os.path.join(self.workdir, "sends-warmup.jsonl"))
        uids = []
        for seq, eid in enumerate(self.listeners, 1):
            uid = f"warm-{seq}"
            payload = {"to": eid, "uid": uid, "sender": "warmup", "seq": seq}
            record = {**payload, "t": time.time(), "outcome": "accepted"}
            record["message_id"] = self.runtime.send_message(eid, payload)
            warm.write(record)
            uids.append(uid)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.approve_round()
            done = {line["uid"] for line in self.journal()}
            if all(u in done for u in uids):
                return
            time.sleep(2.0)
        missing = [u for u in uids if u not in {line["uid"] for line in self.journal()}]
        raise RuntimeError(f"warm-up: {len(missing)} listener(s) never acted on their first message: {missing}")

    def rest_sender(self, seconds: float) -> None:
        rng = random.Random(self.args.seed * 31 + 5)  # noqa: S311 - seeded, not a secret
        targets = sorted(self.listeners)
        deadline, seq = time.monotonic() + seconds, 0
        with requests.Session() as http:
            while not self.stop.is_set() and time.monotonic() < deadline:
                seq += 1
                to, uid = rng.choice(targets), f"rest-{seq}-{rng.getrandbits(48):012x}"
                record: dict[str, Any] = {"uid": uid, "to": to, "sender": "rest", "seq": seq, "t": time.time()}
                try:
                    r = http.post(f"{self.url}/workflow/{to}/messages", timeout=30,
                                  json={"to": to, "uid": uid, "sender": "rest", "seq": seq})
                    record["status"] = r.status_code
                    record["outcome"] = ("accepted" if r.status_code == 200 else
                                         "refused" if r.status_code in (404, 409, 429) else "uncertain")
                    if r.status_code == 200:
                        record["message_id"] = r.text.strip().strip('"')
                except requests.RequestException as err:
                    record.update(outcome="uncertain", error=f"{type(err).__name__}")
                record["t_done"] = time.time()
                self.rest_log.write(record)
                self.stop.wait(self.args.interval)

    def approve_round(self) -> None:
        """Approve what each gated listener waits on (the soak's person)."""
        assert self.runtime is not None
        for eid in self.of_kind("gate"):
            handle = self.runtime.get_handle(eid)
            try:
                pending = [r for r in handle.pending() if r.kind == "approval"]
            except Exception as err:  # noqa: BLE001 - recorded, the soak goes on
                self.errors.append(f"pending({eid}): {type(err).__name__}: {err}"[:300])
                continue
            for request in pending:
                uids = [c.arguments.get("uid") for c in request.tool_calls]
                record: dict[str, Any] = {"to": eid, "uids": uids, "task_id": request.task_id, "t": time.time()}
                try:
                    handle.approve(request=request, by="soak", timeout=30)
                    record["outcome"] = "approved"
                except (NothingPendingError, AnswerConflictError, ExecutionNotRunningError) as err:
                    record["outcome"] = f"refused:{type(err).__name__}"
                except Exception as err:  # noqa: BLE001 - recorded, the soak goes on
                    record["outcome"] = f"uncertain:{type(err).__name__}"
                record["t_done"] = time.time()
                with self.lock:
                    self.approvals.append(record)
                self.note("approval", **record)

    def approver(self, until: threading.Event) -> None:
        while not until.wait(2.0):
            self.approve_round()

    def pauser(self, plan: list[dict[str, Any]], began: float) -> None:
        assert self.runtime is not None
        targets = self.of_kind("pause")
        for item in plan:
            if self.stop.wait(max(0.0, began + item["at"] - time.monotonic())):
                return
            eid = targets[item["index"]]
            handle = self.runtime.get_handle(eid)
            t0 = time.time()
            try:
                handle.pause()
                self.stop.wait(item["hold_s"])
            except Exception as err:  # noqa: BLE001 - recorded, the soak goes on
                self.errors.append(f"pause({eid}): {type(err).__name__}: {err}"[:300])
            finally:
                self._unpause(handle, eid, t0)

    def _unpause(self, handle: Any, eid: str, t0: float) -> None:
        for attempt in range(10):  # bounded: the server may be restarting
            try:
                handle.unpause()
                break
            except Exception as err:  # noqa: BLE001 - recorded, the soak goes on
                self.errors.append(f"unpause({eid}) attempt {attempt}: {type(err).__name__}: {err}"[:300])
                time.sleep(6.0)
        record = {"to": eid, "t0": t0, "t1": time.time()}
        with self.lock:
            self.pauses.append(record)
        self.note("pause", **record)

    # -- faults ---------------------------------------------------------------------------

    def run_faults(self, plan: list[dict[str, Any]], began: float) -> None:
        for item in plan:
            if self.stop.wait(max(0.0, began + item["at"] - time.monotonic())):
                return
            t0 = time.time()
            try:
                detail = FAULTS[item["kind"]](self, item)
            except Exception as err:  # noqa: BLE001 - recorded, the soak goes on
                detail = f"failed: {type(err).__name__}: {err}"[:300]
                self.errors.append(f"fault {item['kind']}: {detail}")
            record = {**item, "t0": t0, "t1": time.time(), "detail": detail}
            with self.lock:
                self.faults.append(record)
            self.note("fault", **record)
            print(f"  fault {item['kind']} at +{item['at']:.0f}s: {detail} ({record['t1'] - t0:.1f}s)", flush=True)

    def replace_serving(self, index: int, graceful: bool, down_s: float) -> str:
        slot = index % len(self.serving)
        old = self.serving[slot]
        if graceful:
            self.serving[slot] = self.start_serving(slot)  # the new process first, as a process manager does
            code = old.term(60.0)
            return f"recycled pid {old.proc.pid} (exit {code}) -> pid {self.serving[slot].proc.pid}"
        old.kill()
        time.sleep(down_s)
        self.serving[slot] = self.start_serving(slot)
        return f"killed pid {old.proc.pid}, restarted as pid {self.serving[slot].proc.pid} after {down_s}s"

    def ensure_serving(self) -> None:
        for slot, child in enumerate(self.serving):
            if not child.alive():
                self.errors.append(f"serving process {child.proc.pid} had exited ({child.proc.returncode})")
                self.serving[slot] = self.start_serving(slot)

    # -- the server's view ------------------------------------------------------------------

    def server_view(self) -> dict[str, Any]:
        """Each listener's status, and whether a live serving process holds its newest lease: sampled twice,
        ``stall + 15`` s apart (a run between two owners is adopted within that); unserved in both: orphaned."""
        first = self._lease_sample()
        time.sleep(self.args.stall_seconds + 15.0)
        second = self._lease_sample()
        view: dict[str, Any] = {"listeners": {}, "unserved": []}
        for eid, row in second.items():
            view["listeners"][eid] = {k: row.get(k) for k in ("status", "current", "runs", "lease", "owner")}
            served = row.get("owner_alive") or first.get(eid, {}).get("owner_alive")
            # A live owner that has not polled the run's domain lately does not serve it either (seen: a process
            # that let its runs go at a fence and never took them up again, while its presence was renewed).
            polled = [age for age in (row.get("owner_poll_age_s"), first.get(eid, {}).get("owner_poll_age_s"))
                      if age is not None]
            if served and (not polled or min(polled) > UNPOLLED_SECONDS):
                served = False
            other, before = row.get("other_poller"), first.get(eid, {}).get("other_poller")
            if row.get("status") == "RUNNING" and other and before and other[1] <= UNPOLLED_SECONDS:
                # Polled by a live process that does not hold its lease, in both samples (not a hand-over under way):
                # two processes serve it (its owner may poll too, unseen: the poll data keeps the last poller only),
                # or the owner let it go to one that took no lease. Either is a split of one listener.
                view.setdefault("split", []).append({"to": eid, "owner": row.get("owner"), "lease": row.get("lease"),
                                                     "other_poller": other[0], "other_poll_age_s": other[1]})
                continue
            if row.get("status") == "RUNNING" and not served:
                view["unserved"].append({"to": eid, **{k: row.get(k) for k in ("current", "lease", "owner")},
                                         "first_sample": first.get(eid), "last_poll_age_s": min(polled, default=None)})
        return view

    def _poll_ages(self, domain: str, polls: dict[str, list[dict[str, Any]]]) -> dict[str, float]:
        """Seconds since each worker last polled a task type of the listeners on ``domain``, as the server's poll data
        keeps it: one row per task type and domain, the last poller's (so a worker that polled before another is not
        seen). ``polls`` caches one sample's poll data (a read per task type)."""
        for task_type in SERVED_TASK_TYPES:
            if task_type not in polls:
                polls[task_type] = list(_get(f"{self.url}/tasks/queue/polldata", taskType=task_type) or [])
        now_ms = time.time() * 1000.0  # the server runs on this machine: one clock
        ages: dict[str, float] = {}
        for rows in polls.values():
            for row in rows:
                if row.get("domain") == domain and row.get("workerId") and row.get("lastPollTime"):
                    age = max(0.0, now_ms - float(row["lastPollTime"])) / 1000.0
                    worker = str(row["workerId"])
                    ages[worker] = min(age, ages.get(worker, age))
        return ages

    def _lease_sample(self) -> dict[str, dict[str, Any]]:
        from conductor_agents._serving.leases import lease_execution_id

        assert self.runtime is not None
        live = {c.worker_id for c in self.serving if c.alive()} - {None}
        out: dict[str, dict[str, Any]] = {}
        polls: dict[str, list[dict[str, Any]]] = {}
        for eid, info in self.listeners.items():
            try:
                st = self.runtime.get_handle(eid).status()
            except Exception as err:  # noqa: BLE001 - recorded, the soak goes on
                out[eid] = {"status": f"unreadable: {type(err).__name__}"}
                continue
            row: dict[str, Any] = {"status": str(getattr(st.status, "value", st.status)),
                                   "current": st.current_execution_id, "runs": st.runs}
            epoch, owner = -1, None
            for n in range(self._leases.get(eid, 0), 10_000):  # the newest lease: the last epoch taken
                record = _get(f"{self.url}/workflow/{lease_execution_id(info['run_id'], n)}", includeTasks="false")
                if record is None:
                    break
                epoch, owner = n, ((record.get("input") or {}).get("context") or {}).get("owner")
            self._leases[eid] = max(0, epoch)
            row.update(lease=epoch, owner=owner, owner_alive=bool(owner) and owner in live)
            if row["owner_alive"]:
                ages = self._poll_ages(info["run_id"], polls)
                row["owner_poll_age_s"] = ages.get(str(owner))
                others = {w: a for w, a in ages.items() if w != owner and w in live}
                if others:  # another live serving process polled the domain: it serves the run too, or instead
                    row["other_poller"] = min(others.items(), key=lambda item: item[1])
            out[eid] = row
        return out

    def delivery(self, eid: str, message_id: str | None) -> str:
        """What the SDK's own delivery check says of a message (``wait_delivered``, 20 s at most)."""
        assert self.runtime is not None
        if not message_id:
            return "no message id"
        try:
            return repr(self.runtime.wait_delivered(eid, message_id, timeout=20))
        except Exception as err:  # noqa: BLE001 - its answer is the evidence
            return f"{type(err).__name__}: {err}"[:400]

    def tasks_tail(self, eid: str, n: int = 8) -> list[str]:
        """The last tasks of a listener's current run, for a violation's evidence."""
        assert self.runtime is not None
        try:
            current = self.runtime.get_handle(eid).status().current_execution_id
            flow = _get(f"{self.url}/workflow/{current}", includeTasks="true") or {}
        except Exception as err:  # noqa: BLE001 - recorded, the soak goes on
            return [f"unreadable: {type(err).__name__}: {err}"[:200]]
        return [f"{current} {flow.get('status')}"] + [
            f"{t.get('referenceTaskName')} {t.get('taskType')} {t.get('status')} polls={t.get('pollCount')} "
            f"worker={t.get('workerId')} reason={(t.get('reasonForIncompletion') or '')[:120]}"
            for t in (flow.get("tasks") or [])[-n:]]

    def store(self) -> dict[str, Any]:
        """The server's store: its SQLite files (bytes) or Redis's used memory, and how many runs it holds."""
        out: dict[str, Any] = {"runs": _run_count(self.url)}
        if self.args.topology == "cluster":
            port = getattr(getattr(self.server, "redis", None), "port", None)
            out["redis_used_memory"] = redis_used_memory(port)
            try:  # where the memory is: the ten biggest kinds of key
                out["redis_by_kind"] = dict(list((redis_memory_by_kind(port) or {}).items())[:10])
            except (OSError, ValueError) as err:
                out["redis_by_kind"] = f"unreadable: {err}"
        else:
            out["sqlite_bytes"] = sum(os.path.getsize(os.path.join(root, f)) for root, _, files in
                                      os.walk(self.data_dir) for f in files if ".db" in f)
        return out

    def close(self) -> None:
        self.stop.set()
        for child in self.children:
            child.close_stdin()
            child.kill()
        if self.proxy is not None:
            self.proxy.stop()
        if self.runtime is not None:
            with contextlib.suppress(Exception):
                self.runtime.close()
        try:
            if self.server is not None:
                self.server.stop()
        finally:
            self.llm.stop()
            self._keep_server_logs()
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def _keep_server_logs(self) -> None:
        """Copy the server's logs (each node's, Redis's, the balancer's) into the work directory before the data
        directory goes: a violation is read against what the server did (which node ran which task, and when)."""
        kept = os.path.join(self.workdir, "server-logs")
        os.makedirs(kept, exist_ok=True)
        for root, _dirs, files in os.walk(self.data_dir):
            for name in (n for n in files if n.endswith(".log")):
                source = os.path.join(root, name)
                target = os.path.join(kept, os.path.relpath(source, self.data_dir).replace(os.sep, "-"))
                with contextlib.suppress(OSError):
                    shutil.copyfile(source, target)


def _kill_serve(soak: Soak, item: dict[str, Any]) -> str:
    return soak.replace_serving(item["index"], False, item["down_s"])


def _recycle_serve(soak: Soak, item: dict[str, Any]) -> str:
    return soak.replace_serving(item["index"], True, item["down_s"])


def _restart_server(soak: Soak, item: dict[str, Any]) -> str:
    soak.server.restart()  # the same data directory and port
    return "server restarted"


def _restart_node(soak: Soak, item: dict[str, Any]) -> str:
    soak.server.kill_node(item["index"])
    time.sleep(item["down_s"])
    soak.server.start_node(item["index"])
    return f"node {item['index']} killed, started again after {item['down_s']}s"


def _restart_redis(soak: Soak, item: dict[str, Any]) -> str:
    soak.server.restart_redis()
    return "redis restarted"


def _cut_connections(soak: Soak, item: dict[str, Any]) -> str:
    assert soak.proxy is not None
    cut = soak.proxy.cut(item["down_s"])
    return f"{cut} connections of the serving processes cut, new ones refused for {item['down_s']}s"


def _slow_connections(soak: Soak, item: dict[str, Any]) -> str:
    assert soak.proxy is not None
    delay = round(item["down_s"] / 4, 2)
    soak.proxy.slow(30.0, delay)
    return f"the serving processes' connections slowed by {delay}s per chunk for 30s"


def _freeze_server(soak: Soak, item: dict[str, Any]) -> str:
    """A slow server: its JVM (a cluster's node ``index``) stopped with SIGSTOP for ``2 x down_s`` s, then SIGCONT."""
    nodes = list(getattr(soak.server, "nodes", None) or [soak.server])
    pid = int(nodes[item["index"] % len(nodes)].pid)
    seconds = 2 * item["down_s"]
    os.kill(pid, signal.SIGSTOP)
    try:
        time.sleep(seconds)
    finally:
        os.kill(pid, signal.SIGCONT)
    return f"server process {pid} frozen (SIGSTOP) for {seconds}s"


#: What each fault kind does (a new kind: a function here and a weight in FAULT_WEIGHTS).
FAULTS: dict[str, Callable[[Soak, dict[str, Any]], str]] = {
    "kill_serve": _kill_serve, "recycle_serve": _recycle_serve, "restart_server": _restart_server,
    "restart_node": _restart_node, "restart_redis": _restart_redis, "cut_connections": _cut_connections,
    "slow_connections": _slow_connections, "freeze_server": _freeze_server,
}


def _get(url: str, **params: Any) -> Any:
    for attempt in range(5):  # a cluster's balancer may answer 502/503 while a node restarts
        try:
            r = requests.get(url, params=params, timeout=30)
            if r.status_code == 200:
                return r.json() if r.content else None
            if r.status_code == 404:
                return None
        except requests.RequestException:
            pass
        time.sleep(1.0 + attempt)
    return None


def _run_count(url: str) -> int | None:
    found = _get(f"{url}/workflow/search", start=0, size=1, query="", freeText="*")
    return int(found["totalHits"]) if isinstance(found, dict) and "totalHits" in found else None


def _read_lines(paths: list[str]) -> list[dict[str, Any]]:
    out = []
    for path in sorted(paths):
        with open(path, encoding="utf-8") as fh:
            for line in fh:
                if line.strip():
                    # (a line cut by a SIGKILL mid-write was never fsync'ed, so never reported as done)
                    with contextlib.suppress(ValueError):
                        out.append(json.loads(line))
    return out


def run(args: argparse.Namespace, workdir: str) -> dict[str, Any]:
    kinds = [k for k in args.faults.split(",") if k] or None
    plan = fault_schedule(args.seed, args.minutes, args.topology, args.processes, tuple(args.fault_gap), kinds)
    paused = max(1, args.listeners // len(KINDS)) if args.listeners >= len(KINDS) else 0
    pauses = pause_schedule(args.seed, args.minutes, paused)
    print(f"soak: {args.minutes} min on {args.topology}, seed {args.seed}, {args.listeners} listeners, "
          f"{args.processes} serving processes; work directory {workdir}", flush=True)
    print("fault schedule (s after the traffic starts): " + json.dumps(plan), flush=True)
    print("pause schedule: " + json.dumps(pauses), flush=True)
    wedge_bound = args.wedge_bound or 2 * args.stall_seconds + 60.0
    soak = Soak(args, workdir)
    result: dict[str, Any] = {"args": vars(args), "fault_schedule": plan, "pause_schedule": pauses,
                              "workdir": workdir, "started": _now()}
    helpers: list[threading.Thread] = []
    approving = threading.Event()
    try:
        began = time.monotonic()
        soak.start_stack()
        result["server_version"] = getattr(soak.server, "version", None) or soak.server.nodes[0].version
        result["startup_s"] = round(time.monotonic() - began, 1)
        soak.serving = [soak.start_serving(slot) for slot in range(args.processes)]
        soak.start_population()
        soak.warm_up()
        result["store_before"] = soak.store()
        print(f"warmed up after {time.monotonic() - began:.0f}s; store {result['store_before']}", flush=True)

        seconds = args.minutes * 60
        traffic_began, t_traffic = time.monotonic(), time.time()
        sdk_cfg = {"server_url": soak.url, "targets": sorted(soak.listeners), "sender": "sdk", "seed": args.seed,
                   "interval": args.interval, "seconds": seconds, "log": os.path.join(workdir, "sends-sdk.jsonl")}
        sender = Child("send", sdk_cfg, os.path.join(workdir, "sender-sdk.log"))
        soak.children.append(sender)
        jobs: list[tuple[Callable[..., None], tuple[Any, ...]]] = [
            (soak.rest_sender, (seconds,)), (soak.run_faults, (plan, traffic_began)),
            (soak.pauser, (pauses, traffic_began)), (soak.approver, (approving,))]
        for target, job_args in jobs:
            thread = threading.Thread(target=target, args=job_args, name=f"soak-{target.__name__}", daemon=True)
            thread.start()
            helpers.append(thread)
        while time.monotonic() - traffic_began < seconds:
            time.sleep(min(60.0, max(0.1, seconds - (time.monotonic() - traffic_began))))
            sends = soak.sends()
            print(f"  +{time.monotonic() - traffic_began:.0f}s: {sum(s.get('outcome') == 'accepted' for s in sends)} "
                  f"accepted, {len({j['uid'] for j in soak.journal()})} acted on, {len(soak.faults)} faults",
                  flush=True)
        soak.stop.set()
        sender.close_stdin()  # it finishes the send under way, logs it, and exits
        if sender._reap(90.0) is None:
            soak.errors.append("the SDK sender did not exit within 90 s of its stdin's end")
            sender.term(30.0)
        for thread in helpers[:3]:
            thread.join(STARTUP_TIMEOUT)  # a fault in progress (a server start) finishes first
        t_traffic_end = time.time()

        soak.ensure_serving()
        drain_began = time.monotonic()
        while time.monotonic() - drain_began < args.drain:
            acted = {j["uid"] for j in soak.journal()}
            waiting = [s for s in soak.sends() if s.get("outcome") == "accepted" and s["uid"] not in acted]
            if not waiting:
                break
            time.sleep(5.0)
        result["drain_s"] = round(time.monotonic() - drain_began, 1)
        if waiting:  # every serving thread's stack, in each live child's log (soak_child registers SIGUSR1)
            for child in soak.children:
                if child.alive() and child.mode == "serve":
                    with contextlib.suppress(OSError):
                        os.kill(child.proc.pid, signal.SIGUSR1)
            time.sleep(2.0)
        approving.set()
        helpers[3].join(120)
        end = time.time()
        result["store_after"] = soak.store()
        server = soak.server_view()
        checked = soak_check.check(
            sends=soak.sends(), journal=soak.journal(), approvals=soak.approvals, listeners=soak.listeners,
            pauses=soak.pauses, faults=soak.faults, server=server, end=end, wedge_bound=wedge_bound)
        evidence: dict[str, Any] = {"tasks": {}, "delivery": {}}
        for found in checked["violations"].values():  # every listener named by an example (at most all)
            for example in found["examples"]:
                to = example.get("to")
                if to and to not in evidence["tasks"]:
                    evidence["tasks"][to] = soak.tasks_tail(to)
        never = (checked["violations"].get("accepted_never_acted_on") or {}).get("examples", [])
        ids = {s["uid"]: s.get("message_id") for s in soak.sends()}
        for example in never[:10]:
            evidence["delivery"][example["uid"]] = soak.delivery(example["to"], ids.get(example["uid"]))
        result.update(
            traffic_s=round(t_traffic_end - t_traffic, 1), wedge_bound_s=wedge_bound, check_end=end,
            listeners=soak.listeners,
            faults=soak.faults, pauses=soak.pauses, approvals=len(soak.approvals), soak_errors=soak.errors[:50],
            faults_by_kind=_count(f["kind"] for f in soak.faults), server_view=server, check=checked,
            sdk_warnings=sdk_warnings(workdir), approvals_given=soak.approvals,
            evidence=evidence, ended=_now())
        return result
    finally:
        approving.set()
        soak.close()


def sdk_warnings(workdir: str, examples: int = 3) -> dict[str, Any]:
    """The serving processes' WARNING and ERROR lines of the SDK, by message (ids and numbers masked)."""
    import re

    masks = [(re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"), "<id>"),
             (re.compile(r"\b[0-9a-f]{32}\b"), "<domain>"), (re.compile(r"\d+(\.\d+)?"), "<n>")]
    out: dict[str, Any] = {}
    for path in sorted(glob.glob(os.path.join(workdir, "serve-*.log"))):
        with open(path, encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if " conductor_agents" not in line or not (" WARNING " in line or " ERROR " in line):
                    continue
                text = line.split(" WARNING ", 1)[-1].split(" ERROR ", 1)[-1].strip()
                key = text
                for pattern, mask in masks:
                    key = pattern.sub(mask, key)
                entry = out.setdefault(key[:160], {"count": 0, "examples": []})
                entry["count"] += 1
                if len(entry["examples"]) < examples:
                    entry["examples"].append(f"{os.path.basename(path)}: {line.strip()[:500]}")
    return dict(sorted(out.items(), key=lambda kv: -kv[1]["count"]))


def _count(items: Any) -> dict[str, int]:
    out: dict[str, int] = {}
    for item in items:
        out[item] = out.get(item, 0) + 1
    return out


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def print_summary(result: dict[str, Any]) -> None:
    checked = result.get("check") or {}
    counts = checked.get("counts") or {}
    before, after = result.get("store_before") or {}, result.get("store_after") or {}
    print(f"\nsoak on {result['args']['topology']}, seed {result['args']['seed']}: "
          f"traffic {result.get('traffic_s')} s, drain {result.get('drain_s')} s, "
          f"server {result.get('server_version')}")
    print(f"faults by kind: {json.dumps(result.get('faults_by_kind'))}")
    print(f"messages: {json.dumps(counts.get('by_sender'))}; acted on {counts.get('acted_on')}; "
          f"approvals given {result.get('approvals')}; pauses {len(result.get('pauses') or [])}")
    print(f"store before {json.dumps(before)}, after {json.dumps(after)}")
    for line in soak_check.summary_lines(checked):
        print(line)
    for kind, found in (checked.get("violations") or {}).items():
        print(f"  {kind}: {found['count']}, e.g. {json.dumps(found['examples'][:2])[:600]}")
    if result.get("soak_errors"):
        print(f"soak's own errors (first 5 of {len(result['soak_errors'])}): {result['soak_errors'][:5]}")


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _interrupt)  # a SIGTERM cleans up as Ctrl-C does (every process killed)
    out = args.out or os.path.join(HERE, f"results-soak-{args.topology}.json")
    workdir = tempfile.mkdtemp(prefix=f"soak-{args.topology}-{args.seed}-")
    result = run(args, workdir)
    with open(out, "w") as fh:
        json.dump(result, fh, indent=1, default=str)
    print_summary(result)
    print(f"wrote {out}; journals and logs in {workdir} (check again: python benchmarks/soak_check.py {out} {workdir})")
    return 1 if result["check"]["violations"] else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
