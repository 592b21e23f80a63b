"""The verbs on a run named by its execution id: send a message, see and answer what it waits on.

:class:`RunsById` is the one implementation behind :meth:`AgentRuntime.send_message`,
``pending``, ``approve``, ``reject`` and ``respond`` and their :class:`AgentHandle` twins. A
continued listener is reached at its current run, whichever id of it the caller holds.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Optional

from .._common.clock import Clock
from .directory import Chain, ChainDirectory
from .sending import send_to_listener
from .._people import approvals
from .._people.pending import HumanAnswer, PendingRequest
from .._wire.api import ConductorApi
from ..settings import AgentSettings

__all__ = ["RunsById"]


class RunsById:
    """Messages and answers for runs named by execution id. Thread-safe (its directory is).

    ``chain``, where a verb takes it, is the chain the caller already knows ``execution_id`` by
    (a handle's); without it the directory looks it up (once per id and process).
    """

    def __init__(self, api: ConductorApi, directory: ChainDirectory, settings: AgentSettings, clock: Clock) -> None:
        self._api = api
        self._directory = directory
        self._settings = settings
        self._clock = clock

    def live_id(self, execution_id: str, chain: Optional[Chain] = None) -> str:
        """The current run of the listener ``execution_id`` names (itself unless it was continued; one small
        request for a continued listener, none otherwise)."""
        chain = self._directory.chain(execution_id) if chain is None else chain
        return self._directory.refresh(chain).execution_id if chain.continuable else execution_id

    def send_message(self, execution_id: str, body: Mapping[str, Any], *, pause: Callable[[float], Any]) -> str:
        """Push ``body`` (a checked message payload) into the listener's current run; its message id."""
        return send_to_listener(self._api, self._directory, execution_id, body,
                                switch_wait=self._settings.switch_wait_seconds, clock=self._clock, pause=pause,
                                on_accepted=self._directory.note_accepted)

    def pending(self, execution_id: str, *, chain: Optional[Chain] = None) -> "tuple[PendingRequest, ...]":
        return approvals.pending(self._api, self.live_id(execution_id, chain))

    def approve(self, execution_id: str, *, chain: Optional[Chain] = None, reason: Optional[str],
                by: Optional[str], request: "Optional[PendingRequest | str]", timeout: float) -> HumanAnswer:
        return approvals.approve(self._api, self.live_id(execution_id, chain), reason=reason, by=by,
                                 request=request, timeout=timeout, clock=self._clock)

    def reject(self, execution_id: str, reason: str, *, chain: Optional[Chain] = None, by: Optional[str],
               request: "Optional[PendingRequest | str]", timeout: float) -> HumanAnswer:
        return approvals.reject(self._api, self.live_id(execution_id, chain), reason, by=by, request=request,
                                timeout=timeout, clock=self._clock)

    def respond(self, execution_id: str, answer: Any, *, chain: Optional[Chain] = None, by: Optional[str],
                request: "Optional[PendingRequest | str]", timeout: float) -> HumanAnswer:
        return approvals.respond(self._api, self.live_id(execution_id, chain), answer, by=by, request=request,
                                 timeout=timeout, clock=self._clock)
