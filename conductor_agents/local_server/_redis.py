"""``RedisServer``: a ``redis-server`` on loopback with its append-only file in a data directory.

Used by the Redis-backed :class:`~conductor_agents.LocalServer` and by
:class:`~conductor_agents.testing.LocalCluster`. Persistence is the append-only file
(``appendfsync everysec``, the Redis default): a graceful stop or restart keeps every
write; a crash of Redis itself may lose the last second.
"""

from __future__ import annotations

import socket
from pathlib import Path

from .._common.clock import SYSTEM_CLOCK, Clock
from ._aux import AuxService

REDIS_PACKAGE = "redis-server"
_PING_TIMEOUT = 1.0


def redis_server_properties(port: int) -> dict[str, str]:
    """The Conductor properties for persistence, queues and the execution lock on Redis at ``port``.

    Checked against the server's source (3.32.x) and the running server: the workflow
    message queue is a Redis list per run when ``conductor.db.type`` is a Redis type
    (shared by every node, durable when Redis persists); search needs Elasticsearch,
    so indexing is off and search endpoints return nothing.
    """
    return {
        "conductor.db.type": "redis_standalone",
        "conductor.queue.type": "redis_standalone",
        # host:port:rack; the rack part is required by the parser and otherwise unused.
        "conductor.redis.hosts": f"127.0.0.1:{port}:local",
        "conductor.redis.workflowNamespacePrefix": "conductor",
        "conductor.redis.queueNamespacePrefix": "conductor_queues",
        "conductor.redis.taskDefCacheRefreshInterval": "1",
        "conductor.redis-lock.serverAddress": f"redis://127.0.0.1:{port}",
        "conductor.workflow-execution-lock.type": "redis",
        "conductor.app.workflowExecutionLockEnabled": "true",
        "conductor.indexing.enabled": "false",
        "conductor.workflow-message-queue.enabled": "true",
    }


class RedisServer(AuxService):
    """A ``redis-server`` child process on 127.0.0.1; the port is kept across restarts. A stop is
    graceful (Redis flushes its append-only file); :meth:`kill` is a crash.

    Thread-safety: start/stop/kill serialize on the underlying process lock.
    """

    binary, package, label = "redis-server", REDIS_PACKAGE, "Redis"

    def __init__(
        self,
        data_dir: Path,
        *,
        port: int | None = None,
        log_path: Path | None = None,
        detached: bool = False,
        startup_timeout: float = 60.0,
        stop_timeout: float = 20.0,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        super().__init__(data_dir, port=port, log_path=log_path or data_dir / "redis.log", detached=detached,
                         startup_timeout=startup_timeout, stop_timeout=stop_timeout, clock=clock)

    def start(self) -> RedisServer:
        """Start Redis and wait until it answers PING (after loading its append-only file).

        Raises:
            LocalServerError: redis-server is missing, the port is taken, or it did not start.
        """
        self._start_process(lambda binary, port: [
            binary,
            "--port", str(port),
            "--bind", "127.0.0.1",
            "--protected-mode", "yes",
            "--dir", str(self.data_dir),
            "--appendonly", "yes",
            "--appendfsync", "everysec",
            "--save", "",  # the append-only file is the persistence; no RDB snapshots
            "--daemonize", "no",
            "--logfile", "",  # to stdout, i.e. our log file
        ])
        return self

    def kill(self) -> None:
        """SIGKILL (a crash). Idempotent."""
        self._process.kill()

    def restart(self) -> RedisServer:
        """Stop and start again on the same port and data."""
        self.stop()
        return self.start()

    def _ready(self) -> bool:
        port = self._port
        if port is None:
            return False
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=_PING_TIMEOUT) as sock:
                sock.sendall(b"PING\r\n")
                return sock.recv(64).startswith(b"+PONG")  # "-LOADING ..." while it reads the AOF
        except OSError:
            return False
