"""The serving process's side of continued listeners: when to switch, and running the switch.

For every continued listener this process serves, :class:`ContinuationDriver` keeps its current
link, and learns of each model turn from the turn task the SDK adds to every link (a ``before_model``
callback: the serving process runs it, so it costs no polling). At some turns it asks the switch rule
(:mod:`.switch_rule`), reading the link's size with two small requests (:mod:`.budget`) when the rule
needs it; once a switch is due, it runs the :class:`~conductor_agents._listener.switch.Switch` on a
thread of its own (``conductor-agents-continue-<run id>``): the new run is started at once (from then on
messages go to it) and the old one is ended once it has come to rest (waiting for a message, no tool
running). A switch left half done (this process closed, or a request failed) is taken up again at the
next turn, or by any process that resumes the listener.

:class:`~.tracker.ChainTracker` is what a handle of a served listener watches: the stall flag of whichever
links are live and of its mailbox, and the current link's id.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import weakref
from collections.abc import Callable, Iterable
from typing import Any

from .._common.clock import SYSTEM_CLOCK, Clock
from .._common.loops import BackgroundLoop
from .._common.task_names import TURN_TASK
from .._tooldefs.context import ToolContext
from .._tooldefs.tooldef import PULL_WORKFLOW_MESSAGES
from .._tracing import hooks as tracing
from .._wire.api import ConductorApi
from ..errors import ConductorAgentsError
from ..tools import ToolDef, tool
from .budget import RunSize, SizeModel
from .chain import is_continued
from .control import cancel_listener
from .directory import Chain, ChainDirectory, Link
from .following import current_status, ended_from_outside, is_running, retry_failed_mailbox
from .mailbox import make_forward_tool
from .mailbox_checks import MailboxChecks
from .parking import JoinParker
from .retention import Retirer
from .stopping import stop_if_read
from .switch import LinkSpec, Switch, read_commit
from .switch_rule import SwitchVerdict, switch_verdict
from .tracker import ChainTracker

__all__ = ["ContinuationDriver"]

log = logging.getLogger("conductor_agents.continuation")

_ITERATION = re.compile(r"__(\d+)$")
#: A switch step that failed (the server unreachable, a 5xx) is tried again after these pauses.
_RETRY_FIRST, _RETRY_MAX = 0.5, 15.0


class _Served:
    """One listener this process serves (owned by the driver; its fields change under the driver's lock)."""

    def __init__(self, chain: Chain, spec: LinkSpec, current: Link, turns_before: int, handle_link: Any,
                 tracker: ChainTracker) -> None:
        self.chain = chain
        self.spec = spec
        self.current = current
        self.turns_before = turns_before
        self.handle_link = handle_link  # (add: bool, execution_id) -> RunWatch or None
        self.tracker = tracker
        self.next_check = 1  # the link turn at which the budget is read next
        self.missed_turn = 0  # a turn of the current link reported while a job ran
        self.new_link_turn = 0  # the latest turn the new link of a switch under way has begun
        self.switch: Switch | None = None  # a switch under way (steps 2-4 left)
        self.thread: BackgroundLoop | None = None
        self.disabled = False
        #: Set when this process stops serving the listener (it closes, or lets the listener go at a fence): its
        #: job stops between steps, and a switch under way is left to the next process that serves it.
        self.stopping = threading.Event()
        self.agent_key = spec.key()  # compiled once, by the start, when it is one


class ContinuationDriver:
    """Continues the listeners this process serves. Thread-safe; owned by the runtime's ``WorkerSet``.

    Args:
        locally_busy: whether this process runs a tool of the given execution right now.
        drain_seconds: the bound of a switch's drain (see :mod:`conductor_agents._listener.switch`).
    """

    def __init__(self, api: ConductorApi, directory: ChainDirectory, *, worker_id: str,
                 locally_busy: Callable[[str], bool], drain_seconds: float = 60.0,
                 switch_wait: float = 300.0, mailbox_check_seconds: float = 300.0,
                 mailbox_check_max_seconds: float | None = None, clock: Clock = SYSTEM_CLOCK) -> None:
        self._api = api
        self._directory = directory
        self._worker_id = worker_id
        self._locally_busy = locally_busy
        self._drain_seconds = drain_seconds
        self._clock = clock
        self._sizes = SizeModel()
        self._lock = threading.Lock()
        self._by_run: dict[str, _Served] = {}
        self._by_link: dict[str, _Served] = {}
        self._by_mailbox: dict[str, _Served] = {}  # the id callers hold -> its listener (mailbox listeners)
        self._every_served: weakref.WeakSet[_Served] = weakref.WeakSet()  # close() stops each one's job
        self._closing = threading.Event()
        self._threads: list[BackgroundLoop] = []
        self.switches = 0  # committed switches (tests, stats)
        #: Retires each listener's older runs after its switches, on a thread of its own (:mod:`.retention`).
        self.retirer = Retirer(api, directory, clock=clock)
        self.turn_tool = self._make_turn_tool()
        #: Parks the join of each wait of the listeners here that wait on a HUMAN task (:mod:`.parking`).
        self.parker = JoinParker(api, worker_id=worker_id, stopping=self._closing, clock=clock)
        self.mailbox_checks = MailboxChecks(api, every=mailbox_check_seconds, most=mailbox_check_max_seconds,
                                            stopping=self._closing, clock=clock)
        self.forward_tool = make_forward_tool(api, directory, switch_wait=switch_wait, clock=clock,  # the mailboxes'
                                              stopping=self._closing, worker_id=worker_id,  # worker, on each domain
                                              batch_size_of=self._batch_size_of, parked_here=self.parker.sent_park,
                                              answered=self.parker.answered, forwarded=self.mailbox_checks.soon)

    # -- registration -----------------------------------------------------------------

    def serve(self, chain: Chain, spec: LinkSpec, current: Link, *, turns_before: int,
              handle_link: Callable[[bool, str], Any], pending_from: Link | None = None) -> ChainTracker:
        """Serve ``chain`` from its link ``current`` (both ``pending_from`` and ``current`` while the switch
        from ``pending_from`` is completed). ``handle_link(True, id)`` registers a link's execution with
        the workers (returning its watch, or None), ``handle_link(False, id)`` drops it."""
        with self._lock:
            served = self._by_run.get(str(chain.run_id))
            fresh = served is None
            if served is None:
                served = _Served(chain, spec, current, turns_before, handle_link, ChainTracker(chain, current))
                self._by_run[str(chain.run_id)] = served
                self._every_served.add(served)
                if self._closing.is_set():
                    served.stopping.set()
            served.current = current
            self._by_link[current.execution_id] = served
            if pending_from is not None:
                self._by_link[pending_from.execution_id] = served
        self._directory.advance(chain, current)
        if spec.human_wait:
            # Its first turn may have begun before this (the run's domain is polled from its start, and a mailbox
            # is opened in between): that turn's watch was missed, and the wait's join was never parked. A run
            # adopted while it waits has a wait to park too.
            self.parker.watch(current.execution_id, str(chain.run_id))
        if fresh and chain.mailbox:
            with self._lock:
                self._by_mailbox[chain.execution_id] = served
            self._attach_mailbox(served)  # its forward task runs here too; its end is looked at
            self.mailbox_checks.watch(chain.execution_id)  # a push nobody woke is taken within its checks
        self._attach(served, current)
        if pending_from is not None:
            self._attach(served, pending_from)
            served.switch = self._new_switch(served, pending_from)
            served.switch.started = True  # another process began it: its new run exists
            self._start_job(served, resume_switch=True)  # its commit asks for a sweep
        elif current.number > chain.first:
            self._retire(served, current.number)  # finish what a process that died left (idempotent)
        return served.tracker

    def _retire(self, served: _Served, head: int) -> None:
        if not self._closing.is_set():
            continuation = served.spec.continuation
            self.retirer.request(served.chain, head, continuation.keep_runs, keep_for=continuation.keep_for,
                                 with_sub_runs=served.spec.agent.has_sub_runs)

    def tracker(self, run_id: str | None) -> ChainTracker | None:
        with self._lock:
            served = self._by_run.get(str(run_id)) if run_id else None
        return served.tracker if served is not None else None

    def link_ended(self, execution_id: str) -> None:
        """A link this process serves ended (a watchdog sample or a handle saw it)."""
        self.parker.forget(execution_id)  # its next wait never comes
        with self._lock:
            served = self._by_link.pop(execution_id, None)
            if served is None:
                ended_mailbox = self._by_mailbox.get(execution_id)
                if ended_mailbox is not None:
                    ended_mailbox.tracker.link_removed(Link(-1, execution_id))
                    self._start_mailbox_check(ended_mailbox)
                return
            ended = served.current.execution_id == execution_id and served.switch is None
            if ended:
                self._by_run.pop(str(served.chain.run_id), None)  # the listener ended (or is let go)
        served.tracker.link_removed(Link(-1, execution_id))
        if ended and served.chain.mailbox:
            self._listener_ended(served, execution_id)

    def let_go(self, executions: Iterable[str]) -> None:
        """This process stops serving these runs (its presence lapsed: another process may serve them next).
        Their listeners are forgotten here, with nothing looked at or ended on the server: no mailbox check, no
        end of a mailbox, and a switch under way stops between steps (whoever serves the listener next finishes
        it). Serving a listener again (an adoption) starts afresh."""
        gone = set(executions)
        with self._lock:
            released = {id(s): s for e in gone for s in (self._by_link.get(e), self._by_mailbox.get(e)) if s}
            for served in released.values():
                served.stopping.set()
                self._by_run.pop(str(served.chain.run_id), None)
                self._by_mailbox.pop(served.chain.execution_id, None)
                self.mailbox_checks.forget(served.chain.execution_id)
            links = [(e, s) for e, s in self._by_link.items() if id(s) in released]
            for execution_id, _ in links:
                del self._by_link[execution_id]
        for execution_id in gone | {e for e, _ in links}:
            self.parker.forget(execution_id)
        for execution_id, served in links:
            served.tracker.link_removed(Link(-1, execution_id))
        for served in released.values():
            served.tracker.link_removed(Link(-1, served.chain.execution_id))
            log.debug("listener %s: let go of (another process may serve it next)", served.chain.execution_id)

    def _listener_ended(self, served: _Served, last: str) -> None:
        """The listener's last link is no longer served here: end its mailbox if that link has ended
        (not when this process only lets it go), and stop serving the mailbox."""
        with self._lock:
            self._by_mailbox.pop(served.chain.execution_id, None)
        self.mailbox_checks.forget(served.chain.execution_id)
        try:
            # The listener's status, not its last link's: a link another process continued (a switch of a process
            # that took the listener over meanwhile) is no end of the listener. current_status ends the mailbox of a
            # listener that has ended (whoever first sees it); before, a link continued elsewhere ended it here.
            if not is_running(self._api, last):
                current_status(self._api, self._directory, served.chain)
        except ConductorAgentsError as err:
            log.debug("listener %s: its last run's status is unreadable (%s)", served.chain.execution_id, err)
        served.tracker.link_removed(Link(-1, served.chain.execution_id))
        served.handle_link(False, served.chain.execution_id)

    def _start_mailbox_check(self, served: _Served) -> None:
        """The listener's mailbox ended (called under the lock): if someone else ended it (a client that is not this
        SDK, the UI), cancel the listener on a thread of its own, else it runs on, reachable by no sender."""
        if not self._closing.is_set():
            self._spawn(f"mailbox-ended-{served.chain.run_id}", lambda: self._mailbox_ended(served)).start()

    def _mailbox_ended(self, served: _Served) -> None:
        mailbox = served.chain.execution_id
        try:
            if retry_failed_mailbox(self._api, mailbox):
                self._attach_mailbox(served)  # served and watched again (its watch ended with the failure)
                return
            why = ended_from_outside(self._api, mailbox)
            if why is None:
                return
            with self._lock:
                served.disabled = True  # no switch from here on
            log.warning("listener %s: its mailbox (the id callers hold) ended: %s; the listener is cancelled",
                        mailbox, why)
            cancel_listener(self._api, self._directory, served.chain, f"its mailbox {mailbox} ended: {why}", None)
        except ConductorAgentsError as err:
            log.warning("listener %s: its mailbox ended, and it could not be retried (when it failed) or the "
                        "listener cancelled (when ended from outside) (%s)", mailbox, err)

    def served_links(self) -> list[str]:
        with self._lock:
            return list(self._by_link)

    def _attach_mailbox(self, served: _Served) -> None:
        """Serve and watch the listener's mailbox here; its stall (a forward nobody polls) is the listener's, told to
        the handle by the id callers hold, as a link's is."""
        watch = served.handle_link(True, served.chain.execution_id)
        served.tracker.link_added(Link(-1, served.chain.execution_id), watch)

    def _attach(self, served: _Served, link: Link) -> None:
        watch = served.handle_link(True, link.execution_id)
        served.tracker.link_added(link, watch)

    def _detach(self, served: _Served, link: Link) -> None:
        self.parker.forget(link.execution_id)
        with self._lock:
            self._by_link.pop(link.execution_id, None)
        served.tracker.link_removed(link)
        served.handle_link(False, link.execution_id)

    # -- turns ------------------------------------------------------------------------

    def _make_turn_tool(self) -> ToolDef:
        driver = self

        @tool(name=TURN_TASK)
        def conductor_agents_turn(ctx: ToolContext, callback_position: str = "", agent_name: str = "",
                                  llm_result: Any | None = None, tool_calls: Any | None = None) -> dict[str, Any]:
            """Tells the serving process that a model turn of a continued listener begins (conductor-agents)."""
            match = _ITERATION.search(ctx.reference_name or "")
            turn = int(match.group(1)) if match else 0
            driver.on_turn(ctx.execution_id, turn)
            driver.stop_if_read(ctx.execution_id, turn, tool_calls)
            return {}

        return conductor_agents_turn

    def stop_if_read(self, execution_id: str, turn: int, tool_calls: Any) -> None:
        """Before model turn ``turn`` of link ``execution_id``: set its stop flag when that turn reads the stop
        message (:func:`.stopping.stop_if_read`; at a later link's first turn, among the messages its switch carried
        over). A failure is logged: the model still reads the stop, and the next turn looks again."""
        with self._lock:
            served = self._by_link.get(execution_id)
        carried: tuple[Any, ...] = ()
        try:
            if served is not None and turn == 1:
                link = next((link for link in (served.current, served.switch.new if served.switch else None)
                             if link is not None and link.execution_id == execution_id), None)
                if link is not None and link.number > 0:
                    record, _ = read_commit(self._api, link)
                    carried = record.pending if record is not None else ()
            stop_if_read(self._api, execution_id, tool_calls=tool_calls, carried=carried, pause=self._closing.wait)
        except ConductorAgentsError as err:
            log.warning("run %s: whether its model turn %d reads a stop message is not known (%s); the model reads "
                        "it anyway", execution_id, turn, err)

    def _batch_size_of(self, run_id: str) -> int:
        """How many messages the wait of the listener on ``run_id`` takes at once (1 when it is not served here)."""
        with self._lock:
            served = self._by_run.get(run_id)
        tools = served.spec.agent.tools if served is not None else ()
        return max((int((t.config or {}).get("batchSize") or 1) for t in tools
                    if t.tool_type == PULL_WORKFLOW_MESSAGES), default=1)

    def on_turn(self, execution_id: str, turn: int) -> None:
        """Link ``execution_id`` begins model turn ``turn`` (its own count, from 1)."""
        with self._lock:
            served = self._by_link.get(execution_id)
            if served is None or self._closing.is_set():
                return
            if served.spec.human_wait:
                self.parker.watch(execution_id, str(served.chain.run_id))  # its next wait follows this turn
            if served.disabled:
                return
            if served.current.execution_id != execution_id:
                if served.switch is not None and served.switch.new.execution_id == execution_id:
                    # The new link works while the old one drains: its budget is read once the switch
                    # is done (dropping these turns let a new link grow far past its budget).
                    served.new_link_turn = max(served.new_link_turn, turn)
                return  # else: the old link of a switch under way
            if served.switch is None and turn < served.next_check:
                return
            if served.thread is not None and served.thread.is_alive:
                served.missed_turn = turn  # the running job looks at it when it is done
                return
        self._start_job(served, turn=turn)

    def _start_job(self, served: _Served, *, turn: int = 0, resume_switch: bool = False) -> None:
        with self._lock:
            busy = served.thread is not None and served.thread.is_alive
            if self._closing.is_set() or served.stopping.is_set() or busy:
                return
            served.thread = thread = self._spawn(f"continue-{served.chain.run_id}", lambda: self._job(served, turn))
        thread.start()

    def _spawn(self, name: str, body: Callable[[], None]) -> BackgroundLoop:
        """A job's thread (called under the lock; the caller starts it), joined by :meth:`close`. Not a daemon: a
        job's steps are each short and bounded, and close() joins it; an interpreter exit without close() leaves it
        for the next process (a switch resumes). Every job stops on ``_closing``."""
        thread = BackgroundLoop(name, body, daemon=False, stop=self._closing)
        self._threads = [t for t in self._threads if t.is_alive] + [thread]
        return thread

    def _job(self, served: _Served, turn: int) -> None:
        retry = _RETRY_FIRST
        while True:
            try:
                if served.switch is not None:
                    self._finish(served)
                elif self._due(served, turn):
                    self._begin(served)
            except ConductorAgentsError as err:
                if served.switch is None:
                    log.warning("listener %s: could not decide on a continuation (%s); it is looked at again at "
                                "the next turn", served.chain.execution_id, err)
                else:  # a switch under way waits for no turn (its new run takes none): try again soon
                    log.warning("listener %s: a step of its switch to run %d failed (%s); trying again in %.0fs",
                                served.chain.execution_id, served.switch.new.number + 1, err, retry)
                    if not served.stopping.wait(retry):
                        retry = min(_RETRY_MAX, retry * 2)
                        continue
                    return
            except Exception:
                log.exception("listener %s: continuation failed", served.chain.execution_id)
            with self._lock:  # a turn reported meanwhile (of the current link) is looked at now
                turn, served.missed_turn = served.missed_turn, 0
                if not turn or served.stopping.is_set() or served.disabled or turn < served.next_check:
                    return

    # -- deciding ---------------------------------------------------------------------

    def _due(self, served: _Served, turn: int) -> bool:
        """The switch rule (:func:`.switch_rule.switch_verdict`) at ``turn``, with the reads it needs."""
        def verdict(turns_left: float | None = None) -> SwitchVerdict:
            return switch_verdict(served.spec.continuation, turn=turn, turns_before=served.turns_before,
                                  agent_max_turns=served.spec.agent.max_turns, disabled=served.disabled,
                                  turns_left=turns_left)

        decided = verdict()
        if decided.needs_size:
            size = self._read_size(served, turn)
            decided = verdict(self._sizes.turns_until(served.agent_key, size, served.spec.continuation.max_bytes))
            if decided.due:
                log.debug("listener %s: link %d at turn %d is about %d bytes: continuing it",
                          served.chain.execution_id, served.current.number, turn,
                          self._sizes.estimate(served.agent_key, size))
        if decided.next_check is not None:
            with self._lock:
                served.next_check = decided.next_check
        return decided.due

    def _read_size(self, served: _Served, turn: int) -> RunSize:
        """The current link's size from two small reads, with the agent's one whole-run measurement when the
        size model asks for it."""
        link = served.current.execution_id
        tasks = self._api.workflow_tasks(link, start=0, count=1).total
        variables = self._api.workflow_status(link, include_variables=True).get("variables") or {}
        size = RunSize(tasks=tasks, turns=turn, digest=len(json.dumps(variables, separators=(",", ":"))))
        if self._sizes.needs_measurement(served.agent_key, size):
            try:
                whole = self._api.get_workflow(link, include_tasks=True)
                actual = len(json.dumps(whole, separators=(",", ":"), default=str))
            except BaseException:
                self._sizes.measurement_failed(served.agent_key)  # another run of the agent takes it
                raise
            per_task = self._sizes.measured(served.agent_key, size, actual)
            log.debug("listener %s: a run of %s stores %.0f bytes per task", served.chain.execution_id,
                      served.spec.agent.name, per_task or 0)
        return size

    # -- switching --------------------------------------------------------------------

    def _new_switch(self, served: _Served, old: Link) -> Switch:
        return Switch(self._api, served.chain, old, served.spec, worker_id=self._worker_id,
                      locally_idle=lambda execution_id: not self._locally_busy(execution_id),
                      stopping=served.stopping, drain_seconds=self._drain_seconds, clock=self._clock)

    def _begin(self, served: _Served) -> None:
        old = served.current
        switch = self._new_switch(served, old)
        with self._lock:
            served.switch = switch
            self._by_link[switch.new.execution_id] = served
        self._attach(served, switch.new)  # served before it exists: its first task is never missed
        self._start(served, switch)
        self._finish(served)

    def _start(self, served: _Served, switch: Switch) -> None:
        """Start the switch's new run. A failed start whose run may exist all the same keeps the switch (the job tries
        again: the start is create-once); one whose run does not exist drops it until the old run's next turn."""
        try:
            switch.start_new(turns_before=served.turns_before + self._turns_of(switch.old))
        except ConductorAgentsError as err:
            if "derives idempotent run ids differently" in str(err):
                served.disabled = True
                log.error("%s", err)
            elif self._may_exist(served.chain, switch.new):  # its answer lost: senders may find it, so it must go on
                raise
            with self._lock:
                served.switch = None
                served.new_link_turn = 0
            self._detach(served, switch.new)
            raise

    def _may_exist(self, chain: Chain, link: Link) -> bool:
        """Whether a link whose start failed may exist all the same (its answer was lost, or the server cannot say):
        once it exists, the SDK's senders and the forward find it, and only its switch makes it take turns."""
        try:
            return self._directory.exists(chain, link.number)
        except ConductorAgentsError:
            return True  # the server cannot say

    def _turns_of(self, link: Link) -> int:
        # From the first task in progress on (offsets count from 0): the loop task carries the
        # iteration as well, and between two of its tasks it is the only one in progress.
        page = self._api.workflow_tasks(link.execution_id, statuses=("IN_PROGRESS",), start=0, count=5)
        return max((int(t.get("iteration") or 0) for t in page.tasks), default=0)

    def _finish(self, served: _Served) -> None:
        switch = served.switch
        assert switch is not None
        if not switch.started:  # a start whose outcome was not known (see _start): sent again, create-once
            self._start(served, switch)
        self._directory.advance(served.chain, switch.new)
        outcome = switch.finish()
        if outcome is None:
            return  # closing: the next process that serves the listener completes it
        old = switch.old
        with self._lock:
            served.switch = None
        if outcome.record is None:  # abandoned: the listener ended with its old link
            self._detach(served, switch.new)
            self._detach(served, old)
            with self._lock:
                self._by_run.pop(str(served.chain.run_id), None)
            if served.chain.mailbox:
                self._listener_ended(served, old.execution_id)
            if old.number > served.chain.first:
                self._retire(served, old.number)
            return
        with self._lock:
            served.current = switch.new
            served.turns_before = outcome.record.turns
            served.next_check = 1
            served.missed_turn, served.new_link_turn = served.new_link_turn, 0  # looked at by the job next
            self.switches += 1
        served.tracker.moved_to(switch.new)
        self._directory.advance(served.chain, switch.new)
        self._detach(served, old)
        tracing.run_ended(old.execution_id, lambda: self._api.get_workflow(old.execution_id, include_tasks=True),
                          continued=is_continued,  # its span ends now, not when the watchdog next looks
                          read_run=lambda run_id: self._api.get_workflow(run_id, include_tasks=True))
        self._retire(served, switch.new.number)  # at rest: the head hint, then the older runs go

    # -- shutdown ---------------------------------------------------------------------

    def close(self, timeout: float = 15.0) -> None:
        """Stop between switch steps and join the switch threads (bounded). Idempotent."""
        self._closing.set()
        with self._lock:
            threads = list(self._threads)
            for served in list(self._every_served):
                served.stopping.set()
        deadline = self._clock.monotonic() + timeout
        for thread in threads:
            thread.join(max(0.0, deadline - self._clock.monotonic()))
        self.parker.close(max(0.0, deadline - self._clock.monotonic()))
        self.mailbox_checks.close(max(0.0, deadline - self._clock.monotonic()))
        self.retirer.close(max(0.0, deadline - self._clock.monotonic()))
