"""Retiring a continued listener's older runs from the server (``Continuation.keep_runs``).

Every switch leaves an ended run on the server, and the server never deletes one by itself (its
archiving listener does not fire for agent runs; its prune endpoint needs a search index: see
``docs/operations.md``). So the process that serves a listener removes them: after each switch has
come to rest, and whenever it takes a listener up (a start, ``resume()``, an adoption), it runs a
*sweep*:

1. write the head hint (:mod:`.head`): the newest committed link's number, and read it back; without
   it a process that knows only the first run's id could not find the newest one once the runs in
   between are gone, so nothing is retired unless the hint is there;
2. retire, lowest first, every link from 1 (from 0 when the listener has a mailbox, the id callers hold
   then: :mod:`.mailbox`) up to ``head - 1 - keep_runs``: link 0 of a listener without a mailbox (the id
   callers hold) and the newest ``keep_runs`` ended links stay, with the live one. A link's sub-runs (its sub-agents
   and agent tools, and theirs) go before the link itself, which is what lists them.

Each step is idempotent and the removed links always form the lowest stretch after link 0, so a
process killed in the middle leaves a listener that the next sweep (any process's) finishes: it
finds the lowest link still there with a binary search and goes on from it.

Removal is ``DELETE /workflow/{id}/remove?archiveWorkflow=false``, the only call that frees every row
and key of a run on both SQLite and Redis. On a SQLite server with task indexing on, that call holds
the server's only database connection for 30 s and fails; the first failure or timeout is logged
once and the process uses ``archiveWorkflow=true`` from then on (frees the run, keeps its index rows).
Sweeps run on one background thread per process (``conductor-agents-retire``), never on a switch's
or a tool's path.
"""

from __future__ import annotations

import collections
import logging
import threading
from typing import Deque, Dict, Optional

from .._common.loops import BackgroundLoop
from .._liveness.tree import all_sub_runs
from .._wire.api import ConductorApi
from .._wire.transport import HttpError
from .directory import Chain, ChainDirectory
from .head import read_head, write_head
from ..errors import ConductorAgentsError, ExecutionNotFoundError, ServerUnavailableError

__all__ = ["Remover", "Retirer", "sweep"]

log = logging.getLogger("conductor_agents.continuation")

#: The longest one removal may take before it counts as hanging (a healthy server answers in 0.1 s).
REMOVE_TIMEOUT = 15.0


class Remover:
    """Removes runs from the server, falling back to archiving where a full removal fails. Thread-safe."""

    def __init__(self, api: ConductorApi, *, timeout: float = REMOVE_TIMEOUT) -> None:
        self._api = api
        self._timeout = timeout
        self._lock = threading.Lock()
        self.archive = False  # True once a full removal failed here: archive from then on
        self.removed = 0  # runs removed (tests, stats)

    def remove(self, execution_id: str) -> bool:
        """Remove one run; False when it could not be removed (logged), True when it is gone."""
        with self._lock:
            archive = self.archive
        if not archive:
            try:
                self._api.remove_workflow(execution_id, archive=False, timeout=self._timeout)
                return self._gone()
            except ExecutionNotFoundError:
                return True
            except (ServerUnavailableError, HttpError) as err:
                if isinstance(err, HttpError) and err.status < 500:
                    log.warning("run %s could not be removed (%s); it is kept", execution_id, err)
                    return False
                with self._lock:
                    first, self.archive = not self.archive, True
                if first:
                    log.warning(
                        "the server could not remove run %s in full (%s): on a SQLite server this is task "
                        "indexing (start it with conductor.app.taskIndexingEnabled=false, see "
                        "docs/operations.md). This process archives ended runs instead from now on (their "
                        "index rows stay)", execution_id, err)
        try:
            self._api.remove_workflow(execution_id, archive=True, timeout=self._timeout)
            return self._gone()
        except ExecutionNotFoundError:
            return True
        except (ServerUnavailableError, HttpError) as err:
            log.warning("run %s could not be removed (%s); it is kept until the next sweep", execution_id, err)
            return False

    def _gone(self) -> bool:
        with self._lock:
            self.removed += 1
        return True


def sweep(api: ConductorApi, directory: ChainDirectory, chain: Chain, head: int, keep: Optional[int],
          remover: Remover, stop: Optional[threading.Event] = None, *, with_sub_runs: bool = True) -> int:
    """Write the head hint for committed link ``head`` and retire the links ``keep`` allows (see the
    module's docstring); how many links were retired. ``keep`` None keeps every run. ``with_sub_runs``
    False: the agent starts no sub-runs (no sub-agents, no agent tools), so a link's task list (up to a
    megabyte) is not read to find them.

    Raises:
        ServerUnavailableError, ServerError: a read or the hint's write failed (the next sweep goes on).
    """
    if not chain.continuable:
        return 0
    assert chain.run_id is not None
    if chain.first != 0 and not chain.mailbox:  # served from a later run's id: link 0 is the one callers hold
        chain = Chain(chain.link(0).execution_id, chain.run_id, chain.agent_name, 0)
    write_head(api, chain.run_id, head)
    if keep is None:
        return 0
    hint = read_head(api, chain.run_id)
    if hint < head:
        log.warning("listener %s: its head hint reads %d after link %d was written; nothing is retired this time",
                    chain.execution_id, hint, head)
        return 0
    bound = head - 1 - keep
    lowest = directory.lowest_kept(chain, bound)
    if lowest is None:
        return 0
    retired = 0
    for number in range(lowest, bound + 1):
        if stop is not None and stop.is_set():
            break
        link = chain.link(number)
        subs = all_sub_runs(api, link.execution_id) if with_sub_runs else []
        if not all([remover.remove(run) for run in subs]):
            break  # the link lists the sub-runs left: keep it, so the next sweep finds them
        if not remover.remove(link.execution_id):
            break  # removed lowest first: a link left behind stops the sweep (the next one goes on)
        retired += 1
    if retired:
        log.info("listener %s: retired %d ended run(s) (links %d-%d; the newest %d ended kept)",
                 chain.execution_id, retired, lowest, lowest + retired - 1, keep)
    return retired


class Retirer:
    """The ``conductor-agents-retire`` thread of one process: sweeps asked for, one at a time, coalesced
    per listener. Thread-safe; owned by the :class:`~._driver.ContinuationDriver`.
    """

    def __init__(self, api: ConductorApi, directory: ChainDirectory, *, remover: Optional[Remover] = None) -> None:
        self._api = api
        self._directory = directory
        self.remover = remover if remover is not None else Remover(api)
        self._lock = threading.Lock()
        self._wanted: Dict[str, "tuple[Chain, int, Optional[int], bool]"] = {}  # run id -> sweep's arguments
        self._order: Deque[str] = collections.deque()
        self._wake = threading.Event()
        self._stop = threading.Event()
        # A daemon: a sweep cut short leaves the lowest links for the next sweep (any process's).
        self._thread = BackgroundLoop("retire", self._loop, daemon=True, stop=self._stop, wake=self._wake)
        self._busy = False
        self.sweeps = 0  # sweeps done (tests)

    def request(self, chain: Chain, head: int, keep: Optional[int], *, with_sub_runs: bool = True) -> None:
        """Sweep ``chain`` with committed link ``head`` soon (a later request for it replaces this one)."""
        if not chain.continuable or self._stop.is_set():
            return
        key = str(chain.run_id)
        with self._lock:
            known = self._wanted.get(key)
            if known is None:
                self._order.append(key)
            self._wanted[key] = (chain, max(head, known[1]) if known else head, keep, with_sub_runs)
        self._thread.start_once()
        self._wake.set()

    def idle(self) -> bool:
        """No sweep waiting or under way (tests)."""
        with self._lock:
            return not self._order and not self._busy

    def _loop(self) -> None:
        while not self._stop.is_set():
            with self._lock:
                key = self._order.popleft() if self._order else None
                job = self._wanted.pop(key, None) if key is not None else None
                self._busy = job is not None
                if job is None:
                    self._wake.clear()
            if job is None:
                self._wake.wait(5.0)
                continue
            chain, head, keep, with_sub_runs = job
            try:
                sweep(self._api, self._directory, chain, head, keep, self.remover, stop=self._stop,
                      with_sub_runs=with_sub_runs)
            except ConductorAgentsError as err:
                log.warning("listener %s: retiring its older runs failed (%s); the next switch or take-up tries "
                            "again", chain.execution_id, err)
            except Exception:  # noqa: BLE001 - the thread serves every listener of the process
                log.exception("listener %s: retiring its older runs failed", chain.execution_id)
            finally:
                with self._lock:
                    self.sweeps += 1
                    self._busy = False

    def close(self, timeout: float = 15.0) -> None:
        """Stop between two removals and join the thread (bounded). Idempotent."""
        self._thread.stop()
        self._thread.join(timeout)
