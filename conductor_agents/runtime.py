""":class:`AgentRuntime`: starts runs on the server and serves their tools from this process."""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import threading
import uuid
import weakref
from typing import Any, Callable, Iterator, Mapping, Optional

from ._people import approvals as _approvals
from ._wire.api import ConductorApi
from ._listener.chain import link_key, run_id_for_key
from ._listener.directory import Chain, ChainDirectory, Link
from ._common.clock import SYSTEM_CLOCK, Clock
from ._listener.following import current_status
from ._common.fork import rebuild_after_fork
from ._worker.observer import TaskObserver
from ._listener.delivery import MessageDelivery
from ._wire.payload import message_payload
from ._people.pending import HumanAnswer, PendingRequest
from ._people.pending_watch import PendingMonitor
from ._tooldefs.run_state import check_context, check_media
from ._listener.sending import send_to_listener
from ._serving.service import Service
from ._wire.starting import start_run
from ._listener.switch import LinkSpec, link_start_body, pending_switch, read_commit
from ._serving.takeover import find_live_poller, freshness_window, make_worker_id
from ._liveness.tree import running_sub_runs
from ._wire.transport import Transport
from ._worker.workers import Reservation, WorkerSet
from .agent import Agent
from .errors import (
    AgentDefinitionError,
    AgentTypeError,
    ConfigurationError,
    ResumeError,
    RuntimeClosedError,
    WorkerStallError,
    WorkerStartupError,
)
from .handle import AgentHandle
from .result import AgentResult, RunStatus
from .settings import AgentSettings
from .stats import RuntimeStats

__all__ = ["AgentRuntime"]

log = logging.getLogger("conductor_agents.runtime")

#: Serializes the rebuild of a runtime found in a new process without the fork hook having run.
_process_check_lock = threading.Lock()


def _check_prompt(prompt: Any) -> str:
    if not isinstance(prompt, str):
        raise AgentTypeError(f"prompt must be a str, got {prompt!r}", field="prompt", value=prompt)
    if not prompt.strip():
        raise ValueError("prompt must not be blank: the server needs something to start the agent with")
    return prompt


class AgentRuntime:
    """Starts agents on a Conductor server and runs their Python tools in this process.

    Thread-safe: one runtime may be shared by every thread of a program (a web app's
    views, a notebook's cells). It owns its threads: one polling thread per live stateful
    run (``conductor-agents-poll-<run id>``), one shared poller for non-stateful tools,
    a bounded tool pool (``conductor-agents-tool_*``), a queue watcher and, while it
    serves or watches a run, one watchdog (``conductor-agents-watchdog``) that samples
    every such run: it releases the run's workers when the run ends and, for stateful
    runs, sets :attr:`AgentHandle.stall`. :meth:`close` stops and joins all of them.

    Fork-safe: a runtime built before ``fork()`` (gunicorn ``--preload``, multiprocessing,
    Celery prefork) works in the child as a runtime of the child's own: a new
    :attr:`worker_id`, connection pool, workers and threads (pollers, pool, watcher and
    watchdog, started on first use there) and stats from zero. It keeps its settings, and
    whether it was closed. The runs the parent started stay the parent's: the child does
    not serve, watch, reclaim or stop them (it may still message, stop or wait on them by
    execution id, like any process). See ``docs/operations.md``.

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

    def __init__(
        self,
        settings: Optional[AgentSettings] = None,
        *,
        transport: Optional[Transport] = None,
        clock: Clock = SYSTEM_CLOCK,
        on_stall: Optional[Callable[[AgentHandle, WorkerStallError], Any]] = None,
        on_pending: Optional[Callable[[AgentHandle, PendingRequest], Any]] = None,
    ) -> None:
        if on_stall is not None and not callable(on_stall):
            raise AgentTypeError(f"on_stall must be callable, got {on_stall!r}", field="on_stall", value=on_stall)
        if on_pending is not None and not callable(on_pending):
            raise AgentTypeError(f"on_pending must be callable, got {on_pending!r}", field="on_pending",
                                 value=on_pending)
        self._on_stall = on_stall
        self._on_pending = on_pending
        self._pending_monitor: Optional[PendingMonitor] = None
        self.settings = settings if settings is not None else AgentSettings.from_env()
        self._clock = clock
        self._owns_transport = transport is None
        self._transport = transport if transport is not None else Transport(
            self.settings.server_url,
            auth_key=self.settings.auth_key,
            auth_secret=self.settings.auth_secret,
            timeout=self.settings.http_timeout_seconds,
            pool_size=max(64, self.settings.worker_threads * 2),
            clock=clock,
        )
        self._api = ConductorApi(self._transport)
        #: Which runs belong to which continued listener (shared by every handle of this runtime).
        self._directory = ChainDirectory(self._api)
        #: Counts and local events; survives a fork (reset in the child) so handles keep theirs.
        self._observer = TaskObserver(clock=clock)
        self._closed = False
        self._closing = threading.Event()  # set by close(): ends a start's retry pause at once
        #: The agents serve() was called for, with their hooks: kept across a fork (the child serves them too).
        self._served: "list[tuple[Agent, Optional[Callable[[AgentHandle], Any]]]]" = []
        self._build_process_parts()
        rebuild_after_fork(self)

    def _build_process_parts(self) -> None:
        """Everything that belongs to one process: the worker id, the lock, the workers and
        every thread they own (created on first use). The one place they are made: at
        construction and again in a forked child."""
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self.worker_id = make_worker_id(uuid.uuid4().hex[:6], pid=self._pid)
        self._workers = WorkerSet(self._api, self.settings, worker_id=self.worker_id, clock=self._clock,
                                  observer=self._observer, directory=self._directory)
        self._service: Optional[Service] = None  # presence, leases, adoption: on the first serve()

    def _after_fork_in_child(self) -> None:
        """In a forked child (only its forking thread runs): forget the parent's workers, whose
        threads do not exist here, and build this process's own. Nothing is closed: closing
        would stop or join what belongs to the parent."""
        parent_worker_id = self.worker_id
        closing, self._closing = self._closing, threading.Event()  # its lock may be a parent thread's
        if closing.is_set():
            self._closing.set()
        self._build_process_parts()
        log.debug("forked: runtime worker %s replaces %s in pid %d", self.worker_id, parent_worker_id, self._pid)
        if self._served and not self._closed:
            # The child serves what the parent served, as a process of its own (a thread: the first
            # presence row is a request, and the fork must return at once).
            threading.Thread(target=self._serve_again, name="conductor-agents-serve-start", daemon=True).start()

    def _serve_again(self) -> None:
        for agent, on_adopt in list(self._served):
            try:
                self._service_for_process().add(agent, on_adopt)
            except Exception:  # noqa: BLE001 - logged; this child serves only what it starts
                log.exception("forked child %s could not serve %s", self.worker_id, agent.name)

    def _check_process(self) -> None:
        """A fork the hook did not see (a C-level ``fork()``, e.g. uWSGI without
        ``py-call-osafterfork``): rebuild on first use in the new process."""
        if self._pid != os.getpid():
            with _process_check_lock:
                if self._pid != os.getpid():
                    self._after_fork_in_child()

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"AgentRuntime(server_url={self.settings.server_url!r}, {state})"

    # -- context manager --------------------------------------------------------------

    def __enter__(self) -> "AgentRuntime":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _check_open(self) -> None:
        self._check_process()
        if self._closed:
            raise RuntimeClosedError("this AgentRuntime is closed")

    # -- runs -------------------------------------------------------------------------

    def start(self, agent: Agent, prompt: str, *, idempotency_key: Optional[str] = None,
              context: Optional[Mapping[str, Any]] = None, media: Optional[Any] = None) -> AgentHandle:
        """Start a run of ``agent`` and serve its tools from this process.

        ``context`` seeds the run's context: shown to the model before every turn, given to
        every tool (``ctx.state``), updated by tools (``ctx.update_state``), returned as
        ``result.context``. ``media`` is a list of URLs (images, documents) attached to the
        first user message; the *server* downloads them (it refuses loopback addresses).

        A stateful agent gets a fresh run id; its workers poll the domain of that id
        (started *before* the run, so its first task is never missed). With an
        ``idempotency_key`` that the server already knows, the existing run is returned
        and the workers join that run's domain.

        Concurrent first starts of an agent the server has never seen (threads of a web app,
        several processes) all succeed: the server's conflict on creating the agent's
        definition (no run is created then) is retried with a short backoff.

        Raises:
            RuntimeClosedError, AgentTypeError, ValueError: bad call (no request sent).
            ServerUnavailableError, ServerError: the server refused the start or could not be
                reached; no run was started.
            WorkerStartupError: the run started (``.execution_id``) but anything after that
                failed: this process's workers could not reach the server, or a request of
                the start-up (the idempotent domain lookup, the start-up check's poll data)
                failed (the cause is chained). What was reserved is released and no thread
                serves the run; cancel it, or resume it.
        """
        self._check_open()
        if not isinstance(agent, Agent):
            raise AgentTypeError(f"agent must be an Agent, got {agent!r}", field="agent", value=agent)
        _check_prompt(prompt)
        run_id = uuid.uuid4().hex if agent.is_stateful else None
        checked_context = check_context(context) if context is not None else None
        spec = None
        if agent.is_listener:
            spec = LinkSpec(agent, prompt, self.settings.continuation_for(agent), context=checked_context or {})
        if spec is not None:
            # A listener's first run carries the SDK's key (its chain's name: see _chain); the caller's
            # idempotency key picks the run id, so the same key still gives the same run.
            if idempotency_key is not None:
                run_id = run_id_for_key(agent.name, str(idempotency_key))
            assert run_id is not None
            body = link_start_body(spec, run_id, link_key(run_id, 0, agent.name), number=0, turns_before=0)
        else:
            body = {"agentConfig": agent.to_config(), "prompt": prompt}
            if checked_context is not None:
                body["context"] = checked_context
            if run_id:
                body["runId"] = run_id
            if idempotency_key is not None:
                body["idempotencyKey"] = str(idempotency_key)
        if media is not None:
            body["media"] = check_media(media)  # the first run's only: later runs carry the conversation
        serve = self.settings.auto_start_workers and (bool(agent.worker_tools) or spec is not None)
        if serve and run_id and not self._lease_for_start(agent, run_id):
            serve = False  # another live process holds this run (an idempotent start of a run it serves)
        reservation = self._workers.reserve(run_id, agent, continued=spec is not None) if serve else None
        try:
            started = start_run(self._api, body, pause=self._closing.wait)
        except BaseException:
            if reservation is not None:
                reservation.cancel()
            raise
        execution_id = str(started["executionId"])
        tracker = None
        with self._released_on_failure(reservation, execution_id):
            if run_id and idempotency_key is not None:
                run_id = self._domain_of_existing(execution_id, run_id)
            if reservation is not None:
                reservation.commit(execution_id, domain=run_id)
                self._workers.confirm_polling(reservation)
            if spec is not None:
                chain = Chain(execution_id, run_id, agent.name, 0)
                self._directory.remember(chain, newest=Link(0, execution_id))
                if reservation is not None:
                    tracker = self._serve_chain(reservation, chain, spec)
            else:
                self._directory.remember(Chain(execution_id))  # never continued: sends need no lookup
        log.info("started %s run %s%s", agent.name, execution_id, f" on domain {run_id}" if run_id else "")
        return self._handle(execution_id, agent.name, run_id, agent, workers=reservation is not None,
                            tracker=tracker)

    def run(self, agent: Agent, prompt: str, *, timeout: float = 600.0,
            idempotency_key: Optional[str] = None, context: Optional[Mapping[str, Any]] = None,
            media: Optional[Any] = None) -> AgentResult:
        """Start a run, wait for its result (at most ``timeout`` seconds) and return it.

        Raises: as :meth:`start` and :meth:`AgentHandle.wait`.
        """
        handle = self.start(agent, prompt, idempotency_key=idempotency_key, context=context, media=media)
        return handle.wait(timeout=timeout)

    def send_message(self, execution_id: str, payload: Any) -> str:
        """Push a message into a running execution's queue; return the message id.

        A mapping is sent as is, a string as ``{"message": s}``, any other JSON value as
        ``{"message": value}``.

        Raises:
            PayloadError: (a TypeError) not JSON-serialisable; nothing is sent.
            ExecutionNotFoundError: unknown execution (404).
            MessageQueueDisabledError: the execution exists but the server's queue is off.
            ExecutionNotRunningError: the execution has ended (409).
            MessageQueueFullError: its queue is full (429).
        """
        body = message_payload(payload)
        self._check_open()
        return send_to_listener(self._api, self._directory, str(execution_id), body,
                                switch_wait=self.settings.switch_wait_seconds, clock=self._clock,
                                pause=self._closing.wait, on_accepted=self._directory.note_accepted)

    def wait_delivered(self, execution_id: str, message_id: str, timeout: Optional[float] = None) -> MessageDelivery:
        """Block until run ``execution_id`` has pulled message ``message_id`` (see
        :meth:`AgentHandle.wait_delivered`); one request every 0.5 s, no workers.

        Raises: as :meth:`AgentHandle.wait_delivered`, and RuntimeClosedError.
        """
        self._check_open()
        handle = self._handle(str(execution_id), "", None, None, workers=False, monitor=False)
        return handle.wait_delivered(message_id, timeout=timeout)

    def attach(self, execution_id: str) -> AgentHandle:
        """A handle on an existing run that registers no workers (dashboards, other processes).

        Raises:
            ExecutionNotFoundError: the server does not know the execution.
        """
        self._check_open()
        workflow = self._api.get_workflow(str(execution_id))
        domain = _single_domain(workflow, str(execution_id), required=False)
        chain = self._directory.chain(str(execution_id))
        if chain.continuable:
            self._directory.refresh(chain)
        return self._handle(str(execution_id), str(workflow.get("workflowName") or ""), domain, None,
                            workers=False, monitor=False)

    def resume(self, execution_id: str, agent: Agent, *, force: bool = False) -> AgentHandle:
        """Re-attach to a run after a restart and serve its tools from this process.

        Reads the run's domain from the workflow's ``taskToDomain``, registers ``agent``'s
        workers on it and attaches the liveness monitor. Tasks of that domain that a
        previous worker had taken and not finished (it died) are handed back to the server,
        which delivers them again here (``ctx.attempt`` 2, the same ``ctx.idempotency_key``).
        A run that already ended gives a handle whose ``wait()`` returns at once; no workers
        start.

        A run whose domain another worker still polls is not taken over: two processes
        polling one domain would split the run's tasks (and its in-memory state) between
        them. The server's poll data says who polled last and when; a poll within
        ``_takeover.freshness_window()`` (75 s: a live poller polls each task type at least
        every 60 s) counts as alive, unless that worker is a process of this machine that no
        longer exists (worker ids name host and pid, see ``_takeover.worker_is_dead_here``): a
        run whose process died on this host is resumed at once. When you know a process on
        another host is gone, pass ``force=True``.

        Raises:
            ExecutionNotFoundError: the server does not know the execution.
            ResumeError: the run's domains disagree, a stateful agent's run has none, or
                (without ``force``) another worker polled the run's domain lately.
            WorkerStartupError: (``.execution_id``) this process's workers could not reach
                the server, or a request of the take-over failed; nothing is left serving it.
        """
        self._check_open()
        if not isinstance(agent, Agent):
            raise AgentTypeError(f"agent must be an Agent, got {agent!r}", field="agent", value=agent)
        execution_id = str(execution_id)
        workflow = self._api.get_workflow(execution_id)  # no tasks: the ones to reclaim are read by status
        needs_domain = agent.is_stateful and (bool(agent.worker_tools) or agent.is_listener)
        domain = _single_domain(workflow, execution_id, required=needs_domain)
        chain = self._directory.chain(execution_id) if agent.is_listener else None
        if chain is not None and chain.continuable:
            return self._resume_listener(chain, agent, force=force)
        if RunStatus.parse(workflow.get("status")).is_terminal:
            return self._handle(execution_id, agent.name, domain, agent, workers=False, monitor=False)
        serve = self.settings.auto_start_workers and bool(agent.worker_tools)
        if serve and not force:
            self._refuse_if_served(execution_id, agent, domain)
        if serve and domain:
            self._lease_for_resume(agent, domain, execution_id)
        return self._take_up_run(execution_id, agent, domain, serve=serve)

    def _take_up_run(self, execution_id: str, agent: Agent, domain: Optional[str], *, serve: bool) -> AgentHandle:
        if serve:
            reservation = self._workers.reserve(domain, agent)
            with self._released_on_failure(reservation, execution_id):
                reservation.commit(execution_id, domain=domain)
                self._workers.confirm_polling(reservation)
            if domain:
                self._reclaim(execution_id, domain)
        log.info("resumed %s run %s%s", agent.name, execution_id, f" on domain {domain}" if domain else "")
        return self._handle(execution_id, agent.name, domain, agent, workers=serve)

    def _resume_listener(self, chain: Chain, agent: Agent, *, force: bool, lease: bool = True) -> AgentHandle:
        """``resume()`` of a continued listener: serve its current run (and finish a switch a dead
        process left half done), whichever id of it the caller holds."""
        newest = self._directory.refresh(chain)
        link, status = current_status(self._api, self._directory, chain)
        domain = chain.run_id
        if status.is_terminal:
            return self._handle(chain.execution_id, agent.name, domain, agent, workers=False, monitor=False)
        serve = self.settings.auto_start_workers
        tracker = None
        if serve:
            if not force:
                self._refuse_if_served(chain.execution_id, agent, domain)
            if lease:
                self._lease_for_resume(agent, str(domain), chain.execution_id)
            workflow = self._api.get_workflow(newest.execution_id)
            prompt = str((workflow.get("input") or {}).get("prompt") or "")
            spec = LinkSpec(agent, prompt or "Continue.", self.settings.continuation_for(agent))
            reservation = self._workers.reserve(domain, agent, continued=True)
            with self._released_on_failure(reservation, chain.execution_id):
                reservation.commit(newest.execution_id, domain=domain)
                self._workers.confirm_polling(reservation)
                tracker = self._serve_chain(reservation, chain, spec, newest=newest)
            for live in {newest.execution_id, link.execution_id}:
                self._reclaim(live, domain)
        log.info("resumed %s listener %s (run %d: %s)", agent.name, chain.execution_id,
                 newest.number - chain.first + 1, newest.execution_id)
        return self._handle(chain.execution_id, agent.name, domain, agent, workers=serve, tracker=tracker)

    # -- serving an agent: every process of an app shares its runs ------------------------

    def serve(self, agent: Agent, *, on_adopt: Optional[Callable[[AgentHandle], Any]] = None) -> None:
        """Serve ``agent`` from this process: its runs started here, and the runs no live process serves.

        After this call the process also *adopts* every running run of ``agent`` whose process is
        gone: closed (``close()``, SIGTERM under ``conductor-agents serve``, a recycled web worker),
        killed, or silent for ``liveness_stall_seconds``. Every process that serves the agent shares
        its runs; an orphan goes to one of them (spread by a hash of its domain), and exactly one
        process serves a run at any time: taking a run means creating its next *lease* on the
        server, which only one process can do (see ``docs/operations.md``).

        - A graceful close hands its runs over: others adopt them within about two
          ``serve_interval`` (2 s each by default), not after the stall threshold.
        - A process that dies is replaced once its presence row is older than
          ``liveness_stall_seconds`` (at once for a process of this host whose pid is gone).
        - A process that cannot renew its presence for ¾ of that stops serving its runs by itself
          (the fence), before any other process may take them.
        - An adopted run is served as :meth:`resume` would: tasks the dead process had taken are
          handed back (``ctx.attempt`` 2), a listener keeps its identity and its budget.

        ``on_adopt(handle)`` is called (on the ``conductor-agents-adopt`` thread) after each run is
        adopted here: rebuild per-run state there. Tools get the run's ``ctx.execution_id`` and
        ``ctx.state``; what a tool kept in this process's memory for a run does not move with it.

        Calling it again for the same agent name updates the hook. A runtime built before ``fork()``
        serves in each child as well (gunicorn ``--preload``: the master too). ``close()`` (also run
        at interpreter exit) hands the runs over.

        Raises:
            AgentTypeError: ``agent`` is not an Agent, or ``on_adopt`` is not callable.
            AgentDefinitionError: the agent is not stateful (its tools are served by any process
                that runs them: there is nothing to adopt).
            ConfigurationError: ``auto_start_workers`` is off.
            WorkerStartupError: this process's presence could not be written to the server.
        """
        self._check_open()
        if not isinstance(agent, Agent):
            raise AgentTypeError(f"agent must be an Agent, got {agent!r}", field="agent", value=agent)
        if on_adopt is not None and not callable(on_adopt):
            raise AgentTypeError(f"on_adopt must be callable, got {on_adopt!r}", field="on_adopt", value=on_adopt)
        if not agent.is_stateful:
            raise AgentDefinitionError(
                f"serve() adopts the runs of a stateful agent; {agent.name!r} is not stateful (its tools are "
                "served by any process that polls them): use Agent(stateful=True) or a WaitForMessageTool",
                field="stateful", value=False)
        if not self.settings.auto_start_workers:
            raise ConfigurationError("serve() needs auto_start_workers: with it off this runtime serves no tools",
                                     variable="CONDUCTOR_AGENT_AUTO_START_WORKERS")
        with self._lock:
            self._served = [(a, h) for a, h in self._served if a.name != agent.name] + [(agent, on_adopt)]
            first = len(self._served) == 1
        if first:
            _close_at_exit(self)
        self._service_for_process().add(agent, on_adopt)

    def _service_for_process(self) -> Service:
        with self._lock:
            if self._service is None:
                self._service = Service(
                    self._api, worker_id=self.worker_id, dead_after=self.settings.liveness_stall_seconds,
                    take_up=self._adopt, serving_here=self._workers.serves_domain, let_go=self._workers.let_go,
                    pause=self._closing.wait)
            return self._service

    def _serving(self, agent: Agent) -> Optional[Service]:
        service = self._service
        return service if service is not None and service.serves(agent.name) else None

    def _lease_for_start(self, agent: Agent, run_id: str) -> bool:
        """A run of a served agent about to start here takes lease 0 first: False when another process
        holds it (the same idempotency key started it there)."""
        service = self._serving(agent)
        if service is None:
            return True
        lease = service.claim_first(run_id)
        if lease is not None and lease.owner == self.worker_id:
            return True
        if lease is None:
            return True  # the record could not be read back: it is ours unless it shows otherwise later
        log.info("run on domain %s is held by %s: this start does not serve it", run_id, lease.owner)
        return False

    def _lease_for_resume(self, agent: Agent, domain: str, execution_id: str) -> None:
        service = self._serving(agent)
        if service is not None and not service.claim_next(domain, execution_id):
            raise ResumeError(f"run {execution_id} was taken by another serving process as this one resumed it",
                              execution_id=execution_id)

    def _adopt(self, execution_id: str, agent: Agent) -> AgentHandle:
        """Serve a run whose lease this process just won (the adopter's take-up)."""
        self._check_open()
        workflow = self._api.get_workflow(execution_id)
        domain = _single_domain(workflow, execution_id, required=True)
        chain = self._directory.chain(execution_id) if agent.is_listener else None
        if chain is not None and chain.continuable and chain.first > 0:
            # The adopter may list a later run of the listener (even one whose switch the dead process
            # began and did not finish): serve it as the listener it is, from its first run's id, so
            # that a switch left half done is finished and the handle keeps the listener's identity.
            chain = self._directory.chain(chain.link(0).execution_id)
        if chain is not None and chain.continuable:
            return self._resume_listener(chain, agent, force=True, lease=False)
        if RunStatus.parse(workflow.get("status")).is_terminal:
            return self._handle(execution_id, agent.name, domain, agent, workers=False, monitor=False)
        return self._take_up_run(execution_id, agent, domain, serve=bool(agent.worker_tools))

    def _serve_chain(self, reservation: Reservation, chain: Chain, spec: LinkSpec, *,
                     newest: Optional[Link] = None) -> Any:
        """Serve the continued listener ``chain`` on ``reservation`` from its newest link, finishing a switch
        left half done; the chain's tracker."""
        newest = newest if newest is not None else self._directory.refresh(chain)
        pending = pending_switch(self._api, chain, newest)
        turns_before = 0
        if pending is None and newest.number > chain.first:
            record, _ = read_commit(self._api, newest)
            turns_before = record.turns if record is not None else 0
        if pending is not None:
            log.info("listener %s: finishing the switch from %s to %s that another process began",
                     chain.execution_id, pending.execution_id, newest.execution_id)
        return self._workers.serve_chain(reservation, chain, spec, newest, turns_before=turns_before,
                                         pending_from=pending)

    def _reclaim(self, execution_id: str, domain: str) -> None:
        """Hand back the tasks of ``domain`` in run ``execution_id`` and its running sub-runs (sub-agents,
        agent tools: they share its domain) that a dead worker had taken."""
        for run in (execution_id, *running_sub_runs(self._api, execution_id)):
            page = self._api.workflow_tasks(run, statuses=("IN_PROGRESS",), start=0, count=200)
            self._workers.reclaim_orphans({"tasks": page.tasks}, domain)

    # -- people in the loop, by execution id (any process may answer) -------------------

    def pending(self, execution_id: str) -> "tuple[PendingRequest, ...]":
        """What run ``execution_id`` waits on from a person (see :meth:`AgentHandle.pending`)."""
        self._check_open()
        return _approvals.pending(self._api, self._live_id(execution_id))

    def pending_requests(self, agent: "Agent | str") -> "tuple[PendingRequest, ...]":
        """What every running run of ``agent`` (an Agent or its name) waits on from a person,
        oldest first: an approval queue across processes.

        One request for the running runs, one status per run, one task-list read per run that
        waits on a person.

        Raises:
            AgentTypeError: ``agent`` is neither an Agent nor a name.
        """
        self._check_open()
        name = agent.name if isinstance(agent, Agent) else agent
        if not isinstance(name, str) or not name:
            raise AgentTypeError(f"agent must be an Agent or its name, got {agent!r}", field="agent", value=agent)
        return _approvals.pending_of_agent(self._api, name)

    def approve(self, execution_id: str, *, reason: Optional[str] = None, by: Optional[str] = None,
                request: "Optional[PendingRequest | str]" = None, timeout: float = 30.0) -> HumanAnswer:
        """Approve what run ``execution_id`` waits on (see :meth:`AgentHandle.approve`)."""
        self._check_open()
        return _approvals.approve(self._api, self._live_id(execution_id), reason=reason, by=by, request=request,
                                  timeout=timeout, clock=self._clock)

    def reject(self, execution_id: str, reason: str, *, by: Optional[str] = None,
               request: "Optional[PendingRequest | str]" = None, timeout: float = 30.0) -> HumanAnswer:
        """Reject what run ``execution_id`` waits on (see :meth:`AgentHandle.reject`)."""
        self._check_open()
        return _approvals.reject(self._api, self._live_id(execution_id), reason, by=by, request=request, timeout=timeout,
                                 clock=self._clock)

    def respond(self, execution_id: str, answer: Any, *, by: Optional[str] = None,
                request: "Optional[PendingRequest | str]" = None, timeout: float = 30.0) -> HumanAnswer:
        """Answer the question run ``execution_id`` asks (see :meth:`AgentHandle.respond`)."""
        self._check_open()
        return _approvals.respond(self._api, self._live_id(execution_id), answer, by=by, request=request, timeout=timeout,
                                  clock=self._clock)

    def _live_id(self, execution_id: str) -> str:
        """The current run of the listener ``execution_id`` names (itself unless it was continued)."""
        chain = self._directory.chain(str(execution_id))
        return self._directory.refresh(chain).execution_id if chain.continuable else str(execution_id)

    def _watch_pending(self, handle: AgentHandle) -> None:
        on_pending = self._on_pending
        monitor = self._pending_monitor
        if monitor is None or monitor.pid != os.getpid():  # first use, or first use in a forked child
            with self._lock:
                monitor = self._pending_monitor
                if monitor is None or monitor.pid != os.getpid():
                    monitor = self._pending_monitor = PendingMonitor(
                        self._api, lambda h, r: on_pending(h, r),  # type: ignore[misc]
                        interval=self.settings.pending_check_interval_seconds)
        monitor.watch(handle)

    def stats(self) -> RuntimeStats:
        """Counts and timings of the tools this runtime ran, and the runs it serves now.

        Cheap: no request is sent. See :class:`conductor_agents.stats.RuntimeStats`.
        """
        self._check_process()
        return self._observer.runtime_stats(self._workers.pollers())

    # -- internals --------------------------------------------------------------------

    @contextlib.contextmanager
    def _released_on_failure(self, reservation: Optional[Reservation], execution_id: str) -> Iterator[None]:
        """Taking up a run that exists on the server: on any failure, serve nothing of it and say which run.

        Whatever was reserved is released (its poller stops if no other run needs it) and the
        error becomes a :class:`WorkerStartupError` carrying ``execution_id``, the cause chained.
        """
        try:
            yield
        except BaseException as err:
            if reservation is not None:
                reservation.release()
            if isinstance(err, WorkerStartupError):
                raise WorkerStartupError(str(err), execution_id=execution_id) from None
            if not isinstance(err, Exception):
                raise  # KeyboardInterrupt and the like: released, not re-labelled
            raise WorkerStartupError(
                f"run {execution_id} exists on the server, but this process could not take it up "
                f"({type(err).__name__}: {err}); it does not serve the run. Cancel it, or resume it "
                "once the server is reachable.",
                execution_id=execution_id,
            ) from err

    def _refuse_if_served(self, execution_id: str, agent: Agent, domain: Optional[str]) -> None:
        # Before this process polls the domain itself (its poll would overwrite the poll data).
        live = find_live_poller(self._api, [t.name for t in agent.worker_tools], domain,
                                own_worker_id=self.worker_id, clock=self._clock)
        if live is None:
            return
        raise ResumeError(
            f"run {execution_id} is still served: worker {live.worker_id} polled its domain {domain} "
            f"{live.seconds_ago:.0f}s ago (task {live.task_type!r}), so that process looks alive and two "
            "processes would split the run's tasks. Stop that process, or wait until it has not polled "
            f"for {freshness_window():.0f}s; if you know it is dead, resume with force=True "
            "(CLI: conductor-agents resume --force).",
            execution_id=execution_id,
        )

    def _domain_of_existing(self, execution_id: str, minted: str) -> str:
        workflow = self._api.get_workflow(execution_id)
        domain = _single_domain(workflow, execution_id, required=False)
        if domain and domain != minted:
            log.info("idempotent start returned the existing run %s; joining its domain %s", execution_id, domain)
            return domain
        return minted

    def _handle(self, execution_id: str, agent_name: str, run_id: Optional[str], agent: Optional[Agent],
                *, workers: bool, monitor: bool = True, tracker: Any = None,
                chain: Optional[Chain] = None) -> AgentHandle:
        watch: Any = None
        if monitor and run_id and self.settings.liveness_enabled:
            tree = agent is not None and agent.has_sub_runs
            watch = tracker if tracker is not None else self._workers.watch(execution_id, domain=run_id, tree=tree)
        handle = AgentHandle(
            api=self._api, execution_id=execution_id, agent_name=agent_name, run_id=run_id,
            settings=self.settings, clock=self._clock, agent=agent, liveness=watch,
            on_terminal=self._execution_ended, on_stop=self._stop_requested, workers_attached=workers,
            observer=self._observer, directory=self._directory,
            chain=self._directory.known(execution_id) if chain is None else chain,
        )
        on_stall = self._on_stall
        if watch is not None and on_stall is not None:
            watch.add_listener(lambda error: on_stall(handle, error))
        if monitor and self._on_pending is not None and agent is not None and agent.waits_for_people:
            self._watch_pending(handle)
        return handle

    def _execution_ended(self, execution_id: str) -> None:
        # Through the runtime, not bound to a WorkerSet: a handle made before a fork then
        # reaches the child's workers (which do not serve the parent's run: a no-op).
        self._workers.execution_ended(execution_id)

    def _stop_requested(self, execution_id: str) -> None:
        # Through the runtime for the same reason: its tools running here see ctx.stop_requested.
        self._workers.stop_requested(execution_id)

    def close(self) -> None:
        """Stop polling, let running tools finish (``shutdown_grace_seconds``), join every
        thread and close the connection pool. Idempotent. Runs go on on the server.

        In a forked child it closes the child's own workers and pool, never the parent's."""
        self._check_process()
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._closing.set()
        if self._pending_monitor is not None and self._pending_monitor.pid == os.getpid():
            self._pending_monitor.close()
        if self._service is not None:
            self._service.close(self._workers.close)  # stop adopting, stop serving, then hand over
        else:
            self._workers.close()
        self._observer.close()  # open event streams end with the runtime
        if self._owns_transport:
            self._transport.close()


def _close_at_exit(runtime: AgentRuntime) -> None:
    """Close a serving runtime at interpreter exit (a recycled web worker exits normally): its runs
    are handed over at once instead of after the stall threshold."""
    ref = weakref.ref(runtime)

    def close() -> None:
        live = ref()
        if live is not None and live._pid == os.getpid():
            try:
                live.close()
            except Exception:  # noqa: BLE001 - exiting anyway
                log.exception("closing the serving runtime at exit failed")

    # CPython's threading hook runs first at exit (hooks in reverse order, so before the one that shuts
    # down the executors, registered earlier): the close hands over while tools can still finish.
    register = getattr(threading, "_register_atexit", None)
    try:
        if register is not None:
            register(close)
            return
    except RuntimeError:  # already exiting
        return
    atexit.register(close)


def _single_domain(workflow: Mapping[str, Any], execution_id: str, *, required: bool) -> Optional[str]:
    """The one domain of a run's ``taskToDomain``; None when it has none."""
    domains = {str(d) for d in (workflow.get("taskToDomain") or {}).values() if d}
    if len(domains) > 1:
        raise ResumeError(
            f"run {execution_id} routes its tasks to several domains {sorted(domains)}; "
            "this SDK pins a run to one domain and cannot tell which to serve",
            execution_id=execution_id,
        )
    if not domains:
        if required:
            raise ResumeError(
                f"run {execution_id} has no task domain, but the agent is stateful: it was not "
                "started as a stateful run (or by another SDK without a run id), so its tasks are "
                "not pinned to any process",
                execution_id=execution_id,
            )
        return None
    return domains.pop()



