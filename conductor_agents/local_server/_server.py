"""LocalServer: a real Conductor server (the boot jar) as a child process on loopback."""

from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType

from .._common.clock import SYSTEM_CLOCK, Clock
from ..errors import ConfigurationError, LocalServerError
from . import _boot_archive, _logs, _proc
from ._boot_archive import BootLaunch
from ._command import DEFAULT_JVM_OPTIONS, SERVER_ENV_DEFAULTS, java_command, server_properties, training_command
from ._dirs import run_data_dir
from ._exit_registry import _attached  # noqa: F401  (tests inspect the registry through this module)
from ._exit_registry import register as _register
from ._exit_registry import stop_all_at_exit as _stop_all_at_exit  # noqa: F401  (tests run the exit hook through this module)
from ._exit_registry import unregister as _unregister
from ._jar import PathLike, resolve_server_jar
from ._java import JavaRuntime, find_java, probe_java
from ._node_options import NodeOptions
from ._redis import RedisServer
from ._server_process import LOG_TAIL_LINES, ExitedDuringStartupError, spawn, wait_healthy

__all__ = ["BACKENDS", "DEFAULT_JVM_OPTIONS", "LocalServer", "PathLike"]

_log = logging.getLogger("conductor_agents.local_server")

BACKENDS: tuple[str, ...] = ("sqlite", "redis")
"""What :class:`LocalServer` can keep its data in (``backend=``)."""

#: The least time the first start gives the making of the boot archive (a training start, then the
#: JVM writing the archive: 1-2 minutes on 2 busy cores); past it the server starts from the jar.
_BOOT_ARCHIVE_TIMEOUT = 900.0
_JAR_VERSION_RE = re.compile(r"conductor-server-(.+)-boot\.jar$")


class LocalServer:
    """A real Conductor server running on 127.0.0.1, for development and tests.

    ``data_dir`` holds the SQLite database (``conductor.db``) and, unless ``log_path``
    is given, the server output (``server.log``, appended to). Without ``data_dir`` the
    server makes a temporary directory and deletes it on :meth:`stop`; a directory
    you pass is never deleted. Runs survive :meth:`restart` on the same data dir.
    Note: with SQLite the workflow message queue lives in the server's memory, so
    messages not yet consumed are lost when the server restarts.

    ``backend="redis"`` keeps runs, task queues, the message queue and the execution
    lock in Redis instead: the server starts its own ``redis-server`` (append-only file
    in ``data_dir/redis``, a free loopback port) and stops it with itself, so queued
    messages survive :meth:`restart`. ``redis_port`` points the server at a Redis that
    runs already (how :class:`~conductor_agents.testing.LocalCluster` shares one Redis
    between its nodes) instead of starting one.

    ``port`` None or 0 picks a free loopback port (kept across restarts). ``version``
    and ``jar`` choose the server (see :func:`resolve_server_jar`), ``java`` the runtime
    (see :func:`find_java`). ``env`` is extra environment for the server (merged over
    ``os.environ``), e.g. ``OPENAI_API_KEY``; ``properties`` extra ``-D`` system
    properties (they override the defaults, except ``server.port``); ``jvm_options``
    replaces :data:`DEFAULT_JVM_OPTIONS`. ``secrets`` (name -> value) go into the server's
    secrets store (its environment, as ``CONDUCTOR_SECRET_<name>``), where tools that declare
    them in ``credentials`` get them; they are never part of a ``repr`` or log line.

    ``boot_archive`` (default: on, unless ``CONDUCTOR_AGENTS_BOOT_ARCHIVE=0``) starts the
    server from its boot archive: the jar unpacked once and a JVM class archive made for it
    by one training start (about one start's time, once per jar and Java version, cached
    beside the jar), which makes every later start about twice as fast. A start that fails
    with the archive is tried again without it, and an archive the JVM rejects is made again
    (see ``docs/configuration.md``).

    The server never outlives this process by accident: an ``atexit`` hook stops it, and
    on Linux the kernel sends it SIGTERM if this process dies (even by SIGKILL).
    ``detached=True`` (used by the CLI) turns both off and starts it in a new session;
    a detached server needs an explicit ``data_dir``.

    Thread-safety: :meth:`start`, :meth:`stop` and :meth:`restart` serialize on an
    internal lock (a :meth:`stop` issued during a :meth:`start` waits for it); the
    properties can be read from any thread.

    Fork: the server process belongs to the process that started it. A forked child uses
    it over HTTP (``url``) but cannot stop, restart or start it (:class:`LocalServerError`),
    and its exit never stops it or deletes its data directory.
    """

    def __init__(
        self,
        data_dir: PathLike | None = None,
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
        log_path: PathLike | None = None,
        detached: bool = False,
        progress: bool = True,
        backend: str = "sqlite",
        redis_port: int | None = None,
        boot_archive: bool | None = None,
        clock: Clock = SYSTEM_CLOCK,
        secrets: Mapping[str, str] | None = None,
    ) -> None:
        """Describe a server; nothing starts until :meth:`start`.

        Raises:
            ConfigurationError: an argument has a bad value (or ``CONDUCTOR_AGENTS_BOOT_ARCHIVE`` has).
        """
        if port is not None and (not isinstance(port, int) or not 0 <= port <= 65535):
            raise ConfigurationError(f"port must be an int in 0..65535, got {port!r}")
        self._options = NodeOptions(version=version, jar=jar, java=java, env=env, properties=properties,
                                    jvm_options=jvm_options, startup_timeout=startup_timeout, stop_timeout=stop_timeout,
                                    detached=detached, progress=progress, secrets=secrets)
        if detached and data_dir is None:
            raise ConfigurationError("a detached server needs an explicit data_dir")
        if backend not in BACKENDS:
            raise ConfigurationError(f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
        if redis_port is not None and backend != "redis":
            raise ConfigurationError("redis_port needs backend='redis'")
        self._backend = backend
        self._redis_port = redis_port
        self._boot_archive = _boot_archive.boot_archive_enabled() if boot_archive is None else bool(boot_archive)
        self._launch: BootLaunch | None = None
        self._redis: RedisServer | None = None
        self._given_dir = Path(data_dir).expanduser().resolve() if data_dir is not None else None
        self._java = java  # a path or None until resolved (once: restarts reuse it)
        self._given_log = Path(log_path).expanduser().resolve() if log_path is not None else None
        self._clock = clock
        self._lock = threading.RLock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._port: int | None = port or None
        self._owned_dir: Path | None = None
        self._running_version: str | None = version
        self._owner_pid = os.getpid()  # the process that started (or will start) the server

    # --- lifecycle ---------------------------------------------------------------------

    def start(self) -> LocalServer:
        """Start the server and wait until ``/health`` says healthy; return ``self``.

        Raises:
            LocalServerError: already started, the port is taken, or the server died or
                was not healthy within ``startup_timeout`` (the message and ``log_tail``
                hold the last log lines; the process is killed).
            JavaNotFoundError, JarDownloadError: no usable Java or jar.
        """
        self._check_owner()
        with self._lock:
            if self._proc is not None:
                raise LocalServerError(f"the server is already started (pid {self._proc.pid})")
            self._start()
        return self

    def stop(self) -> None:
        """Stop the server: SIGTERM, then SIGKILL after ``stop_timeout``. Idempotent; safe before start.

        Deletes the data directory only when the server created it.

        Raises:
            LocalServerError: the process survived SIGKILL, or this process is a fork of
                the one that started the server.
        """
        self._check_owner()
        with self._lock:
            self._stop(remove_owned_dir=True)

    def restart(self) -> LocalServer:
        """Stop and start again on the same data directory and port; return ``self``.

        Raises:
            LocalServerError, JavaNotFoundError, JarDownloadError: as :meth:`start`.
        """
        self._check_owner()
        with self._lock:
            self._stop(remove_owned_dir=False)
            self._start()
        return self

    def _check_owner(self) -> None:
        """Only the process that started the server stops or restarts it (not a forked child)."""
        if self._proc is None:
            self._owner_pid = os.getpid()
            return
        if self._owner_pid != os.getpid():
            raise LocalServerError(
                f"the Conductor server (pid {self._proc.pid}) was started by process {self._owner_pid}; this "
                f"process ({os.getpid()}) is a fork of it and cannot stop, restart or start it: use it over "
                f"HTTP ({self.url}) and leave its lifecycle to the process that started it")

    def prepare(self) -> LocalServer:
        """Get the jar, the Java runtime and the boot archive ready without starting; return ``self``.

        What the first :meth:`start` would do before it launches the server: the download and
        the boot archive's one training start happen here instead (e.g. in the background
        while other work runs, as the pytest plugin does). Safe beside a :meth:`start` of any
        server: the caches serialize on their locks.

        Raises:
            JavaNotFoundError, JarDownloadError: no usable Java or jar.
        """
        with self._lock:
            jar = self._server_jar()
            self._java_path()
            self._boot_launch(jar)
        return self

    def kill(self) -> None:
        """SIGKILL the server at once, as a crash would (for fault tests). Idempotent.

        Its own Redis (``backend="redis"``) keeps running; :meth:`start` starts the server again.
        """
        self._check_owner()
        with self._lock:
            proc = self._proc
            if proc is not None:
                _log.info("killing Conductor server (pid %d)", proc.pid)
                proc.kill()
                proc.wait(_proc.KILL_WAIT_SECONDS)
                self._proc = None
                _unregister(self)

    def __enter__(self) -> LocalServer:
        self._check_owner()
        with self._lock:
            if self._proc is None:
                self._start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # --- properties --------------------------------------------------------------------

    @property
    def port(self) -> int | None:
        """The TCP port; None before the first start when it is picked automatically."""
        return self._port

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:PORT`` (health at ``/health``).

        Raises:
            LocalServerError: the port is not known yet (never started).
        """
        if self._port is None:
            raise LocalServerError("the server has no port yet; start it first")
        return f"http://127.0.0.1:{self._port}"

    @property
    def url(self) -> str:
        """The API base URL, ``http://127.0.0.1:PORT/api``.

        Raises:
            LocalServerError: the port is not known yet (never started).
        """
        return f"{self.base_url}/api"

    @property
    def pid(self) -> int | None:
        """The server's process id while it runs, else None."""
        proc = self._proc
        if proc is None:
            return None
        if self._owner_pid != os.getpid():  # a forked child cannot wait for it: ask the kernel
            return proc.pid if _proc.exists(proc.pid) else None
        return proc.pid if proc.poll() is None else None

    @property
    def is_running(self) -> bool:
        """True while the server process is alive."""
        return self.pid is not None

    @property
    def data_dir(self) -> Path | None:
        """The data directory; None before start (or after stop) when it is a temporary one."""
        return self._given_dir or self._owned_dir

    @property
    def log_path(self) -> Path | None:
        """The file the server output is appended to; None when there is no data dir yet."""
        if self._given_log is not None:
            return self._given_log
        data_dir = self.data_dir
        return data_dir / "server.log" if data_dir is not None else None

    @property
    def version(self) -> str | None:
        """The server version (known once started, or when given)."""
        return self._running_version

    @property
    def backend(self) -> str:
        """``"sqlite"`` or ``"redis"``."""
        return self._backend

    @property
    def redis(self) -> RedisServer | None:
        """The Redis this server started for itself (``backend="redis"`` without ``redis_port``), else None."""
        return self._redis

    @property
    def detached(self) -> bool:
        """True when the server is meant to outlive this process."""
        return self._options.detached

    def log_tail(self, n: int = LOG_TAIL_LINES) -> str:
        """Return the last ``n`` lines of the server log ("" when there is none)."""
        path = self.log_path
        return _logs.tail_lines(path, n) if path is not None else ""

    def __repr__(self) -> str:
        state = f"pid={self.pid}" if self.is_running else "stopped"
        return f"<LocalServer port={self._port} {state} data_dir={self.data_dir}>"

    # --- internals (called with self._lock held) ---------------------------------------

    def _server_jar(self) -> Path:
        options = self._options
        return options.jar if options.jar is not None else resolve_server_jar(options.version,
                                                                              progress=options.progress)

    def _start(self) -> None:
        jar = self._server_jar()
        java = self._java_path()
        match = _JAR_VERSION_RE.search(jar.name)
        self._running_version = self._options.version or (match.group(1) if match else None)
        data_dir = self._prepare_data_dir()
        try:
            redis_port = self._start_own_redis(data_dir)
            port = self._port = _proc.claim_port(self._port)
            launch = self._boot_launch(jar)
            try:
                self._spawn_and_wait(java, launch, data_dir, port, redis_port)
            except ExitedDuringStartupError:
                if launch.archive is None:
                    raise
                _log.warning("the server exited during a start from its boot archive; starting it from the jar")
                self._spawn_and_wait(java, BootLaunch.plain(jar), data_dir, port, redis_port)
                _boot_archive.discard_unpacked(launch)  # the archive was at fault: made again next time
        except BaseException:
            self._stop(remove_owned_dir=True)
            raise

    def _spawn_and_wait(self, java: Path, launch: BootLaunch, data_dir: Path, port: int,
                        redis_port: int | None) -> None:
        """Start the server process from ``launch`` and wait until it is healthy (the lock is held)."""
        log_path = self.log_path
        assert log_path is not None
        log_path.parent.mkdir(parents=True, exist_ok=True)
        cmd = self._command(java, launch, data_dir, port, redis_port)
        _log.info("starting Conductor server %s on port %d (data %s)", self._running_version, port, data_dir)
        began = self._clock.monotonic()
        env = {**SERVER_ENV_DEFAULTS, **os.environ, **self._options.env, **self._options.secret_env}
        self._proc, offset = spawn(cmd, log_path=log_path, env=env, data_dir=data_dir, detached=self._options.detached)
        if not self._options.detached:
            _register(self)
        try:
            wait_healthy(self._proc, port, offset, log_path=log_path, timeout=self._options.startup_timeout,
                         clock=self._clock)
        except ExitedDuringStartupError:
            self._proc = None
            _unregister(self)
            raise
        if launch.archive is not None and _boot_archive.rejected_archive(_logs.read_from(log_path, offset)):
            _boot_archive.discard(launch)  # the server runs (without it); the next start makes a new one
        _log.info(
            "Conductor server up at %s (pid %d) in %.1f s%s",
            self.url,
            self._proc.pid,
            self._clock.monotonic() - began,
            " (boot archive)" if launch.archive is not None else "",
        )

    def _boot_launch(self, jar: Path) -> BootLaunch:
        """The launch of this start: from the boot archive when it is on and can be had, else the jar."""
        if not self._boot_archive or not _boot_archive.is_archivable_jar(jar):
            return BootLaunch.plain(jar)
        runtime = self._java_runtime()
        if runtime is None:
            return BootLaunch.plain(jar)
        if self._launch is None or self._launch.archive is None or not self._launch.archive.is_file():
            self._launch = _boot_archive.prepare_launch(
                jar, runtime, training_command, timeout=max(self._options.startup_timeout, _BOOT_ARCHIVE_TIMEOUT),
                progress=self._options.progress, clock=self._clock)
        return self._launch

    def _java_runtime(self) -> JavaRuntime | None:
        """The Java runtime with its version (asked once when only a path was given); None if unknown."""
        if not isinstance(self._java, JavaRuntime):
            version, _ = probe_java(self._java_path())
            if version is None:
                return None
            self._java = JavaRuntime(self._java_path(), version)
        return self._java

    def _java_path(self) -> Path:
        if self._java is None:
            self._java = find_java()  # once: restarts reuse it
        if isinstance(self._java, JavaRuntime):
            return self._java.path
        return Path(self._java)

    def _prepare_data_dir(self) -> Path:
        path = run_data_dir(self._given_dir, self._owned_dir, "conductor-agents-server-")
        if self._given_dir is None:
            self._owned_dir = path
        return path

    def _start_own_redis(self, data_dir: Path) -> int | None:
        """Start this server's own Redis when it needs one; return the Redis port to use (None: SQLite)."""
        if self._backend != "redis":
            return None
        if self._redis_port is not None:
            return self._redis_port
        if self._redis is None:
            self._redis = RedisServer(
                data_dir / "redis", log_path=data_dir / "redis.log", detached=self._options.detached, clock=self._clock
            )
        if self._redis.pid is None:  # still running after kill()
            self._redis.start()
        return self._redis.port

    def _command(self, java: Path, launch: BootLaunch, data_dir: Path, port: int,
                 redis_port: int | None) -> list[str]:
        props = {**server_properties(data_dir, redis_port), **self._options.properties}
        return java_command(java, launch.jar, [*self._options.jvm_options, *launch.jvm_options], props, port)

    def _stop(self, *, remove_owned_dir: bool) -> None:
        proc = self._proc
        if proc is not None:
            _log.info("stopping Conductor server (pid %d)", proc.pid)
            _proc.stop_child(proc, self._options.stop_timeout, role="server")
            self._proc = None
            _unregister(self)
        if self._redis is not None:
            self._redis.stop()
        if remove_owned_dir and self._owned_dir is not None:
            shutil.rmtree(self._owned_dir, ignore_errors=True)
            self._owned_dir = None

    def _stop_at_exit(self) -> None:
        """Stop from the atexit hook without waiting forever for a thread inside start()."""
        if self._lock.acquire(timeout=self._options.stop_timeout):
            try:
                self._stop(remove_owned_dir=True)
            finally:
                self._lock.release()
            return
        proc = self._proc
        if proc is not None:
            _proc.stop_child(proc, self._options.stop_timeout, role="server")
