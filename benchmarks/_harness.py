"""The harness side of the benchmarks: the stack, the scripted models, driver processes, server reads."""

from __future__ import annotations

import concurrent.futures
import json
import os
import queue
import signal
import subprocess
import threading
import time
from typing import Any, Dict, List, Optional

import requests

import _procs
from conductor_agents.testing import ScriptedLLM, ToolCall, listener_policy
from proxy import CountingProxy

HERE = os.path.dirname(os.path.abspath(__file__))
TERMINAL = {"COMPLETED", "FAILED", "TERMINATED", "TIMED_OUT"}

#: ``--server`` choices: a SQLite node, one Redis-backed node, two Redis-backed nodes behind a balancer.
SERVERS = ("sqlite", "redis", "cluster")
#: Seconds a server may take to start: on a shared 2-core machine start-ups of over 6 minutes were seen.
_STARTUP_TIMEOUT = 900.0


def server_unavailable(kind: str) -> Optional[str]:
    """Why ``--server kind`` cannot run with this checkout of conductor_agents (None when it can)."""
    import inspect

    from conductor_agents.local_server import LocalServer

    if kind == "redis" and "backend" not in inspect.signature(LocalServer.__init__).parameters:
        return "--server redis needs LocalServer(backend='redis'), which this checkout does not have"
    if kind == "cluster":
        try:
            from conductor_agents.local_server import LocalCluster  # noqa: F401
        except ImportError:
            return "--server cluster needs conductor_agents.local_server.LocalCluster, which this checkout does not have"
    return None


def redis_used_memory(port: Optional[int]) -> Optional[int]:
    """Redis's ``used_memory`` (bytes) from ``INFO memory`` on the loopback ``port``; None without a port."""
    if port is None:
        return None
    import socket

    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(b"INFO memory\r\n")
        data = b""
        while b"used_memory:" not in data or not data.endswith(b"\r\n"):
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
    for line in data.decode(errors="replace").splitlines():
        if line.startswith("used_memory:"):
            return int(line.split(":", 1)[1])
    return None


def redis_memory_by_kind(port: Optional[int], *, limit: int = 200_000) -> Optional[Dict[str, Dict[str, int]]]:
    """Redis's keys grouped by kind (the key with its ids replaced by ``*``): ``{kind: {keys, bytes}}`` (``MEMORY
    USAGE`` of each), the biggest first; at most ``limit`` keys looked at. None without a port. What piles up in a
    cluster's store, where no index counts runs (a Conductor key names its type before the run's or task's id)."""
    if port is None:
        return None
    import re
    import socket

    ids = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}|[0-9a-f]{32}|\d+")
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        reader = sock.makefile("rb")

        def command(*parts: str) -> None:
            out = f"*{len(parts)}\r\n" + "".join(f"${len(p.encode())}\r\n{p}\r\n" for p in parts)
            sock.sendall(out.encode())

        def reply() -> object:
            line = reader.readline().rstrip(b"\r\n")
            kind, rest = line[:1], line[1:]
            if kind in (b"+", b"-"):
                return rest.decode(errors="replace")
            if kind == b":":
                return int(rest)
            if kind == b"$":
                size = int(rest)
                if size < 0:
                    return None
                data = reader.read(size + 2)[:-2]
                return data.decode(errors="replace")
            if kind == b"*":
                return [reply() for _ in range(int(rest))]
            raise ValueError(f"unexpected Redis reply {line[:40]!r}")

        kinds: Dict[str, Dict[str, int]] = {}
        cursor, seen = "0", 0
        while True:
            command("SCAN", cursor, "COUNT", "1000")
            answer = reply()
            assert isinstance(answer, list)
            cursor, keys = str(answer[0]), list(answer[1])
            for key in keys:
                command("MEMORY", "USAGE", str(key), "SAMPLES", "0")
            for key in keys:
                size = reply()
                entry = kinds.setdefault(ids.sub("*", str(key)), {"keys": 0, "bytes": 0})
                entry["keys"] += 1
                entry["bytes"] += size if isinstance(size, int) else 0
            seen += len(keys)
            if cursor == "0" or seen >= limit:
                break
    return dict(sorted(kinds.items(), key=lambda item: -item[1]["bytes"]))


def percentiles(values: List[float]) -> Dict[str, Optional[float]]:
    """p50/p95/p99 (nearest rank) of ``values``; None when empty."""
    if not values:
        return {"p50": None, "p95": None, "p99": None, "n": 0}
    ordered = sorted(values)

    def rank(q: float) -> float:
        return ordered[min(len(ordered) - 1, max(0, int(round(q * len(ordered) + 0.5)) - 1))]

    return {"p50": rank(0.50), "p95": rank(0.95), "p99": rank(0.99), "n": len(ordered)}


def _pickup_policy(tool: str, turns: int):
    """One call of ``tool`` per model turn, ``turns`` times, then a final answer."""

    def policy(request):
        done = sum(1 for o in request.all_tool_outputs if o.name == tool)
        return ToolCall(tool, {"i": done}) if done < turns else "done"

    return policy


def _act_on(tool: str):
    def on_message(payload):
        return ToolCall(tool, {"key": str(payload.get("key", ""))})

    return on_message


class Driver:
    """One SDK driver subprocess (its own session, so it and its children are killed together)."""

    def __init__(self, python: str, script: str, cfg: dict, log_path: str) -> None:
        self._log = open(log_path, "ab")
        self.proc = subprocess.Popen(
            [python, os.path.join(HERE, script), json.dumps(cfg)], cwd=HERE, stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=self._log, start_new_session=True,
        )
        self.pid = self.proc.pid
        self._events: "queue.Queue[dict]" = queue.Queue()
        self._reader = threading.Thread(target=self._read, name="bench-driver-reader", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            line = raw.decode(errors="replace").strip()
            if line.startswith("@@ "):
                self._events.put(json.loads(line[3:]))
        self._events.put({"event": "exit"})

    def expect(self, event: str, timeout: float) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"driver sent no {event!r} within {timeout:.0f}s")
            try:
                got = self._events.get(timeout=min(remaining, 1.0))
            except queue.Empty:
                continue
            if got.get("event") == event:
                return got
            if got.get("event") == "exit":
                raise RuntimeError(f"driver exited (code {self.proc.wait()}) before {event!r}; see {self._log.name}")

    def send(self, command: str) -> None:
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.write((command + "\n").encode())
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            pass

    def finish(self, timeout: float = 90.0) -> None:
        """Ask it to stop, wait, then kill its process group (it and any worker processes)."""
        self.send("stop")
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            pass
        try:
            os.killpg(self.pid, signal.SIGKILL)  # the session we started: the driver and its children
        except ProcessLookupError:
            pass
        self.proc.wait(10)
        self._log.close()


class MemoryGuard:
    """Kills a driver's process group when its processes' summed PSS passes ``cap_mb``.

    The driver checks the cap itself before each start; this is the hard stop for whatever
    grows after that (a process per worker that keeps allocating), so that a benchmark never
    takes the machine down. Samples every ``interval`` s on its own thread until :meth:`stop`.
    """

    def __init__(self, driver: "Driver", cap_mb: float, interval: float = 2.0) -> None:
        self.driver = driver
        self.cap_mb = cap_mb
        self.interval = interval
        self.killed_at_mb: Optional[float] = None
        self.peak_mb = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-memory-guard", daemon=True)

    def start(self) -> "MemoryGuard":
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            pss = _procs.memory(_procs.tree(self.driver.pid))["pss_mb"]
            self.peak_mb = max(self.peak_mb, pss)
            if pss > self.cap_mb:
                self.killed_at_mb = pss
                try:
                    os.killpg(self.driver.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                return

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)


class Bench:
    """The shared stack, scripted models per SDK, and the calls the harness makes to the server."""

    def __init__(self, workdir: str, ours_python: str, peer_python: str, *, pickup_turns: int,
                 server: str = "sqlite", peer2_python: Optional[str] = None,
                 properties: Optional[Dict[str, str]] = None) -> None:
        if server not in SERVERS:
            raise ValueError(f"server must be one of {SERVERS}, got {server!r}")
        self.workdir = workdir
        self.server_kind = server
        # peer: conductor-agent-sdk 0.4.4; peer2: conductor-python 2.0.0; floor: the REST calls alone
        self.pythons = {"ours": ours_python, "peer": peer_python, "peer2": peer2_python or peer_python,
                        "floor": ours_python}
        self.scripts = {"ours": "driver_ours.py", "peer": "driver_peer.py", "peer2": "driver_peer2.py",
                        "floor": "driver_floor.py"}
        self.properties = dict(properties or {})
        self._pickup_turns = pickup_turns
        self.llm = ScriptedLLM()
        self.server: Any = None  # a LocalServer, or a LocalCluster for --server cluster
        self.http = requests.Session()
        self.models: Dict[str, Dict[str, str]] = {}
        self._count = 0

    def __enter__(self) -> "Bench":
        self.llm.start()
        try:
            self.server = self._make_server()
            self.server.start()
        except BaseException:
            self.llm.stop()
            raise
        for sdk in self.scripts:
            self.models[sdk] = {
                "pick": self.llm.script(policy=_pickup_policy(f"bench_tool_{sdk}", self._pickup_turns)),
                "warm": self.llm.script(policy=_pickup_policy(f"bench_tool_{sdk}", 10)),
                "listen": self.llm.script(policy=listener_policy(_act_on(f"bench_act_{sdk}"))),
            }
        return self

    def _make_server(self) -> Any:
        data_dir = os.path.join(self.workdir, "server")
        env = self.llm.server_env()
        if self.server_kind == "cluster":
            from conductor_agents.local_server import LocalCluster

            return LocalCluster(data_dir, nodes=2, env=env, startup_timeout=_STARTUP_TIMEOUT,
                                **({"properties": self.properties} if self.properties else {}))
        from conductor_agents.local_server import LocalServer

        options: Dict[str, Any] = {"backend": "redis"} if self.server_kind == "redis" else {}
        if self.properties:
            options["properties"] = self.properties
        return LocalServer(data_dir, env=env, startup_timeout=_STARTUP_TIMEOUT, **options)

    def __exit__(self, *exc: Any) -> None:
        self.http.close()
        try:
            if self.server is not None:
                self.server.stop()
        finally:
            self.llm.stop()

    @property
    def url(self) -> str:
        return str(self.server.url)

    @property
    def _nodes(self) -> List[Any]:
        return list(getattr(self.server, "nodes", None) or [self.server])

    @property
    def server_pids(self) -> List[int]:
        """The Conductor JVM(s): one for a node, one per node for a cluster."""
        return [int(node.pid) for node in self._nodes if node.pid]

    @property
    def store_pids(self) -> List[int]:
        """The Redis process behind a Redis-backed node or a cluster (none for SQLite: it is in the JVM)."""
        redis = getattr(self.server, "redis", None) or getattr(self.server, "_redis", None)
        pid = getattr(redis, "pid", None)
        return [int(pid)] if pid else []

    @property
    def server_version(self) -> Optional[str]:
        return self._nodes[0].version

    def server_requests(self) -> Dict[str, int]:
        """Requests each server node has answered so far, by method and URI template, summed over nodes.

        Read from the server's own counters (``/actuator/prometheus``,
        ``http_server_requests_seconds_count``): no proxy in the way, every client counted.
        """
        counts: Dict[str, int] = {}
        for node in self._nodes:
            root = str(node.url)[: -len("/api")] if str(node.url).endswith("/api") else str(node.url)
            text = self.http.get(f"{root}/actuator/prometheus", timeout=30).text
            for line in text.splitlines():
                if not line.startswith("http_server_requests_seconds_count{"):
                    continue
                labels, _, value = line.rpartition(" ")
                fields = dict(part.split("=", 1) for part in labels[labels.index("{") + 1:-1].split(",") if "=" in part)
                key = f"{fields.get('method', '').strip(chr(34))} {fields.get('uri', '').strip(chr(34))}"
                counts[key] = counts.get(key, 0) + int(float(value))
        return counts

    def driver(self, sdk: str, scenario: str, **cfg: Any) -> Driver:
        self._count += 1
        tag = f"{self._count:02d}-{sdk}-{scenario}"
        cfg = {"server_url": self.url, "scenario": scenario,
               "entry_log": os.path.join(self.workdir, f"{tag}.entries"), **cfg}
        return Driver(self.pythons[sdk], self.scripts[sdk], cfg, os.path.join(self.workdir, f"{tag}.log"))

    def proxy(self) -> CountingProxy:
        return CountingProxy(self.url).start()

    # -- server reads -------------------------------------------------------------------

    def workflow(self, execution_id: str, *, tasks: bool = False) -> dict:
        r = self.http.get(f"{self.url}/workflow/{execution_id}", params={"includeTasks": str(tasks).lower()},
                          timeout=30)
        r.raise_for_status()
        return r.json()

    def wait_terminal(self, ids: List[str], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        pending = list(ids)
        while pending:
            pending = [eid for eid in pending if self.workflow(eid).get("status") not in TERMINAL]
            if not pending:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"{len(pending)} run(s) still running after {timeout:.0f}s")
            time.sleep(1.0)

    def answer_split(self, sent_by_run: Dict[str, float], task_type: str) -> Dict[str, List[float]]:
        """Split each run's answer on the server's clock: message sent → tool task scheduled
        (the server's work: message check, join, LLM turn) and scheduled → started (the SDK's pickup), ms."""

        def one(item: "tuple[str, float]") -> "tuple[Optional[float], Optional[float]]":
            eid, sent = item
            try:
                tasks = self.workflow(eid, tasks=True).get("tasks", [])
            except requests.RequestException:
                return None, None
            acts = sorted((t for t in tasks if t.get("taskType") == task_type and t.get("scheduledTime")),
                          key=lambda t: t["scheduledTime"])
            if not acts:
                return None, None
            first = acts[0]
            pickup = first["startTime"] - first["scheduledTime"] if first.get("startTime") else None
            return first["scheduledTime"] - sent * 1000.0, pickup

        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            pairs = list(pool.map(one, sent_by_run.items()))
        return {"server_ms": [a for a, _ in pairs if a is not None], "pickup_ms": [b for _, b in pairs if b is not None]}

    def probe_polls(self, stop: threading.Event, interval: float = 0.05) -> List[float]:
        """Latency (ms) of an empty task poll (``timeout=0``), every ``interval`` s until ``stop``.

        The least any SDK must do to pick a task up: how long the server takes to answer it
        during a scenario bounds every SDK's pickup latency from below.
        """
        lat: List[float] = []
        with requests.Session() as http:
            while not stop.wait(interval):
                began = time.monotonic()
                try:
                    http.get(f"{self.url}/tasks/poll/batch/bench_probe", timeout=30,
                             params={"workerid": "bench-probe", "count": 1, "timeout": 0})
                except requests.RequestException:
                    continue
                lat.append((time.monotonic() - began) * 1000.0)
        return lat

    def cancel(self, ids: List[str]) -> None:
        def one(eid: str) -> None:
            try:
                self.http.delete(f"{self.url}/agent/{eid}/cancel", params={"reason": "benchmark over"}, timeout=30)
            except requests.RequestException:
                pass

        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            list(pool.map(one, ids))

    def probe_status(self, execution_id: Optional[str], seconds: float) -> Dict[str, Optional[float]]:
        """Latency (ms) of ``GET /agent/{id}/status`` every 0.5 s for ``seconds`` (server responsiveness)."""
        lat: List[float] = []
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            began = time.monotonic()
            if execution_id:
                try:
                    self.http.get(f"{self.url}/agent/{execution_id}/status", timeout=30)
                    lat.append((time.monotonic() - began) * 1000.0)
                except requests.RequestException:
                    lat.append(30_000.0)
            time.sleep(max(0.0, 0.5 - (time.monotonic() - began)))
        out = percentiles(lat)
        out["max"] = max(lat) if lat else None
        return out
