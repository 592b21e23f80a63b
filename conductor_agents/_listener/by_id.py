"""The verbs on a run named by its execution id: send a message, see and answer what it waits on.

:class:`RunsById` is the one implementation behind :class:`AgentHandle`'s ``send_message``, ``signal``,
``pending``, ``approve``, ``reject`` and ``respond`` (the runtime's verbs by execution id are the handle's). A
continued listener is reached at its current run, whichever id of it the caller holds. People in
the loop are reached in every run that may hold a request (:func:`people_runs`): while a switch
drains the old run, that run may wait for a person (the approval of a call the model made in the
turn the switch began, a question, a review) and the switch waits for the answer; the answer goes
to the run that holds the request (see ``docs/humans.md``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from .._common.clock import Clock
from .._people import approvals
from .._people.pending import HumanAnswer, PendingRequest
from .._wire.api import ConductorApi
from ..errors import AgentTypeError, AnswerConflictError, ExecutionNotFoundError, ExecutionNotRunningError
from ..settings import AgentSettings
from .directory import Chain, ChainDirectory
from .following import is_running, live_links
from .naming import names_errors
from .sending import send_to_listener
from .signals import post_signal

__all__ = ["RunsById", "check_signal", "pending_of_agent", "people_runs"]


def check_signal(text: object) -> str:
    """``text`` if it can be a run's signal (a str; ``""`` clears it).

    Raises: AgentTypeError: not a str.
    """
    if not isinstance(text, str):
        raise AgentTypeError(f"a signal must be a str ('' clears it), got {text!r}", field="text", value=text)
    return text


def people_runs(api: ConductorApi, directory: ChainDirectory, execution_id: str, chain: Chain | None = None, *,
                request: PendingRequest | str | None = None) -> tuple[str, ...]:
    """The runs of the listener ``execution_id`` names that may hold a request for a person, oldest
    first; the last is its current run.

    The current run, and the one before while a switch drains it (its status: one small request),
    whichever run of the listener ``execution_id`` is. An answer to a named ``request`` also looks at
    the run before when it has ended (a late answer is told who answered), and at the run a
    :class:`PendingRequest` came from. A run that is not a continued listener is its only run (no request).
    """
    chain = directory.chain(execution_id) if chain is None else chain
    if not chain.continuable:
        return (execution_id,)
    newest = directory.refresh(chain)
    runs: list[str] = [newest.execution_id]
    if newest.number > 0:
        previous = chain.link(newest.number - 1).execution_id
        if request is not None or is_running(api, previous):
            runs.insert(0, previous)
    if isinstance(request, PendingRequest) and request.held_in not in runs:
        try:
            held = directory.chain(request.held_in)
        except ExecutionNotFoundError:
            return tuple(runs)  # retired from the server: the answer is told there is no such request
        if (held.run_id, held.agent_name) == (chain.run_id, chain.agent_name):
            runs.insert(0, request.held_in)
    return tuple(runs)


def pending_of_agent(api: ConductorApi, directory: ChainDirectory, agent_name: str) -> tuple[PendingRequest, ...]:
    """What every running run of agent ``agent_name`` waits on, each request named by the id callers
    hold for its listener (one status read per listener, once per process, and one poll-data read)."""
    found = approvals.pending_of_agent(api, agent_name)
    listener_ids: dict[str, str] = {}
    for request in found:
        if request.held_in not in listener_ids:
            try:
                listener_ids[request.held_in] = directory.anchor(directory.chain(request.held_in)).execution_id
            except ExecutionNotFoundError:
                listener_ids[request.held_in] = request.held_in  # ended since: named by its own run
    return tuple(request.known_as(listener_ids[request.held_in]) for request in found)


class RunsById:
    """Messages and answers for runs named by execution id. Thread-safe (its directory is).

    ``chain``, where a verb takes it, is the chain the caller already knows ``execution_id`` by (a handle's,
    from the directory: ``directory.chain(execution_id)``).
    """

    def __init__(self, api: ConductorApi, directory: ChainDirectory, settings: AgentSettings, clock: Clock) -> None:
        self._api = api
        self._directory = directory
        self._settings = settings
        self._clock = clock

    def send_message(self, execution_id: str, body: Mapping[str, Any], *, pause: Callable[[float], Any]) -> str:
        """Push ``body`` (a checked message payload) into the listener's current run; its message id."""
        return send_to_listener(self._api, self._directory, execution_id, body,
                                switch_wait=self._settings.switch_wait_seconds, clock=self._clock, pause=pause,
                                on_accepted=self._directory.note_accepted)

    @names_errors
    def signal(self, execution_id: str, text: str, *, chain: Chain, pause: Callable[[float], Any]) -> None:
        """Set the standing signal of the listener ``execution_id`` names: its current run, and the run
        before while a switch drains it (the switch carries the signal over too: see :mod:`.signals`).

        Raises:
            ExecutionNotRunningError: no run of it is running.
        """
        posted: set[str] = set()
        reached = False
        for _ in range(3):  # a switch that began meanwhile copies the old run's signal: reach its new run too
            links = [link for link in live_links(self._api, self._directory, chain)
                     if link.execution_id not in posted]
            if not links:
                break
            for link in links:
                posted.add(link.execution_id)
                reached = post_signal(self._api, link.execution_id, text, pause=pause, clock=self._clock) or reached
        if not reached:
            raise ExecutionNotRunningError(f"execution {execution_id!r} is not running; a signal cannot reach it",
                                           execution_id=execution_id)

    @names_errors
    def pending(self, execution_id: str, *, chain: Chain) -> tuple[PendingRequest, ...]:
        """What the listener ``execution_id`` names waits on, each request named by the listener's id."""
        *earlier, current = people_runs(self._api, self._directory, execution_id, chain)
        found = approvals.pending(self._api, current, earlier=earlier)
        if not found or not chain.continuable:
            return found
        listener_id = self._directory.anchor(chain).execution_id
        return tuple(request.known_as(listener_id) for request in found)

    def approve(self, execution_id: str, *, chain: Chain, reason: str | None,
                by: str | None, request: PendingRequest | str | None, timeout: float) -> HumanAnswer:
        return self._answer(approvals.approve, execution_id, chain, request=request, reason=reason, by=by,
                            timeout=timeout)

    def reject(self, execution_id: str, reason: str, *, chain: Chain, by: str | None,
               request: PendingRequest | str | None, timeout: float) -> HumanAnswer:
        return self._answer(approvals.reject, execution_id, chain, reason, request=request, by=by, timeout=timeout)

    def respond(self, execution_id: str, answer: Any, *, chain: Chain, by: str | None,
                request: PendingRequest | str | None, timeout: float) -> HumanAnswer:
        return self._answer(approvals.respond, execution_id, chain, answer, request=request, by=by, timeout=timeout)

    @names_errors
    def _answer(self, verb: Callable[..., HumanAnswer], execution_id: str, chain: Chain, *args: Any,
                request: PendingRequest | str | None, **kwargs: Any) -> HumanAnswer:
        """``verb`` (:func:`approvals.approve`, ``reject`` or ``respond``) on the run of the listener that
        holds ``request``, the answer named by the id callers hold."""
        *earlier, current = people_runs(self._api, self._directory, execution_id, chain, request=request)
        with self._named(chain) as named:
            return named(verb(self._api, current, *args, request=request, clock=self._clock, earlier=earlier,
                              **kwargs))

    @contextlib.contextmanager
    def _named(self, chain: Chain) -> Iterator[Callable[[HumanAnswer], HumanAnswer]]:
        """Names an answer (and a conflict's winner) by the id callers hold for the listener ``chain`` is."""
        def named(answer: HumanAnswer) -> HumanAnswer:
            if not chain.continuable:
                return answer
            return answer.known_as(self._directory.anchor(chain).execution_id)

        try:
            yield named
        except AnswerConflictError as err:
            if isinstance(err.winner, HumanAnswer):
                err.winner = named(err.winner)
            raise
