""":class:`AgentRuntime`: starts runs on the server and serves their tools from this process."""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Mapping
from typing import Any

from ._common.clock import SYSTEM_CLOCK, Clock
from ._common.fork import rebuild_after_fork
from ._common.parts import close_in_order
from ._listener.by_id import pending_of_agent
from ._listener.delivery import MessageDelivery
from ._listener.directory import ChainDirectory
from ._listener.running import RunningRun, agent_name_of, running_runs
from ._people.pending import HumanAnswer, PendingRequest
from ._runs.process import ProcessRuns
from ._runs.start import check_start
from ._scheduling import Schedules
from ._serving.at_exit import close_at_exit
from ._serving.process import ServedAgents, check_servable
from ._serving.served import row_with_serving
from ._teams.model_settings import ModelSettings
from ._wire.api import ConductorApi
from ._wire.transport import Transport
from ._worker.observer import TaskObserver
from .agent import Agent, check_agent
from .errors import AgentTypeError, RuntimeClosedError, WorkerStallError
from .handle import AgentHandle
from .result import AgentResult
from .settings import AgentSettings
from .stats import RuntimeStats

__all__ = ["AgentRuntime"]

log = logging.getLogger("conductor_agents.runtime")

#: Serializes the rebuild of a runtime found in a new process without the fork hook having run.
_process_check_lock = threading.Lock()


class AgentRuntime:
    """Starts agents on a Conductor server and runs their Python tools in this process.

    Thread-safe: one runtime may be shared by every thread of a program (a web app's views, a notebook's cells). It
    owns its threads: one polling thread per live stateful run (``conductor-agents-poll-<run id>``), one shared
    poller for non-stateful tools, a bounded tool pool (``conductor-agents-tool_*``), a queue watcher and, while it
    serves or watches a run, one watchdog (``conductor-agents-watchdog``) that samples every such run: it releases
    the run's workers when the run ends and, for stateful runs, sets :attr:`AgentHandle.stall`. :meth:`close` stops
    and joins all of them.

    Fork-safe: a runtime built before ``fork()`` (gunicorn ``--preload``, multiprocessing, Celery prefork) works in
    the child as a runtime of the child's own: a new :attr:`worker_id`, connection pool, workers and threads
    (pollers, pool, watcher and watchdog, started on first use there) and stats from zero. It keeps its settings,
    and whether it was closed. The runs the parent started stay the parent's: the child does not serve, watch,
    reclaim or stop them (it may still message, stop or wait on them by execution id, like any process). See
    ``docs/operations.md``.

    Args:
        settings: defaults to :meth:`AgentSettings.from_env`.
        on_stall: ``on_stall(handle, error)`` is called once each time a run started or
            resumed here stalls (:class:`WorkerStallError`), whether or not anyone waits on
            it. It runs on the watchdog thread: keep it short. An exception it raises is
            logged and ignored.
        on_pending: ``on_pending(handle, request)`` is called once for each
            :class:`PendingRequest` (a tool call to approve, a question) of a run started or
            resumed here, within ``pending_check_interval_seconds`` (5 s) of its start. It runs
            on the ``conductor-agents-pending`` thread: keep it short; an exception is logged
            and ignored.
    """

    def __init__(self, settings: AgentSettings | None = None, *, transport: Transport | None = None,
                 clock: Clock = SYSTEM_CLOCK, on_stall: Callable[[AgentHandle, WorkerStallError], Any] | None = None,
                 on_pending: Callable[[AgentHandle, PendingRequest], Any] | None = None) -> None:
        """Make a runtime that talks to the server ``settings.server_url`` names.

        Args:
            settings: the server, workers and liveness (:class:`AgentSettings`); default
                :meth:`AgentSettings.from_env`, read from ``CONDUCTOR_*`` variables.
            transport: the HTTP transport to use instead of one of its own (tests, a shared connection
                pool); the caller owns it: :meth:`close` does not close it.
            clock: the clock that waits, liveness and back-off read (tests pass a fake one).
            on_stall: ``on_stall(handle, error)``, called on the watchdog thread once each time a run
                started or resumed here stalls (:class:`WorkerStallError`); keep it short.
            on_pending: ``on_pending(handle, request)``, called on the ``conductor-agents-pending`` thread
                once for each :class:`PendingRequest` of a run started or resumed here; keep it short.

        Raises:
            ConfigurationError: ``settings`` was not given and a ``CONDUCTOR_*`` variable is malformed.
            AgentTypeError: ``on_stall`` or ``on_pending`` is not callable.
        """
        if on_stall is not None and not callable(on_stall):
            raise AgentTypeError(f"on_stall must be callable, got {on_stall!r}", field="on_stall", value=on_stall)
        if on_pending is not None and not callable(on_pending):
            raise AgentTypeError(f"on_pending must be callable, got {on_pending!r}", field="on_pending",
                                 value=on_pending)
        self.settings = settings if settings is not None else AgentSettings.from_env()
        self._clock = clock
        self._owns_transport = transport is None
        self._transport = transport if transport is not None else Transport(
            self.settings.server_url, auth_key=self.settings.auth_key, auth_secret=self.settings.auth_secret,
            timeout=self.settings.http_timeout_seconds, pool_size=max(64, self.settings.worker_threads * 2),
            clock=clock)
        self._api = ConductorApi(self._transport)
        #: Which runs belong to which continued listener (shared by every handle of this runtime).
        self._directory = ChainDirectory(self._api)
        #: Counts and local events; survives a fork (reset in the child) so handles keep theirs.
        self._observer = TaskObserver(clock=clock)
        self._on_stall, self._on_pending = on_stall, on_pending
        self._closed = False
        self._closing = threading.Event()  # set by close(): ends a start's retry pause at once
        self._served = ServedAgents()  # kept across a fork: the child serves them too
        self._build_process_parts()
        rebuild_after_fork(self)

    def _build_process_parts(self) -> None:
        """The parts of this process (:class:`ProcessRuns`): made at construction and again in a forked child."""
        self._process = ProcessRuns(
            self._api, self._directory, self.settings, clock=self._clock, observer=self._observer,
            closing=self._closing, workers_now=lambda: self._process.workers, adopt=self._adopt,
            on_stall=self._on_stall, on_pending=self._on_pending)
        self.worker_id = self._process.worker_id

    def _after_fork_in_child(self) -> None:
        """In a forked child (only its forking thread runs): forget the parent's workers, whose threads do not
        exist here, and build this process's own. Nothing is closed: that would stop what is the parent's."""
        self._served.forked()  # first: the rebuild below reads it, and its lock may be a parent thread's
        parent_worker_id = self.worker_id
        closing, self._closing = self._closing, threading.Event()  # its lock may be a parent thread's
        if closing.is_set():
            self._closing.set()
        self._build_process_parts()
        log.debug("forked: runtime worker %s replaces %s in pid %d", self.worker_id, parent_worker_id,
                  self._process.pid)
        if self._served.agents() and not self._closed:
            self._process.serving.serve_again(self._served.agents)  # the child serves what the parent served

    def _check_process(self) -> None:
        """A fork the hook did not see (a C-level ``fork()``, e.g. uWSGI without
        ``py-call-osafterfork``): rebuild on first use in the new process."""
        if self._process.pid != os.getpid():
            with _process_check_lock:
                if self._process.pid != os.getpid():
                    self._after_fork_in_child()

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"AgentRuntime(server_url={self.settings.server_url!r}, {state})"

    # -- context manager --------------------------------------------------------------

    def __enter__(self) -> AgentRuntime:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _check_open(self) -> None:
        self._check_process()
        if self._closed:
            raise RuntimeClosedError("this AgentRuntime is closed")

    # -- runs -------------------------------------------------------------------------

    def start(self, agent: Agent, prompt: str, *, idempotency_key: str | None = None,
              context: Mapping[str, Any] | None = None, media: Any | None = None,
              model_settings: ModelSettings | None = None) -> AgentHandle:
        """Start a run of ``agent`` and serve its tools from this process.

        ``context`` seeds the run's context: shown to the model before every turn, given to every tool
        (``ctx.state``), updated by tools (``ctx.update_state``), returned as ``result.context``. ``media`` is a
        list of URLs (images, documents) attached to the first user message; the *server* downloads them (it refuses
        loopback addresses). ``model_settings`` (:class:`ModelSettings`) changes the model, temperature, token limit
        or reasoning effort of this run only, a listener's later runs included (``docs/steering.md``).

        A stateful agent gets a fresh run id; its workers poll the domain of that id (started *before* the run, so
        its first task is never missed). With an ``idempotency_key`` that the server already knows, the existing run
        is returned and the workers join that run's domain.

        Concurrent first starts of an agent the server has never seen (threads of a web app, several processes) all
        succeed: the server's conflict on creating the agent's definition (no run is created then) is retried with a
        short backoff. A start whose answer is lost (a timeout or a reset after the server got it) is sent again for
        up to about half a minute: every start carries an idempotency key (``idempotency_key``, or one of the SDK's
        own), so the server returns the run it made rather than a second one.

        Raises:
            RuntimeClosedError, AgentTypeError, ValueError: bad call (no request sent); also
                AgentDefinitionError: ``model_settings`` cannot reach an agent tool of the agent.
            ServerUnavailableError, ServerError: the server refused the start or could not be
                reached; no run was started, except when no answer came for half a minute of tries: the message
                then names the execution id the run would have.
            WorkerStartupError: the run started (``.execution_id``) but anything after that
                failed: this process's workers could not reach the server, or a request of
                the start-up (the idempotent domain lookup, the start-up check's poll data)
                failed (the cause is chained). What was reserved is released and no thread
                serves the run; cancel it, or resume it.
        """
        self._check_open()
        check_start(agent, prompt, model_settings)
        return self._process.starter.start(agent, prompt, idempotency_key=idempotency_key, context=context,
                                           media=media, model_settings=model_settings)

    def run(self, agent: Agent, prompt: str, *, timeout: float = 600.0,
            idempotency_key: str | None = None, context: Mapping[str, Any] | None = None,
            media: Any | None = None, model_settings: ModelSettings | None = None) -> AgentResult:
        """Start a run, wait for its result (at most ``timeout`` seconds) and return it.

        Raises: as :meth:`start` and :meth:`AgentHandle.wait`.
        """
        handle = self.start(agent, prompt, idempotency_key=idempotency_key, context=context, media=media,
                            model_settings=model_settings)
        return handle.wait(timeout=timeout)

    def get_handle(self, execution_id: str) -> AgentHandle:
        """A handle on run ``execution_id`` that costs nothing: no request is sent, no worker registered, no
        watch kept (temporalio's ``get_workflow_handle``). Every verb of a run by its id is the handle's.

        What it does not know yet, it learns on first need: :attr:`AgentHandle.agent_name` and
        :attr:`~AgentHandle.run_id` on first read (one request), the listener a run belongs to on the first
        verb. An unknown id is found out then (ExecutionNotFoundError), not here. :meth:`attach` reads the
        run at once instead (it raises for an unknown id, and knows the name and run id from the start).

        Raises:
            RuntimeClosedError: the runtime is closed.
        """
        self._check_open()
        return self._process.handles.make(str(execution_id), None, None, None, workers=False, monitor=False)

    def send_message(self, execution_id: str, payload: Any) -> str:
        """Push a message into run ``execution_id``'s queue; the message id (see :meth:`AgentHandle.send_message`).

        Raises: as :meth:`AgentHandle.send_message`, and RuntimeClosedError.
        """
        return self.get_handle(execution_id).send_message(payload)

    def signal(self, execution_id: str, text: str) -> None:
        """Set the standing signal of run ``execution_id`` (see :meth:`AgentHandle.signal`).

        Raises: as :meth:`AgentHandle.signal`, and RuntimeClosedError.
        """
        self.get_handle(execution_id).signal(text)

    def wait_delivered(self, execution_id: str, message_id: str, timeout: float | None = None) -> MessageDelivery:
        """Block until run ``execution_id`` has pulled message ``message_id`` (see
        :meth:`AgentHandle.wait_delivered`); one request every 0.5 s, no workers.

        Raises: as :meth:`AgentHandle.wait_delivered`, and RuntimeClosedError.
        """
        return self.get_handle(execution_id).wait_delivered(message_id, timeout=timeout)

    def attach(self, execution_id: str) -> AgentHandle:
        """A handle on an existing run that registers no workers (dashboards, other processes).

        Unlike :meth:`get_handle` it reads the run now (one or two requests): the handle knows its agent's
        name and run id, and an unknown id raises here.

        Raises:
            ExecutionNotFoundError: the server does not know the execution.
        """
        self._check_open()
        return self._process.taker.attach(str(execution_id))

    def resume(self, execution_id: str, agent: Agent, *, force: bool = False) -> AgentHandle:
        """Re-attach to a run after a restart and serve its tools from this process.

        Reads the run's domain from the workflow's ``taskToDomain``, registers ``agent``'s workers on it and
        attaches the liveness monitor. Tasks of that domain that a previous worker had taken and not finished (it
        died) are handed back to the server, which delivers them again here (``ctx.attempt`` 2, the same
        ``ctx.idempotency_key``). A run that already ended gives a handle whose ``wait()`` returns at once; no
        workers start.

        A run whose domain another worker still polls is not taken over: two processes polling one domain would
        split the run's tasks (and its in-memory state) between them. The server's poll data says who polled last
        and when; a poll within ``live_workers.freshness_window()`` (75 s: a live poller polls each task type at
        least every 60 s) counts as alive, unless that worker is a process of this machine that no longer exists
        (worker ids name host and pid, see ``live_workers.worker_is_dead_here``): a run whose process died on this
        host is resumed at once. When you know a process on another host is gone, pass ``force=True``.

        Raises:
            ExecutionNotFoundError: the server does not know the execution.
            ResumeError: the run's domains disagree, a stateful agent's run has none, or
                (without ``force``) another worker polled the run's domain lately.
            WorkerStartupError: (``.execution_id``) this process's workers could not reach
                the server, or a request of the take-over failed; nothing is left serving it.
        """
        self._check_open()
        check_agent(agent)
        return self._process.taker.resume(str(execution_id), agent, force=force)

    # -- serving an agent: every process of an app shares its runs ------------------------

    def serve(self, agent: Agent, *, on_adopt: Callable[[AgentHandle], Any] | None = None) -> None:
        """Serve ``agent`` from this process: its runs started here, and the runs no live process serves.

        After this call the process also *adopts* every running run of ``agent`` whose process is gone: closed
        (``close()``, SIGTERM under ``conductor-agents serve``, a recycled web worker), killed, or silent for
        ``liveness_stall_seconds``. Every process that serves the agent shares its runs; an orphan goes to one of
        them (spread by a hash of its domain), and exactly one process serves a run at any time: taking a run means
        creating its next *lease* on the server, which only one process can do (see ``docs/operations.md``).

        - A graceful close hands its runs over: others adopt them within about two
          ``serve_interval`` (2 s each by default), not after the stall threshold.
        - A process that dies is replaced once its presence row is older than
          ``liveness_stall_seconds`` (at once for a process of this host whose pid is gone).
        - A process that cannot renew its presence for ¾ of that stops running its runs' tasks by itself
          (the fence), before any other process may take them; once back, it serves on each run it still
          holds the next lease of, and lets go of the others.
        - An adopted run is served as :meth:`resume` would: tasks the dead process had taken are
          handed back (``ctx.attempt`` 2), a listener keeps its identity and its budget.

        ``on_adopt(handle)`` is called (on the ``conductor-agents-adopt`` thread) after each run is adopted here:
        rebuild per-run state there. Tools get the run's ``ctx.execution_id`` and ``ctx.state``; what a tool kept in
        this process's memory for a run does not move with it.

        Calling it again for the same agent name updates the hook. A runtime built before ``fork()`` serves in each
        child as well (gunicorn ``--preload``: the master too). ``close()`` (also run at interpreter exit) hands the
        runs over.

        Raises:
            AgentTypeError: ``agent`` is not an Agent, or ``on_adopt`` is not callable.
            AgentDefinitionError: the agent is not stateful (its tools are served by any process
                that runs them: there is nothing to adopt).
            ConfigurationError: ``auto_start_workers`` is off.
            WorkerStartupError: this process's presence could not be written to the server.
        """
        self._check_open()
        check_servable(agent, on_adopt, self.settings)
        if self._served.put(agent, on_adopt):  # the first
            close_at_exit(self, here=lambda runtime: runtime._process.pid == os.getpid())
        self._process.serving.add(agent, on_adopt)

    def _adopt(self, execution_id: str, agent: Agent) -> AgentHandle:
        """Serve a run whose lease this process just won (the adopter's take-up)."""
        self._check_open()
        return self._process.taker.adopt(execution_id, agent)

    # -- people in the loop, by execution id (any process may answer) -------------------

    def pending(self, execution_id: str) -> tuple[PendingRequest, ...]:
        """What run ``execution_id`` waits on from a person (see :meth:`AgentHandle.pending`)."""
        return self.get_handle(execution_id).pending()

    def running(self, agent: Agent | str) -> tuple[RunningRun, ...]:
        """The running runs of ``agent`` (an Agent or its name) on the server, whichever process
        serves them, oldest first: one :class:`RunningRun` per listener, named by the id callers hold
        (a continued listener's two runs mid-switch are one row).

        One request for the running runs, then a status and (once per process and run) which
        listener it is, per running run, and whether a process serves it (``served``, a few small reads:
        see ``docs/concepts.md``, "Who serves a run"): a page of a dashboard, not something to call in a loop.

        Raises:
            AgentTypeError: ``agent`` is neither an Agent nor a name; ConfigurationError: not a valid agent name.
        """
        self._check_open()
        rows = running_runs(self._api, self._directory, agent_name_of(agent))
        return tuple(row_with_serving(self._api, self.settings, row, clock=self._clock) for row in rows)

    @property
    def schedules(self) -> Schedules:
        """The server's cron schedules of agents: ``create``, ``get``, ``list``, ``pause``, ``unpause``,
        ``delete``, ``next_runs`` (see ``docs/schedules.md``). A scheduled run is served by the processes
        that :meth:`serve` its agent."""
        self._check_open()
        return Schedules(self._api)

    def pending_requests(self, agent: Agent | str) -> tuple[PendingRequest, ...]:
        """What every running run of ``agent`` (an Agent or its name) waits on from a person,
        oldest first: an approval queue across processes.

        One request for the running runs, one status per run, one task-list read per run that
        waits on a person.

        Raises:
            AgentTypeError: ``agent`` is neither an Agent nor a name.
        """
        self._check_open()
        return pending_of_agent(self._api, self._directory, agent_name_of(agent))

    def approve(self, execution_id: str, *, reason: str | None = None, by: str | None = None,
                request: PendingRequest | str | None = None, timeout: float = 30.0) -> HumanAnswer:
        """Approve what run ``execution_id`` waits on (see :meth:`AgentHandle.approve`)."""
        return self.get_handle(execution_id).approve(reason=reason, by=by, request=request, timeout=timeout)

    def reject(self, execution_id: str, reason: str, *, by: str | None = None,
               request: PendingRequest | str | None = None, timeout: float = 30.0) -> HumanAnswer:
        """Reject what run ``execution_id`` waits on (see :meth:`AgentHandle.reject`)."""
        return self.get_handle(execution_id).reject(reason, by=by, request=request, timeout=timeout)

    def respond(self, execution_id: str, answer: Any, *, by: str | None = None,
                request: PendingRequest | str | None = None, timeout: float = 30.0) -> HumanAnswer:
        """Answer the question run ``execution_id`` asks (see :meth:`AgentHandle.respond`)."""
        return self.get_handle(execution_id).respond(answer, by=by, request=request, timeout=timeout)

    def stats(self) -> RuntimeStats:
        """Counts and timings of the tools this runtime ran, and the runs it serves now.

        Cheap: no request is sent. See :class:`conductor_agents.stats.RuntimeStats`.
        """
        self._check_process()
        return self._observer.runtime_stats(self._process.workers.pollers())

    def close(self) -> None:
        """Stop polling, let running tools finish (``shutdown_grace_seconds``), join every
        thread and close the connection pool. Idempotent. Runs go on on the server.

        In a forked child it closes the child's own workers and pool, never the parent's."""
        self._check_process()
        with self._process.lock:
            if self._closed:
                return
            self._closed = True
        self._closing.set()
        process = self._process
        close_in_order([  # what this process of the runtime owns, in the order it stops (each a Part)
            process.handles,  # the pending monitor
            process.serving.adoption,  # no run is taken up while the workers stop
            process.workers,  # stop polling, let running tools finish, join every thread
            process.serving.presence,  # mark this process gone: its runs are handed over
            self._observer,  # open event streams end with the runtime
            *([self._transport] if self._owns_transport else []),  # the connection pool it made
        ], log)
