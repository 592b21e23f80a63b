"""Parking the ``JOIN`` around a listener's ``HUMAN`` wait, so the server does not evaluate it while it waits.

A listener waits inside the fork of its turn's tool calls: the ``HUMAN`` wait and the ``JOIN`` after it. The server
never evaluates the ``HUMAN`` task, but it evaluates the ``JOIN``: at once for its first 200 evaluations, then at a
growing interval up to ``systemTaskWorkerCallbackDuration`` (30 s on a stock server: a wake could wait that long for
the join). The serving process *parks* the join: a task update ``IN_PROGRESS`` with ``callbackAfterSeconds``
:data:`PARK_SECONDS` postpones its next evaluation. That is safe: a join whose branch is a ``HUMAN`` wait in progress
cannot complete, so the park races nothing but the server's own write of the same state (a lost park is seen when
read back, and done again). A young join is evaluated every 50 ms, and an evaluation that ends after the park
re-queues it with the server's own delay, so a park is read back twice, a second apart, and done again until it
holds (its ``pollCount`` did not move and its ``callbackAfterSeconds`` is the park's): measured in
``benchmarks/parked_joins.py``. After the forward completed the wait, it nudges a parked join (:func:`nudge`).

:class:`JoinParker` watches the links it is told about (each model turn of a listener that waits on a ``HUMAN``
task: its next wait follows) on one thread, and parks each one's join once it waits. A link that ends is forgotten
(:meth:`JoinParker.forget`): an ended listener costs no request, and the thread ends once it has nothing to look
at (the next watch starts it again). Thread-safe.
"""

from __future__ import annotations

import collections
import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any

import attrs

from .._common.clock import SYSTEM_CLOCK, Clock
from .._common.loops import BackgroundLoop
from .._liveness.nudges import MODEL_UNSTARTED_SECONDS, nudge_unstarted_model_calls
from .._wire.api import ConductorApi
from ..errors import ConductorAgentsError, ExecutionNotFoundError
from .handover import delivery_lock, waiting_wait

__all__ = ["JoinParker", "PARK_SECONDS", "nudge"]

log = logging.getLogger("conductor_agents.continuation")

#: How long a park postpones a join's next evaluation. Nothing the server does for a waiting ``HUMAN`` task
#: needs the join, so a park is long; if its serving process is gone, the server takes the join up again then.
PARK_SECONDS = 3600
#: Rounds of park and read-back before a join is left at the server's own pace.
_PARK_ROUNDS = 5
#: How often a watched link is looked at, and for how long at most (a turn with slow tools).
_LOOK_EVERY = 0.25
_WATCH_SECONDS = 600.0
#: After :data:`_PARK_ROUNDS` parks that did not hold, the next round comes this much later.
_PARK_AGAIN_AFTER = 10.0
#: A park found holding is looked at once more this much later: on a loaded server an evaluation already under
#: way can write the task (and its queue message) after the first look, undoing the park.
_HELD_LOOKS = 2
_LOOK_AGAIN_AFTER = 5.0
#: A park trusted is still looked at while its wait waits (until the watch ends, :data:`_WATCH_SECONDS`), first this
#: long after it was trusted, then at twice the last gap (30, 60, 120, 240 s: four looks in ten minutes, where one
#: every 30 s cost a thousand idle listeners' server 33 requests a second): on the cluster an evaluation that undid
#: it came later than the looks above, and the join was evaluated at the server's pace again, the park lost (seen
#: twice in a day's runs of tests/integration/test_human_wait.py).
_LOOK_WHILE_PARKED = 30.0
#: While a watched link has not come to its wait, how often its model call is looked at (from
#: :data:`~conductor_agents._liveness.nudges.MODEL_UNSTARTED_SECONDS` after the turn began): a call a Redis restart left
#: leased is made due again instead of waiting out its hour-long lease (seen in the cluster soak).
_LOOK_EVERY_MODEL = 15.0
#: After a request of a watch failed (a read timeout on a loaded server), the watch is looked at again this much
#: later, while it lasts (it was dropped, and the wait's join left at the server's pace for as long as it waited).
_AFTER_FAILURE = 2.0
#: Joins a park was sent for, remembered for the forward's nudge (the oldest forgotten first).
_SENT_KEPT = 100_000
#: When the join of an answered wait is looked at again (seconds after the answer, then after each nudge): a
#: healthy one has ended by the first look (its evaluation is due at once).
_CHECKS_AFTER_ANSWER = (3.0, 5.0, 10.0, 30.0)


def _update(api: ConductorApi, join: Mapping[str, Any], callback: int, worker_id: str) -> None:
    api.update_task({"workflowInstanceId": str(join.get("workflowInstanceId")), "taskId": str(join.get("taskId")),
                     "status": "IN_PROGRESS", "callbackAfterSeconds": callback, "workerId": worker_id,
                     "outputData": dict(join.get("outputData") or {})})


def nudge(api: ConductorApi, join: Mapping[str, Any] | None, *, worker_id: str,
          parked_here: Callable[[str], bool] = lambda join_id: False) -> bool:
    """Make a parked join due now (after its wait was completed); whether it was parked. A join not parked is left
    to the server (its own evaluation may be completing it: an update then would write over it).

    A park and an evaluation of the server's that overlap can leave the join's queue message parked while the task
    reads the evaluation's own callback (both write the queue, then the task): so a join this process sent a park
    for (``parked_here``) is nudged whatever the task reads, else it would wait out the whole park.

    Raises: as :meth:`ConductorApi.get_task` and :meth:`ConductorApi.update_task`.
    """
    if join is None:
        return False
    now = api.get_task(str(join.get("taskId")))
    parked = int(now.get("callbackAfterSeconds") or 0) == PARK_SECONDS or parked_here(str(join.get("taskId")))
    log.debug("join %s of run %s after its wait was answered: %s, callback %s, parked here: %s",
              join.get("taskId"), join.get("workflowInstanceId"), now.get("status"), now.get("callbackAfterSeconds"),
              parked_here(str(join.get("taskId"))))
    if now.get("status") != "IN_PROGRESS" or not parked:
        return False
    _update(api, now, 0, worker_id)
    return True


@attrs.define
class _Watch:
    """One watched link: until when, and its join's park under way (the read-backs are due at ``due``)."""

    until: float
    run_id: str
    join: Mapping[str, Any] | None = None
    wait_id: str = ""
    rounds: int = 0
    first_count: Any = None
    due: float = 0.0
    held_looks: int = 0  # looks that found the park holding (it is trusted after _HELD_LOOKS)
    gap: float = 0.0  # seconds between the looks at a trusted park (doubling from _LOOK_WHILE_PARKED)
    counted: bool = False  # in JoinParker.parked
    model_look: float = 0.0  # when the turn's model call is looked at (never started: made due again)


class JoinParker:
    """Parks the join of each watched link's next ``HUMAN`` wait, on one thread (started on first use).

    Each watched link is looked at every :data:`_LOOK_EVERY` seconds until it waits; its join is then parked and
    read back half a second and a second and a half later, once more five seconds after that, then every thirty
    seconds while its wait waits, parked again if undone (no thread sleeps for one link: the others go on)."""

    def __init__(self, api: ConductorApi, *, worker_id: str, stopping: threading.Event,
                 clock: Clock = SYSTEM_CLOCK) -> None:
        self._api = api
        self._worker_id = worker_id
        self._stopping = stopping
        self._clock = clock
        self._lock = threading.Lock()
        self._watched: dict[str, _Watch] = {}  # link execution id -> its watch
        self._thread: BackgroundLoop | None = None
        self.parked = 0  # joins parked and held (tests, stats)
        self._sent: collections.OrderedDict[str, None] = collections.OrderedDict()  # joins a park was sent for
        self._answered: dict[str, tuple[float, int, Mapping[str, Any]]] = {}  # join id -> (due, attempt, join)

    def watch(self, execution_id: str, run_id: str) -> None:
        """Park the join of the next wait of link ``execution_id`` of the listener on ``run_id`` (its current
        one, if it waits now)."""
        with self._lock:
            # Always a new watch: a model turn means the link's previous wait was answered, and a watch still looking
            # at that wait's park (a trusted park is looked at for minutes) must not stand in for the next one's (it
            # did: the next wait was never parked, and its join was evaluated at the server's pace).
            now = self._clock.monotonic()
            self._watched[execution_id] = _Watch(until=now + _WATCH_SECONDS, run_id=run_id,
                                                 model_look=now + MODEL_UNSTARTED_SECONDS + _LOOK_EVERY_MODEL)
            self._start_locked()
        log.debug("run %s: watching for its next wait, to park its join", execution_id)

    def forget(self, execution_id: str) -> None:
        """Link ``execution_id`` ended (or is no longer served here): stop watching it, and drop the later looks at
        the joins of its answered waits (an ended run's join has nothing left to nudge)."""
        with self._lock:
            self._watched.pop(execution_id, None)
            for join_id in [j for j, (_, _, join) in self._answered.items()
                            if str(join.get("workflowInstanceId")) == execution_id]:
                del self._answered[join_id]

    def _start_locked(self) -> None:
        """Start the parker's thread unless it runs or the parker is closing (called under the lock). A thread that
        found nothing to do cleared :attr:`_thread` under the lock as it ended, so a watch is never left to a thread
        that is ending."""
        if not self._stopping.is_set() and (self._thread is None or not self._thread.is_alive):
            self._thread = BackgroundLoop("join-parker", self._run, daemon=True, stop=self._stopping)
            self._thread.start()

    def close(self, timeout: float) -> None:
        """Stop the parker's thread and join it (bounded by ``timeout`` seconds), so it ends with its runtime; a
        watch after that starts none. Idempotent. A join left parked is taken up by the server when its park ends."""
        self._stopping.set()
        with self._lock:
            thread = self._thread
        if thread is not None:
            thread.stop()
            thread.join(timeout)

    def answered(self, join: Mapping[str, Any]) -> None:
        """The wait inside ``join`` was answered (and the join nudged if parked): look at the join again a little
        later, and nudge it again while it has not ended. A nudge that met an evaluation of the server's can leave
        the join in progress with no queue message (both write the task, and the queue, in turn); another nudge
        gives it one again. Bounded: :data:`_CHECKS_AFTER_ANSWER`."""
        with self._lock:
            self._answered[str(join.get("taskId"))] = (self._clock.monotonic() + _CHECKS_AFTER_ANSWER[0], 0, join)
            self._start_locked()

    def _check_answered(self, join_id: str, attempt: int, join: Mapping[str, Any]) -> None:
        try:
            task = self._api.get_task(join_id)
            if task.get("status") == "IN_PROGRESS":
                log.info("run %s: the join of an answered wait has not ended; made due again",
                         join.get("workflowInstanceId"))
                _update(self._api, task, 0, self._worker_id)
                attempt += 1
                if attempt < len(_CHECKS_AFTER_ANSWER):
                    with self._lock:
                        self._answered[join_id] = (self._clock.monotonic() + _CHECKS_AFTER_ANSWER[attempt], attempt,
                                                   join)
                    return
        except ConductorAgentsError as err:
            log.debug("join %s: looking at it after its wait was answered failed (%s)", join_id, err)
        with self._lock:
            self._answered.pop(join_id, None)

    def sent_park(self, join_id: str) -> bool:
        """Whether this process sent a park for join ``join_id`` (then a nudge after its wait is answered is due)."""
        with self._lock:
            return join_id in self._sent

    def _run(self) -> None:
        while not self._stopping.is_set():
            with self._lock:
                now = self._clock.monotonic()
                for gone in [e for e, w in self._watched.items() if w.until <= now]:
                    ended = self._watched.pop(gone)
                    if not ended.counted:  # a turn that outlasted the watch, or a park that never held
                        log.info("run %s: its join was not parked within %g s (found: %s, parks sent: %d); left "
                                 "to the server's pace", gone, _WATCH_SECONDS, ended.join is not None, ended.rounds)
                due = [(e, w) for e, w in self._watched.items() if w.due <= now]
                checks = [(j, c) for j, c in self._answered.items() if c[0] <= now]
                if not self._watched and not self._answered:
                    self._thread = None  # nothing left: the thread ends (a watch or an answer starts a new one)
                    return
            for join_id, (_, attempt, join) in checks:
                self._check_answered(join_id, attempt, join)
            for execution_id, watch in due:
                if self._stopping.is_set():
                    return
                try:
                    done = self._step(execution_id, watch)
                except ExecutionNotFoundError as err:  # gone: nothing to park
                    log.debug("run %s: parking its join failed (%s)", execution_id, err)
                    done = True
                except ConductorAgentsError as err:  # a request failed (a loaded server): looked at again later
                    log.info("run %s: parking its join failed (%s); trying again in %g s", execution_id, err,
                             _AFTER_FAILURE)
                    watch.due, done = self._clock.monotonic() + _AFTER_FAILURE, False
                if done:
                    with self._lock:
                        if self._watched.get(execution_id) is watch:
                            del self._watched[execution_id]
            self._stopping.wait(_LOOK_EVERY)

    def _step(self, execution_id: str, watch: _Watch) -> bool:
        """One step of link ``execution_id``'s watch; whether it is done with (its wait answered, or ended). A park
        trusted is looked at while the watch lasts, at doubling gaps from :data:`_LOOK_WHILE_PARKED` seconds, and parked
        again if undone."""
        now = self._clock.monotonic()
        if watch.join is None:
            wait, join = waiting_wait(self._api, execution_id)
            if wait is None or join is None:
                if now >= watch.model_look:  # no wait yet, long after the turn began: was its model call dropped?
                    watch.model_look = now + _LOOK_EVERY_MODEL
                    nudge_unstarted_model_calls(self._api, execution_id, clock=self._clock)
                return False
            watch.join, watch.wait_id = join, str(wait.get("taskId"))
            log.debug("run %s: waits (%s); parking its join %s", execution_id, wait.get("referenceTaskName"),
                      join.get("taskId"))
            return self._park(watch, now)
        task = self._api.get_task(str(watch.join.get("taskId")))
        if task.get("status") != "IN_PROGRESS":
            return True  # the wait was answered meanwhile: nothing to park
        if watch.first_count is None:
            watch.first_count, watch.due = task.get("pollCount"), now + 1.0
            return False
        if int(task.get("callbackAfterSeconds") or 0) == PARK_SECONDS and task.get("pollCount") == watch.first_count:
            watch.held_looks += 1
            if watch.held_looks >= _HELD_LOOKS:  # trusted: still looked at now and then while the wait waits
                if not watch.counted:
                    watch.counted = True
                    self.parked += 1
                    log.debug("run %s: the park of its join %s holds (%d sent)", execution_id,
                              watch.join.get("taskId"), watch.rounds)
                watch.gap = _LOOK_WHILE_PARKED if watch.gap == 0 else watch.gap * 2
                watch.due = now + watch.gap
                return False
            watch.due = now + _LOOK_AGAIN_AFTER  # the same count then: nothing evaluated it since
            return False
        if watch.held_looks >= _HELD_LOOKS:
            log.info("run %s: the park of its join was undone after it held (an evaluation of the server's); "
                     "parking it again", execution_id)
            watch.held_looks, watch.rounds, watch.gap = 0, 1, 0.0
            return self._park(watch, now)
        watch.held_looks = 0
        if watch.rounds % _PARK_ROUNDS == 0:  # a young join: parks rarely hold before its 200 quick evaluations
            log.debug("run %s: %d parks of its join did not hold; again in %g s", execution_id, watch.rounds,
                      _PARK_AGAIN_AFTER)
            watch.first_count, watch.due = None, now + _PARK_AGAIN_AFTER
            watch.join = None  # looked up again then (the wait may have been answered meanwhile)
            return False
        return self._park(watch, now)

    def _park(self, watch: _Watch, now: float) -> bool:
        """Park the join while its wait is in progress; done with (True) when the wait was answered. Under the
        listener's delivery lock, as the forward completes the wait: a park never lands after a completion
        whose nudge found the join unparked (it would hold the answered listener for an hour)."""
        assert watch.join is not None
        with delivery_lock(watch.run_id):
            if watch.wait_id and self._api.get_task(watch.wait_id).get("status") != "IN_PROGRESS":
                return True
            _update(self._api, watch.join, PARK_SECONDS, self._worker_id)
            with self._lock:
                self._sent[str(watch.join.get("taskId"))] = None
                while len(self._sent) > _SENT_KEPT:
                    self._sent.popitem(last=False)
        watch.rounds += 1
        watch.first_count, watch.due = None, now + 0.5
        return False
