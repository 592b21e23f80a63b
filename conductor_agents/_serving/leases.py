"""Who serves a stateful run: a numbered lease per run, each number created once on the server.

A run served by :meth:`AgentRuntime.serve` has leases 0, 1, 2, ... (one per change of owner). Lease
``n`` of the run whose domain is ``D`` is a record the server creates once (:mod:`.._listener.records`: an
agent run started with ``idempotencyKey`` ``lease:D:n``). Every process that races to create it gets the same
execution, and exactly one racer's request created it. Its input names the owner's worker id, or none: a
process that closes writes the next lease with no owner (a release), so that another one may take the run
at once.

A lease's execution id is known without a search: the server derives it from the agent's name and
the key (:func:`.._listener.records.record_id`). Leases are never deleted: a run that changes hands
``k`` times has ``k + 1`` small ended runs of the lease agent beside it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import attrs

from .._listener.records import create_once, read_record, record_id
from .._wire.api import ConductorApi
from ..errors import ServerError

__all__ = ["LEASE_AGENT", "Lease", "LeaseBook", "lease_execution_id"]

log = logging.getLogger("conductor_agents.serve")

#: The lease agent's name (its runs show under this name on the server).
LEASE_AGENT = "conductor_agents_lease"
#: The highest lease number looked for: a run changing hands more often than this is a loop.
_MAX_EPOCH = 100_000


def lease_key(domain: str, epoch: int) -> str:
    return f"lease:{domain}:{epoch}"


def lease_execution_id(domain: str, epoch: int) -> str:
    """The execution id of lease ``epoch`` of the run on ``domain`` (whether or not it exists)."""
    return record_id(LEASE_AGENT, lease_key(domain, epoch))


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
        record = create_once(self._api, LEASE_AGENT, lease_key(domain, epoch),
                             {"owner": owner or "", "domain": domain, "epoch": epoch, "execution": execution_id},
                             prompt=f"lease {epoch} of run {execution_id or domain}", pause=self._pause,
                             kind="lease record")
        if record.context is None:
            return None
        held = Lease(domain, epoch, str(record.context.get("owner") or "") or None)
        self._remember(held)
        return held

    # -- internals --------------------------------------------------------------------

    def _read(self, domain: str, epoch: int) -> Lease | None:
        context = read_record(self._api, lease_execution_id(domain, epoch), tries=1)
        if context is None:
            return None
        if "owner" not in context:
            raise ServerError(f"lease {epoch} of domain {domain} has no record")
        return Lease(domain, epoch, str(context.get("owner") or "") or None)

    def _remember(self, lease: Lease) -> None:
        with self._lock:
            known = self._newest.get(lease.domain)
            if known is None or known.epoch <= lease.epoch:
                self._newest[lease.domain] = lease
