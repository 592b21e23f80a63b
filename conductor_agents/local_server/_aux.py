"""A helper process beside the Conductor server (Redis, the load balancer): start, wait ready, stop.

The process is spawned like the server (see :mod:`._proc`): attached ones get
``PR_SET_PDEATHSIG`` and are stopped by the ``atexit`` hook, detached ones start a new
session. Its output is appended to one log file.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from .._common.clock import SYSTEM_CLOCK, Clock
from ..errors import LocalServerError
from . import _exit_registry, _logs, _proc

_log = logging.getLogger("conductor_agents.local_server")

_READY_POLL_SECONDS = 0.1
_LOG_TAIL_LINES = 30


def find_binary(name: str, package: str) -> str:
    """Return the path of the executable ``name``.

    Raises:
        LocalServerError: it is not on PATH (the message names the package to install).
    """
    path = shutil.which(name)
    if path is None:
        raise LocalServerError(
            f"{name} is not installed: install the package {package!r} "
            f"(Debian/Ubuntu: apt-get install {package}; `make test` does it when run as root)"
        )
    return path


class AuxProcess:
    """One helper process: a command, a log file, a readiness check.

    Thread-safety: :meth:`start`, :meth:`stop` and :meth:`kill` serialize on a lock.
    """

    def __init__(
        self,
        role: str,
        *,
        log_path: Path,
        cwd: Path,
        detached: bool,
        ready: Callable[[], bool],
        startup_timeout: float,
        stop_timeout: float,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.role = role
        self.log_path = log_path
        self._cwd = cwd
        self._detached = detached
        self._ready = ready
        self._startup_timeout = startup_timeout
        self._stop_timeout = stop_timeout
        self._clock = clock
        self._lock = threading.RLock()
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        """The process id while it runs, else None."""
        proc = self._proc
        return proc.pid if proc is not None and proc.poll() is None else None

    def start(self, cmd: Sequence[str]) -> None:
        """Spawn ``cmd`` and wait until the readiness check passes.

        Raises:
            LocalServerError: already running, it exited, or it was not ready in time
                (the process is then killed; the message holds the last log lines).
        """
        with self._lock:
            if self.pid is not None:
                raise LocalServerError(f"{self.role} is already running (pid {self.pid})")
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.log_path, "a", encoding="utf-8") as log:
                offset = log.tell()
                log.write(f"--- conductor-agents: starting {self.role} at {time.strftime('%Y-%m-%d %H:%M:%S')}\n")
                log.flush()
                self._proc = _proc.spawn(cmd, env=_plain_env(), log_file=log, cwd=self._cwd, detached=self._detached)
            if not self._detached:
                _exit_registry.register(self)
            try:
                self._wait_ready(self._proc, offset)
            except BaseException:
                self._stop(self._stop_timeout)
                raise

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after the stop timeout. Idempotent."""
        with self._lock:
            self._stop(self._stop_timeout)

    def kill(self) -> None:
        """SIGKILL at once (a crash, for fault tests). Idempotent."""
        with self._lock:
            proc = self._proc
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
            self._stop(0.0)

    def _stop_at_exit(self) -> None:
        if self._lock.acquire(timeout=self._stop_timeout):
            try:
                self._stop(self._stop_timeout)
            finally:
                self._lock.release()

    def _stop(self, timeout: float) -> None:
        proc = self._proc
        if proc is None:
            return
        _proc.stop_child(proc, timeout, role=self.role)
        self._proc = None
        _exit_registry.unregister(self)

    def _wait_ready(self, proc: subprocess.Popen[bytes], offset: int) -> None:
        _proc.wait_ready(proc, self._ready, timeout=self._startup_timeout, poll=_READY_POLL_SECONDS, clock=self._clock,
                         exited=lambda code: self._failure(f"{self.role} exited with code {code} during startup",
                                                           offset),
                         late=lambda: self._failure(f"{self.role} was not ready within {self._startup_timeout:.0f} s",
                                                    offset))

    def _failure(self, message: str, offset: int) -> LocalServerError:
        tail = _logs.tail_lines(self.log_path, _LOG_TAIL_LINES, offset)
        return LocalServerError(f"{message} (log: {self.log_path}); last lines:\n{tail}", log_tail=tail)


def _plain_env() -> dict[str, str]:
    """Redis and HAProxy need no secrets: they get PATH and locale only."""
    return {k: v for k, v in os.environ.items() if k in ("PATH", "LANG", "LC_ALL", "HOME", "TZ")}


class AuxService:
    """What Redis and the balancer share: a data directory, a port kept across restarts, one
    :class:`AuxProcess`. Subclasses give the command (:meth:`_launch`) and the readiness check."""

    #: The binary, the Debian package that has it, and how errors name the service.
    binary = ""
    package = ""
    label = ""

    def __init__(self, data_dir: Path, *, port: int | None, log_path: Path, detached: bool,
                 startup_timeout: float, stop_timeout: float, clock: Clock = SYSTEM_CLOCK) -> None:
        self.data_dir = data_dir
        self._port = port or None
        self._process = AuxProcess(
            self.binary, log_path=log_path, cwd=data_dir, detached=detached, ready=self._ready,
            startup_timeout=startup_timeout, stop_timeout=stop_timeout, clock=clock,
        )

    @property
    def port(self) -> int | None:
        """The TCP port on 127.0.0.1; None before the first start when picked automatically."""
        return self._port

    @property
    def pid(self) -> int | None:
        """The process id while it runs, else None."""
        return self._process.pid

    @property
    def log_path(self) -> Path:
        """Where the process's output is appended."""
        return self._process.log_path

    def _start_process(self, args: Callable[[str, int], Sequence[str]]) -> None:
        """Find the binary, claim the port, spawn ``args(binary, port)`` and wait until ready.

        Raises:
            LocalServerError: the binary is missing, the port is taken, or it did not start.
        """
        binary = find_binary(self.binary, self.package)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._port = _proc.claim_port(self._port, self.label)
        self._process.start(args(binary, self._port))

    def stop(self) -> None:
        """Stop the process (SIGTERM, then SIGKILL after the stop timeout). Idempotent."""
        self._process.stop()

    def _ready(self) -> bool:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"<{type(self).__name__} port={self._port} pid={self.pid} dir={self.data_dir}>"
