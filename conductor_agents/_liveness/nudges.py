"""Tasks whose queue message the server leased away: found by the watchdog, and made due again.

A task waits in its queue as a message; a node that pops it *leases* it (the message is invisible until
the lease ends) and, for a worker's task, hands it out. Two of the server's failures leave a run waiting
on a message leased for an hour with nobody working on it (3.32.3 with Redis; the sweeper repairs only
a message that is *missing*):

- **A JOIN left unevaluated.** A ``JOIN`` (the end of the fork that runs a turn's tool calls) is an async
  system task: a node pops its message, extends the lease to the task's response timeout (an hour for a
  ``JOIN``) and evaluates it, again and again until every branch has ended. When that lease write reaches
  Redis but its answer is lost (Redis restarting, a connection dropped), the node skips the evaluation
  ("will retry on redelivery", ``AsyncSystemTaskExecutor``) and the message stays leased for the hour.
  Seen on the local cluster by restarting Redis while a listener's tool ran: the run waited although its
  tools had ended.
- **A tool's task never handed out.** A node that popped a worker task's message and died (SIGKILL)
  before answering the poll leaves it leased; the task stays ``SCHEDULED`` with ``pollCount`` 0 while
  this process polls its domain and gets nothing. Seen on the local cluster after a node's SIGKILL (a
  tool ``SCHEDULED`` for minutes; the lease itself was not read that time).

- **A task handed out in a poll whose answer was lost.** The server marks a polled task ``IN_PROGRESS`` for the
  polling worker before it answers; a connection cut while the answer is on its way leaves the task with this
  process's worker id and nobody running it, until its response timeout (an hour for an agent's tool, a minute
  for a mailbox's forward). Seen in the soak: a forward polled as the serving process's connections were cut,
  its message acted on 84 s later.

The cure is the server's own REST call: a task result ``IN_PROGRESS`` with ``callbackAfterSeconds`` 0
makes the task's message due at once (``updateTask`` postpones it by 0 s; a system task stays
``IN_PROGRESS``, a worker's task stays ``SCHEDULED``). Neither nudge can do harm: one evaluation more of
a ``JOIN`` reads its branches and completes or waits again; a ``SCHEDULED`` task's message is made due
when it was due already (only tasks without a retry delay still to come are nudged).

When (:class:`Nudges`, called by the watchdog at a run's samples; only runs this process serves):

- after this process posted the result of one of the run's tools and no task of the run's own machinery
  (the turn callback and the like, which come after the ``JOIN``) followed within
  :data:`JOIN_CHECK_SECONDS`: one read of the run's waiting tasks; each ``JOIN`` in progress none of
  whose branches waits is nudged. A look that nudged is followed by another, twice as late each time,
  at most :data:`JOIN_LOOKS` in all: a nudge is not always enough (seen once on the local cluster after a
  node's SIGKILL: the ``JOIN`` nudged, its message due, and still not evaluated 128 s later);
- a task of the run's domain ``SCHEDULED`` and never polled for :data:`UNPOLLED_SECONDS` (the sample
  read it anyway): nudged once;
- after a poller of the run's domain polled again following failed polls (:meth:`Nudges.note_lost_polls`): one read
  of the run's tasks in progress :data:`LOST_AFTER_SECONDS` later; each of a type whose poll failed, handed to this
  process's worker id at least that long ago (server clock) and not running here, is nudged. Nothing is read while
  polls succeed.

Each nudge is logged as a warning.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import attrs

from .._common.clock import SYSTEM_CLOCK, Clock
from .._common.task_names import MODEL_TASK_TYPE
from .._wire.api import ConductorApi
from ..errors import ConductorAgentsError
from .stall import server_now as server_clock

__all__ = ["JOIN_CHECK_SECONDS", "JOIN_LOOKS", "LOST_AFTER_SECONDS", "MODEL_UNSTARTED_SECONDS", "UNPOLLED_SECONDS",
           "LostPolls", "Nudges", "lost_tasks", "nudge_result", "nudge_unstarted_model_calls", "stuck_joins",
           "unpolled_tasks", "unstarted_model_calls"]

log = logging.getLogger("conductor_agents.liveness")

#: How long after a tool's result with nothing after it a run's joins are looked at. The server evaluates
#: a waiting ``JOIN`` at least every 30 s (its ``systemTaskWorkerCallbackDuration``), so a healthy one
#: has ended by then.
JOIN_CHECK_SECONDS = 45.0
#: How many looks at a run's joins one tool result may lead to (the first and those after a nudge: 45 s, then
#: 90, 180 and 360 s later: about 11 minutes in all).
JOIN_LOOKS = 4
#: How long a task of a served domain may wait unpolled (server clock) before its message is made due
#: again. A polling process takes a task within a second; a full tool pool makes tasks wait longer, and
#: the nudge then changes nothing.
UNPOLLED_SECONDS = 20.0
#: How old (server clock) a task in progress with this process's worker id must be, and not running here, to count
#: as handed out in a lost answer: a poll's tasks reach the tool pool within milliseconds of its answer.
LOST_AFTER_SECONDS = 5.0
#: How long a model call may be due and never started (server clock) before its message is made due again. A node
#: starts a due model call within milliseconds while the server keeps up; one that waited this long in a queue behind
#: others is made due again too, which can let two nodes make that call (the second's answer rewrites the first's).
MODEL_UNSTARTED_SECONDS = 45.0
#: The worker id the server records on a nudged task.
NUDGE_WORKER_ID = "conductor-agents (made due again)"


def _refs(join: Mapping[str, Any]) -> list[str]:
    """The reference names a ``JOIN`` waits on (in a loop, with the iteration's ``__N`` suffix)."""
    join_on = (join.get("inputData") or {}).get("joinOn") or ()
    refs = [ref for ref in join_on if isinstance(ref, str)]
    if join.get("loopOverTask") and isinstance(join.get("iteration"), int) and join["iteration"] > 0:
        refs = [f"{ref}__{join['iteration']}" for ref in refs]
    return refs


def stuck_joins(waiting: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """Of a run's tasks still SCHEDULED or IN_PROGRESS (``waiting``), the ``JOIN`` tasks in progress none
    of whose branches is among them: every branch ended (or is not scheduled yet, which one more
    evaluation does not harm), so a healthy ``JOIN`` would have completed."""
    tasks = list(waiting)
    pending = {t.get("referenceTaskName") for t in tasks}
    joins = [(t, _refs(t)) for t in tasks if t.get("taskType") == "JOIN" and t.get("status") == "IN_PROGRESS"]
    return [join for join, refs in joins if refs and not pending.intersection(refs)]


def unpolled_tasks(tasks: Iterable[Mapping[str, Any]], *, domain: str, server_now: float,
                   seconds: float | None = None) -> list[Mapping[str, Any]]:
    """The tasks of ``domain`` SCHEDULED, never polled, and due (retry delay included) for over ``seconds``
    (:data:`UNPOLLED_SECONDS` as it is at the call) by the server's clock ``server_now`` (epoch seconds)."""
    seconds = UNPOLLED_SECONDS if seconds is None else seconds
    found = []
    for task in tasks:
        if task.get("domain") != domain or task.get("status") != "SCHEDULED" or int(task.get("pollCount") or 0):
            continue
        due_ms = (task.get("scheduledTime") or 0) + 1000 * max(0, int(task.get("callbackAfterSeconds") or 0))
        if due_ms and server_now - due_ms / 1000.0 > seconds:
            found.append(task)
    return found


def unstarted_model_calls(tasks: Iterable[Mapping[str, Any]], *, server_now: float,
                          seconds: float | None = None) -> list[Mapping[str, Any]]:
    """The model calls (``LLM_CHAT_COMPLETE``) among a run's tasks that no node ever started and that have been due for
    over ``seconds`` (:data:`MODEL_UNSTARTED_SECONDS` as it is at the call) by the server's clock ``server_now``.

    Never started is provable from outside: a node that takes a model call persists its start time and poll count
    before it calls the model (3.32.3, ``AsyncSystemTaskExecutor.execute``); a call ``SCHEDULED`` with neither is one
    whose queue message a node leased and then dropped (a Redis restart lost the answer of the lease's write: the
    message stays invisible for the task's hour-long lease, ``will retry on redelivery``)."""
    seconds = MODEL_UNSTARTED_SECONDS if seconds is None else seconds
    found = []
    for task in tasks:
        if task.get("taskType") != MODEL_TASK_TYPE or task.get("status") != "SCHEDULED":
            continue
        if int(task.get("pollCount") or 0) or int(task.get("startTime") or 0):
            continue
        due_ms = (task.get("scheduledTime") or 0) + 1000 * max(0, int(task.get("callbackAfterSeconds") or 0))
        if due_ms and server_now - due_ms / 1000.0 > seconds:
            found.append(task)
    return found


def nudge_unstarted_model_calls(api: ConductorApi, execution_id: str, *, clock: Clock = SYSTEM_CLOCK) -> int:
    """Make due again each of run ``execution_id``'s :func:`unstarted_model_calls` (one small read; each candidate read
    again just before, so a node that took it meanwhile is not raced); how many. With an ``IN_PROGRESS`` result, as the
    other nudges: a model call is a task whose start and evaluation are one (an annotated system task), so the node
    that takes it up then makes the call. Logged as a warning.

    Raises: as :meth:`ConductorApi.workflow_tasks`, :meth:`ConductorApi.get_task`, :meth:`ConductorApi.update_task`.
    """
    page = api.workflow_tasks(execution_id, statuses=("SCHEDULED",), count=20)
    now = server_clock(page.date, clock.time())
    count = 0
    for task in unstarted_model_calls(page.tasks, server_now=now):
        fresh = api.get_task(str(task.get("taskId")))
        if not unstarted_model_calls([fresh], server_now=now):
            continue
        log.warning("run %s: its model call %s was never started (its queue message leased away, e.g. by a Redis "
                    "restart); making it due again", execution_id, task.get("referenceTaskName"))
        api.update_task(nudge_result(fresh))
        count += 1
    return count


@attrs.frozen
class LostPolls:
    """Polls of ``types`` by ``worker_id`` failed, and the poller polls again: their answers may have been lost with
    tasks in them. ``running_here(task_id)``: whether this process runs that task now."""

    types: frozenset[str]
    worker_id: str
    running_here: Callable[[str], bool]


def lost_tasks(tasks: Iterable[Mapping[str, Any]], lost: LostPolls, *, server_now: float) -> list[Mapping[str, Any]]:
    """Of a run's tasks in progress, those of a type whose poll failed, handed to ``lost.worker_id`` at least
    :data:`LOST_AFTER_SECONDS` before ``server_now`` (epoch seconds), and not running here."""
    found = []
    for task in tasks:
        if (task.get("status") != "IN_PROGRESS" or task.get("taskType") not in lost.types
                or task.get("workerId") != lost.worker_id or lost.running_here(str(task.get("taskId")))):
            continue
        handed_ms = task.get("startTime") or task.get("updateTime") or 0
        if handed_ms and server_now - handed_ms / 1000.0 >= LOST_AFTER_SECONDS:
            found.append(task)
    return found


def nudge_result(task: Mapping[str, Any]) -> dict[str, Any]:
    """The task result that makes ``task``'s queue message due at once."""
    return {"workflowInstanceId": task.get("workflowInstanceId"), "taskId": task.get("taskId"),
            "status": "IN_PROGRESS", "callbackAfterSeconds": 0, "workerId": NUDGE_WORKER_ID, "outputData": {}}


class Nudges:
    """What the watchdog nudges, per run: when to look at its joins, and which unpolled tasks it nudged.

    Thread-safe: :meth:`note_result` comes from the tool pool, the rest from the watchdog thread.
    """

    def __init__(self, api: ConductorApi, *, clock: Clock = SYSTEM_CLOCK) -> None:
        self._api = api
        self._clock = clock
        self._lock = threading.Lock()
        self._joins_due: dict[str, tuple[float, int]] = {}  # run id -> (monotonic time of its next look, looks made)
        self._nudged: dict[str, set[str]] = {}  # run id -> ids of its unpolled tasks nudged
        self._lost_due: dict[str, tuple[float, LostPolls]] = {}  # run id -> (when to look, the failed polls)

    def note_result(self, execution_id: str, *, tool: bool) -> None:
        """This process posted a task result of the run: one of its tools' (``tool``) has its joins looked
        at :data:`JOIN_CHECK_SECONDS` later; any other task (the run's own machinery, which comes after
        its join) calls that look off."""
        with self._lock:
            if tool:
                self._joins_due[execution_id] = (self._clock.monotonic() + JOIN_CHECK_SECONDS, 0)
            else:
                self._joins_due.pop(execution_id, None)

    def check_joins(self, execution_id: str) -> None:
        """When the run's look is due: one read of its waiting tasks, and each :func:`stuck_joins` one
        nudged, then looked at again later (see the module's docstring); tried again at the next call if the
        server did not answer."""
        now = self._clock.monotonic()
        with self._lock:
            due, looks = self._joins_due.get(execution_id, (now + 1.0, 0))
            if due > now:
                return
            del self._joins_due[execution_id]
        try:
            page = self._api.workflow_tasks(execution_id, statuses=("SCHEDULED", "IN_PROGRESS"), count=100)
            stuck = stuck_joins(page.tasks)
            for join in stuck:
                self._nudge(join, "left unevaluated though its branches ended")
        except ConductorAgentsError as err:
            log.info("looking at the joins of run %s failed (%s); trying again at its next sample",
                     execution_id, err)
            with self._lock:
                self._joins_due.setdefault(execution_id, (now, looks))
            return
        if stuck and looks + 1 < JOIN_LOOKS:
            with self._lock:  # unless a newer result of the run asked for a look of its own meanwhile
                self._joins_due.setdefault(execution_id, (now + JOIN_CHECK_SECONDS * 2 ** (looks + 1), looks + 1))

    def note_lost_polls(self, execution_id: str, lost: LostPolls) -> None:
        """A poller of the run's domain polls again after failed polls (see :class:`LostPolls`): its tasks in progress
        are looked at once, :data:`LOST_AFTER_SECONDS` from now."""
        with self._lock:
            _, earlier = self._lost_due.get(execution_id, (0.0, None))
            if earlier is not None:
                lost = attrs.evolve(lost, types=lost.types | earlier.types)
            self._lost_due[execution_id] = (self._clock.monotonic() + LOST_AFTER_SECONDS, lost)

    def check(self, execution_id: str) -> None:
        """At each sample of the run: its joins (:meth:`check_joins`) and its lost answers (:meth:`check_lost`)."""
        self.check_joins(execution_id)
        self.check_lost(execution_id)

    def check_lost(self, execution_id: str) -> None:
        """When the run's look is due: one read of its tasks in progress, and each of :func:`lost_tasks` nudged (the
        look stays due while the server does not answer)."""
        now = self._clock.monotonic()
        with self._lock:
            due, lost = self._lost_due.get(execution_id, (now + 1.0, None))
            if lost is None or due > now:
                return
        try:
            page = self._api.workflow_tasks(execution_id, statuses=("IN_PROGRESS",), count=100)
            for task in lost_tasks(page.tasks, lost, server_now=server_clock(page.date, self._clock.time())):
                log.warning("run %s: task %s was handed to this process by a poll whose answer was lost (the "
                            "connection failed); making it due again", execution_id, task.get("referenceTaskName"))
                self._api.update_task(nudge_result(task))
        except ConductorAgentsError as err:
            log.info("looking for tasks of run %s lost in a poll's answer failed (%s); trying again at its next "
                     "sample", execution_id, err)
            return
        with self._lock:
            if self._lost_due.get(execution_id, (0.0, None))[1] is lost:
                del self._lost_due[execution_id]

    def check_unpolled(self, execution_id: str, tasks: Iterable[Mapping[str, Any]], *, domain: str,
                       server_now: float | None) -> None:
        """Nudge, once each, the :func:`unpolled_tasks` of a sample of the run (its SCHEDULED tasks)."""
        if server_now is None:
            return
        for task in unpolled_tasks(tasks, domain=domain, server_now=server_now):
            task_id = str(task.get("taskId"))
            with self._lock:
                nudged = self._nudged.setdefault(execution_id, set())
                if task_id in nudged:
                    continue
                nudged.add(task_id)
            try:
                self._nudge(task, "never handed out though this process polls its domain")
            except ConductorAgentsError as err:
                log.info("making task %s due again failed (%s)", task_id, err)
                with self._lock:
                    nudged.discard(task_id)

    def _nudge(self, task: Mapping[str, Any], why: str) -> None:
        log.warning("run %s: task %s was %s (its queue message leased away, e.g. by a Redis restart or a "
                    "node's crash); making it due again", task.get("workflowInstanceId"),
                    task.get("referenceTaskName"), why)
        self._api.update_task(nudge_result(task))

    def forget(self, execution_id: str) -> None:
        with self._lock:
            self._joins_due.pop(execution_id, None)
            self._nudged.pop(execution_id, None)
            self._lost_due.pop(execution_id, None)

    def clear(self) -> None:
        with self._lock:
            self._joins_due.clear()
            self._nudged.clear()
            self._lost_due.clear()
