"""Adopting the runs of a served agent that no live process serves, one lease at a time.

Each round (right after each presence read) the adopter lists the agent's running runs (``GET
/workflow/running/{name}``: one indexed read), groups them by domain (a continued listener's runs
share one) and, for each run this process does not hold, decides from what it already knows:

- its newest lease's owner is present (its presence row is fresh): nothing to do, no request;
- the owner is gone (closed, marked gone), silent past ``dead_after``, a process of this host that
  no longer exists, or this very process (a run it released): the run is an orphan;
- it never had a lease (a runtime that does not serve the agent started it): an orphan once it is
  older than ``dead_after`` and no other worker polled its domain within the freshness window.

Orphans are spread: each goes to the present process its domain hashes to; any other present
process takes it only when it is still an orphan two rounds later (the chosen one may be slow). A
process takes a run by creating its next lease; if another process created that lease first, it
leaves the run alone. Then it serves the run as ``resume()`` would (its workers, its tasks taken by
the dead process handed back, a switch left half done finished).
"""

from __future__ import annotations

import concurrent.futures
import concurrent.futures.thread  # registers its exit hook before ours: see _EXITING
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import attrs

from .._common.loops import BackgroundLoop
from .._wire.api import ConductorApi
from ..errors import ConductorAgentsError, ExecutionNotFoundError, ServerError
from .leases import Lease, LeaseBook
from .live_workers import find_live_poller, worker_is_dead_here
from .presence import PeerView, Presence

__all__ = ["Adopter", "ServedAgent"]

log = logging.getLogger("conductor_agents.serve")

#: Runs looked at (and taken up) at once in one round: most of a take-up is waiting on the server.
_TAKE_UPS_AT_ONCE = 8

#: How long a held domain whose runs have all ended is kept for its next run (a schedule's domain between two
#: runs) before that run needs a new lease.
_RESTED_SECONDS = 3600.0

#: Set when the interpreter begins to exit: a process on its way out adopts nothing. CPython runs the
#: threading exit hooks in reverse order of registration, before non-daemon threads are joined; the
#: executors' own hook (registered when ``concurrent.futures.thread`` is first imported) shuts their
#: pools down. Importing that module above, before registering here, makes this hook run first, so
#: no round starts a take-up on a pool that is shutting down. The runtime itself is closed later, by
#: an ``atexit`` hook.
_EXITING = threading.Event()
if hasattr(threading, "_register_atexit"):
    threading._register_atexit(_EXITING.set)


@attrs.frozen
class ServedAgent:
    agent: Any  # an Agent
    on_adopt: Callable[[Any], Any] | None = None


@attrs.frozen
class _RunInfo:
    domain: str | None
    start_ms: float


class Adopter:
    """The ``conductor-agents-adopt`` thread of one process. Thread-safe."""

    def __init__(self, api: ConductorApi, book: LeaseBook, presence: Presence, *, worker_id: str,
                 adopt: Callable[[str, Any], Any], serving_here: Callable[[str], bool],
                 let_go: Callable[[str], None] = lambda domain: None) -> None:
        self._api = api
        self._book = book
        self._presence = presence
        self._worker_id = worker_id
        self._adopt = adopt
        self._serving_here = serving_here
        self._let_go = let_go
        self._lock = threading.Lock()
        self._agents: dict[str, ServedAgent] = {}
        self._held: dict[str, Lease] = {}
        #: Held domains whose lease lapsed at a fence: no task of theirs runs here until the lease is renewed (the
        #: next lease won by this process), or they are let go of (another process took the next lease meanwhile).
        self._lapsed: set[str] = set()
        #: Leases renewed after a fence, and when to look once more that no other process made a newer one.
        self._renewed: dict[str, tuple[Lease, float]] = {}
        self._runs: dict[str, _RunInfo] = {}
        self._orphan_since: dict[str, float] = {}
        self._taken: dict[str, set[str]] = {}  # held domain -> the runs of it taken up here
        # Domains held here whose runs had all ended at the last round (a schedule's domain between two of its
        # runs): lease and when. The next run of such a domain is taken up on the same lease while it is still
        # the domain's newest; a new lease would be a change of owner that did not happen.
        self._rested: dict[str, tuple[Lease, float]] = {}
        self._wake = threading.Event()
        # Daemon: if it dies with the interpreter, only adoptions by this process are lost (the
        # other present processes adopt the orphans).
        self._thread = BackgroundLoop("adopt", self._loop, daemon=True, wake=self._wake)
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None  # take-ups of one round, at once
        #: Domains whose look (and take-up) is still under way, and since when: a later round skips them. A take-up
        #: can be slow (a start whose answer was lost is sent again for up to half a minute, each try bounded by the
        #: HTTP timeout); the rounds go on meanwhile, so one slow run never keeps the others unserved.
        self._in_flight: dict[str, float] = {}
        self._slow: set[str] = set()  # those of them said to be slow (once each)
        self._why: dict[str, str] = {}  # why each domain was last left alone (said at DEBUG when it changes)
        #: Each agent's runs and their domains as its latest round listed them.
        self._seen: dict[str, tuple[frozenset[str], frozenset[str]]] = {}
        #: Counts, for tests and stats: runs adopted, leases lost to another process.
        self.adopted = 0
        self.lost = 0

    # -- what the runtime tells it --------------------------------------------------------

    def add(self, served: ServedAgent) -> None:
        with self._lock:
            self._agents[served.agent.name] = served

    def serves(self, agent_name: str) -> bool:
        with self._lock:
            return agent_name in self._agents

    def hold(self, lease: Lease) -> None:
        with self._lock:
            self._held[lease.domain] = lease
            self._orphan_since.pop(lease.domain, None)

    def held(self) -> list[str]:
        with self._lock:
            return list(self._held)

    def holds_lease(self, domain: str) -> bool:
        """Whether this process holds the lease of the run on ``domain``."""
        with self._lock:
            return domain in self._held

    def lapse_all(self) -> list[str]:
        """The fence: every lease held lapses (:meth:`lapsed`); the domains, sorted. The runs stay registered here:
        once this process's presence is renewed, each round renews their leases first (:meth:`renew_lapsed`)."""
        with self._lock:
            self._lapsed |= set(self._held)  # (a rested domain's next run checks that its lease is still the newest)
            return sorted(self._lapsed)

    def lapsed(self, domain: str) -> bool:
        """Whether this process holds the lease of ``domain`` and it lapsed at a fence, not yet renewed."""
        with self._lock:
            return domain in self._lapsed

    def renew_lapsed(self) -> int:
        """Take the next lease of each lapsed domain (at once, on the round's pool; bounded by a round's wait): won,
        the runs are served here again as they were; lost (another process adopted the run while this one could
        not renew its presence), they are let go of. Kept lapsed when the server cannot say. The number renewed."""
        with self._lock:
            lapsed = [(domain, self._held[domain]) for domain in sorted(self._lapsed) if domain in self._held]
        futures = [f for domain, lease in lapsed if (f := self._in_flight_look(domain, self._renew, lease)) is not None]
        return self._count_done(futures, "renewing a lapsed lease")

    def _renew(self, lease: Lease) -> bool:
        if self._stopping():
            return False
        won = self._book.claim(lease.domain, lease.epoch + 1, self._worker_id)
        if won is not None and won.owner == self._worker_id:
            with self._lock:
                if lease.domain in self._held:
                    self._held[lease.domain] = won
                self._lapsed.discard(lease.domain)
                self._renewed[lease.domain] = (won, time.monotonic() + self._presence.interval * 2)
            log.info("kept serving the runs on domain %s after the fence (lease %d: no other process took them)",
                     lease.domain, won.epoch)
            return True
        if won is None:
            return False  # its record could not be read back: looked at again next round
        self._superseded(won)
        return False

    def _superseded(self, newer: Lease) -> None:
        """Another process holds ``newer``, the domain's newest lease: let the runs on it go."""
        with self._lock:
            self._held.pop(newer.domain, None)
            self._lapsed.discard(newer.domain)
            self._renewed.pop(newer.domain, None)
        self._book.forget(newer.domain)
        log.info("process %s took the runs on domain %s while this one could not renew its presence (lease %d): "
                 "letting them go", newer.owner or "(none: released)", newer.domain, newer.epoch)
        try:
            self._let_go(newer.domain)
        except Exception:
            log.exception("could not stop serving domain %s", newer.domain)

    def check_renewed(self) -> None:
        """A round after a lapsed lease was renewed, read the domain's newest lease once more: a process that adopted
        the runs on a view of who was present read before the renewal (the window ``_adopt_if_orphan`` closes from
        its side, up to the read itself) made a newer lease, and the runs are let go of here."""
        now = time.monotonic()
        with self._lock:
            due = [lease for lease, at in self._renewed.values() if at <= now]
            for lease in due:
                del self._renewed[lease.domain]
        for lease in due:
            try:
                newest = self._book.newest(lease.domain)
            except (ServerError, OSError) as err:
                log.debug("the lease of domain %s could not be read again after its renewal (%s)", lease.domain, err)
                continue
            if newest is not None and newest.epoch > lease.epoch and newest.owner != self._worker_id:
                self._superseded(newest)

    def wake(self) -> None:
        self._wake.set()

    # -- the thread ---------------------------------------------------------------------

    def start(self) -> None:
        """Start the thread; only the first call does."""
        self._thread.start_once()

    def close(self) -> None:
        """Stop adopting: stop the thread, join it (30 s at most), then the pool of its take-ups. Idempotent,
        safe before start."""
        self._thread.stop()
        self._thread.join(30.0)
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)

    def _stopping(self) -> bool:
        return self._thread.stopping or _EXITING.is_set()

    def _loop(self) -> None:
        while not self._stopping():
            self._wake.wait(self._presence.interval * 2)
            self._wake.clear()
            if self._stopping():
                return
            with self._lock:
                agents = list(self._agents.values())
                renew = bool(self._lapsed)
            if renew and self._presence.holds():
                try:
                    self.renew_lapsed()
                except Exception:  # the thread must go on
                    log.exception("renewing lapsed leases failed")
            try:
                self.check_renewed()
            except Exception:  # the thread must go on
                log.exception("checking renewed leases failed")
            for served in agents:
                if self._stopping():
                    return
                try:
                    self.run_round(served)
                except (ServerError, OSError) as err:
                    log.debug("adoption round for %s failed: %s", served.agent.name, err)
                except Exception:  # the thread must go on
                    log.exception("adoption round for %s failed", served.agent.name)

    # -- one round ----------------------------------------------------------------------

    def run_round(self, served: ServedAgent) -> int:
        """Look at every running run of ``served``'s agent once; the number of runs adopted."""
        agent = served.agent
        view = self._presence.view(agent.name)
        if view is None or not self._presence.holds():
            return 0  # no fresh evidence of who is present, or this process may not take leases now
        ids = self._api.running_workflow_ids(agent.name)
        by_domain: dict[str, list[str]] = {}
        oldest: dict[str, float] = {}
        for execution_id in ids:
            info = self._run_info(execution_id)
            if info is None or not info.domain:
                continue
            by_domain.setdefault(info.domain, []).append(execution_id)
            oldest[info.domain] = min(oldest.get(info.domain, info.start_ms), info.start_ms)
        self._prune(agent.name, set(ids), set(by_domain))
        futures = [future for domain, executions in by_domain.items()
                   if (future := self._in_flight_look(domain, self._adopt_if_orphan, served, view, domain,
                                                      executions[0], oldest[domain])) is not None]
        adopted = self._count_done(futures, f"adopting a run of {agent.name}")
        if not agent.is_listener:  # a listener's runs share its domain one after the other: its chain follows them
            adopted += self._take_up_siblings(served, by_domain)
        return adopted

    def _in_flight_look(self, domain: str, look: Callable[..., bool],
                        *args: Any) -> concurrent.futures.Future[bool] | None:
        """``look(*args)`` on the round's pool, unless a look at ``domain`` is still under way (None then; said at INFO
        once it has taken longer than a round's wait)."""
        now = time.monotonic()
        with self._lock:
            since = self._in_flight.setdefault(domain, now)
            tell = since != now and now - since > self._round_wait() and domain not in self._slow
            if tell:
                self._slow.add(domain)
        if since != now:
            if tell:
                log.info("a look at the runs on domain %s is still under way after %.0fs (other runs are looked at "
                         "meanwhile)", domain, now - since)
            return None
        try:
            future = self._round_pool().submit(look, *args)
        except RuntimeError:  # the interpreter is exiting (its executors are shut down)
            self._landed(domain)
            return None
        future.add_done_callback(lambda _: self._landed(domain))
        return future

    def _count_done(self, futures: list[concurrent.futures.Future[bool]], what: str) -> int:
        """How many of ``futures`` came back True within a round's wait (the others go on); failures said at DEBUG."""
        done, _ = concurrent.futures.wait(futures, timeout=self._round_wait())
        count = 0
        for future in done:
            try:
                count += bool(future.result())
            except (ServerError, OSError) as err:
                log.debug("%s failed: %s", what, err)
        return count

    def _landed(self, domain: str) -> None:
        with self._lock:
            self._in_flight.pop(domain, None)
            self._slow.discard(domain)

    def _round_wait(self) -> float:
        """How long a round waits for its looks before the next may begin (they go on meanwhile)."""
        return self._presence.interval * 4

    def _take_up_siblings(self, served: ServedAgent, by_domain: dict[str, list[str]]) -> int:
        """Take up the running runs of a domain this process holds that it does not serve yet: the runs of
        one schedule share a domain (``_scheduling``), the later ones started after the first was adopted.
        The domain's lease is this process's already: no new one is made."""
        with self._lock:  # domains adopted here only: a run this process started on its own domain is served
            held = [(domain, set(runs)) for domain, runs in self._taken.items()
                    if domain in self._held and domain in by_domain]
        count = 0
        for domain, taken in held:
            for execution_id in by_domain[domain]:
                if execution_id in taken or self._stopping():
                    continue
                try:
                    handle = self._adopt(execution_id, served.agent)
                except (ConductorAgentsError, OSError) as err:
                    log.warning("could not take up run %s of domain %s held here (%s)", execution_id, domain, err)
                    continue
                self._note_taken(domain, execution_id)
                log.info("serving %s run %s too (domain %s, held here)", served.agent.name, execution_id, domain)
                count += 1
                _tell_adopted(served, handle, execution_id)
        return count

    def _note_taken(self, domain: str, execution_id: str) -> None:
        with self._lock:
            self._taken.setdefault(domain, set()).add(execution_id)

    def _round_pool(self) -> concurrent.futures.ThreadPoolExecutor:
        with self._lock:
            if self._pool is None:
                self._pool = concurrent.futures.ThreadPoolExecutor(
                    max_workers=_TAKE_UPS_AT_ONCE, thread_name_prefix="conductor-agents-adopt")
            return self._pool

    def _adopt_if_orphan(self, served: ServedAgent, view: PeerView, domain: str, execution_id: str,
                         start_ms: float) -> bool:
        me = self._worker_id
        with self._lock:
            held = domain in self._held
            rested = None if held else self._rested.pop(domain, None)
        if held:
            return self._not_now(domain, "held here")
        if rested is not None and self._take_up_rested(served, domain, execution_id, rested[0]):
            return True
        if self._serving_here(domain):  # served here without a lease of its own making (resume() without serve())
            return self._not_now(domain, "served here without a lease")
        known = self._book.known(domain)
        if known is not None and self._present(view, known.owner):
            return self._not_now(domain, f"lease {known.epoch} held by {known.owner}, present")
        lease = self._book.newest(domain)
        if lease is not None and self._present(view, lease.owner):
            return self._not_now(domain, f"lease {lease.epoch} held by {lease.owner}, present")
        now = time.monotonic()
        if lease is None and (time.time() - start_ms / 1000.0) < self._presence.dead_after:
            return self._not_now(domain, "started lately, with no lease")  # by a runtime that does not serve it
        if self._stopping():
            return False
        with self._lock:
            first = self._orphan_since.setdefault(domain, now)
        if view.assignee(domain) != me and now - first < self._presence.interval * 2 + 1.0:
            return self._not_now(domain, f"an orphan for its assignee {view.assignee(domain)} first")
        previous = lease.owner if lease is not None else None
        ignore = set(view.gone) | ({previous} if previous else set())
        tool_types = [t.name for t in served.agent.worker_tools]
        live = find_live_poller(self._api, tool_types, domain, own_worker_id=me, ignore=ignore)
        if live is not None:  # someone else polls it (a resume() elsewhere): not an orphan
            return self._not_now(domain, f"polled by {live.worker_id} {live.seconds_ago:.0f}s ago")
        if previous and previous != me and self._present(self._presence.read_again(served.agent.name), previous):
            # Present after all: its presence was renewed after the round's view was read (a process back from a
            # fence renews its presence, then its leases). Claimed on the stale view, the run had two owners.
            return self._not_now(domain, f"lease {lease.epoch if lease else -1} held by {previous}, present now")
        epoch = lease.epoch + 1 if lease is not None else 0
        if self._stopping():
            return False
        won = self._book.claim(domain, epoch, me, execution_id=execution_id)
        if won is None or won.owner != me:
            self.lost += 1
            return False
        log.info("adopting %s run %s (domain %s, lease %d, previous owner %s)", served.agent.name,
                 execution_id, domain, epoch, previous or "none")
        return self._serve_on(won, served, execution_id, adopting=True)

    def _not_now(self, domain: str, why: str) -> bool:
        """False, having said at DEBUG why the run on ``domain`` is not taken up now (when the reason changed)."""
        with self._lock:
            told, self._why[domain] = self._why.get(domain), why
        if told != why:
            log.debug("not adopting the run on domain %s: %s", domain, why)
        return False

    def _serve_on(self, lease: Lease, served: ServedAgent, execution_id: str, *, adopting: bool = False) -> bool:
        """Hold ``lease`` and take up ``execution_id`` on it (``adopting``: counted as an adoption); a take-up
        that fails releases the lease."""
        self.hold(lease)
        try:
            handle = self._adopt(execution_id, served.agent)
        except (ConductorAgentsError, OSError) as err:
            log.warning("could not take up run %s on lease %d of domain %s (%s); releasing it", execution_id,
                        lease.epoch, lease.domain, err)
            self._release(lease.domain, lease)
            return False
        if adopting:
            self.adopted += 1
        self._note_taken(lease.domain, execution_id)
        _tell_adopted(served, handle, execution_id)
        return True

    def _take_up_rested(self, served: ServedAgent, domain: str, execution_id: str, lease: Lease) -> bool:
        """A new run on a domain whose lease this process held when its last run ended: served here on that
        lease if it is still the domain's newest (nobody took the domain since); False otherwise."""
        newest = self._book.newest(domain)
        if newest is None or (newest.epoch, newest.owner) != (lease.epoch, self._worker_id) or self._stopping():
            return False
        log.info("serving %s run %s (domain %s, held here, lease %d)", served.agent.name, execution_id, domain,
                 newest.epoch)
        return self._serve_on(newest, served, execution_id)

    def _present(self, view: PeerView, owner: str | None) -> bool:
        if not owner or owner == self._worker_id:
            return False  # released, or this process's own lease of a run it let go of
        return owner in view.alive and not worker_is_dead_here(owner)

    def _release(self, domain: str, lease: Lease) -> None:
        with self._lock:
            self._held.pop(domain, None)
        try:
            self._book.claim(domain, lease.epoch + 1, None)
        except (ServerError, OSError) as err:
            log.warning("could not release run on domain %s (%s): it is adopted once this process is gone",
                        domain, err)

    def _run_info(self, execution_id: str) -> _RunInfo | None:
        info = self._runs.get(execution_id)
        if info is not None:
            return info
        try:
            workflow = self._api.get_workflow(execution_id)
        except ExecutionNotFoundError:
            return None
        domains = {str(d) for d in (workflow.get("taskToDomain") or {}).values() if d}
        info = _RunInfo(domains.pop() if len(domains) == 1 else None,
                        float(workflow.get("startTime") or workflow.get("createTime") or 0))
        self._runs[execution_id] = info
        return info

    def _prune(self, agent_name: str, running: set[str], domains: set[str]) -> None:
        """Forget what is gone since the last rounds. A round lists one agent's runs: what it does not list may be
        another agent's, still running (a process may serve several agents), so only what no agent's latest round
        listed is forgotten (pruning by one agent's list restarted the orphan grace of every other agent's runs at
        each round, and a fenced process then never took back the runs that hashed to another process)."""
        with self._lock:
            self._seen[agent_name] = (frozenset(running), frozenset(domains))
            all_running = frozenset().union(*(r for r, _ in self._seen.values()))
            all_domains = frozenset().union(*(d for _, d in self._seen.values()))
        for execution_id in [e for e in self._runs if e not in all_running]:
            del self._runs[execution_id]
        now = time.monotonic()
        with self._lock:
            ended = [d for d in self._held if d not in all_domains and not self._serving_here(d)]
            for domain in ended:
                self._rested[domain] = (self._held.pop(domain), now)
                self._lapsed.discard(domain)
            for domain in [d for d, (_, since) in self._rested.items() if now - since > _RESTED_SECONDS]:
                del self._rested[domain]
            for domain in [d for d in self._orphan_since if d not in all_domains]:
                del self._orphan_since[domain]
            for domain in [d for d in self._why if d not in all_domains]:
                del self._why[domain]
            self._taken = {d: {e for e in runs if e in all_running} for d, runs in self._taken.items()
                           if d in self._held}
        for domain in ended:
            self._book.forget(domain)


def _tell_adopted(served: ServedAgent, handle: Any, execution_id: str) -> None:
    """Call the agent's ``on_adopt`` hook (if any) with the handle of a run taken up here; never raises."""
    if served.on_adopt is None:
        return
    try:
        served.on_adopt(handle)
    except Exception:  # the user's hook; the run is served anyway
        log.exception("on_adopt hook failed for run %s", execution_id)
