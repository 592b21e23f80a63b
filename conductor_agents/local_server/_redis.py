"""``RedisServer``: a ``redis-server`` on loopback with its append-only file in a data directory.

Used by the Redis-backed :class:`~conductor_agents.LocalServer` and by
:class:`~conductor_agents.testing.LocalCluster`. Persistence is the append-only file
(``appendfsync everysec``, the Redis default): a graceful stop or restart keeps every
write; a crash of Redis itself may lose the last second.
"""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Dict, Optional

from .._clock import SYSTEM_CLOCK, Clock
from ..errors import LocalServerError
from . import _proc
from ._aux import AuxProcess, find_binary

REDIS_PACKAGE = "redis-server"
_PING_TIMEOUT = 1.0


def redis_server_properties(port: int) -> Dict[str, str]:
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


class RedisServer:
    """A ``redis-server`` child process on 127.0.0.1; the port is kept across restarts.

    Thread-safety: start/stop/kill serialize on the underlying process lock.
    """

    def __init__(
        self,
        data_dir: Path,
        *,
        port: Optional[int] = None,
        log_path: Optional[Path] = None,
        detached: bool = False,
        startup_timeout: float = 60.0,
        stop_timeout: float = 20.0,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.data_dir = data_dir
        self._port = port or None
        self._process = AuxProcess(
            "redis-server",
            log_path=log_path or data_dir / "redis.log",
            cwd=data_dir,
            detached=detached,
            ready=self._answers_ping,
            startup_timeout=startup_timeout,
            stop_timeout=stop_timeout,
            clock=clock,
        )

    @property
    def port(self) -> Optional[int]:
        """The TCP port; None before the first start when picked automatically."""
        return self._port

    @property
    def pid(self) -> Optional[int]:
        """The process id while it runs, else None."""
        return self._process.pid

    @property
    def log_path(self) -> Path:
        """Where the Redis output is appended."""
        return self._process.log_path

    def start(self) -> "RedisServer":
        """Start Redis and wait until it answers PING (after loading its append-only file).

        Raises:
            LocalServerError: redis-server is missing, the port is taken, or it did not start.
        """
        binary = find_binary("redis-server", REDIS_PACKAGE)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        if self._port is None:
            self._port = _proc.free_port()
        if not _proc.port_is_free(self._port):
            raise LocalServerError(f"port {self._port} on 127.0.0.1 is already in use (Redis)")
        cmd = [
            binary,
            "--port", str(self._port),
            "--bind", "127.0.0.1",
            "--protected-mode", "yes",
            "--dir", str(self.data_dir),
            "--appendonly", "yes",
            "--appendfsync", "everysec",
            "--save", "",  # the append-only file is the persistence; no RDB snapshots
            "--daemonize", "no",
            "--logfile", "",  # to stdout, i.e. our log file
        ]
        self._process.start(cmd)
        return self

    def stop(self) -> None:
        """Stop gracefully (Redis flushes its append-only file). Idempotent."""
        self._process.stop()

    def kill(self) -> None:
        """SIGKILL (a crash). Idempotent."""
        self._process.kill()

    def restart(self) -> "RedisServer":
        """Stop and start again on the same port and data."""
        self.stop()
        return self.start()

    def _answers_ping(self) -> bool:
        port = self._port
        if port is None:
            return False
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=_PING_TIMEOUT) as sock:
                sock.sendall(b"PING\r\n")
                return sock.recv(64).startswith(b"+PONG")  # "-LOADING ..." while it reads the AOF
        except OSError:
            return False

    def __repr__(self) -> str:
        return f"<RedisServer port={self._port} pid={self.pid} dir={self.data_dir}>"
