"""Whether another worker still serves a run's domain, before ``resume()`` takes the run over.

``resume()`` moves a stateful run to this process. If the process that served it is alive (it is
merely busy, or the caller guessed wrong), both would then poll the same domain and the run's
tasks would go to either: its in-memory state splits in two. The server knows who polls: its poll
data (``GET /tasks/queue/polldata?taskType=T``) holds, per task type and domain, the worker id of
the last poll and when it came (``lastPollTime``, the server's clock). A poll from another worker
within :func:`freshness_window` seconds means that worker is alive.

Except when the worker is known dead at once: this SDK's worker ids name the host and the pid
(:func:`make_worker_id`: ``host-pid-nonce.start.tag``, where ``start`` is the process's start time
in clock ticks since boot and ``tag`` a digest of this machine's boot id and pid namespace, both
read from ``/proc`` on Linux). A poll by a worker of this machine and pid namespace whose pid no
longer exists (``os.kill(pid, 0)`` raises ProcessLookupError), is a zombie, or now belongs to a
process started at another time (the pid was reused) cannot be a live worker's: it does not count.
Without ``/proc`` (macOS, Windows) the id carries no start time and no tag: a missing pid on the
same host name still counts as dead (a small risk: another machine or container with the same
host name; a reused pid only makes us wait the window). A remote worker only ages out.
"""

from __future__ import annotations

import hashlib
import os
import socket
from collections.abc import Iterable

import attrs

from .._common.clock import SYSTEM_CLOCK, Clock
from .._liveness.stall import poll_age, server_now
from .._wire.api import ConductorApi
from .._worker import poller as _poller

__all__ = ["LivePoller", "domain_polls", "find_live_poller", "freshness_window", "make_worker_id",
           "worker_is_dead_here"]

#: Added to the poller's longest quiet spell: one long poll (the server caps it at 5 s), the pause
#: after a failed poll (at most 5 s), the 1 s resolution of the ``Date`` header, and slack for a
#: loaded machine.
_MARGIN_SECONDS = 15.0


def freshness_window() -> float:
    """Seconds after its last poll a domain still counts as served by a live worker.

    A live poller whose queues the watcher reads polls each task type at least once per
    ``SAFETY_POLL_SECONDS`` (60 s: between rings it only does that safety poll); without the
    watcher it long-polls back to back. So a worker silent for longer than that plus the margin
    has stopped (or can no longer reach the server, which for the run is the same).
    """
    return _poller.SAFETY_POLL_SECONDS + _MARGIN_SECONDS


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="ascii", errors="replace") as fh:
            return fh.read()
    except OSError:
        return None


def _proc_stat(pid: int) -> tuple[str, str] | None:
    """A Linux process's (state, start time in clock ticks since boot), or None (no /proc, no such pid)."""
    text = _read(f"/proc/{pid}/stat")
    if not text or ")" not in text:
        return None
    fields = text.rsplit(")", 1)[1].split()  # after "pid (comm)": field 3 (state) on
    if len(fields) < 20:
        return None
    return fields[0], fields[19]  # state, starttime (field 22)


def _machine_tag() -> str:
    """Six hex digits naming this boot of this machine and this pid namespace ("" without /proc)."""
    boot = _read("/proc/sys/kernel/random/boot_id")
    try:
        namespace = os.readlink("/proc/self/ns/pid")
    except OSError:
        namespace = None
    if not boot or not namespace:
        return ""
    return hashlib.sha256(f"{boot.strip()}|{namespace}".encode()).hexdigest()[:6]


def make_worker_id(nonce: str, *, pid: int | None = None, host: str | None = None) -> str:
    """This process's worker id: ``host-pid-nonce.start.tag`` (``host-pid-nonce`` without /proc)."""
    pid = os.getpid() if pid is None else pid
    host = socket.gethostname() if host is None else host
    stat, tag = _proc_stat(pid), _machine_tag()
    if stat is None or not tag:
        return f"{host}-{pid}-{nonce}"
    return f"{host}-{pid}-{nonce}.{stat[1]}.{tag}"


def worker_is_dead_here(worker_id: str) -> bool:
    """Whether ``worker_id`` names a process of this machine that no longer runs.

    False whenever that cannot be known for sure: another host (or, on Linux, another boot or pid
    namespace), an id not made by :func:`make_worker_id`, this very process, or a process that exists
    (also one we may not signal) and, when the id carries its start time, started at that time.
    """
    parts = worker_id.rsplit("-", 2)
    if len(parts) != 3 or parts[0] != socket.gethostname() or not parts[1].isdigit():
        return False
    pid = int(parts[1])
    ident = parts[2].split(".")  # nonce[.start.tag]
    if len(ident) not in (1, 3) or pid <= 0 or pid == os.getpid():
        return False
    if len(ident) == 3 and ident[2] != _machine_tag():
        return False  # another machine, boot or container with the same host name
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        pass  # it exists, as another user's process
    except OSError:
        return False
    stat = _proc_stat(pid)
    if stat is None:
        return False  # exists; nothing more to tell (no /proc)
    state, started = stat
    if state == "Z":
        return True  # killed, not yet reaped by its parent
    return len(ident) == 3 and started != ident[1]  # the pid now names another process


@attrs.frozen
class LivePoller:
    """A worker's last poll of a run's domain (``find_live_poller``: another worker's, lately)."""

    worker_id: str
    task_type: str
    seconds_ago: float


def find_live_poller(api: ConductorApi, task_types: Iterable[str], domain: str | None, *,
                     own_worker_id: str, clock: Clock = SYSTEM_CLOCK,
                     ignore: Iterable[str] = ()) -> LivePoller | None:
    """The most recent poll of ``domain`` by another worker within the window, or None.

    Ages are measured on the server's clock (its ``Date`` header against its ``lastPollTime``),
    so a client clock that is off neither hides a live worker nor invents one.

    Raises:
        ServerError (and subclasses): the poll data could not be read.
    """
    if not domain:
        return None  # shared (domain-less) tools may be served by many workers at once, by design
    window = freshness_window()
    ignored = set(ignore) | {own_worker_id}
    freshest: LivePoller | None = None
    for poll in domain_polls(api, task_types, domain, clock=clock):
        if poll.worker_id in ignored or worker_is_dead_here(poll.worker_id):
            continue  # a dead process's last poll says nothing of a live worker
        if poll.seconds_ago <= window and (freshest is None or poll.seconds_ago < freshest.seconds_ago):
            freshest = poll
    return freshest


def domain_polls(api: ConductorApi, task_types: Iterable[str], domain: str, *,
                 clock: Clock = SYSTEM_CLOCK) -> list[LivePoller]:
    """Every worker's last poll of ``domain`` for each of ``task_types`` (one poll-data read per type),
    its age on the server's clock; dead or alive (:func:`worker_is_dead_here` tells).

    Raises:
        ServerError (and subclasses): the poll data could not be read.
    """
    polls: list[LivePoller] = []
    for task_type in task_types:
        rows, date = api.poll_data_sample(task_type)
        now = server_now(date, clock.time())
        for row in rows:
            age = poll_age(row, now)
            if row.get("domain") != domain or age is None:
                continue
            polls.append(LivePoller(worker_id=str(row.get("workerId") or ""), task_type=task_type, seconds_ago=age))
    return polls
