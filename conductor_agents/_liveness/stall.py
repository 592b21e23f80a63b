"""The stall rule: turns "nobody polls this run's domain" into a :class:`WorkerStallError`.

Pure logic; the runtime's watchdog (:mod:`conductor_agents._liveness.watchdog`) samples each run's
task list every check interval and applies it. A task counts as
stalled when it is routed to the run's domain, is SCHEDULED or IN_PROGRESS, has never
been polled (``pollCount`` 0) and has waited longer than the stall threshold.

Clock skew: a task's age is measured on the *server's* clock only, as the server's
``Date`` response header minus the task's ``scheduledTime``, so a client clock that is
minutes off can neither raise nor hide a stall. Without a ``Date`` header the watchdog
falls back to how long it has itself observed the task unpolled (client monotonic time).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import timezone
from email.utils import parsedate_to_datetime
from typing import Any

import attrs

from ..errors import WorkerStallError

__all__ = ["Stall", "find_stall", "poll_age", "run_words", "server_now", "server_time_from_date",
           "stall_error"]

_WAITING = frozenset({"SCHEDULED", "IN_PROGRESS"})


@attrs.frozen
class Stall:
    """A task that no worker picked up in time."""

    task_reference_name: str
    task_type: str
    domain: str
    waited_seconds: float


def server_time_from_date(value: str | None) -> float | None:
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


def server_now(date: str | None, fallback: float) -> float:
    """The server's clock from its ``Date`` header ``date``, else ``fallback`` (this machine's clock)."""
    now = server_time_from_date(date)
    return fallback if now is None else now


def poll_age(row: Mapping[str, Any], now: float) -> float | None:
    """How long before ``now`` (the server's clock: :func:`server_now`) the poll-data ``row`` was last polled;
    None for a row with no poll."""
    at = row.get("lastPollTime")
    return max(0.0, now - float(at) / 1000.0) if at else None


def find_stall(
    tasks: Iterable[Mapping[str, Any]],
    *,
    domain: str,
    stall_seconds: float,
    server_now: float | None,
    first_seen: dict[str, Any],
    client_now: float,
    grace: Mapping[str, float] | None = None,
) -> Stall | None:
    """The longest-waiting stalled task among ``tasks``, or None.

    ``first_seen`` maps task ids to the client monotonic time they were first seen
    unpolled; it is updated in place and used only when ``server_now`` is unknown.
    ``grace`` gives task types extra seconds before they count (see the watchdog).
    """
    worst: Stall | None = None
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
        allowed = stall_seconds + (grace or {}).get(str(task.get("taskType") or ""), 0.0)
        if waited > allowed and (worst is None or waited > worst.waited_seconds):
            worst = Stall(
                task_reference_name=str(task.get("referenceTaskName") or ""),
                task_type=str(task.get("taskType") or ""),
                domain=domain,
                waited_seconds=round(waited, 3),
            )
    for stale in set(first_seen) - live_ids:
        del first_seen[stale]
    return worst


def run_words(execution_id: str, listener_id: str | None) -> str:
    """How a log line names run ``execution_id``: by the id callers hold first when it is a run of the continued
    listener ``listener_id`` (``listener <id> (its run <run id>)``), else ``run <id>``."""
    if listener_id and listener_id != execution_id:
        return f"listener {listener_id} (its run {execution_id})"
    return f"run {execution_id}"


def stall_error(execution_id: str, stall: Stall) -> WorkerStallError:
    """The error that reports ``stall`` of run ``execution_id``: what waits, where, for how long, what to do."""
    return WorkerStallError(
        f"task {stall.task_reference_name!r} of run {execution_id} is routed to domain "
        f"{stall.domain!r} and no worker has polled it for {stall.waited_seconds:.1f}s. The process "
        "serving this run's domain has probably died (or cannot reach the server). The task is still "
        "SCHEDULED on the server: resume the run from a live process with "
        "runtime.resume(execution_id, agent).",
        execution_id=execution_id,
        task_reference_name=stall.task_reference_name,
        domain=stall.domain,
        waited_seconds=stall.waited_seconds,
    )
