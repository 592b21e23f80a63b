""":class:`AgentHandle`: one run on the server, and a bounded ``wait()`` for its result."""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING, Any

import attrs

from ._answers.output_type import Rejection, typed_result
from ._common.checks import A_TIMEOUT
from ._common.clock import Clock
from ._common.transient import TransientErrors
from ._listener.by_id import RunsById, check_signal
from ._listener.chained_events import ChainedEvents
from ._listener.control import cancel_listener, pause_listener, unpause_listener
from ._listener.delivery import MessageDelivery, wait_for_delivery
from ._listener.directory import Chain, ChainDirectory, Link
from ._listener.following import current_status, ended_result, listener_totals, run_identity, with_mailbox_pause
from ._listener.naming import held_stall, rename
from ._listener.stopping import stop_run
from ._liveness.model_calls import FirstModelTurn, ended_model_failure, unavailable_model_cancel_reason
from ._people.pending import HumanAnswer, PendingRequest
from ._serving.served import unserved_words, with_serving
from ._wire.api import ConductorApi
from ._wire.payload import message_payload
from ._wire.transport import HttpError
from .errors import (
    ConductorAgentsError,
    ModelUnavailableError,
    OutputValidationError,
    ServerUnavailableError,
    WaitTimeoutError,
    WorkerStallError,
)
from .result import STOP_SIGNAL, AgentResult, AgentStatus, ListenerTotals, RunStatus
from .stats import RunStats

if TYPE_CHECKING:
    from ._liveness.watchdog import RunWatch
    from .agent import Agent
    from .settings import AgentSettings

__all__ = ["AgentHandle"]

log = logging.getLogger("conductor_agents.handle")

class AgentHandle:
    """A run of an agent on the server.

    Returned by :meth:`AgentRuntime.start`, ``resume``, ``attach`` and ``get_handle`` (no request: it
    learns what it needs on first use). The verbs on one run live here; the runtime's verbs by execution
    id call them. Thread-safe: any thread may call ``status``, ``send_message``, ``stop`` or ``cancel``
    while another waits. The handle does not own the run: dropping it neither stops nor cancels it.

    A long-lived listener is continued as fresh runs (``docs/concepts.md``); the handle keeps
    :attr:`execution_id`, the id it was made with, and every call reaches the listener's current
    run (:attr:`current_execution_id`; :attr:`runs` counts them).
    """

    def __init__(self, *, api: ConductorApi, execution_id: str, agent_name: str | None, run_id: str | None = None,
                 settings: AgentSettings, clock: Clock, agent: Agent | None = None, liveness: RunWatch | None = None,
                 on_terminal: Any | None = None, on_stop: Any | None = None, workers_attached: bool = False,
                 observer: Any | None = None,  # the runtime's TaskObserver: local events and stats
                 directory: ChainDirectory | None = None, chain: Chain | None = None) -> None:
        self._api = api
        self._directory = directory if directory is not None else ChainDirectory(api)
        #: Messages and answers: the same code as the runtime's verbs by execution id.
        self._by_id = RunsById(api, self._directory, settings, clock)
        self._chain_known = chain
        self._observer = observer
        self.execution_id = execution_id
        #: The agent's name and the run's domain; None for a handle that has not learnt them yet.
        self._identity: tuple[str, str | None] | None = None if agent_name is None else (agent_name, run_id)
        self.agent = agent
        self._settings = settings
        self._clock = clock
        self._liveness = liveness
        self._on_terminal = on_terminal
        self._on_stop = on_stop
        self.workers_attached = workers_attached
        self._last_status: RunStatus | None = None
        #: The run the listener ended in, once a status read found it ended: a switch that the listener's end
        #: abandoned leaves a newer (terminated) run behind, which is not where it ended.
        self._ended_in: Link | None = None
        self._result: AgentResult | None = None
        self._rejection: Rejection | None = None  # why a FAILED run's answer was refused (output_type)
        self._model_error: ConductorAgentsError | None = None  # it ended as the server could not call its model
        self._wake = threading.Event()
        self._lock = threading.Lock()
        if liveness is not None:
            liveness.add_listener(self._stalled)
        self._pause = lambda seconds: threading.Event().wait(seconds)  # between delivery samples
        #: Until the run's first model turn completes: can the server call the model at all?
        self._first_turn = FirstModelTurn(api)

    # -- which run ----------------------------------------------------------------------

    @property
    def agent_name(self) -> str:
        """The agent's name. A handle of :meth:`AgentRuntime.get_handle` learns it (and :attr:`run_id`) on
        first read: one request, once."""
        return self._learnt()[0]

    @property
    def run_id(self) -> str | None:
        """The task domain the run is pinned to (a stateful run's), or None. Learnt as :attr:`agent_name`."""
        return self._learnt()[1]

    def _learnt(self) -> tuple[str, str | None]:
        identity = self._identity
        if identity is None:
            workflow = self._api.get_workflow(self.execution_id)
            if self._chain_known is None:
                self._chain_known = self._directory.chain(self.execution_id, record=workflow)
            identity = self._identity = run_identity(workflow, self._chain_known)
        return identity

    def _chain(self) -> Chain:
        if self._chain_known is None:
            self._chain_known = self._directory.chain(self.execution_id)
        return self._chain_known

    def _link(self) -> Link:
        """The newest run of the listener this process knows of, or the one it ended in (no request)."""
        if self._ended_in is not None:
            return self._ended_in
        chain = self._chain_known
        if chain is None:
            return Link(0, self.execution_id)
        link = self._directory.newest(chain)
        current = getattr(self._liveness, "current", None)
        return current if isinstance(current, Link) and current.number > link.number else link

    @property
    def current_execution_id(self) -> str:
        """The execution id of the listener's current run (the same as :attr:`execution_id` until
        it was first continued). As last learned; :meth:`status` and :meth:`wait` refresh it."""
        return self._link().execution_id

    @property
    def runs(self) -> int:
        """How many runs the listener has had so far (1 until it was first continued)."""
        chain = self._chain_known
        return 1 if chain is None else self._link().number - chain.first + 1

    def __repr__(self) -> str:  # no request: what was not read yet (the status, before status()/wait()) is left out
        name, run_id = self._identity or (None, None)
        last = self._last_status
        parts = [f"execution_id={self.execution_id!r}", f"agent={name!r}" if name else "",
                 f"run_id={run_id!r}" if run_id else "", f"runs={self.runs}" if self.runs > 1 else "",
                 f"status={last.value}" if last else "", "workers=local" if self.workers_attached else "workers=none"]
        return f"AgentHandle({', '.join(part for part in parts if part)})"

    def _repr_html_(self) -> str:  # a notebook shows the state without blocking the kernel
        status = self._last_status.value if self._last_status else "not read yet"
        name, run_id = self._identity or ("not read yet", None)
        run = f"<br>run id <code>{run_id}</code>" if run_id else ""
        return (f"<b>{name}</b> &mdash; {status}<br>execution <code>{self.execution_id}</code>"
                f"{run}")

    # -- observing --------------------------------------------------------------------

    def status(self) -> AgentStatus:
        """The run's status (one request; a running run's a few more: ``waiting_for``, ``served``, concepts.md).

        Raises:
            ExecutionNotFoundError: the server does not know the execution.
            ServerUnavailableError, ServerError: the request failed.
        """
        link, status = current_status(self._api, self._directory, chain := self._chain())
        status = self._as_listener(with_mailbox_pause(self._api, chain, status), link)
        self._last_status = status.status
        if status.is_terminal:
            self._terminal()
        return with_serving(self._api, self._settings, status, link.execution_id, clock=self._clock,
                            also=(self.execution_id,) if self._chain().mailbox else ())

    def _as_listener(self, status: AgentStatus, link: Link) -> AgentStatus:
        self._ended_in = link if status.is_terminal else None
        return attrs.evolve(status, execution_id=self.execution_id, current_execution_id=link.execution_id,
                            runs=link.number - self._chain().first + 1)

    def totals(self) -> ListenerTotals:
        """What the listener has done over all its runs: runs, model turns, messages, tokens, and a
        compact history of the runs before the current one (a few small requests). Readable from any
        process, also after retention removed the older runs (``Continuation.keep_runs``).

        Raises:
            ExecutionNotFoundError: the server does not know the execution.
            ServerUnavailableError, ServerError: a request failed.
        """
        return listener_totals(self._api, self._directory, self._chain())

    def wait(self, timeout: float | None = None) -> AgentResult:
        """Block until the run ends and return its result; never longer than ``timeout``.

        Polls the status every ``status_poll_interval_seconds`` (0.5 s). Up to ``max_transient_errors`` (3)
        consecutive transient errors are tolerated. For a stateful run started or resumed by this runtime, the
        watchdog's stall flag (:attr:`stall`) is checked before each poll, and a stall wakes the wait at once.
        Safe to call again after it returned or raised.

        ``timeout`` is in seconds, default ``wait_timeout_seconds`` (600). ``math.inf`` waits with no
        deadline: the way to serve a long-lived listener from Python (its tools run in this process while
        ``wait()`` waits) until it is stopped or ends. ``0`` is refused; :meth:`status` looks once.

        With an agent ``output_type``, a COMPLETED run's ``output`` is an instance of it.

        Raises:
            ValueError: ``timeout`` is not a number of seconds > 0 (``math.inf`` included).
            WaitTimeoutError: the deadline passed (default 600 s); the run goes on (it says if no process serves it).
            WorkerStallError: a task of this run's domain is not being polled.
            ModelUnavailableError: the server cannot call the model (no route, a refused key, no such model): at
                the first model turn's first failure (the run is cancelled), and from any later ``wait()``.
            OutputValidationError: the run COMPLETED but its answer does not fit the agent's
                ``output_type``, or it FAILED because no answer did (``err.raw_output``,
                ``err.problems``, ``err.result`` keep it); raised again by a later ``wait()``.
            ExecutionNotFoundError: the server does not know the execution (at once).
            ServerUnavailableError, ServerError: too many consecutive transient errors,
                or a non-transient one.
        """
        if self._result is not None:
            return self._typed(self._result)
        limit = self._settings.wait_timeout_seconds if timeout is None else float(A_TIMEOUT.check("timeout", timeout))
        deadline = self._clock.monotonic() + limit
        return self._typed(self._wait_loop(deadline, limit))

    def _typed(self, result: AgentResult) -> AgentResult:
        # The agent's output_type (if any) checked on the client: the server does not check it.
        if self._model_error is not None:  # every wait() that reads the end says why it ended
            raise self._model_error
        return typed_result(result, self.agent.output_spec if self.agent is not None else None, self._rejection)

    def _wait_loop(self, deadline: float, limit: float) -> AgentResult:
        budget = TransientErrors(self._settings.max_transient_errors)
        while True:
            self._raise_if_stalled()
            remaining = deadline - self._clock.monotonic()
            try:
                link, status = current_status(
                    self._api, self._directory, self._chain(),
                    timeout=max(1.0, min(self._settings.http_timeout_seconds, remaining)))
                status = self._as_listener(status, link)
                budget.ok()
            except (ServerUnavailableError, HttpError) as err:
                if not budget.tolerate(err):
                    raise
                log.info("status of %s failed (%s); %d consecutive transient errors",
                         self.execution_id, err, budget.count)
                status = None
            if status is not None:
                self._last_status = status.status
                if status.is_terminal:
                    return self._finish(status, link)
                self._raise_if_model_unavailable(link, deadline)
            remaining = deadline - self._clock.monotonic()
            if remaining <= 0:  # a run no process serves says so: it would wait for ever
                unserved = unserved_words(self._api, self._settings, self._link().execution_id, self.execution_id,
                                          clock=self._clock)
                raise WaitTimeoutError(
                    f"run {self.execution_id} is still {self._last_status.value if self._last_status else 'going'} "
                    f"after {limit:g}s{unserved}; it goes on on the server and is not cancelled "
                    "(call wait() again, stop() or cancel())", execution_id=self.execution_id, timeout=limit)
            self._wake.wait(min(self._settings.status_poll_interval_seconds, remaining))
            self._wake.clear()

    def _raise_if_model_unavailable(self, link: Link, deadline: float) -> None:
        """Raise ModelUnavailableError (and cancel the run) when its first model turn cannot be made."""
        if self._first_turn.settled:
            return
        if link.number != self._chain().first:
            self._first_turn.settle()  # a listener's later run: its model answered before
            return
        try:
            remaining = deadline - self._clock.monotonic()
            problem = self._first_turn.problem(
                link.execution_id, timeout=max(1.0, min(self._settings.http_timeout_seconds, remaining)))
        except ConductorAgentsError as err:  # a read that failed: the next poll asks again
            log.info("could not read the model turns of %s: %s", link.execution_id, err)
            return
        if problem is None:
            return
        try:
            self.cancel(unavailable_model_cancel_reason(problem.detail))
        except ConductorAgentsError as err:
            log.warning("could not cancel %s after its model failed: %s", self.execution_id, err)
        raise rename(problem, self.execution_id)

    def _raise_if_stalled(self) -> None:
        stall = self.stall
        if stall is None:
            return
        raise WorkerStallError(
            str(stall), execution_id=stall.execution_id, task_reference_name=stall.task_reference_name,
            domain=stall.domain, waited_seconds=stall.waited_seconds,
        )

    def _finish(self, status: AgentStatus, link: Link) -> AgentResult:
        result, self._rejection = ended_result(self._api, status, link, execution_id=self.execution_id,
                                               agent=self.agent, totals=self.totals, directory=self._directory,
                                               chain=self._chain())
        self._model_error = None if result.ok else ended_model_failure(
            self._api, link.execution_id, result.error, named=self.execution_id)
        self._result = result
        self._terminal()
        return result

    def _terminal(self) -> None:
        if self._on_terminal is None:
            return
        ids = {self.execution_id, self._link().execution_id}
        if self._chain_known is not None:  # a switch the end abandoned: its run is let go too
            ids.add(self._directory.newest(self._chain_known).execution_id)
        for execution_id in ids:
            self._on_terminal(execution_id)

    # -- liveness ---------------------------------------------------------------------

    @property
    def stall(self) -> WorkerStallError | None:
        """The stall the runtime's watchdog found on this run, or None.

        Set (without anyone waiting) when a task routed to this run's domain has waited
        unpolled longer than ``liveness_stall_seconds``; cleared when a later sample finds
        it polled, or the run ended. Always None for :meth:`AgentRuntime.attach` handles and
        when liveness is disabled. :meth:`wait` raises a copy of it. A continued listener's names the
        handle's :attr:`execution_id`, and the run it is in after it.
        """
        stall = self._liveness.stall if self._liveness is not None else None
        return None if stall is None else held_stall(stall, self.execution_id)

    def _stalled(self, error: WorkerStallError) -> None:
        self._wake.set()  # a wait() in progress raises now rather than after its next poll

    # -- watching ---------------------------------------------------------------------

    def events(self, timeout: float | None = None) -> ChainedEvents:
        """An iterator of the run's events, in order, ending after its last one (``done``). A continued
        listener's: every run the server still holds, oldest first, from any process (``retired``: runs removed).

        Server events come from the server's event stream (reconnecting with
        ``Last-Event-ID`` when the connection drops; nothing is lost or repeated), or from
        polling the run's task list when the stream is unavailable. Tool bodies run by this
        process add ``tool_started`` / ``tool_finished`` events. A run that already ended
        gives all its events at once. Close the iterator (``close()`` or ``with``) to close
        the connection early. See ``docs/events.md``.

        Raises:
            ValueError: ``timeout`` is not positive.
            RuntimeClosedError: the runtime is closed.
            WaitTimeoutError: (while iterating) ``timeout`` seconds passed, default
                ``wait_timeout_seconds`` (600 s); the run goes on.
        """
        limit = self._settings.wait_timeout_seconds if timeout is None else float(timeout)
        return ChainedEvents(
            self._api, self._directory, self._chain(), timeout=limit, observer=self._observer, clock=self._clock,
            poll_interval=self._settings.status_poll_interval_seconds,
            max_transient_errors=self._settings.max_transient_errors,
        )

    def stats(self) -> RunStats:
        """This process's tool counts and timings for the run (no request; zeros if it ran nothing here)."""
        domain = self._identity[1] if self._identity is not None else None  # no request: as far as known
        if self._observer is None:
            return RunStats(execution_id=self.execution_id, domain=domain)
        stats: RunStats = self._observer.run_stats(self.execution_id, domain=domain)
        return stats

    # -- acting -----------------------------------------------------------------------

    def send_message(self, payload: Any) -> str:
        """Push a message into the run's queue (a listener's current run); return the message id.

        A mapping is sent as is, a string as ``{"message": s}``, any other JSON value as ``{"message": value}``.
        To a listener's mailbox: returns once it is sure to take the message now (at once as a rule, a second after a
        round that just ended, up to 15 s on a loaded or failing server; past that the next look takes it).

        Raises:
            PayloadError: (a TypeError) not JSON-serialisable; nothing is sent. ExecutionNotFoundError: unknown
                execution (404). MessageQueueDisabledError: the execution exists but the server's queue is off.
            ExecutionNotRunningError: the execution has ended (409). MessageQueueFullError: its queue is full (429).
        """
        return self._by_id.send_message(self.execution_id, message_payload(payload), pause=self._pause)

    def signal(self, text: str) -> None:
        """Set the run's standing signal: the server puts ``text`` before every later model turn of the
        agent (``[SIGNALS]...[/SIGNALS]``), also in a listener's later runs, until the next ``signal()``
        replaces it; ``signal("")`` clears it (see ``docs/steering.md``).

        Raises:
            ExecutionNotRunningError: the run has ended. ExecutionNotFoundError: unknown execution.
        """
        self._by_id.signal(self.execution_id, check_signal(text), chain=self._chain(), pause=self._pause)

    def wait_delivered(self, message_id: str, timeout: float | None = None) -> MessageDelivery:
        """Block until the run has pulled message ``message_id``; never longer than ``timeout``.

        Returns where it went (the wait-for-message task that pulled it). Samples the run's
        task list every ``status_poll_interval_seconds`` (0.5 s).

        Raises:
            MessageLostError: the message can no longer arrive: the run ended without it
                (``reason == MessageLostError.RUN_ENDED``), or the run waited on an empty queue
                after it was accepted (``NOT_IN_QUEUE``: the server lost it, e.g. a SQLite
                server restarted), or a wait took it in behind the stop message (``NOT_ACTED_ON``).
                Send it again if it matters.
            WaitTimeoutError: the deadline passed (default 600 s) with nothing known; the
                message may still arrive.
            ValueError: ``message_id`` is blank or ``timeout`` is not positive.
            ExecutionNotFoundError, ServerUnavailableError, ServerError: as :meth:`wait`.
        """
        limit = self._settings.wait_timeout_seconds if timeout is None else float(A_TIMEOUT.check("timeout", timeout))
        if not isinstance(message_id, str) or not message_id.strip():
            raise ValueError(f"message_id must be a message id returned by send_message, got {message_id!r}")
        return wait_for_delivery(
            self._api, self._directory, self._chain(), message_id.strip(), timeout=limit,
            interval=self._settings.status_poll_interval_seconds,
            max_transient_errors=self._settings.max_transient_errors, clock=self._clock, pause=self._pause,
        )

    def stop(self) -> None:
        """Ask the run to finish gracefully (COMPLETED), after it acted on the messages it accepted before; returns
        at once (a few requests).

        A listener takes the stop in the order of its messages (``docs/concepts.md``, *Stop and cancel*): one that
        waits with nothing unread ends at once, no model turn after it; one with messages not read yet gets the stop
        behind them (``{"_signal": "stop"}``, from any process, across switches), and its serving process ends it
        after the model turn that reads them. Any other run ends after its current turn (a blocked wait for
        messages is woken by the stop message). Stopping an ended run does nothing; a paused run ends once unpaused.

        Raises:
            ExecutionNotFoundError: the server does not know the execution.
        """
        takes = None if self.agent is None else self.agent.needs_message_queue
        stop_run(self._api, self._directory, self._chain(), takes_messages=takes,
                 send_stop=lambda: self.send_message(STOP_SIGNAL), on_stop=self._on_stop)

    def cancel(self, reason: str = "cancelled by the caller") -> None:
        """Terminate the run at once (TERMINATED). Its tools running in this process see
        ``ctx.cancelled`` at once (elsewhere within seconds); bodies are never interrupted.

        Raises:
            ExecutionNotFoundError: the server does not know the execution.
        """
        cancel_listener(self._api, self._directory, self._chain(), reason, self._on_terminal)
        self._terminal()
        self._wake.set()

    def pause(self) -> None:
        """Pause the run: it takes no model turn until :meth:`unpause` (tool calls already handed out
        finish). Messages are refused while it is paused (``RunPausedError``; a push to its id with the
        server's REST call answers 409), and the liveness monitor does not call it stalled. Idempotent.
        A model call begun just before the pause ends first (a minute at most); then none comes until unpause.

        Raises:
            ExecutionNotRunningError: the run has ended.
            ExecutionNotFoundError: the server does not know the execution.
        """
        pause_listener(self._api, self._directory, self._chain(), clock=self._clock, pause=self._pause)

    def unpause(self) -> None:
        """Let a paused run go on where it stopped (a run that is not paused is left as it is).

        Raises:
            ExecutionNotRunningError: the run has ended.
            ExecutionNotFoundError: the server does not know the execution.
        """
        unpause_listener(self._api, self._directory, self._chain())
        self._wake.set()

    # -- people in the loop -----------------------------------------------------------

    def pending(self) -> tuple[PendingRequest, ...]:
        """What the run waits on from a person now, oldest first: tool calls to approve, questions
        (one request; empty when it waits for nobody or has ended).

        Raises:
            ExecutionNotFoundError, ServerUnavailableError, ServerError: the request failed.
        """
        return self._by_id.pending(self.execution_id, chain=self._chain())

    def approve(self, *, reason: str | None = None, by: str | None = None,
                request: PendingRequest | str | None = None, timeout: float = 30.0) -> HumanAnswer:
        """Approve the tool calls the run waits on; they run in the process serving the run. Also
        approves an answer a guardrail (``on_fail="human"``) holds for review: it leaves as it is.

        ``reason`` is shown to the model with the approval, ``by`` names who approved (both
        optional), ``request`` picks one of :meth:`pending` (default: the oldest approval).
        Returns once the run has taken the answer (at most ``timeout`` seconds).

        Raises:
            NothingPendingError: the run waits for no approval (``err.waiting_for`` says what else).
            AnswerConflictError: another answer was taken instead (``err.winner``).
            ExecutionNotRunningError: the run has ended.
            WaitTimeoutError: the run did not take an answer in time (it may still).
        """
        return self._by_id.approve(self.execution_id, chain=self._chain(), reason=reason, by=by, request=request,
                                   timeout=timeout)

    def reject(self, reason: str, *, by: str | None = None,
               request: PendingRequest | str | None = None, timeout: float = 30.0) -> HumanAnswer:
        """Reject the tool calls the run waits on: none runs, the model sees the rejection and
        ``reason``, and the run goes on. Rejecting an answer a guardrail holds for review ends the
        run FAILED with ``reason`` (the server's only outcome). Otherwise as :meth:`approve`."""
        return self._by_id.reject(self.execution_id, reason, chain=self._chain(), by=by, request=request,
                                  timeout=timeout)

    def respond(self, answer: Any, *, by: str | None = None,
                request: PendingRequest | str | None = None, timeout: float = 30.0) -> HumanAnswer:
        """Answer the question a :class:`~conductor_agents.HumanTool` call asks; the model gets
        ``{"answer": answer}``. ``answer`` is any JSON value. A ``manual`` team's pick of its next
        sub-agent (a request with ``options``) takes a sub-agent's name (or the Agent). To an answer a
        guardrail holds for review (``kind == "review"``), ``answer`` is the corrected answer (a
        non-empty str): it becomes the run's output. Otherwise as :meth:`approve`.

        Raises:
            PayloadError: ``answer`` is not JSON.
            InvalidAnswerError: the request has ``options`` and ``answer`` is none of them.
            ValueError: a review's corrected answer is not a non-empty str. Otherwise as :meth:`approve`.
        """
        return self._by_id.respond(self.execution_id, answer, chain=self._chain(), by=by, request=request,
                                   timeout=timeout)

    # -- context manager --------------------------------------------------------------

    def __enter__(self) -> AgentHandle:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        """Leaving the block ends a run that is still going: cancelled when the block
        raised, otherwise stopped gracefully and waited for (bounded by the shutdown
        grace period, then cancelled)."""
        if self._result is not None:
            return
        try:
            if self.status().is_terminal:
                return
            if exc_type is not None:
                self.cancel(reason=f"the caller's block raised {exc_type.__name__}")
                return
            self.stop()
            try:
                self.wait(timeout=self._settings.shutdown_grace_seconds)
            except (WaitTimeoutError, WorkerStallError):
                self.cancel(reason="did not stop within the grace period")
            except (OutputValidationError, ModelUnavailableError):
                pass  # the run ended; its answer does not fit output_type, or its model (wait() says so again)
        except ConductorAgentsError as err:
            log.warning("could not end run %s on exit: %s", self.execution_id, err)
