"""Starting a run: the body of ``POST /agent/start``, and serving the run from this process.

:class:`RunStarter` builds the start request (a continued listener's first link, or a plain start
with the caller's idempotency key, context and media), decides whether this process serves the run
(and, for a served agent, takes its first lease), reserves the run's workers *before* the start so
that its first task is never missed, then commits them to the run the server started. The runtime
builds one per process (a forked child builds its own) and calls it after checking its arguments.
"""

from __future__ import annotations

import contextlib
import logging
import uuid
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from .._listener.chain import link_id, link_key, run_id_for_key
from .._listener.directory import Chain, ChainDirectory, Link
from .._listener.mailbox import Mailboxes
from .._listener.switch import LinkSpec, agent_key, link_start_body
from .._teams.model_settings import ModelSettings, apply_model_settings, run_model
from .._tooldefs.run_state import check_context, check_media
from .._tracing import hooks as tracing
from .._tracing.carrier import START_KEY as TRACE_START_KEY
from .._wire.api import ConductorApi
from .._wire.starting import start_run
from .._worker.workers import Reservation, WorkerSet
from ..agent import Agent, check_agent
from ..errors import AgentTypeError, ConductorAgentsError, ServerUnavailableError
from ..settings import AgentSettings
from .existing import HandleFactory, RunTaker, released_on_failure

if TYPE_CHECKING:
    from ..handle import AgentHandle

__all__ = ["RunStarter", "check_prompt", "check_start"]

log = logging.getLogger("conductor_agents.runtime")

#: The idempotency key of a start the caller gave none (``<prefix><32 hex>``): the server's create-once for it makes
#: a start whose answer was lost safe to send again (:func:`~.._wire.starting.start_run`). The server sets a keyed
#: run's ``correlationId`` to its key; this one matches neither a listener's link key nor a mailbox's.
_OWN_KEY_PREFIX = "conductor-agents/start/"


def check_start(agent: Any, prompt: Any, model_settings: Any) -> None:
    """Whether ``start(agent, prompt, model_settings=model_settings)`` may start a run (no request).

    Raises: AgentTypeError, ValueError: as :meth:`AgentRuntime.start`.
    """
    check_agent(agent)
    check_prompt(prompt)
    if model_settings is not None and not isinstance(model_settings, ModelSettings):
        raise AgentTypeError(f"model_settings must be a ModelSettings or None, got {model_settings!r}",
                             field="model_settings", value=model_settings)


def check_prompt(prompt: Any) -> str:
    """``prompt`` if it can start a run.

    Raises: AgentTypeError: not a str. ValueError: blank.
    """
    if not isinstance(prompt, str):
        raise AgentTypeError(f"prompt must be a str, got {prompt!r}", field="prompt", value=prompt)
    if not prompt.strip():
        raise ValueError("prompt must not be blank: the server needs something to start the agent with")
    return prompt


class RunStarter:
    """Starts runs for one process of a runtime and serves the ones that need this process.

    Thread-safe: it keeps no state of its own; what it uses (workers, directory, taker) is.
    """

    def __init__(self, api: ConductorApi, directory: ChainDirectory, workers: WorkerSet, settings: AgentSettings,
                 *, taker: RunTaker, pause: Callable[[float], Any], handle: HandleFactory) -> None:
        self._api = api
        self._directory = directory
        self._workers = workers
        self._settings = settings
        self._taker = taker  # leases, the domain of an existing run, serving a listener's chain
        self._pause = pause  # between retries of a start; returns at once when the runtime closes
        self._handle = handle
        self._mailboxes = Mailboxes(api, pause=pause)

    def start(self, agent: Agent, prompt: str, *, idempotency_key: str | None,
              context: Mapping[str, Any] | None, media: Any | None,
              model_settings: ModelSettings | None = None) -> AgentHandle:
        """Start a run of ``agent`` (arguments checked but these) and serve it (see :meth:`AgentRuntime.start`).

        Raises: as :meth:`AgentRuntime.start`; AgentDefinitionError (``model_settings`` cannot reach an agent
        tool) before anything is sent.
        """
        compiled = agent.to_config()  # once
        key = agent_key(agent.name, compiled) if agent.is_listener else None  # before the settings change it
        config = apply_model_settings(compiled, model_settings)  # refused before anything is sent
        run_id = uuid.uuid4().hex if agent.is_stateful else None
        checked_context = check_context(context) if context is not None else None
        spec = None
        traced = tracing.begin_run(agent.name, owner=self._workers.worker_id,  # a child of the caller's current span
                                   model=run_model(agent.model, model_settings))
        if agent.is_listener:
            continuation = self._settings.continuation_for(agent)
            spec = LinkSpec(agent, prompt, continuation, context=checked_context or {},
                            model_settings=model_settings, trace_parent=traced.traceparent, agent_key=key,
                            human_wait=(self._settings.listener_wait == "human" and continuation.enabled
                                        and continuation.mailbox))
            # A listener's first run carries the SDK's key (its chain's name: see _chain); the caller's
            # idempotency key picks the run id, so the same key still gives the same run.
            if idempotency_key is not None:
                run_id = run_id_for_key(agent.name, str(idempotency_key))
        body = start_body(agent, prompt, run_id, spec, context=checked_context, idempotency_key=idempotency_key,
                          model_settings=model_settings, config=config)
        body.setdefault("idempotencyKey", f"{_OWN_KEY_PREFIX}{uuid.uuid4().hex}")
        if traced.traceparent is not None:
            body[TRACE_START_KEY] = traced.traceparent  # where later runs and other processes find it
        if media is not None:
            body["media"] = check_media(media)  # the first run's only: later runs carry the conversation
        try:
            serve = self._settings.auto_start_workers and (bool(agent.worker_tools) or spec is not None)
            if serve and run_id and not self._taker.lease_for_start(agent, run_id):
                serve = False  # another live process holds this run (an idempotent start of a run it serves)
            reservation = self._workers.reserve(run_id, agent, continued=spec is not None) if serve else None
            return self._started(agent, body, reservation, run_id, spec, keyed=idempotency_key is not None,
                                 traced=traced)
        except BaseException as err:
            traced.failed(err)
            raise

    def _started(self, agent: Agent, body: dict[str, Any], reservation: Reservation | None, run_id: str | None,
                 spec: LinkSpec | None, *, keyed: bool, traced: Any = tracing.NO_RUN) -> AgentHandle:
        """Send the start, then commit ``reservation`` (if any) to the run the server started."""
        try:
            started = start_run(self._api, body, pause=self._pause)
        except BaseException as err:
            if reservation is not None:
                reservation.cancel()
            if isinstance(err, ServerUnavailableError) and body.get("idempotencyKey"):
                maybe = link_id(agent.name, str(body["idempotencyKey"]))
                raise ServerUnavailableError(
                    f"{err}; the start was sent again for about half a minute without an answer: the server may "
                    f"have started the run, whose execution id would be {maybe} (runtime.get_handle({maybe!r}) "
                    "finds it once the server answers)", status=err.status) from err
            raise
        execution_id = str(started["executionId"])
        traced.started(execution_id)  # before its first tool runs here
        tracker = None
        with released_on_failure(reservation, execution_id):
            if run_id and keyed:
                run_id = self._taker.domain_of_existing(execution_id, run_id)
            if reservation is not None:
                reservation.commit(execution_id, domain=run_id)
                self._workers.confirm_polling(reservation)
            if spec is not None:
                assert run_id is not None
                chain = (self._open_mailbox(spec, run_id, execution_id, keyed=keyed)
                         or Chain(execution_id, run_id, agent.name, 0))
                self._directory.remember(chain, newest=Link(0, execution_id))
                if reservation is not None:
                    tracker = self._taker.serve_chain(reservation, chain, spec)
                execution_id = chain.execution_id  # the id callers hold: the mailbox's, when it has one
                traced.started(str(started["executionId"]), conversation_id=execution_id)
            else:
                self._directory.remember(Chain(execution_id))  # never continued: sends need no lookup
        log.info("started %s run %s%s", agent.name, execution_id, f" on domain {run_id}" if run_id else "")
        return self._handle(execution_id, agent.name, run_id, agent, workers=reservation is not None,
                            tracker=tracker)


    def _open_mailbox(self, spec: LinkSpec, run_id: str, first_id: str, *, keyed: bool) -> Chain | None:
        """The chain of a listener by its mailbox (opened now, or the one an earlier start with the same
        key opened); None when it has none (``Continuation(mailbox=False)``, or no continuation)."""
        continuation = spec.continuation
        if not (continuation.enabled and continuation.mailbox):
            return None
        try:
            mailbox_id = self._mailboxes.open(run_id, spec.agent.name, human_wait=spec.human_wait, keyed=keyed)
        except ConductorAgentsError as err:
            if spec.human_wait:  # its wait is completed only by its mailbox's forward: it cannot live without one
                if not keyed:  # a keyed run may be another start's, whose mailbox opened: a retry with the key finds it
                    with contextlib.suppress(ConductorAgentsError):
                        self._api.terminate_workflow(first_id, "conductor-agents: its mailbox could not be opened")
                raise
            log.warning("listener %s: its mailbox could not be opened (%s); callers hold its first run's id, and "
                        "senders outside this SDK reach it only until it is continued", first_id, err)
            return None
        return Chain(mailbox_id, run_id, spec.agent.name, 0, mailbox=True, human_wait=spec.human_wait)


def start_body(agent: Agent, prompt: str, run_id: str | None, spec: LinkSpec | None, *,
               context: dict[str, Any] | None, idempotency_key: str | None,
               model_settings: ModelSettings | None = None, config: dict[str, Any] | None = None) -> dict[str, Any]:
    """The body of ``POST /agent/start``: a continued listener's first link (``spec``), or a plain start;
    ``config``: the agent's config with ``model_settings`` applied, when the caller compiled it already."""
    config = apply_model_settings(agent.to_config(), model_settings) if config is None else config
    if spec is not None:
        assert run_id is not None
        return link_start_body(spec, run_id, link_key(run_id, 0, agent.name), number=0, turns_before=0,
                               config=config)
    body: dict[str, Any] = {"agentConfig": config, "prompt": prompt}
    if context is not None:
        body["context"] = context
    if run_id:
        body["runId"] = run_id
    if idempotency_key is not None:
        body["idempotencyKey"] = str(idempotency_key)
    return body
