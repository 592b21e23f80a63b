"""Taking up a run that exists on the server: attach, resume, adoption, reclaim, leases.

:class:`RunTaker` gives a handle on any run that serves and watches nothing (``attach``), and serves
from this process a run that another process (or this one, before a restart) started: it reads the
run's domain, refuses a run another live process still serves, takes the run's next lease when its
agent is served, registers the agent's workers, finishes a continued listener's switch left half done,
and hands back the tasks a dead worker had taken. The runtime builds one per process (a forked child
builds its own) and calls it; it calls back only through the handle factory it was given.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from .._common.clock import Clock
from .._listener.directory import Chain, ChainDirectory, Link
from .._listener.following import current_status, run_identity
from .._listener.switch import LinkSpec, pending_switch, read_commit
from .._liveness.tree import running_sub_runs
from .._serving.live_workers import find_live_poller, freshness_window
from .._serving.service import Service
from .._teams.model_settings import ModelSettings, recorded_model_settings, run_model
from .._tracing import hooks as tracing
from .._wire.api import ConductorApi
from .._wire.domains import single_domain
from .._worker.workers import Reservation, WorkerSet
from ..agent import Agent
from ..errors import ResumeError, WorkerStartupError
from ..result import RunStatus
from ..settings import AgentSettings

if TYPE_CHECKING:
    from ..handle import AgentHandle

__all__ = ["RunTaker"]

log = logging.getLogger("conductor_agents.runtime")

#: ``handle(execution_id, agent_name, run_id, agent, *, workers, monitor=True, tracker=None)``: the runtime's
#: handle factory.
HandleFactory = Callable[..., "AgentHandle"]


class RunTaker:
    """Takes up runs for one process of a runtime: resume, adopt, and the checks before serving.

    Thread-safe: it keeps no state of its own; what it uses (workers, directory, service) is.
    """

    def __init__(self, api: ConductorApi, directory: ChainDirectory, workers: WorkerSet, settings: AgentSettings,
                 *, clock: Clock, worker_id: str, service: Callable[[], Service | None],
                 handle: HandleFactory) -> None:
        self._api = api
        self._directory = directory
        self._workers = workers
        self._settings = settings
        self._clock = clock
        self._worker_id = worker_id
        self._service = service  # this process's Service, or None before the first serve()
        self._handle = handle

    # -- attach, resume and adopt -------------------------------------------------------

    def attach(self, execution_id: str) -> AgentHandle:
        """A handle on run ``execution_id`` that serves and watches nothing (see :meth:`AgentRuntime.attach`)."""
        workflow = self._api.get_workflow(execution_id)
        chain = self._directory.chain(execution_id, record=workflow)
        name, domain = run_identity(workflow, chain)
        if chain.continuable:
            self._directory.refresh(chain)
        return self._handle(execution_id, name, domain, None, workers=False, monitor=False)

    def resume(self, execution_id: str, agent: Agent, *, force: bool) -> AgentHandle:
        """Serve run ``execution_id`` of ``agent`` from this process (see :meth:`AgentRuntime.resume`)."""
        workflow = self._api.get_workflow(execution_id)  # no tasks: the ones to reclaim are read by status
        needs_domain = agent.is_stateful and (bool(agent.worker_tools) or agent.is_listener)
        domain = single_domain(workflow, execution_id, required=needs_domain)
        chain = self._directory.chain(execution_id, record=workflow) if agent.is_listener else None
        if chain is not None and chain.continuable:
            return self._resume_listener(self._directory.anchor(chain), agent, force=force, how="resume",
                                         read=workflow)
        if RunStatus.parse(workflow.get("status")).is_terminal:
            return self._handle(execution_id, agent.name, domain, agent, workers=False, monitor=False)
        serve = self._settings.auto_start_workers and bool(agent.worker_tools)
        if serve and not force:
            self._refuse_if_served(execution_id, agent, domain)
        if serve and domain:
            self._lease_for_resume(agent, domain, execution_id)
        return self._take_up_run(execution_id, agent, domain, serve=serve, traced=_traced(workflow, "resume"))

    def adopt(self, execution_id: str, agent: Agent) -> AgentHandle:
        """Serve a run whose lease this process just won (the adopter's take-up)."""
        workflow = self._api.get_workflow(execution_id)
        domain = single_domain(workflow, execution_id, required=True)
        chain = self._directory.chain(execution_id, record=workflow) if agent.is_listener else None
        if chain is not None and chain.continuable:
            # The adopter may list a later run of the listener (even one whose switch the dead process
            # began and did not finish): serve it as the listener it is, from the id callers hold (its
            # mailbox, or its first run), so that a switch left half done is finished, its mailbox is
            # served, and the handle keeps the listener's identity.
            chain = self._directory.anchor(chain)
        if chain is not None and chain.continuable:
            return self._resume_listener(chain, agent, force=True, lease=False, how="adopt", read=workflow)
        if RunStatus.parse(workflow.get("status")).is_terminal:
            return self._handle(execution_id, agent.name, domain, agent, workers=False, monitor=False)
        return self._take_up_run(execution_id, agent, domain, serve=bool(agent.worker_tools),
                                 traced=_traced(workflow, "adopt"))

    def _take_up_run(self, execution_id: str, agent: Agent, domain: str | None, *,
                     serve: bool, traced: tuple[str | None, str, ModelSettings | None] | None = None) -> AgentHandle:
        if serve and traced is not None:  # its span here: a child of the span it was started with
            parent, how, settings = traced
            tracing.begin_run(agent.name, parent=parent, taken_up=how, owner=self._worker_id,
                              model=run_model(agent.model, settings)).started(execution_id)
        if serve:
            reservation = self._workers.reserve(domain, agent)
            with released_on_failure(reservation, execution_id):
                reservation.commit(execution_id, domain=domain)
                self._workers.confirm_polling(reservation)
            if domain:
                self._reclaim(execution_id, domain)
        log.info("resumed %s run %s%s", agent.name, execution_id, f" on domain {domain}" if domain else "")
        return self._handle(execution_id, agent.name, domain, agent, workers=serve)

    def _resume_listener(self, chain: Chain, agent: Agent, *, force: bool, lease: bool = True,
                         how: str = "resume", read: Mapping[str, Any] | None = None) -> AgentHandle:
        """``resume()`` of a continued listener: serve its current run (and finish a switch a dead
        process left half done), whichever id of it the caller holds; ``read``: a run of it whose
        workflow the caller has just read (not read again when it is the current run)."""
        newest = self._directory.refresh(chain)
        link, status = current_status(self._api, self._directory, chain)
        domain = chain.run_id
        if status.is_terminal:
            return self._handle(chain.execution_id, agent.name, domain, agent, workers=False, monitor=False)
        serve = self._settings.auto_start_workers
        tracker = None
        if serve:
            if not force:
                self._refuse_if_served(chain.execution_id, agent, domain)
            if lease:
                self._lease_for_resume(agent, str(domain), chain.execution_id)
            workflow = read if read is not None and read.get("workflowId") == newest.execution_id else \
                self._api.get_workflow(newest.execution_id)
            prompt = str((workflow.get("input") or {}).get("prompt") or "")
            carrier = tracing.carrier_of(workflow)  # its later runs stay in the trace it was started in
            box = chain if chain.mailbox else self._directory.anchor(chain, cached=True)
            spec = LinkSpec(agent, prompt or "Continue.", self._settings.continuation_for(agent), trace_parent=carrier,
                            model_settings=recorded_model_settings(workflow),  # the start's, kept by the server
                            human_wait=box.human_wait)
            tracing.begin_run(agent.name, parent=carrier, taken_up=how, owner=self._worker_id,
                              model=run_model(agent.model, spec.model_settings)).started(
                newest.execution_id, conversation_id=chain.execution_id)
            reservation = self._workers.reserve(domain, agent, continued=True)
            with released_on_failure(reservation, chain.execution_id):
                reservation.commit(newest.execution_id, domain=domain)
                self._workers.confirm_polling(reservation)
                half_done = pending_switch(self._api, chain, newest)
                tracker = self._serve_from(reservation, chain, spec, newest, half_done)
            # The mailbox's forward too, and the old run of a switch the dead process left half done: a tool
            # it had taken there and not answered is delivered again here (at least once, as after any crash),
            # else that run never comes to rest and the message behind the tool is never acted on.
            for live in {newest.execution_id, link.execution_id} | ({chain.execution_id} if chain.mailbox else set()) \
                    | ({half_done.execution_id} if half_done is not None else set()):
                self._reclaim(live, domain)
        log.info("resumed %s listener %s (run %d: %s)", agent.name, chain.execution_id,
                 newest.number - chain.first + 1, newest.execution_id)
        return self._handle(chain.execution_id, agent.name, domain, agent, workers=serve, tracker=tracker)

    def serve_chain(self, reservation: Reservation, chain: Chain, spec: LinkSpec, *,
                    newest: Link | None = None) -> Any:
        """Serve the continued listener ``chain`` on ``reservation`` from its newest link, finishing a switch
        left half done; the chain's tracker."""
        newest = newest if newest is not None else self._directory.refresh(chain)
        return self._serve_from(reservation, chain, spec, newest, pending_switch(self._api, chain, newest))

    def _serve_from(self, reservation: Reservation, chain: Chain, spec: LinkSpec, newest: Link,
                    pending: Link | None) -> Any:
        """:meth:`serve_chain` from ``newest``, the switch to it from ``pending`` left half done (or None)."""
        turns_before = 0
        if pending is None and newest.number > chain.first:
            record, _ = read_commit(self._api, newest)
            turns_before = record.turns if record is not None else 0
        if pending is not None:
            log.info("listener %s: finishing the switch from %s to %s that another process began",
                     chain.execution_id, pending.execution_id, newest.execution_id)
        return self._workers.serve_chain(reservation, chain, spec, newest, turns_before=turns_before,
                                         pending_from=pending)

    def _reclaim(self, execution_id: str, domain: str | None) -> None:
        """Hand back the tasks of ``domain`` in run ``execution_id`` and its running sub-runs (sub-agents,
        agent tools: they share its domain) that a dead worker had taken."""
        for run in (execution_id, *running_sub_runs(self._api, execution_id)):
            page = self._api.workflow_tasks(run, statuses=("IN_PROGRESS",), start=0, count=200)
            self._workers.reclaim_orphans({"tasks": page.tasks}, domain)

    # -- checks before serving ---------------------------------------------------------

    def _refuse_if_served(self, execution_id: str, agent: Agent, domain: str | None) -> None:
        # Before this process polls the domain itself (its poll would overwrite the poll data).
        live = find_live_poller(self._api, [t.name for t in agent.worker_tools], domain,
                                own_worker_id=self._worker_id, clock=self._clock)
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

    def _serving(self, agent: Agent) -> Service | None:
        service = self._service()
        return service if service is not None and service.serves(agent.name) else None

    def lease_for_start(self, agent: Agent, run_id: str) -> bool:
        """A run of a served agent about to start here takes lease 0 first: False when another process
        holds it (the same idempotency key started it there)."""
        service = self._serving(agent)
        if service is None:
            return True
        lease = service.claim_first(run_id)
        if lease is not None and lease.owner == self._worker_id:
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

    def domain_of_existing(self, execution_id: str, minted: str) -> str:
        """The domain of the run an idempotent start returned: its own when it existed before (``minted``
        otherwise)."""
        workflow = self._api.get_workflow(execution_id)
        domain = single_domain(workflow, execution_id, required=False)
        if domain and domain != minted:
            log.info("idempotent start returned the existing run %s; joining its domain %s", execution_id, domain)
            return domain
        return minted


@contextlib.contextmanager
def released_on_failure(reservation: Reservation | None, execution_id: str) -> Iterator[None]:
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


def _traced(workflow: Mapping[str, Any], how: str) -> tuple[str | None, str, ModelSettings | None]:
    """The carrier a run was started with (its span's traceparent), how it is taken up here and the model settings
    it was started with."""
    return tracing.carrier_of(workflow), how, recorded_model_settings(workflow)
