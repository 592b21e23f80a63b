"""The liveness monitor: turns "nobody polls this run's domain" into a :class:`WorkerStallError`.

A watchdog thread samples the run's task list every check interval. A task counts as
stalled when it is routed to the run's domain, is SCHEDULED or IN_PROGRESS, has never
been polled (``pollCount`` 0) and has waited longer than the stall threshold.

Clock skew: a task's age is measured on the *server's* clock only, as the server's
``Date`` response header minus the task's ``scheduledTime``, so a client clock that is
minutes off can neither raise nor hide a stall. Without a ``Date`` header the monitor
falls back to how long it has itself observed the task unpolled (client monotonic time).
"""

from __future__ import annotations

import logging
import threading
from datetime import timezone
from email.utils import parsedate_to_datetime
from typing import Any, Callable, Iterable, Mapping, Optional, Tuple

import attrs

from ._clock import SYSTEM_CLOCK, Clock
from .errors import ConductorAgentsError

__all__ = ["LivenessMonitor", "Stall", "find_stall", "server_time_from_date"]

log = logging.getLogger("conductor_agents.liveness")

_WAITING = frozenset({"SCHEDULED", "IN_PROGRESS"})
_TERMINAL_RUN = frozenset({"COMPLETED", "FAILED", "TERMINATED", "TIMED_OUT"})

#: ``sample()`` returns the workflow (with tasks) and the server's time in epoch seconds, if known.
Sampler = Callable[[], Tuple[Mapping[str, Any], Optional[float]]]


@attrs.frozen
class Stall:
    """A task that no worker picked up in time."""

    task_reference_name: str
    task_type: str
    domain: str
    waited_seconds: float


def server_time_from_date(value: Optional[str]) -> Optional[float]:
    """The server's clock from an HTTP ``Date`` header (mid-second), or None."""
    if not value:
        return None
    try:
        parsed = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if parsed.tzinfo is None:  # every HTTP date format is GMT (RFC 7231), even asctime's
        parsed = parsed.replace(tzinfo=timezone.utc)
    return parsed.timestamp() + 0.5


def find_stall(
    tasks: Iterable[Mapping[str, Any]],
    *,
    domain: str,
    stall_seconds: float,
    server_now: Optional[float],
    first_seen: dict,
    client_now: float,
) -> Optional[Stall]:
    """The longest-waiting stalled task among ``tasks``, or None.

    ``first_seen`` maps task ids to the client monotonic time they were first seen
    unpolled; it is updated in place and used only when ``server_now`` is unknown.
    """
    worst: Optional[Stall] = None
    live_ids = set()
    for task in tasks:
        if task.get("domain") != domain or task.get("status") not in _WAITING:
            continue
        if int(task.get("pollCount") or 0) > 0:
            continue
        task_id = str(task.get("taskId"))
        live_ids.add(task_id)
        first_seen.setdefault(task_id, client_now)
        scheduled_ms = task.get("scheduledTime") or 0
        if server_now is not None and scheduled_ms:
            waited = server_now - scheduled_ms / 1000.0
        else:
            waited = client_now - first_seen[task_id]
        if waited > stall_seconds and (worst is None or waited > worst.waited_seconds):
            worst = Stall(
                task_reference_name=str(task.get("referenceTaskName") or ""),
                task_type=str(task.get("taskType") or ""),
                domain=domain,
                waited_seconds=round(waited, 3),
            )
    for stale in set(first_seen) - live_ids:
        del first_seen[stale]
    return worst


class LivenessMonitor:
    """Watches one stateful run. Thread-safe; owned by the handle that waits on the run.

    :meth:`start` once; :meth:`dispose` is idempotent and safe before start. The thread
    (``conductor-agents-liveness-<run id>``) wakes on a ``threading.Event`` timer, never
    ``time.sleep``, so disposing it takes at most one sample.
    """

    def __init__(
        self,
        sample: Sampler,
        *,
        execution_id: str,
        domain: str,
        check_interval: float,
        stall_seconds: float,
        clock: Clock = SYSTEM_CLOCK,
        on_stall: Optional[Callable[[Stall], None]] = None,
    ) -> None:
        self.execution_id = execution_id
        self.domain = domain
        self._sample = sample
        self._interval = check_interval
        self._stall_seconds = stall_seconds
        self._clock = clock
        self._on_stall = on_stall
        self._first_seen: dict = {}
        self._stall: Optional[Stall] = None
        self._stop = threading.Event()
        self.samples = 0
        # Daemon: a monitor only observes; losing it at interpreter exit loses nothing.
        self._thread = threading.Thread(
            target=self._loop, name=f"conductor-agents-liveness-{domain}", daemon=True
        )

    @property
    def stall(self) -> Optional[Stall]:
        """The stall found so far, or None."""
        return self._stall

    def start(self) -> "LivenessMonitor":
        self._thread.start()
        return self

    def check_once(self) -> Optional[Stall]:
        """Take one sample now and return the stall, if any (used by the loop and tests)."""
        workflow, server_now = self._sample()
        self.samples += 1
        if str(workflow.get("status")) in _TERMINAL_RUN:
            self._stop.set()
            return None
        stall = find_stall(
            workflow.get("tasks") or (),
            domain=self.domain,
            stall_seconds=self._stall_seconds,
            server_now=server_now,
            first_seen=self._first_seen,
            client_now=self._clock.monotonic(),
        )
        if stall is not None and self._stall is None:
            self._stall = stall
            log.warning(
                "run %s: task %s (domain %s) has not been polled for %.1fs",
                self.execution_id, stall.task_reference_name, stall.domain, stall.waited_seconds,
            )
            if self._on_stall is not None:
                self._on_stall(stall)
        return stall

    def _loop(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                self.check_once()
            except ConductorAgentsError as err:
                log.debug("liveness sample of %s failed: %s", self.execution_id, err)
            except Exception:
                log.exception("liveness monitor of %s failed", self.execution_id)
            if self._stall is not None:
                return

    def dispose(self) -> None:
        """Stop the thread and wait for it (bounded). Idempotent."""
        self._stop.set()
        if self._thread.ident is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=max(2.0, self._interval + 1.0))
