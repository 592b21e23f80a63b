"""Whether a process serves a run now, and since when none does: what ``status``, ``list`` and ``wait`` say.

A stateful run's worker tasks (its tools; a continued listener's turn task and its mailbox's forward) are
routed to the run's task domain, and only the process that serves the run polls that domain. When that
process is gone, the server shows nothing wrong: the run stays RUNNING and its next worker task waits,
SCHEDULED, for ever. This module tells it from what the liveness monitor and ``resume()`` already read
(the run's SCHEDULED tasks with the stall rule of :mod:`.._liveness.stall`, and the server's poll data of
the domain, :func:`.live_workers.domain_polls`), with a few small reads and no state. The rule:

- **Not served** (``served=False``) when either

  a. a task of the run's domain (the run's, or its mailbox's) waits SCHEDULED, never polled, longer than
     ``liveness_stall_seconds`` (the stall rule, with its grace for a switch's carry task), and no live
     worker polled that task type on the domain within that bound (a busy worker does); ``unserved_for``
     is how long the task has waited, or since that type's last poll on the domain (since the run
     started, when it never was) when that is longer; or
  b. no worker polled the domain within the freshness window (:func:`.live_workers.freshness_window`: a
     live poller polls each of its types at least that often, also when idle), a worker of this host whose
     process no longer exists not counting, and the last poll of the domain (the run's start when nothing
     ever polled it) is older than ``liveness_stall_seconds``; ``unserved_for`` is its age. This covers a
     run that waits on the server (a message, a person): its wait needs no process, but what comes after
     it does (the tools, the approved call, the mailbox's forward of the next message).

- **Served** (``served=True``) when a worker not known dead polled the domain within the window (case
  *a*: polled the waiting task's type within the stall bound).

- **Cannot tell** (``served=None``): the run is not RUNNING (ended, or paused on purpose), has no task
  domain (a stateless run: any process of its agent may serve its tools, and one with no worker tools
  needs none), or it lost its process too recently to say (less than the stall bound ago). A worker on
  another host is known dead only once its last poll is older than the window (about 75 s).

Sub-runs (sub-agents, agent tools) share the parent's domain, hence its serving process: they are not read.
Cost: one read of the run, one page of SCHEDULED tasks per run read, and one poll-data read per task type
of the domain until a live poll is found (one when served; at most :data:`_MAX_TYPES`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any

import attrs

from .._common.clock import SYSTEM_CLOCK, Clock
from .._common.task_names import CARRY_TASK, TURN_TASK
from .._listener.running import RunningRun, waiting_for
from .._listener.switch import carry_grace_seconds
from .._liveness.stall import find_stall, server_time_from_date
from .._wire.api import ConductorApi
from .._wire.domains import single_domain
from ..errors import ConductorAgentsError
from ..result import AgentStatus, RunStatus
from ..settings import AgentSettings
from .live_workers import domain_polls, freshness_window, worker_is_dead_here

__all__ = ["SERVE_HINT", "Serving", "read_serving", "row_with_serving", "unserved_line", "unserved_words",
           "with_serving"]

log = logging.getLogger("conductor_agents.liveness")

#: The most task types whose poll data one check reads (every type of a domain is polled by its one process).
_MAX_TYPES = 6


@attrs.frozen
class Serving:
    """Whether a process serves a run (None: cannot tell, see the module) and, when none does, for how
    many seconds (the server's clock)."""

    served: bool | None = None
    unserved_for: float | None = None


UNKNOWN = Serving()
SERVED = Serving(served=True)


def read_serving(api: ConductorApi, settings: AgentSettings, execution_id: str, *, also: Iterable[str] = (),
                 clock: Clock = SYSTEM_CLOCK) -> Serving:
    """Whether a process serves run ``execution_id`` (a listener's current run; ``also``: more runs on its
    domain whose SCHEDULED tasks count, its mailbox), by the rule of the module.

    Raises:
        ExecutionNotFoundError: the server does not know the run.
        ServerUnavailableError, ServerError: a read failed.
    """
    workflow = api.get_workflow(execution_id)
    if RunStatus.parse(workflow.get("status")) is not RunStatus.RUNNING:
        return UNKNOWN
    try:
        domain = single_domain(workflow, execution_id, required=False)
    except ConductorAgentsError:  # several domains: not a run of this SDK's
        return UNKNOWN
    if domain is None:
        return UNKNOWN
    tasks: list[Mapping[str, Any]] = []
    server_now: float | None = None
    for run in dict.fromkeys((execution_id, *also)):
        page = api.workflow_tasks(run, statuses=("SCHEDULED",), count=100)
        tasks += page.tasks
        server_now = server_now if server_now is not None else server_time_from_date(page.date)
    now = server_now if server_now is not None else clock.time()
    started = workflow.get("startTime")
    age = now - started / 1000.0 if isinstance(started, (int, float)) and started > 0 else None
    stall_seconds = settings.liveness_stall_seconds
    stall = find_stall(tasks, domain=domain, stall_seconds=stall_seconds, server_now=server_now, first_seen={},
                       client_now=0.0, grace={CARRY_TASK: carry_grace_seconds(settings.continuation_drain_seconds)})
    if stall is not None:  # case a: the watchdog's stall, unless the task's type was polled within the bound
        live, last = _last_poll(api, (stall.task_type,), domain, within=stall_seconds, clock=clock)
        if live:
            return SERVED
        return Serving(served=False, unserved_for=round(max(stall.waited_seconds, _or(last, age) or 0.0), 1))
    live, last = _last_poll(api, _task_types(workflow), domain, within=freshness_window(), clock=clock)
    if live:
        return SERVED
    since = _or(last, age)  # never polled: since the run started
    if since is None or since <= stall_seconds:
        return UNKNOWN
    return Serving(served=False, unserved_for=round(since, 1))


def _or(value: float | None, otherwise: float | None) -> float | None:
    return value if value is not None else otherwise


def with_serving(api: ConductorApi, settings: AgentSettings, status: AgentStatus, execution_id: str, *,
                 also: Iterable[str] = (), clock: Clock = SYSTEM_CLOCK) -> AgentStatus:
    """``status`` of a run not ended (``execution_id``: the run working now) with what it waits for and, when
    RUNNING, whether a process serves it; unchanged when it ended or a read fails (logged: the status itself
    was read)."""
    if status.is_terminal:
        return status
    try:
        waiting = waiting_for(api, status)
        running = status.status is RunStatus.RUNNING
        serving = read_serving(api, settings, execution_id, also=also, clock=clock) if running else UNKNOWN
    except ConductorAgentsError as err:
        log.info("could not read whether run %s is served: %s", execution_id, err)
        return status
    return attrs.evolve(status, waiting_for=waiting, served=serving.served, unserved_for=serving.unserved_for)


def row_with_serving(api: ConductorApi, settings: AgentSettings, row: RunningRun, *,
                     clock: Clock = SYSTEM_CLOCK) -> RunningRun:
    """A row of :func:`~.._listener.running.running_runs` with whether a process serves it (unchanged when it is
    not RUNNING or a read fails)."""
    if row.status is not RunStatus.RUNNING:
        return row
    also = (row.execution_id,) if row.execution_id != row.current_execution_id else ()
    try:
        serving = read_serving(api, settings, row.current_execution_id, also=also, clock=clock)
    except ConductorAgentsError as err:
        log.info("could not read whether run %s is served: %s", row.current_execution_id, err)
        return row
    return attrs.evolve(row, served=serving.served, unserved_for=serving.unserved_for)


def _task_types(workflow: Mapping[str, Any]) -> list[str]:
    """The worker task types routed to the run's domain, its turn task first (every listener's process polls it)."""
    routed = [str(t) for t in (workflow.get("taskToDomain") or {}) if t not in ("*", CARRY_TASK)]
    return sorted(routed, key=lambda t: (t != TURN_TASK, t))[:_MAX_TYPES]


def _last_poll(api: ConductorApi, task_types: Iterable[str], domain: str, *, within: float,
               clock: Clock) -> tuple[bool, float | None]:
    """Whether a worker not known dead polled ``domain`` for one of ``task_types`` within ``within`` seconds
    (the reads stop there), and the age of the domain's freshest poll by anyone read (None: none)."""
    freshest: float | None = None
    for task_type in task_types:
        for poll in domain_polls(api, (task_type,), domain, clock=clock):
            if poll.seconds_ago <= within and not worker_is_dead_here(poll.worker_id):
                return True, poll.seconds_ago
            freshest = poll.seconds_ago if freshest is None else min(freshest, poll.seconds_ago)
    return False, freshest


#: The command that serves a run nobody serves (``serve`` adopts every orphaned run of the agent).
SERVE_HINT = "conductor-agents serve MODULE:AGENT"


def unserved_line(unserved_for: float | None) -> str:
    """What the CLI says of a run no process serves: ``not served: ... (serve it with: ...)``."""
    return f"not served: no process has polled its tasks{_for(unserved_for)} (serve it with: {SERVE_HINT})"


def unserved_words(api: ConductorApi, settings: AgentSettings, execution_id: str, held: str, *,
                   clock: Clock = SYSTEM_CLOCK) -> str:
    """What ``wait()`` adds to its timeout when no process serves run ``execution_id`` (the current run of what the
    caller holds as ``held``): ``, and no process has polled its tasks for 41 s (serve it with ...)``; else, and
    when a read fails (logged), nothing."""
    try:
        serving = read_serving(api, settings, execution_id, also=(held,), clock=clock)
    except ConductorAgentsError as err:
        log.info("could not read whether run %s is served: %s", execution_id, err)
        return ""
    if serving.served is not False:
        return ""
    return (f", and no process has polled its tasks{_for(serving.unserved_for)} (serve it with "
            f"runtime.resume({held!r}, agent), or {SERVE_HINT})")


def _for(unserved_for: float | None) -> str:
    """`` for 41 s`` (how long a run has not been served), or nothing when that is not known."""
    return f" for {unserved_for:.0f} s" if unserved_for is not None else ""
