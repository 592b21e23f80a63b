"""Whether another worker still serves a run's domain, before ``resume()`` takes the run over.

``resume()`` moves a stateful run to this process. If the process that served it is alive (it is
merely busy, or the caller guessed wrong), both would then poll the same domain and the run's
tasks would go to either: its in-memory state splits in two. The server knows who polls: its poll
data (``GET /tasks/queue/polldata?taskType=T``) holds, per task type and domain, the worker id of
the last poll and when it came (``lastPollTime``, the server's clock). A poll from another worker
within :func:`freshness_window` seconds means that worker is alive.
"""

from __future__ import annotations

from typing import Iterable, Optional

import attrs

from . import _poller
from ._api import ConductorApi
from ._clock import SYSTEM_CLOCK, Clock
from ._liveness import server_time_from_date

__all__ = ["LivePoller", "find_live_poller", "freshness_window"]

#: Added to the poller's longest quiet spell: one long poll (the server caps it at 5 s), the pause
#: after a failed poll (at most 5 s), the 1 s resolution of the ``Date`` header, and slack for a
#: loaded machine.
_MARGIN_SECONDS = 15.0


def freshness_window() -> float:
    """Seconds after its last poll a domain still counts as served by a live worker.

    A live poller whose queues the watcher reads polls each task type at least once per
    ``_SAFETY_POLL_SECONDS`` (60 s: between rings it only does that safety poll); without the
    watcher it long-polls back to back. So a worker silent for longer than that plus the margin
    has stopped (or can no longer reach the server, which for the run is the same).
    """
    return _poller._SAFETY_POLL_SECONDS + _MARGIN_SECONDS


@attrs.frozen
class LivePoller:
    """Another worker polled the run's domain lately."""

    worker_id: str
    task_type: str
    seconds_ago: float


def find_live_poller(api: ConductorApi, task_types: Iterable[str], domain: Optional[str], *,
                     own_worker_id: str, clock: Clock = SYSTEM_CLOCK) -> Optional[LivePoller]:
    """The most recent poll of ``domain`` by another worker within the window, or None.

    Ages are measured on the server's clock (its ``Date`` header against its ``lastPollTime``),
    so a client clock that is off neither hides a live worker nor invents one.

    Raises:
        ServerError (and subclasses): the poll data could not be read.
    """
    if not domain:
        return None  # shared (domain-less) tools may be served by many workers at once, by design
    window = freshness_window()
    freshest: Optional[LivePoller] = None
    for task_type in task_types:
        rows, date = api.poll_data_sample(task_type)
        now = server_time_from_date(date)
        if now is None:  # no usable Date header: fall back to this machine's clock
            now = clock.time()
        for row in rows:
            if row.get("domain") != domain or not row.get("lastPollTime"):
                continue
            worker = str(row.get("workerId") or "")
            if worker == own_worker_id:
                continue
            age = max(0.0, now - float(row["lastPollTime"]) / 1000.0)
            if age <= window and (freshest is None or age < freshest.seconds_ago):
                freshest = LivePoller(worker_id=worker, task_type=task_type, seconds_ago=age)
    return freshest
