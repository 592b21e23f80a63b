"""``conductor-agents server ...``: run a local Conductor server for development.

``start`` launches a detached server and records it (pid, port, data dir, log, version)
in the state file; ``--backend redis`` keeps the data in its own Redis, and ``--nodes N``
starts a local cluster (N nodes on one Redis behind HAProxy; the URL is the balancer's), and
``--scripted-model`` a scripted model beside it (:mod:`._scripted`) as its OpenAI provider; ``status``, ``logs``
and ``stop`` read that record. ``start
--foreground`` keeps the server attached until Ctrl-C. ``fetch`` and ``java`` check the
prerequisites (the jar and a Java 21+ runtime).
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..local_server import (
    BACKENDS,
    LocalCluster,
    LocalServer,
    _dirs,
    _http,
    _logs,
    _proc,
    _state,
    find_java,
    resolve_server_jar,
)
from ._main import EXIT_ERROR, EXIT_NOT_FOUND, EXIT_OK, EXIT_USAGE, error
from ._scripted import ScriptedModel, start_scripted_model

DEFAULT_PORT = 8080
_STOP_TIMEOUT = 20.0
_FOLLOW_POLL_SECONDS = 0.5
_WATCH_POLL_SECONDS = 0.5


def register(subparsers: Any) -> None:
    """Add the ``server`` verb group to the top-level ``subparsers``."""
    server = subparsers.add_parser(
        "server",
        help="run a local Conductor server",
        description="Run a real Conductor server on this machine (needs Java 21+).",
    )
    verbs = server.add_subparsers(dest="verb", metavar="VERB")
    verbs.required = True

    start = verbs.add_parser("start", help="start a server (detached unless --foreground)")
    start.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"TCP port on 127.0.0.1 (default {DEFAULT_PORT})")
    start.add_argument("--data-dir", type=Path, default=None,
                       help="database and log directory (default: $XDG_DATA_HOME/conductor-agents/server)")
    start.add_argument("--version", help="server version (default: CONDUCTOR_SERVER_VERSION or the pinned one)")
    start.add_argument("--foreground", action="store_true", help="stay attached; Ctrl-C stops the server")
    start.add_argument("--env", action="append", type=_env_item, default=[], metavar="KEY=VALUE",
                       help="environment for the server, e.g. OPENAI_API_KEY=... (repeatable)")
    start.add_argument("--startup-timeout", type=float, default=180.0, help="seconds to wait for health")
    start.add_argument("--backend", choices=BACKENDS, default=None,
                       help="where runs and queued messages live: sqlite (default; queued messages are lost "
                       "on restart) or redis (a redis-server of its own, durable)")
    start.add_argument("--nodes", type=int, default=1,
                       help="with --backend redis: how many server nodes behind an HAProxy balancer (default 1)")
    start.add_argument("--scripted-model", action="store_true",
                       help="also start a scripted model (no key, no network) as the server's OpenAI provider, "
                       "and print the two variables to export: its model is openai/scripted")
    start.set_defaults(handler=_start)

    stop = verbs.add_parser("stop", help="stop the recorded server")
    stop.add_argument("--timeout", type=float, default=_STOP_TIMEOUT, help="seconds before SIGKILL")
    stop.set_defaults(handler=_stop)

    status = verbs.add_parser("status", help="say whether the recorded server runs")
    status.set_defaults(handler=_status)

    logs = verbs.add_parser("logs", help="print the end of the server log")
    logs.add_argument("-n", "--lines", type=int, default=40, help="how many lines (default 40)")
    logs.add_argument("-f", "--follow", action="store_true", help="keep printing until the server stops")
    logs.add_argument("--data-dir", type=Path, default=None, help="read this data dir's log when none is recorded")
    logs.set_defaults(handler=_logs_verb)

    fetch = verbs.add_parser("fetch", help="download the server jar and find Java; print both")
    fetch.add_argument("--version", help="server version (default: CONDUCTOR_SERVER_VERSION or the pinned one)")
    fetch.set_defaults(handler=_fetch)

    java = verbs.add_parser("java", help="print the Java 21+ runtime that would be used")
    java.set_defaults(handler=_java)


def _env_item(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key, value


# --- verbs -------------------------------------------------------------------------------


_Recorded = tuple[_state.ServerRecord | None, int | None]


def _live_record(state: Path, *, stop_timeout: float | None = None) -> _Recorded:
    """The record in ``state`` of a server that runs, and None; else None and the pid of a record whose
    server is gone (removed, after stopping what outlives it when ``stop_timeout`` is given), or None
    when there is no record."""
    record = _state.load(state)
    if record is None or record.is_alive():
        return record, None
    if stop_timeout is not None:
        _stop_processes(record, stop_timeout)  # a cluster's other parts may outlive its balancer
    _state.remove(state)
    return None, record.pid


def _start(args: argparse.Namespace) -> int:
    state = _state.state_file()
    record, _ = _live_record(state)
    if record is not None:
        error(f"a server is already running at {record.url} (pid {record.pid}); stop it first")
        return EXIT_ERROR
    data_dir = args.data_dir or _dirs.default_data_dir()
    env: dict[str, str] = dict(args.env)
    backend = args.backend or ("redis" if args.nodes > 1 else "sqlite")
    if args.nodes < 1 or (args.nodes > 1 and backend != "redis"):
        error("--nodes N needs N >= 1, and more than one node needs --backend redis")
        return EXIT_USAGE
    model: ScriptedModel | None = None
    if args.scripted_model:
        model = start_scripted_model(data_dir, detached=not args.foreground)
        env.update(model.server_env)
    try:
        if args.nodes > 1:
            return _start_cluster(args, state, data_dir, env, model)
        return _start_single(args, state, data_dir, env, backend, model)
    finally:
        if model is not None and (args.foreground or _state.load(state) is None):
            model.stop()  # the server stopped (foreground), or it never started


def _start_single(args: argparse.Namespace, state: Path, data_dir: Path, env: dict[str, str], backend: str,
                  model: ScriptedModel | None) -> int:
    server = LocalServer(
        data_dir,
        port=args.port,
        version=args.version,
        env=env,
        startup_timeout=args.startup_timeout,
        detached=not args.foreground,
        backend=backend,
    )
    print(f"Starting the Conductor server on port {args.port} (data in {data_dir}, {backend}) ...", file=sys.stderr)
    server.start()
    assert server.pid is not None and server.port is not None and server.log_path is not None
    redis = server.redis
    members = (
        (_state.MemberRecord.for_process("redis-server", redis.pid, redis.log_path),)
        if redis is not None and redis.pid is not None else ()
    ) + _model_member(model)
    record = _state.ServerRecord.for_process(
        pid=server.pid,
        port=server.port,
        data_dir=data_dir,
        log_path=server.log_path,
        version=server.version,
        detached=not args.foreground,
        backend=backend,
        members=members,
    )
    _state.save(state, record)
    print(f"Conductor server {server.version or '(unknown version)'} running at {server.url} (pid {server.pid})")
    print(f"  data: {data_dir}\n  log:  {server.log_path}")
    _say_durability(backend)
    _say_exports(server.url, model)
    if not args.foreground:
        return EXIT_OK
    print("Press Ctrl-C to stop it.", file=sys.stderr)
    return _run_in_foreground(server, state, record)


def _model_member(model: ScriptedModel | None) -> tuple[_state.MemberRecord, ...]:
    if model is None:
        return ()
    return (_state.MemberRecord.for_process("scripted-model", model.pid, model.log_path),)


def _say_exports(url: str, model: ScriptedModel | None) -> None:
    """With a scripted model: the two lines that point the CLI and the samples at this server and model."""
    if model is None:
        return
    print(f"  scripted model: {model.model} (log {model.log_path}); to use it, export:")
    print(f"export CONDUCTOR_SERVER_URL={url}")
    print(f"export CONDUCTOR_AGENT_MODEL={model.model}")


def _say_durability(backend: str) -> None:
    if backend == "sqlite":
        print("  note: on SQLite, messages queued for a run and not yet consumed are lost when the server "
              "restarts (--backend redis keeps them)")
    else:
        print("  queued messages are kept in Redis (append-only file) and survive a restart")


def _start_cluster(args: argparse.Namespace, state: Path, data_dir: Path, env: dict[str, str],
                   model: ScriptedModel | None) -> int:
    cluster = LocalCluster(
        data_dir,
        nodes=args.nodes,
        port=args.port,
        version=args.version,
        env=env,
        startup_timeout=args.startup_timeout,
        detached=not args.foreground,
    )
    print(f"Starting a local cluster: Redis, {args.nodes} Conductor nodes and HAProxy on port {args.port} "
          f"(data in {data_dir}) ...", file=sys.stderr)
    cluster.start()
    parts = cluster.processes()
    balancer = parts[0]
    assert balancer[0] == "haproxy" and cluster.port is not None
    record = _state.ServerRecord.for_process(
        pid=balancer[1],
        port=cluster.port,
        data_dir=data_dir,
        log_path=balancer[2],
        version=cluster.nodes[0].version,
        detached=not args.foreground,
        backend="redis",
        members=tuple(_state.MemberRecord.for_process(role, pid, log) for role, pid, log in parts[1:])
        + _model_member(model),
    )
    _state.save(state, record)
    print(f"Conductor cluster ({args.nodes} nodes, {record.version or 'unknown version'}) running at "
          f"{cluster.url} (HAProxy round-robin, pid {record.pid})")
    for role, pid, log in parts[1:]:
        print(f"  {role}: pid {pid}, log {log}")
    print(f"  data: {data_dir}")
    _say_durability("redis")
    _say_exports(str(cluster.url), model)
    if not args.foreground:
        return EXIT_OK
    print("Press Ctrl-C to stop it.", file=sys.stderr)
    return _run_in_foreground(cluster, state, record)


def _run_in_foreground(server: LocalServer | LocalCluster, state: Path, record: _state.ServerRecord) -> int:
    stop_requested = threading.Event()
    previous = {
        sig: signal.signal(sig, lambda *_: stop_requested.set()) for sig in (signal.SIGINT, signal.SIGTERM)
    }
    try:
        while not stop_requested.wait(_WATCH_POLL_SECONDS):
            if server.is_running:
                continue
            if _stopped_elsewhere(state, record):
                print("The server was stopped.", file=sys.stderr)
                return EXIT_OK
            error(f"the server exited unexpectedly; see {record.log_path}")
            return EXIT_ERROR
        print("Stopping the server ...", file=sys.stderr)
        return EXIT_OK
    finally:
        server.stop()
        if _state.load(state) == record:
            _state.remove(state)
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _stopped_elsewhere(state: Path, record: _state.ServerRecord) -> bool:
    """True when `server stop` (which removes the record once the process is gone) ended it."""
    pause = threading.Event()  # never set: its wait() is the poll interval
    for _ in range(20):  # the record goes a moment after the process: wait up to ~2 s
        if _state.load(state) != record:
            return True
        pause.wait(0.1)
    return False


def _stop(args: argparse.Namespace) -> int:
    state = _state.state_file()
    record, gone = _live_record(state, stop_timeout=args.timeout)
    if record is None:
        error("no server started with `conductor-agents server start` is running" + (
            "" if gone is None else f" (removed the stale record of pid {gone})"))
        return EXIT_NOT_FOUND
    stuck = _stop_processes(record, args.timeout)
    if stuck:
        error(f"could not stop the server (pid {', '.join(map(str, stuck))})")
        return EXIT_ERROR
    _state.remove(state)
    count = len(record.members)
    others = f" and {count} more process{'es' if count != 1 else ''}" if count else ""
    print(f"Stopped the Conductor server at {record.url} (pid {record.pid}{others}).")
    return EXIT_OK


def _stop_processes(record: _state.ServerRecord, timeout: float) -> list[int]:
    """Stop the recorded process, then its members in order; return the pids that survived."""
    stuck = [] if not record.is_alive() or _proc.terminate(record.pid, timeout) else [record.pid]
    stuck.extend(member.pid for member in record.members
                 if member.is_alive() and not _proc.terminate(member.pid, timeout))
    return stuck


def _status(args: argparse.Namespace) -> int:
    record, gone = _live_record(_state.state_file())
    if record is None:
        print("not running" if gone is None
              else f"not running (the recorded server, pid {gone}, is gone; record removed)")
        return EXIT_NOT_FOUND
    health = "healthy" if _http.probe_health(record.base_url) else "not answering /health"
    print(f"running at {record.url} (pid {record.pid}, version {record.version or 'unknown'}, "
          f"{record.backend}, {health})")
    for member in record.members:
        state_text = f"pid {member.pid}" if member.is_alive() else f"pid {member.pid} NOT RUNNING"
        print(f"  {member.role}: {state_text}, log {member.log_path}")
    print(f"  data: {record.data_dir}\n  log:  {record.log_path}")
    return EXIT_OK


def _logs_verb(args: argparse.Namespace) -> int:
    record = _state.load(_state.state_file())
    path = record.log_path if record is not None else (args.data_dir or _dirs.default_data_dir()) / "server.log"
    if not path.is_file():
        error(f"no server log at {path}")
        return EXIT_NOT_FOUND
    if record is not None and record.members and not args.follow:
        for role, log in [("main", path), *((m.role, m.log_path) for m in record.members)]:
            print(f"==> {role}: {log} <==")
            text = _logs.tail_lines(log, args.lines)
            if text:
                print(text)
        return EXIT_OK
    text = _logs.tail_lines(path, args.lines)
    if text:
        print(text)
    if args.follow:
        try:
            for chunk in _follow(path, record):
                sys.stdout.write(chunk)
                sys.stdout.flush()
        except KeyboardInterrupt:
            pass
    return EXIT_OK


def _follow(path: Path, record: _state.ServerRecord | None) -> Iterator[str]:
    """Yield what is appended to ``path`` until the recorded server stops (or Ctrl-C)."""
    idle = threading.Event()  # never set: its wait() is the poll interval
    with open(path, encoding="utf-8", errors="replace") as fh:
        fh.seek(0, 2)
        while True:
            chunk = fh.read()
            if chunk:
                yield chunk
                continue
            if record is None or not record.is_alive():
                return
            idle.wait(_FOLLOW_POLL_SECONDS)


def _fetch(args: argparse.Namespace) -> int:
    jar = resolve_server_jar(args.version, progress=True)
    runtime = find_java()
    print(f"jar:  {jar}")
    print(f"java: {runtime.path} (Java {runtime.version})")
    return EXIT_OK


def _java(args: argparse.Namespace) -> int:
    runtime = find_java()
    print(f"{runtime.path} (Java {runtime.version})")
    return EXIT_OK
