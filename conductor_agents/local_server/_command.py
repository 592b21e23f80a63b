"""The server's command line: the JVM options, the ``-D`` properties every local server gets, redaction for logs."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path

from ._redis import redis_server_properties

DEFAULT_JVM_OPTIONS: tuple[str, ...] = ("-Xmx1g", "-XX:+UseSerialGC", "-XX:+ExitOnOutOfMemoryError")
"""JVM flags for a small machine that runs several servers at once (e.g. in tests).

A 1 GB heap cap and the single-threaded serial collector keep one server near 420 MB
RSS (about 500-560 MB without them) at the same start time (about 15 s on 2 cores).
Running out of heap ends the process at once instead of leaving it half alive.
"""


#: System task evaluations in flight per queue on a SQLite node (measured on 2 cores; see server_properties).
_SYSTEM_TASK_THREADS = 16


def server_properties(data_dir: Path, redis_port: int | None) -> dict[str, str]:
    """The ``-D`` properties every local server gets: its storage, the message queue, loopback."""
    if redis_port is None:
        backend = {
            # synchronous=NORMAL: in WAL mode a commit is not flushed to disk (checkpoints are). With
            # one connection every evaluation of a listener's wait queues behind the others' commits:
            # on a loaded machine, 50 listeners at 3 messages a second answered in 5.4 s (p50) instead of
            # 12.0 s (no difference on a quiet one; docs/operations.md). A killed server loses nothing;
            # the last commits can be lost only if the machine itself goes down.
            "spring.datasource.url": f"jdbc:sqlite:{data_dir / 'conductor.db'}"
                                     "?busy_timeout=15000&journal_mode=WAL&synchronous=NORMAL",
            # One connection: SQLite has one writer anyway, and concurrent transactions that read
            # then write fail with SQLITE_BUSY_SNAPSHOT (a 500 to 1 of 50 concurrent starts), which
            # the server's own retries do not cover on every path. transaction_mode=IMMEDIATE also
            # avoids it but puts every read behind the busy handler's sleeps: tool pickup p95/p99
            # went from 113/203 ms to 1062/2546 ms (benchmarks/run.py --scenarios pickup).
            "spring.datasource.hikari.maximum-pool-size": "1",
            # No task index: the server nests a second connection inside a transaction where it
            # removes a task's index rows, so with one connection a full removal (``DELETE
            # /workflow/{id}/remove?archiveWorkflow=false``, which retention uses) held the whole
            # server for 30 s and failed; without the index it takes 0.1 s and frees every row
            # (docs/operations.md). The index also grew by a row per task for ever. It serves only
            # task search (``/tasks/search``), which this SDK does not use.
            "conductor.app.taskIndexingEnabled": "false",
            # Evaluations in flight per system task queue (the server's default: 2 per core, 4 here).
            # Every waiting listener has its message wait and its fork's JOIN evaluated once a second
            # (its mailbox's wait too), each a load of the whole run; 4 at a time left 200 listeners'
            # waits evaluated every few seconds. 16 keeps the one connection busy while the others
            # do their JSON: at 200 listeners and 3 messages a second, answers p50 2.6 s instead of
            # 4.4 s; 32 was worse (5.1 s: the CPU ran out). benchmarks/answer_stages.py,
            # docs/operations.md "Server settings, measured". The poll count must follow: its default is
            # fixed from the core count before the thread count is set.
            "conductor.app.systemTaskWorkerThreadCount": str(_SYSTEM_TASK_THREADS),
            "conductor.app.systemTaskMaxPollCount": str(_SYSTEM_TASK_THREADS),
        }
    else:
        backend = redis_server_properties(redis_port)
    return {
        "polyglot.engine.WarnInterpreterOnly": "false",
        **backend,
        "conductor.workflow-message-queue.enabled": "true",
        # A JOIN re-checks at a growing interval once it has waited a while, up to this
        # many seconds (default 30): a listener idle for minutes then took up to 30 s to act
        # on a message. 1 s bounds that; it is also the drain time of system tasks at stop.
        "conductor.app.systemTaskWorkerCallbackDuration": "1",
        # The server (Spring Boot 3.5) shuts down gracefully: it waits for open requests, up to 30 s a
        # phase. A client's event stream or long poll (`conductor-agents run` keeps one) is open until it
        # ends, so `server stop` waited 20 s and then killed it. 3 s lets a request in flight finish.
        "spring.lifecycle.timeout-per-shutdown-phase": "3s",
        "server.address": "127.0.0.1",
    }


#: The server's environment unless the caller's sets it. A workflow's script (a listener's loop condition, a
#: ``SWITCH`` or ``INLINE`` task) gets ``CONDUCTOR_SCRIPT_MAX_EXECUTION_SECONDS`` (4 by default): a loaded machine
#: evaluated one past it, and the server terminated the listener ("Script not evaluated within 4 seconds,
#: interrupted."). 30 s, as the tests' servers have; ``docs/operations.md``, *Script limit*.
SERVER_ENV_DEFAULTS = {"CONDUCTOR_SCRIPT_MAX_EXECUTION_SECONDS": "30"}


def java_command(java: Path, jar: Path, jvm_options: Sequence[str], properties: Mapping[str, str],
                  port: int) -> list[str]:
    props = {**properties, "server.port": str(port)}
    return [str(java), *jvm_options, *(f"-D{k}={v}" for k, v in props.items()), "-jar", str(jar)]


def training_command(java: Path, jar: Path, extra_options: Sequence[str], data_dir: Path,
                      port: int) -> Sequence[str]:
    """The boot archive's training start: the default JVM options and a SQLite server in ``data_dir``."""
    return java_command(java, jar, [*DEFAULT_JVM_OPTIONS, *extra_options], server_properties(data_dir, None), port)


_SECRET_RE = re.compile(r"(-D[^=]*(?:key|secret|password|token)[^=]*=).*", re.IGNORECASE)


def redacted(cmd: Sequence[str]) -> str:
    """The command line for the log, with secret-looking property values hidden."""
    return " ".join(_SECRET_RE.sub(r"\1***", part) for part in cmd)
