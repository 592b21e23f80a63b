"""One Conductor server process: spawned holding its data directory's lock, watched until ``/health``
answers, stopped with SIGTERM and then SIGKILL.

:class:`~conductor_agents.LocalServer` decides what to start (jar, Java, data directory, port) and
when; this module runs the process. A failed start carries the last lines the server logged in it.

Functions; thread-safe as long as one caller owns a given process.
"""

from __future__ import annotations

import fcntl
import logging
import os
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from .._common.clock import Clock
from ..errors import LocalServerError
from . import _http, _logs, _proc
from ._command import redacted

__all__ = ["LOG_TAIL_LINES", "ExitedDuringStartupError", "spawn", "startup_failure", "wait_healthy"]

_log = logging.getLogger("conductor_agents.local_server")

LOG_TAIL_LINES = 40
_HEALTH_POLL_SECONDS = 0.25
_HEALTH_PROBE_TIMEOUT = 2.0


class ExitedDuringStartupError(LocalServerError):
    """The server process ended before it was healthy (a start from the jar alone may still work)."""


def spawn(cmd: Sequence[str], *, log_path: Path, env: Mapping[str, str], data_dir: Path,
          detached: bool) -> tuple[subprocess.Popen[bytes], int]:
    """Start the server ``cmd`` in ``data_dir``, its output appended to ``log_path`` after a line saying when
    and how (secret-looking values hidden); return the process and where this start's lines begin in the log.

    Raises:
        LocalServerError: another server uses ``data_dir``, or the executable cannot be started.
    """
    lock_fd = _lock_data_dir(data_dir)
    try:
        with open(log_path, "a", encoding="utf-8") as log:
            offset = log.tell()
            stamp = time.strftime("%Y-%m-%d %H:%M:%S")
            log.write(f"--- conductor-agents: starting the server at {stamp}: {redacted(cmd)}\n")
            log.flush()
            proc = _proc.spawn(
                cmd,
                env=env,
                log_file=log,
                cwd=data_dir,
                detached=detached,
                pass_fds=(lock_fd,),  # the server holds the data dir lock while it lives
            )
    finally:
        os.close(lock_fd)
    return proc, offset


def wait_healthy(proc: subprocess.Popen[bytes], port: int, offset: int, *, log_path: Path | None,
                 timeout: float, clock: Clock) -> None:
    """Wait until the server ``proc`` answers ``/health`` on ``port``.

    Raises:
        ExitedDuringStartupError: the process ended first.
        LocalServerError: another process answers on the port, or no health within ``timeout`` seconds.
    """
    base_url = f"http://127.0.0.1:{port}"

    def healthy() -> bool:
        if not _http.probe_health(base_url, _HEALTH_PROBE_TIMEOUT):
            return False
        if _proc.listens_on(proc.pid, port) is False:
            raise startup_failure(log_path, f"another process answers on port {port}", offset)
        return proc.poll() is None

    def exited(code: int) -> ExitedDuringStartupError:
        failure = startup_failure(log_path, f"the server exited with code {code} during startup", offset)
        return ExitedDuringStartupError(str(failure), log_tail=failure.log_tail)

    _proc.wait_ready(proc, healthy, timeout=timeout, poll=_HEALTH_POLL_SECONDS, clock=clock, exited=exited,
                     late=lambda: startup_failure(log_path, f"the server was not healthy within {timeout:.0f} s",
                                                  offset))


def startup_failure(log_path: Path | None, message: str, offset: int) -> LocalServerError:
    """The error of a failed start: ``message``, where the log is, and what it got since ``offset``."""
    # First line: what happened and where the log is (the CLI prints only that line).
    tail = _logs.tail_lines(log_path, LOG_TAIL_LINES, offset) if log_path is not None else ""
    return LocalServerError(f"{message} (log: {log_path}); last lines:\n{tail}", log_tail=tail)


def _lock_data_dir(data_dir: Path) -> int:
    """Take the data directory's lock (``flock``) and return its descriptor.

    The descriptor is inherited by the server, so the lock lasts exactly as long as the
    server process: two servers never share one SQLite database.

    Raises:
        LocalServerError: another server uses this data directory.
    """
    fd = os.open(data_dir / ".conductor-agents.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as err:
        os.close(fd)
        raise LocalServerError(f"another server is using the data directory {data_dir}") from err
    return fd
