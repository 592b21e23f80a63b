"""The scenario loops both drivers run, written once so both SDKs are driven the same way.

Standard library only: ``driver_ours.py`` imports it from the project's virtualenv and
``driver_peer.py`` from the peer SDK's. A driver supplies an adapter (start a pickup run,
start a listener, send a message, close) and :func:`main` does the rest:

* the harness passes one JSON config as ``argv[1]``;
* the driver answers with lines ``@@ {json}`` on stdout (anything else there is noise);
* the harness steers the phases with lines on stdin (``answer``, ``stop``).

Tool bodies record ``time.time()`` at entry by appending ``"<key> <time>"`` to the file
named by ``BENCH_ENTRY_LOG`` (one ``O_APPEND`` write, so it works from the peer's forked
worker processes too).
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any, Callable, Dict, List, Optional

import _procs

ENTRY_LOG_ENV = "BENCH_ENTRY_LOG"


def record_entry(key: Any) -> None:
    """Called first thing in a tool body: note when it started (host clock)."""
    path = os.environ.get(ENTRY_LOG_ENV)
    if not path:
        return
    line = f"{key} {time.time():.6f}\n".encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


class EntryLog:
    """Reads the entry log incrementally: key -> first entry time."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._offset = 0
        self._partial = b""
        self.entries: Dict[str, float] = {}
        self.repeats = 0  # entries for a key already seen (a tool run twice for one message)

    def refresh(self) -> Dict[str, float]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self._offset)
                data = f.read()
        except FileNotFoundError:
            return self.entries
        self._offset += len(data)
        data = self._partial + data
        lines = data.split(b"\n")
        self._partial = lines.pop()
        for raw in lines:
            parts = raw.decode().split()
            if len(parts) == 2:
                if parts[0] in self.entries:
                    self.repeats += 1
                self.entries.setdefault(parts[0], float(parts[1]))
        return self.entries

    def wait_for(self, key: str, timeout: float, interval: float = 0.005) -> Optional[float]:
        deadline = time.monotonic() + timeout
        while True:
            found = self.refresh().get(key)
            if found is not None or time.monotonic() >= deadline:
                return found
            time.sleep(interval)


def emit(**event: Any) -> None:
    sys.stdout.write("@@ " + json.dumps(event) + "\n")
    sys.stdout.flush()


def wait_command(expected: "tuple[str, ...]", timeout: float) -> str:
    """Block until the harness writes one of ``expected`` on stdin (or EOF / timeout -> 'stop')."""
    import select

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([sys.stdin], [], [], min(1.0, max(0.0, deadline - time.monotonic())))
        if not ready:
            continue
        line = sys.stdin.readline()
        if not line:
            return "stop"
        word = line.strip()
        if word in expected:
            return word
    return "stop"


# -- scenarios ---------------------------------------------------------------------------


def scenario_pickup(adapter: Any, cfg: dict) -> None:
    """Start ``runs`` runs whose model calls the tool ``turns`` times, one call per turn."""
    began = time.monotonic()
    ids = [adapter.start_pickup(cfg["model"], cfg["stateful"]) for _ in range(cfg["runs"])]
    emit(event="started", ids=ids, start_s=time.monotonic() - began)
    wait_command(("stop",), cfg.get("max_seconds", 900))


def scenario_roundtrip(adapter: Any, cfg: dict, log: EntryLog) -> None:
    """One stateful listener; ``messages`` times: send, then wait for the tool it triggers."""
    eid = adapter.start_listener(cfg["model"])
    emit(event="started", ids=[eid])
    time.sleep(cfg.get("settle", 1.0))
    latencies: List[float] = []
    missing = 0
    for i in range(cfg["messages"]):
        key = f"rt-{i}"
        sent = time.time()
        adapter.send(eid, {"key": key})
        entered = log.wait_for(key, timeout=cfg.get("message_timeout", 30.0))
        if entered is None:
            missing += 1
        else:
            latencies.append(entered - sent)
        time.sleep(cfg.get("gap", 0.5))  # let the run get back to waiting for the next message
    emit(event="result", latencies=latencies, missing=missing)
    wait_command(("stop",), 120)


def start_listeners(adapter: Any, cfg: dict) -> "tuple[List[str], Optional[str], float]":
    """Start ``cfg["n"]`` listeners within the start budget and the memory cap: (ids, why it stopped, seconds)."""
    n = cfg["n"]
    budget = cfg.get("start_budget_s", 300.0)
    pss_cap = cfg.get("pss_cap_mb", 6000.0)
    ids: List[str] = []
    stopped = None
    began = time.monotonic()
    for i in range(n):
        if time.monotonic() - began > budget:
            stopped = f"start budget of {budget:.0f}s used up after {len(ids)} runs"
            break
        if i and i % 10 == 0:
            pss = _procs.memory(_procs.tree(os.getpid()))["pss_mb"]
            if pss > pss_cap:
                stopped = f"memory cap: {pss:.0f} MB PSS after {len(ids)} runs"
                break
        try:
            ids.append(adapter.start_listener(cfg["model"]))
        except Exception as err:  # the peer may give up somewhere: report where
            stopped = f"start {i + 1} failed: {type(err).__name__}: {str(err)[:200]}"
            break
    return ids, stopped, time.monotonic() - began


def scenario_live(adapter: Any, cfg: dict, log: EntryLog) -> None:
    """N concurrent stateful listeners: start them, idle (the harness measures), answer one message each."""
    ids, stopped, start_s = start_listeners(adapter, cfg)
    emit(event="started", ids=ids, start_s=start_s, stopped=stopped)
    if wait_command(("answer", "stop"), cfg.get("max_seconds", 900)) != "answer":
        return
    sent: Dict[str, float] = {}
    spacing = 1.0 / cfg.get("answer_rate", 10.0)  # messages per second: the server's LLM turns are the limit
    for i, eid in enumerate(ids):
        key = f"live-{i}"
        if i:
            time.sleep(max(0.0, sent[f"live-{i - 1}"] + spacing - time.time()))
        sent[key] = time.time()
        try:
            adapter.send(eid, {"key": key})
        except Exception as err:
            print(f"send to {eid} failed: {err}", file=sys.stderr)
    deadline = time.monotonic() + cfg.get("answer_wait_s", 15.0)
    while time.monotonic() < deadline and len([k for k in sent if k in log.refresh()]) < len(sent):
        time.sleep(0.05)
    entries = log.refresh()
    latencies = {k: entries[k] - t for k, t in sent.items() if k in entries}
    # Per run: when its message was sent (host clock), so the harness can split each answer
    # into the server's share (until the tool task is scheduled) and the SDK's (until it starts).
    # A continued listener's id is its mailbox's: the answer happens in the run it forwards to.
    def run_of(eid: str) -> str:
        if not hasattr(adapter, "describe"):
            return eid
        try:
            return adapter.describe(eid).get("current") or eid
        except Exception:  # noqa: BLE001 - the split is best effort
            return eid
    sent_by_run = {run_of(eid): sent[f"live-{i}"] for i, eid in enumerate(ids) if f"live-{i}" in sent}
    emit(event="answered", latencies=sorted(latencies.values()), sent=len(sent), sent_by_run=sent_by_run)
    wait_command(("stop",), 300)


def scenario_share(adapter: Any, cfg: dict, log: EntryLog) -> None:
    """N listeners; at each ``burst`` from the harness, ``messages`` messages round-robin over them at
    ``rate`` a second, then ``burst_done`` once each was acted on (or ``answer_wait_s`` passed)."""
    ids, stopped, start_s = start_listeners(adapter, cfg)
    emit(event="started", ids=ids, start_s=start_s, stopped=stopped)
    spacing = 1.0 / cfg.get("rate", 2.0)
    burst = 0
    while ids and wait_command(("burst", "stop"), cfg.get("max_seconds", 1800)) == "burst":
        sent: Dict[str, float] = {}
        next_at = time.time()
        for i in range(cfg["messages"]):
            time.sleep(max(0.0, next_at - time.time()))
            next_at += spacing
            key = f"share-{burst}-{i}"
            sent[key] = time.time()
            try:
                adapter.send(ids[i % len(ids)], {"key": key})
            except Exception as err:
                print(f"send {key} failed: {err}", file=sys.stderr)
        deadline = time.monotonic() + cfg.get("answer_wait_s", 60.0)
        while time.monotonic() < deadline and any(k not in log.refresh() for k in sent):
            time.sleep(0.05)
        entries = log.refresh()
        emit(event="burst_done", latencies=sorted(entries[k] - t for k, t in sent.items() if k in entries),
             sent=len(sent))
        burst += 1


def scenario_long(adapter: Any, cfg: dict, log: EntryLog) -> None:
    """One listener, ``messages`` messages of ``size`` bytes, at most ``in_flight`` of them sent and not
    yet acted on at any time (1: each sent once the previous one was acted on); a ``window`` event every
    ``window`` messages, then ``result``. Stops at the first message the listener can no longer take (its
    run failed) or that is not acted on in time."""
    eid = adapter.start_listener(cfg["model"])
    emit(event="started", ids=[eid])
    latencies: List[float] = []
    failure = None
    filler = "x" * max(0, cfg.get("size", 300) - 40)
    in_flight = max(1, int(cfg.get("in_flight", 1)))
    window = cfg.get("window", 1000)
    timeout = cfg.get("message_timeout", 120.0)
    sent: Dict[str, float] = {}
    sending: List[float] = []  # how long each send call took (the next send waits for it)
    total = cfg["messages"]

    def settle(i: int) -> bool:
        """Wait until message ``i`` was acted on; record its round trip (False: it was not, in time)."""
        nonlocal failure
        key = f"long-{i}"
        entered = log.wait_for(key, timeout=timeout)
        if entered is None:
            failure = {"message": i, "error": f"not acted on within {timeout:.0f}s",
                       "status": adapter.status(eid) if hasattr(adapter, "status") else None}
            return False
        latencies.append(entered - sent.pop(key))
        done = len(latencies)
        if done % window == 0:
            info = adapter.describe(eid) if hasattr(adapter, "describe") else {}
            emit(event="window", done=done, latencies=latencies[-window:], repeats=log.repeats, **info)
        return True

    ok = True
    for i in range(total):
        if i >= in_flight and not settle(i - in_flight):
            ok = False
            break
        key = f"long-{i}"
        sent[key] = time.time()
        try:
            adapter.send(eid, {"key": key, "text": filler})
            sending.append(time.time() - sent[key])
        except Exception as err:  # the listener's run has ended (failed): this is where it stops
            failure = {"message": i, "error": f"{type(err).__name__}: {str(err)[:300]}"}
            sent.pop(key)
            ok = False
            break
    if ok:
        for i in range(max(0, total - in_flight), total):
            if not settle(i):
                break
    time.sleep(2.0)  # a late second run of a tool would show here
    log.refresh()
    emit(event="result", done=len(latencies), failure=failure, repeats=log.repeats,
         send_seconds=sending,
         latencies_tail=latencies[-(len(latencies) % window or window):])
    wait_command(("stop",), 300)


def main(make_adapter: Callable[[dict], Any]) -> int:
    cfg = json.loads(sys.argv[1])
    os.environ[ENTRY_LOG_ENV] = cfg["entry_log"]
    log = EntryLog(cfg["entry_log"])
    adapter = make_adapter(cfg)
    try:
        kind = cfg["scenario"]
        if kind == "pickup":
            scenario_pickup(adapter, cfg)
        elif kind == "roundtrip":
            scenario_roundtrip(adapter, cfg, log)
        elif kind == "live":
            scenario_live(adapter, cfg, log)
        elif kind == "share":
            scenario_share(adapter, cfg, log)
        elif kind == "long":
            scenario_long(adapter, cfg, log)
        else:
            raise SystemExit(f"unknown scenario {kind!r}")
    finally:
        began = time.monotonic()
        adapter.close()
        emit(event="closed", close_s=time.monotonic() - began)
    return 0
