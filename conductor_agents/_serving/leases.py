"""Who serves a stateful run: a numbered lease per run, each number created once on the server.

A run served by :meth:`AgentRuntime.serve` has leases 0, 1, 2, ... (one per change of owner). Lease
``n`` of the run whose domain is ``D`` is an agent run the server creates once: ``POST /agent/start``
with ``idempotencyKey`` ``lease:D:n`` (the server's one atomic create-once, see
``docs/operations.md``). Every process that races to create it gets the same execution; the nonce in
its input says which request created it, so exactly one racer holds lease ``n``. Its input also names
the owner's worker id, or none: a process that closes writes the next lease with no owner (a
release), so that another one may take the run at once.

A lease's run is a ``manual`` team waiting on a person: it makes no model call and runs no worker.
It is terminated as soon as it has been read back: its record (the input) stays, and starting it
again with the same key still returns it (whatever its status), which is all a lease needs.

A lease's execution id is known without a search: the server derives it from the agent's name and
the key (:func:`conductor_agents._listener.chain.link_id`). Leases are never deleted: a run that changes hands
``k`` times has ``k + 1`` small ended runs of the lease agent beside it.
"""

from __future__ import annotations

import copy
import functools
import logging
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import attrs

from .._listener.chain import link_id
from .._wire.api import ConductorApi
from .._wire.starting import start_run
from .._wire.transport import HttpError
from ..errors import ExecutionNotFoundError, ServerError

__all__ = ["LEASE_AGENT", "Lease", "LeaseBook", "lease_execution_id"]

log = logging.getLogger("conductor_agents.serve")

#: The lease agent's name (its runs show under this name on the server).
LEASE_AGENT = "conductor_agents_lease"
_MODEL = "openai/none"  # never called: the team's first step waits on a person
#: The highest lease number looked for: a run changing hands more often than this is a loop.
_MAX_EPOCH = 100_000


@functools.lru_cache(maxsize=1)
def _lease_config() -> dict[str, Any]:
    # A manual team: its first task is a HUMAN pick. No model call, no worker task, until answered.
    from ..agent import Agent

    member = Agent(name=f"{LEASE_AGENT}_record", model=_MODEL, instructions="lease record")
    return Agent(name=LEASE_AGENT, model=_MODEL, instructions="lease record", agents=[member],
                 strategy="manual", max_turns=1).to_config()


def lease_key(domain: str, epoch: int) -> str:
    return f"lease:{domain}:{epoch}"


def lease_execution_id(domain: str, epoch: int) -> str:
    """The execution id of lease ``epoch`` of the run on ``domain`` (whether or not it exists)."""
    return link_id(LEASE_AGENT, lease_key(domain, epoch))


@attrs.frozen
class Lease:
    """Lease ``epoch`` of the run on ``domain``: held by ``owner`` (a worker id), or released (None)."""

    domain: str
    epoch: int
    owner: str | None

    @property
    def released(self) -> bool:
        return self.owner is None


class LeaseBook:
    """Creates and reads leases. Thread-safe; remembers the newest lease it saw of each run."""

    def __init__(self, api: ConductorApi, *, pause: Callable[[float], bool] = lambda s: False) -> None:
        self._api = api
        self._pause = pause
        self._lock = threading.Lock()
        self._newest: dict[str, Lease] = {}

    def forget(self, domain: str) -> None:
        with self._lock:
            self._newest.pop(domain, None)

    def known(self, domain: str) -> Lease | None:
        """The newest lease of ``domain`` seen here (no request)."""
        with self._lock:
            return self._newest.get(domain)

    def newest(self, domain: str) -> Lease | None:
        """The newest lease of the run on ``domain`` (None: it never had one). Reads from the last
        one known here upwards, one ``GET /workflow/{id}`` per lease number.

        Raises: ServerError (and subclasses) when the server could not be read.
        """
        with self._lock:
            known = self._newest.get(domain)
        epoch = known.epoch + 1 if known is not None else 0
        newest = known
        while epoch <= _MAX_EPOCH:
            found = self._read(domain, epoch)
            if found is None:
                break
            newest, epoch = found, epoch + 1
        if newest is not None:
            self._remember(newest)
        return newest

    def claim(self, domain: str, epoch: int, owner: str | None, *, execution_id: str = "") -> Lease | None:
        """Try to create lease ``epoch`` of ``domain`` for ``owner`` (None: a release).

        Returns the lease as the server holds it: ``owner`` if this call created it, whoever else
        did otherwise (None when its record could not be read back).

        Raises: ServerError (and subclasses) when the start itself failed.
        """
        nonce = uuid.uuid4().hex
        body = {
            "agentConfig": copy.deepcopy(_lease_config()),
            "prompt": f"lease {epoch} of run {execution_id or domain}",
            "idempotencyKey": lease_key(domain, epoch),
            "context": {"owner": owner or "", "nonce": nonce, "domain": domain, "epoch": epoch,
                        "execution": execution_id},
        }
        started = self._start(body)
        lease_id = str(started["executionId"])
        record = self._record(lease_id)
        if record is None:
            return None
        context = record
        held = Lease(domain, epoch, str(context.get("owner") or "") or None)
        if context.get("nonce") == nonce:
            self._terminate(lease_id)  # its record stays; the run need not wait on a person
        self._remember(held)
        return held

    # -- internals --------------------------------------------------------------------

    def _start(self, body: dict[str, Any]) -> dict[str, Any]:
        # Racers on one key may meet the server's execution lock: one of them then fails (a 5xx)
        # without creating anything; a second try finds the lease made.
        for attempt in range(1, 4):
            try:
                return start_run(self._api, body, pause=self._pause)
            except HttpError as err:
                if err.status is None or err.status < 500 or attempt == 3:
                    raise
                log.debug("lease start %s failed (%s); trying again", body["idempotencyKey"], err)
                if self._pause(0.2 * attempt):
                    raise
        raise AssertionError("unreachable")

    def _record(self, lease_id: str) -> dict[str, Any] | None:
        for _ in range(3):
            try:
                workflow = self._api.get_workflow(lease_id)
            except ExecutionNotFoundError:
                time.sleep(0.1)  # created on another node of a cluster, not yet visible here
                continue
            context = (workflow.get("input") or {}).get("context")
            return context if isinstance(context, dict) else {}
        return None

    def _read(self, domain: str, epoch: int) -> Lease | None:
        try:
            workflow = self._api.get_workflow(lease_execution_id(domain, epoch))
        except ExecutionNotFoundError:
            return None
        context = (workflow.get("input") or {}).get("context")
        if not isinstance(context, dict):
            raise ServerError(f"lease {epoch} of domain {domain} has no record")
        return Lease(domain, epoch, str(context.get("owner") or "") or None)

    def _terminate(self, lease_id: str) -> None:
        try:
            self._api.cancel_agent(lease_id, "lease recorded")
        except ServerError as err:  # it only waits on a person: harmless if left running
            log.debug("could not end lease run %s: %s", lease_id, err)

    def _remember(self, lease: Lease) -> None:
        with self._lock:
            known = self._newest.get(lease.domain)
            if known is None or known.epoch <= lease.epoch:
                self._newest[lease.domain] = lease
