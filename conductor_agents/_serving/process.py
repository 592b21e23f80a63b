"""Serving agents from one process: its :class:`Service` (presence, leases, adoption), made on first use.

:meth:`AgentRuntime.serve` hands each agent to :class:`ProcessServing`; the first one makes the
process's Service. A forked child serves again, with a Service of its own, the agents its parent
served. Its two parts to close, :attr:`ProcessServing.adoption` and :attr:`ProcessServing.presence`, go
before and after the workers in the runtime's ``close()``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from typing import Any

from .._common.parts import Part, Step
from .._wire.api import ConductorApi
from .._worker.workers import WorkerSet
from ..agent import Agent, check_agent
from ..errors import AgentDefinitionError, AgentTypeError, ConfigurationError
from ..settings import AgentSettings
from .service import Service

__all__ = ["ProcessServing", "ServedAgents", "check_servable"]

log = logging.getLogger("conductor_agents.runtime")

#: ``on_adopt(handle)``, or None.
AdoptHook = Callable[[Any], Any] | None


def check_servable(agent: Any, on_adopt: Any, settings: AgentSettings) -> None:
    """Whether ``serve(agent, on_adopt=on_adopt)`` may serve ``agent`` with these settings.

    Raises: as :meth:`AgentRuntime.serve` (AgentTypeError, AgentDefinitionError, ConfigurationError).
    """
    check_agent(agent)
    if on_adopt is not None and not callable(on_adopt):
        raise AgentTypeError(f"on_adopt must be callable, got {on_adopt!r}", field="on_adopt", value=on_adopt)
    if not agent.is_stateful:
        raise AgentDefinitionError(
            f"serve() adopts the runs of a stateful agent; {agent.name!r} is not stateful (its tools are "
            "served by any process that polls them): use Agent(stateful=True) or a WaitForMessageTool",
            field="stateful", value=False)
    if not settings.auto_start_workers:
        raise ConfigurationError("serve() needs auto_start_workers: with it off this runtime serves no tools",
                                 variable="CONDUCTOR_AGENT_AUTO_START_WORKERS")


class ServedAgents:
    """The agents ``serve()`` was called for, with their ``on_adopt`` hooks, one per agent name. Thread-safe.

    Fork: the owner calls :meth:`forked` first thing in a child (a parent thread may have held the lock at
    the fork); :meth:`agents` takes no lock (it reads an immutable tuple, replaced whole under the lock).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._served: tuple[tuple[Agent, AdoptHook], ...] = ()
        self._any = False

    def forked(self) -> None:
        """In a forked child, before anything else uses this: a lock of the child's own."""
        self._lock = threading.Lock()

    def put(self, agent: Agent, on_adopt: AdoptHook) -> bool:
        """Serve ``agent`` with ``on_adopt`` (the hook replaces an earlier one of its name); whether it is the
        first agent ever served (True once)."""
        with self._lock:
            self._served = (*((a, h) for a, h in self._served if a.name != agent.name), (agent, on_adopt))
            first, self._any = not self._any, True
            return first

    def agents(self) -> list[tuple[Agent, AdoptHook]]:
        """The agents served, with their hooks, in the order first served. Takes no lock."""
        return list(self._served)


class ProcessServing:
    """The :class:`Service` of one process of a runtime, made on the first :meth:`add`. Thread-safe.

    ``adopt(execution_id, agent)`` serves a run whose lease this process won; ``pause`` waits
    between retries and returns at once when the runtime closes.
    """

    def __init__(self, api: ConductorApi, settings: AgentSettings, workers: WorkerSet, *, worker_id: str,
                 adopt: Callable[[str, Agent], Any], pause: Callable[[float], bool]) -> None:
        self._api = api
        self._settings = settings
        self._workers = workers
        self._worker_id = worker_id
        self._adopt = adopt
        self._pause = pause
        self._lock = threading.Lock()
        self._service: Service | None = None

    def get(self) -> Service | None:
        """This process's Service; None before the first :meth:`add`."""
        return self._service

    def add(self, agent: Agent, on_adopt: AdoptHook) -> None:
        """Serve ``agent`` from this process too (the first call writes its presence row).

        Raises: WorkerStartupError: the first presence row could not be written and read back.
        """
        self._for_process().add(agent, on_adopt)

    def _for_process(self) -> Service:
        with self._lock:
            if self._service is None:
                self._service = Service(
                    self._api, worker_id=self._worker_id, dead_after=self._settings.liveness_stall_seconds,
                    adopt=self._adopt, serving_here=self._workers.serves_domain, let_go=self._workers.let_go,
                    pause=self._pause)
                self._workers.serve_gate = self._service.may_serve  # no task of a lapsed lease runs here
            return self._service

    def serve_again(self, served: Callable[[], Iterable[tuple[Agent, AdoptHook]]]) -> None:
        """In a forked child: serve what the parent served, as a process of its own (on a thread: the
        first presence row is a request, and the fork must return at once)."""
        threading.Thread(target=self._serve_all, args=(served,), name="conductor-agents-serve-start",
                         daemon=True).start()  # daemon: what it has not added yet is not served by this child

    def _serve_all(self, served: Callable[[], Iterable[tuple[Agent, AdoptHook]]]) -> None:
        for agent, on_adopt in list(served()):
            try:
                self.add(agent, on_adopt)
            except Exception:  # logged; this child serves only what it starts
                log.exception("forked child %s could not serve %s", self._worker_id, agent.name)

    @property
    def adoption(self) -> Part:
        """Adoption as a part to close: first, so that no run is taken up while the workers stop. The Service
        is looked up when the part is closed (one a concurrent first ``serve()`` made is closed too)."""
        return Step("adoption", lambda: self._close(lambda service: service.adopter.close()))

    @property
    def presence(self) -> Part:
        """Presence as a part to close: after the workers, it marks this process gone (the hand-over)."""
        return Step("presence", lambda: self._close(lambda service: service.presence.close()))

    def _close(self, close: Callable[[Service], None]) -> None:
        """``close(service)``, if this process has a Service by now."""
        with self._lock:
            service = self._service
        if service is not None:
            close(service)
