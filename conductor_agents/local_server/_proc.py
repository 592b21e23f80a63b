"""Processes and ports: spawning the server so it cannot be orphaned, and inspecting pids.

Attached servers get ``PR_SET_PDEATHSIG=SIGTERM`` (Linux) and their own process group:
if the Python process dies, even by SIGKILL, the kernel sends the server SIGTERM;
a Ctrl-C in the terminal reaches Python only, which then stops the server in order.
Detached servers start a new session and outlive their parent.
"""

from __future__ import annotations

import concurrent.futures
import ctypes
import logging
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar, TextIO

from .._common.clock import SYSTEM_CLOCK, Clock
from ..errors import LocalServerError

_log = logging.getLogger("conductor_agents.local_server")

_PR_SET_PDEATHSIG = 1
_SPAWN_TIMEOUT = 60.0
_POLL_SECONDS = 0.1
KILL_WAIT_SECONDS = 10.0


def _load_prctl() -> Callable[..., int] | None:
    # Loaded once at import: the child between fork and exec must not load libraries.
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


_PRCTL = _load_prctl()


def _attached_preexec(parent_pid: int) -> Callable[[], None]:
    def preexec() -> None:
        os.setpgid(0, 0)  # terminal signals (Ctrl-C) go to Python, which stops us in order
        if _PRCTL is not None:
            _PRCTL(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
            if os.getppid() != parent_pid:  # the parent died before prctl took effect
                os._exit(1)

    return preexec


def spawn(
    cmd: Sequence[str],
    *,
    env: Mapping[str, str],
    log_file: TextIO,
    cwd: Path,
    detached: bool,
    pass_fds: Sequence[int] = (),
) -> subprocess.Popen[bytes]:
    """Start ``cmd`` with stdout and stderr appended to ``log_file``; ``pass_fds`` are inherited.

    Raises:
        LocalServerError: the executable cannot be started.
    """
    kwargs: dict[str, Any] = {
        "stdin": subprocess.DEVNULL,
        "stdout": log_file,
        "stderr": subprocess.STDOUT,
        "env": dict(env),
        "cwd": cwd,
        "pass_fds": tuple(pass_fds),
    }
    if detached:
        kwargs["start_new_session"] = True
    else:
        kwargs["preexec_fn"] = _attached_preexec(os.getpid())

    def popen() -> subprocess.Popen[bytes]:
        return subprocess.Popen(list(cmd), **kwargs)

    try:
        if detached or threading.current_thread() is threading.main_thread():
            return popen()
        # PR_SET_PDEATHSIG fires when the *thread* that forked exits, so fork from a
        # thread that lives as long as the process.
        return _Spawner.call(popen, _SPAWN_TIMEOUT)
    except OSError as err:
        raise LocalServerError(f"cannot start {cmd[0]}: {err}") from err


class _Spawner:
    """Owns the thread that forks attached servers for callers that are not the main thread.

    PR_SET_PDEATHSIG fires when the thread that forked the child exits, so the forking
    thread must outlive every server it started. This thread runs while any of its
    servers is alive and ends about a second after the last one stops (a later
    request starts a new one). It is a daemon: at interpreter exit the atexit hook has
    already stopped the servers, and nothing else is lost with it. Thread-safe.
    """

    _IDLE_CHECK_SECONDS = 1.0
    _lock = threading.Lock()
    _thread: threading.Thread | None = None
    _requests: ClassVar[queue.Queue[tuple[Callable[[], subprocess.Popen[bytes]],
                                          concurrent.futures.Future[subprocess.Popen[bytes]]]]] = queue.Queue()
    _children: ClassVar[list[subprocess.Popen[bytes]]] = []

    @classmethod
    def _after_fork_in_child(cls) -> None:
        """A forked child has no spawner thread (the parent's does not exist there): start afresh."""
        cls._lock = threading.Lock()
        cls._thread = None
        cls._requests = queue.Queue()
        cls._children = []

    @classmethod
    def call(cls, fn: Callable[[], subprocess.Popen[bytes]], timeout: float) -> subprocess.Popen[bytes]:
        """Run ``fn`` (which starts a process) on the spawner thread and return its result."""
        future: concurrent.futures.Future[subprocess.Popen[bytes]] = concurrent.futures.Future()
        with cls._lock:
            cls._requests.put((fn, future))
            if cls._thread is None:
                cls._thread = threading.Thread(
                    target=cls._run, name="conductor-agents-local-server-spawner", daemon=True
                )
                cls._thread.start()
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError as err:
            raise LocalServerError(f"the spawner thread did not start the server in {timeout:.0f} s") from err

    @classmethod
    def _run(cls) -> None:
        while True:
            try:
                fn, future = cls._requests.get(timeout=cls._IDLE_CHECK_SECONDS)
            except queue.Empty:
                with cls._lock:
                    # poll() is None also while another thread waits on the child: conservative.
                    cls._children = [child for child in cls._children if child.poll() is None]
                    if not cls._children and cls._requests.empty():
                        cls._thread = None
                        return
                continue
            if future.set_running_or_notify_cancel():
                try:
                    child = fn()
                except BaseException as err:  # noqa: BLE001 - handed to the caller, never lost
                    future.set_exception(err)
                else:
                    with cls._lock:
                        cls._children.append(child)
                    future.set_result(child)


# --- pids ----------------------------------------------------------------------------


def _stat_fields(pid: int) -> list[str] | None:
    """Return /proc/<pid>/stat fields from field 3 (state) on, or None."""
    try:
        content = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return content[content.rindex(")") + 2 :].split()


def exists(pid: int) -> bool:
    """Return True when ``pid`` exists (a zombie too): what a process that cannot wait for it may ask."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def is_alive(pid: int) -> bool:
    """Return True when ``pid`` exists and is not a zombie."""
    if not exists(pid):
        return False
    fields = _stat_fields(pid)
    return not (fields and fields[0] in ("Z", "X"))


def start_ticks(pid: int) -> int | None:
    """Return the process start time in clock ticks since boot (tells a reused pid apart)."""
    fields = _stat_fields(pid)
    try:
        return int(fields[19]) if fields else None
    except (IndexError, ValueError):
        return None


def terminate(pid: int, timeout: float, clock: Clock = SYSTEM_CLOCK) -> bool:
    """SIGTERM ``pid``, wait up to ``timeout``, then SIGKILL; return True once it is gone.

    For processes that are not our children (we cannot ``wait`` for them).
    """
    for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, KILL_WAIT_SECONDS)):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return True
        deadline = clock.monotonic() + wait
        while is_alive(pid):
            if clock.monotonic() >= deadline:
                break
            time.sleep(_POLL_SECONDS)  # bounded by the deadline
        else:
            return True
        if sig == signal.SIGTERM:
            _log.warning("process %d ignored SIGTERM for %.0f s; killing it", pid, timeout)
    return not is_alive(pid)


def stop_child(proc: subprocess.Popen[bytes], timeout: float, *, role: str) -> None:
    """Stop our child ``proc`` (named ``role`` in messages): SIGTERM, then SIGKILL after ``timeout`` seconds.

    Raises:
        LocalServerError: it survived SIGKILL.
    """
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout)
        return
    except subprocess.TimeoutExpired:
        _log.warning("%s pid %d ignored SIGTERM for %.0f s; killing it", role, proc.pid, timeout)
    proc.kill()
    try:
        proc.wait(KILL_WAIT_SECONDS)
    except subprocess.TimeoutExpired as err:
        raise LocalServerError(f"{role} pid {proc.pid} survived SIGKILL") from err


def wait_ready(proc: subprocess.Popen[bytes], ready: Callable[[], bool], *, timeout: float, poll: float,
               clock: Clock, exited: Callable[[int], BaseException], late: Callable[[], BaseException]) -> None:
    """Wait until ``ready()`` says yes while our child ``proc`` runs, looking every ``poll`` seconds.

    Raises:
        ``exited(code)``: the process ended first; ``late()``: not ready within ``timeout`` seconds; and
        whatever ``ready`` raises.
    """
    deadline = clock.monotonic() + timeout
    while True:
        try:
            code = proc.wait(timeout=poll)  # doubles as the poll interval
        except subprocess.TimeoutExpired:
            pass
        else:
            raise exited(code)
        if ready():
            return
        if clock.monotonic() >= deadline:
            raise late()


# --- ports ---------------------------------------------------------------------------


#: Ports :func:`free_port` gave out lately (monotonic time): the parts of a cluster start at once, each binds its
#: port only once its process is up, and the kernel may give two of them the same free port meanwhile.
_GIVEN: dict[int, float] = {}
_GIVEN_LOCK = threading.Lock()
_GIVEN_FOR_SECONDS = 600.0
#: Ports :func:`claim_port` tries when the one it chose was taken by another process before the check.
_CLAIM_TRIES = 5


def free_port() -> int:
    """Return a TCP port on 127.0.0.1 that is free right now and that this process did not give out lately."""
    with _GIVEN_LOCK:
        now = time.monotonic()
        for given, at in list(_GIVEN.items()):
            if now - at > _GIVEN_FOR_SECONDS:
                del _GIVEN[given]
        port = 0
        for _ in range(64):
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
                sock.bind(("127.0.0.1", 0))
                port = int(sock.getsockname()[1])
            if port not in _GIVEN:
                break
        _GIVEN[port] = now
        return port


def claim_port(port: int | None, label: str = "") -> int:
    """The port a local part starts on: ``port`` if it is free; for None, a :func:`free_port`, and another one when
    another process took it before the check (CI: a cluster's node met the other test worker's server there).

    Raises:
        LocalServerError: ``port`` (given) is in use, or no free one was found.
    """
    what = f" ({label})" if label else ""
    if port is not None:
        if not port_is_free(port):
            raise LocalServerError(f"port {port} on 127.0.0.1 is already in use{what}")
        return port
    for _ in range(_CLAIM_TRIES):
        chosen = free_port()
        if port_is_free(chosen):
            return chosen
    raise LocalServerError(f"no free port on 127.0.0.1 after {_CLAIM_TRIES} tries{what}")


def port_is_free(port: int) -> bool:
    """Return True when a server could bind 127.0.0.1:``port`` (as Tomcat does, with SO_REUSEADDR)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def listens_on(pid: int, port: int) -> bool | None:
    """Return whether ``pid`` owns a listening socket on ``port``; None when /proc cannot tell."""
    inodes = set()
    try:
        for table in ("/proc/net/tcp", "/proc/net/tcp6"):
            with open(table) as fh:
                next(fh, None)
                for line in fh:
                    fields = line.split()
                    if len(fields) > 9 and fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                        inodes.add(f"socket:[{fields[9]}]")
        entries = list(Path(f"/proc/{pid}/fd").iterdir())
    except (OSError, ValueError, IndexError):
        return None
    for entry in entries:
        try:
            if os.readlink(entry) in inodes:
                return True
        except OSError:  # the descriptor closed while we looked
            continue
    return False


os.register_at_fork(after_in_child=_Spawner._after_fork_in_child)
