"""``LocalCluster``: several real Conductor nodes sharing one Redis, behind HAProxy, on loopback.

The production topology in miniature: ``redis-server`` (append-only file on),
N Conductor nodes from the same jar (Redis persistence, Redis queues, Redis
execution lock, indexing off, message queue on) and HAProxy round-robin in front.
Clients use the balancer's URL. Each part is a child process started the way
:class:`~conductor_agents.LocalServer` starts its server, so nothing outlives this
process by accident. Fault tests use :meth:`kill_node`, :meth:`restart_redis` and
:meth:`restart`.

Layout of ``data_dir``: ``redis/`` (the append-only file) and ``redis.log``,
``node-1/``, ``node-2/``, ... (each node's log, ``server.log``), ``haproxy.cfg`` and
``haproxy.log``.
"""

from __future__ import annotations

import concurrent.futures
import logging
import shutil
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from ..errors import ConfigurationError, LocalServerError
from ._balancer import Balancer
from ._dirs import run_data_dir
from ._java import JavaRuntime
from ._node_options import NodeOptions
from ._redis import RedisServer
from ._server import LocalServer, PathLike

_log = logging.getLogger("conductor_agents.local_server")


class LocalCluster:
    """N Conductor nodes on one Redis behind an HAProxy round-robin balancer, all on 127.0.0.1.

    ``data_dir`` as for :class:`~conductor_agents.LocalServer` (a temporary directory,
    deleted on :meth:`stop`, when None). ``port`` is the balancer's (None: a free one);
    nodes and Redis always take free loopback ports. ``env`` is extra environment for
    every node (e.g. ``OPENAI_API_KEY``, or a ScriptedLLM's ``server_env()``);
    ``properties``, ``jvm_options``, ``version``, ``jar``, ``java``, ``secrets`` as for LocalServer.
    ``detached=True`` (the CLI) lets the cluster outlive this process.

    Thread-safety: lifecycle methods serialize on one lock; properties can be read
    from any thread.
    """

    def __init__(
        self,
        data_dir: PathLike | None = None,
        nodes: int = 2,
        *,
        port: int | None = None,
        version: str | None = None,
        jar: PathLike | None = None,
        java: JavaRuntime | PathLike | None = None,
        env: Mapping[str, str] | None = None,
        properties: Mapping[str, object] | None = None,
        jvm_options: Sequence[str] | None = None,
        startup_timeout: float = 180.0,
        stop_timeout: float = 20.0,
        detached: bool = False,
        progress: bool = True,
        secrets: Mapping[str, str] | None = None,
    ) -> None:
        """Describe a cluster; nothing starts until :meth:`start`.

        Raises:
            ConfigurationError: an argument has a bad value.
        """
        if not isinstance(nodes, int) or nodes < 1:
            raise ConfigurationError(f"nodes must be an int >= 1, got {nodes!r}")
        if port is not None and (not isinstance(port, int) or not 0 <= port <= 65535):
            raise ConfigurationError(f"port must be an int in 0..65535, got {port!r}")
        if detached and data_dir is None:
            raise ConfigurationError("a detached cluster needs an explicit data_dir")
        self._given_dir = Path(data_dir).expanduser().resolve() if data_dir is not None else None
        self._owned_dir: Path | None = None
        self._node_count = nodes
        self._port = port or None
        #: What every node is started with (checked here: a bad value fails now, not at start).
        self._node_options = NodeOptions(version=version, jar=jar, java=java, env=env, properties=properties,
                                         jvm_options=jvm_options, startup_timeout=startup_timeout,
                                         stop_timeout=stop_timeout, detached=detached, progress=progress,
                                         secrets=secrets)
        self._lock = threading.RLock()
        self._redis: RedisServer | None = None
        self._nodes: list[LocalServer] = []
        self._balancer: Balancer | None = None
        self._started = False

    # --- lifecycle ---------------------------------------------------------------------

    def start(self) -> LocalCluster:
        """Start Redis, the nodes (in parallel) and the balancer; wait until the URL is healthy.

        Raises:
            LocalServerError: a part failed to start (every part started is stopped again),
                or ``redis-server`` / ``haproxy`` is not installed (the message names the package).
            JavaNotFoundError, JarDownloadError: no usable Java or jar.
        """
        with self._lock:
            if self._started:
                raise LocalServerError("the cluster is already started")
            try:
                self._build()
                self._start_all()
            except BaseException:
                self._stop_all(remove_owned_dir=True)
                raise
            self._started = True
        _log.info("Conductor cluster up at %s (%d nodes)", self.url, self._node_count)
        return self

    def stop(self) -> None:
        """Stop the balancer, the nodes and Redis. Idempotent; safe before start."""
        with self._lock:
            self._stop_all(remove_owned_dir=True)
            self._started = False

    def restart(self) -> LocalCluster:
        """Stop everything and start it again on the same ports and data (a whole-cluster restart)."""
        with self._lock:
            self._stop_all(remove_owned_dir=False)
            self._started = False
            self._start_all()
            self._started = True
        return self

    def kill_node(self, index: int) -> None:
        """SIGKILL node ``index`` (0-based), as a crash; the balancer takes it out within ~2 s."""
        with self._lock:
            self._node(index).kill()

    def stop_node(self, index: int) -> None:
        """Stop node ``index`` gracefully."""
        with self._lock:
            self._node(index).stop()

    def start_node(self, index: int) -> None:
        """Start node ``index`` again (same port) and wait until it is healthy."""
        with self._lock:
            self._node(index).start()

    def restart_node(self, index: int) -> None:
        """Stop and start node ``index``."""
        with self._lock:
            self._node(index).restart()

    def restart_redis(self) -> None:
        """Stop Redis gracefully (its append-only file is flushed) and start it on the same port."""
        with self._lock:
            if self._redis is None:
                raise LocalServerError("the cluster is not started")
            self._redis.restart()

    def __enter__(self) -> LocalCluster:
        with self._lock:
            if not self._started:
                self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    # --- properties --------------------------------------------------------------------

    @property
    def port(self) -> int | None:
        """The balancer's port; None before the first start when picked automatically."""
        return self._balancer.port if self._balancer is not None else self._port

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:PORT`` of the balancer.

        Raises:
            LocalServerError: never started.
        """
        if self.port is None:
            raise LocalServerError("the cluster has no port yet; start it first")
        return f"http://127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        """The API base URL through the balancer, ``http://127.0.0.1:PORT/api``."""
        return f"{self.base_url}/api"

    @property
    def nodes(self) -> tuple[LocalServer, ...]:
        """The Conductor nodes (each a LocalServer with ``backend="redis"``)."""
        return tuple(self._nodes)

    @property
    def node_urls(self) -> tuple[str, ...]:
        """Each node's own API URL (bypassing the balancer)."""
        return tuple(node.url for node in self._nodes)

    @property
    def redis(self) -> RedisServer | None:
        """The shared Redis (None before start)."""
        return self._redis

    @property
    def balancer(self) -> Balancer | None:
        """The HAProxy balancer (None before start)."""
        return self._balancer

    @property
    def data_dir(self) -> Path | None:
        """The data directory; None before start (or after stop) when it is a temporary one."""
        return self._given_dir or self._owned_dir

    @property
    def is_running(self) -> bool:
        """True while the balancer, Redis and at least one node run."""
        return bool(
            self._balancer is not None and self._balancer.pid is not None
            and self._redis is not None and self._redis.pid is not None
            and any(node.is_running for node in self._nodes)
        )

    def processes(self) -> list[tuple[str, int, Path]]:
        """``(role, pid, log path)`` of every running part (for the CLI's record)."""
        parts: list[tuple[str, int | None, Path]] = []
        if self._balancer is not None:
            parts.append(("haproxy", self._balancer.pid, self._balancer.log_path))
        for i, node in enumerate(self._nodes, start=1):
            parts.append((f"node-{i}", node.pid, node.log_path or Path()))
        if self._redis is not None:
            parts.append(("redis-server", self._redis.pid, self._redis.log_path))
        return [(role, pid, log) for role, pid, log in parts if pid is not None]

    def __repr__(self) -> str:
        return f"<LocalCluster port={self.port} nodes={self._node_count} data_dir={self.data_dir}>"

    # --- internals (with self._lock held) ------------------------------------------------

    def _node(self, index: int) -> LocalServer:
        if not 0 <= index < len(self._nodes):
            raise LocalServerError(f"no node {index}: the cluster has nodes 0..{len(self._nodes) - 1}")
        return self._nodes[index]

    def _build(self) -> None:
        if self._redis is not None:
            return
        data_dir = self._prepare_data_dir()
        detached = self._node_options.detached
        self._redis = RedisServer(data_dir / "redis", log_path=data_dir / "redis.log", detached=detached)
        self._balancer = Balancer(data_dir, port=self._port, detached=detached)

    def _start_all(self) -> None:
        assert self._redis is not None and self._balancer is not None
        data_dir = self.data_dir
        assert data_dir is not None
        self._redis.start()
        if not self._nodes:
            self._nodes = [
                LocalServer(data_dir / f"node-{i}", backend="redis", redis_port=self._redis.port,
                            **self._node_options.as_kwargs())
                for i in range(1, self._node_count + 1)
            ]
        _all_or_nothing([node.start for node in self._nodes], self._node_options.startup_timeout)
        self._balancer.start([node.port for node in self._nodes if node.port is not None])

    def _stop_all(self, *, remove_owned_dir: bool) -> None:
        errors: list[BaseException] = []
        parts: list[Callable[[], Any]] = []
        if self._balancer is not None:
            parts.append(self._balancer.stop)
        parts.extend(node.stop for node in self._nodes)
        if self._redis is not None:
            parts.append(self._redis.stop)
        for stop in parts:
            try:
                stop()
            except LocalServerError as err:  # keep stopping the others
                errors.append(err)
        if remove_owned_dir and self._owned_dir is not None:
            shutil.rmtree(self._owned_dir, ignore_errors=True)
            self._owned_dir = None
            self._nodes, self._redis, self._balancer = [], None, None
        if errors:
            raise errors[0]

    def _prepare_data_dir(self) -> Path:
        path = run_data_dir(self._given_dir, self._owned_dir, "conductor-agents-cluster-")
        if self._given_dir is None:
            self._owned_dir = path
        return path


def _all_or_nothing(starts: Sequence[Callable[[], Any]], timeout: float) -> None:
    """Run ``starts`` in parallel threads; raise the first failure once all have finished."""
    if len(starts) == 1:
        starts[0]()
        return
    with concurrent.futures.ThreadPoolExecutor(len(starts),
                                               thread_name_prefix="conductor-agents-cluster-start") as pool:
        futures = [pool.submit(start) for start in starts]
        concurrent.futures.wait(futures, timeout=timeout + 30.0)
    for future in futures:
        error = future.exception() if future.done() else None
        if error is not None:
            raise error
