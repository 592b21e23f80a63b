"""One thread per runtime that tells the pollers when their queues hold tasks.

Why not a long poll per run: on the SQL-backed servers a long poll pops its queue every
100 ms and holds one of the server's HTTP threads (Tomcat: 200) for its whole length, so N
live runs each long-polling cost the server 10N queue transactions per second and can take
every HTTP thread (measured in benchmarks/: 31 % of a client core, 93 % server CPU and 0/200
runs answering within 2 s with 200 idle runs).

Instead the watcher reads the queue sizes and rings the pollers whose queues are not empty:
every ``slow`` seconds for all of them, every ``fast`` seconds while one is active (a task
came lately, so another is likely soon). A full round reads every queue of ours with one
``GET /tasks/queue/all`` (one request whatever the number of runs), or queue by queue with
``GET /tasks/queue/sizes`` when the server refuses that or knows so many queues that listing
them costs more than asking for ours (one count per queue on the server). A fast round wants
only the active pollers' queues: it asks for them by name once the server lists many more
queues than that (a SQL server's queue rows stay, one per domain and task type ever used, so a
long-lived server's listing grows; see ``_LISTED_PER_NAME``). A count by name is what a poll
would take: the server acks a task's queue message when a worker polls it, so neither the
count nor the listing holds a task once taken (checked on 3.32.3 with SQLite).

On a Redis-backed server the listing cannot be trusted, and costs more: each node lists only
the queues *it* has touched lately (a cache that forgets idle ones), and counts each of them
for every listing (measured: 18 ms with 528 queues). Behind a round-robin balancer a queue
holding our task may be missing from every answer of the node that did not schedule it. A
SQL server's listing only ever grows (its queues are rows that stay); so the first time any
queue a listing held is missing from a later one, the watcher knows it sees several views (or
a forgetful node) and asks queue by queue from then on (one O(1) count per queue on Redis).
"""

from __future__ import annotations

import logging
import math
import operator
import threading
from collections.abc import Callable, Mapping
from itertools import chain, filterfalse

from .._common.clock import SYSTEM_CLOCK, Clock
from .._common.loops import BackgroundLoop
from .._wire.api import ConductorApi
from .._wire.transport import HttpError
from ..errors import AuthenticationError, ConfigurationError, ServerError
from .poller import _ACTIVE_SECONDS, DomainPoller

__all__ = ["QueueWatcher"]

log = logging.getLogger("conductor_agents.worker")

#: Longest query string of one ``/tasks/queue/sizes`` request (Tomcat's request-header limit is 8 KB).
_SIZES_QUERY_CHARS = 3000
#: A ``/tasks/queue/all`` answer longer than this many queues (and than ``_ALL_PER_OWN`` times
#: ours) is not worth reading 4-10 times a second: ask queue by queue for a while instead.
_ALL_QUEUES_LIMIT = 2000
_ALL_PER_OWN = 4
_SIZES_HOLD_SECONDS = 60.0
#: A queue of ours that the listing lacks and that was empty when asked by name is asked again after
#: this, then at doubling intervals up to the maximum (it counts as empty in between).
_UNLISTED_RECHECK_SECONDS = 1.0
_UNLISTED_RECHECK_MAX_SECONDS = 30.0
#: Between full rounds while no poller is active the watcher waits ``slow`` seconds, or this long
#: per queue it reads when that is longer (every idle round costs a pass over them), at most the max.
_SLOW_PER_QUEUE_SECONDS = 0.0005
#: Between rounds while a poller is active (a task came in the last ``_ACTIVE_SECONDS``); each such
#: round wants the active pollers' queues only (asked by name on a server that lists many queues:
#: ``_LISTED_PER_NAME``). As listings, 0.015 s (and 5 s active) sent 8-13 per message a listener handled,
#: and 0.05 s (and 2 s) took the server's CPU per message down by about a fifth (benchmarks/server_share.py).
#: 0.1 s sent 4.4 fewer requests per message than 0.05 s (13.2 against 17.6) and cost the server 7 % less CPU
#: per message, with the same answer times (p50 1.03 s against 1.02, p95 1.91 against 1.99; side by side,
#: ``server_share.py --quick --messages 60 --repeats 3 --variant f100:...:_FAST_SECONDS=0.1``).
_FAST_SECONDS = 0.1
#: A fast round asks the active pollers' queues by name once the server lists this many queues per name
#: asked: measured on one SQLite server (3.32.3; `GET` in a loop, the JVM's CPU per request), a listing
#: costs 0.5 ms with 20 queues, 1.2 ms with 500 and 2.2 ms with 2,000; three queues by name 0.9-1.0 ms.
_LISTED_PER_NAME = 150
_SLOW_MAX_SECONDS = 1.0
_NEVER_ASKED = (0.0, 0.0)
_QUEUE_NAMES = operator.methodcaller("queue_names")
_MAX_BACKOFF = 5.0


def _query_chars(name: str) -> int:
    """What a queue name adds to a ``/tasks/queue/sizes`` query string (``taskType=``, escaping, ``&``)."""
    return len(name) + 10


def _fits_one_request(names: list[str]) -> bool:
    """Whether one ``/tasks/queue/sizes`` request asks for all of ``names`` (see ``_sizes_of``)."""
    return sum(map(_query_chars, names)) < _SIZES_QUERY_CHARS


def _on_grid(at: float, delay: float) -> float:
    """``at`` rounded up to a multiple of a fifth of ``delay`` (whole seconds from 5 s on): the
    queues whose rechecks fall due close together are asked for in one request."""
    step = float(int(delay / 5)) if delay >= 5 else 0.0
    return math.ceil(at / step) * step if step else at


class QueueWatcher:
    """Reads queue sizes and rings the pollers with work waiting. Thread-safe; owned by ``WorkerSet``.

    While the watcher is not healthy (not started yet, server unreachable, or a server that
    answers neither endpoint: then it stops for good), pollers long-poll as before; every
    change of health rings all pollers.
    """

    def __init__(self, api: ConductorApi, pollers: Callable[[], list[DomainPoller]], *, clock: Clock = SYSTEM_CLOCK,
                 fast: float | None = None, slow: float = 0.25,
                 may_stop: Callable[[QueueWatcher], bool] | None = None,
                 unlisted_recheck_max: float = _UNLISTED_RECHECK_MAX_SECONDS) -> None:
        self._api = api
        # The longest an unlisted queue found empty counts as empty before it is asked again (the
        # runtime gives half its stall threshold when that is shorter than the 30 s default).
        self._unlisted_max = max(_UNLISTED_RECHECK_SECONDS, min(_UNLISTED_RECHECK_MAX_SECONDS,
                                                                unlisted_recheck_max))
        self._pollers = pollers
        # Asked (from the watcher thread) when no poller is left; True lets the thread end. The
        # owner answers under its own lock and starts a new watcher for the next poller, so a
        # runtime that serves no run sends no request at all.
        self._may_stop = may_stop
        self._clock = clock
        self._fast = _FAST_SECONDS if fast is None else fast
        self._slow = slow
        self._healthy = False
        self._list_all = True  # False for good once the server refuses /tasks/queue/all
        self._by_queue_until = 0.0  # ask queue by queue until then (the server knows too many queues)
        self._listed: set[str] = set()  # the queues the last listing held (to tell a cluster's partial views)
        # our unlisted queues found empty -> (when to ask again, the delay that gave it)
        self._unlisted_next: dict[str, tuple[float, float]] = {}
        self._unlisted_due_at = 0.0  # the earliest of those times (inf when there is none)
        # Our queue names -> when a round last read them empty (dropped when read non-empty);
        # updated in place by the watcher thread, read name by name by the watchdog (see is_empty).
        self._empty_at: dict[str, float] = {}
        self._queue_count = 0  # how many queues the last round read for the pollers
        self._activity_at = -math.inf  # the pollers' latest activity (see note_activity)
        self._stop = threading.Event()
        # Daemon: if it dies with the interpreter, only the rings are lost (pollers fall back
        # to long polls when it is unhealthy; at exit they die too).
        self._thread = BackgroundLoop(
            "watch", self._loop, daemon=True, stop=self._stop, on_exit=lambda: self._set_health(False),
            on_crash=lambda err: log.exception("the queue watcher crashed; pollers long-poll instead"))

    @property
    def healthy(self) -> bool:
        return self._healthy

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._thread.stop()

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)

    def close(self, timeout: float = 15.0) -> None:
        """Stop the thread and join it, at most ``timeout`` (a :class:`~.._common.parts.Part`). Idempotent,
        safe before start."""
        self.stop()
        self.join(timeout)

    @property
    def is_alive(self) -> bool:
        return self._thread.is_alive

    def _set_health(self, healthy: bool) -> None:
        if healthy != self._healthy:
            self._healthy = healthy
            for poller in self._pollers():
                poller.ring()

    def _loop(self) -> None:
        """The thread's body (its crash is logged and its health cleared by the BackgroundLoop)."""
        next_full = 0.0
        backoff = 0.0
        while not self._stop.is_set():
            now = self._clock.monotonic()
            pollers = self._pollers()
            if not pollers and self._may_stop is not None and self._may_stop(self):
                log.debug("no poller left; the queue watcher stops until the next run")
                return
            full = now >= next_full
            try:
                self._round(pollers, now, full=full)
            except HttpError as err:
                if not err.transient:
                    log.info("the server cannot report queue sizes (%s); pollers long-poll instead", err)
                    return
                backoff = self._unhealthy(backoff, err)
                continue
            except ServerError as err:
                backoff = self._unhealthy(backoff, err)
                continue
            except ConfigurationError as err:  # a server URL without /api: the run's own call says so
                log.info("the queue watcher stops: %s", err)
                return
            backoff = 0.0
            self._set_health(True)
            if full:
                next_full = now + self.idle_interval()
            active = now - self._activity_at < _ACTIVE_SECONDS
            self._stop.wait(self._fast if active else max(0.0, next_full - self._clock.monotonic()))

    def note_activity(self, now: float) -> None:
        """A poller got a task or a run (``now`` on the watcher's clock): read fast for a while."""
        if now > self._activity_at:
            self._activity_at = now

    def idle_interval(self) -> float:
        """Seconds between full rounds while no poller is active: ``slow``, longer with many queues."""
        return max(self._slow, min(_SLOW_MAX_SECONDS, self._queue_count * _SLOW_PER_QUEUE_SECONDS))

    def _unhealthy(self, backoff: float, err: Exception) -> float:
        backoff = min(_MAX_BACKOFF, max(0.5, backoff * 2))
        log.debug("reading queue sizes failed: %s; retrying in %.1fs", err, backoff)
        self._set_health(False)
        self._stop.wait(backoff)
        return backoff

    # -- one round --------------------------------------------------------------------

    def _round(self, pollers: list[DomainPoller], now: float, *, full: bool) -> None:
        # With a thousand idle runs the round's Python loops over every queue cost ~4 ms (measured:
        # the poller objects are out of the CPU cache between rounds), more than its request: the
        # passes over all queues are C-level (map/filter/dict.fromkeys); per-queue Python work is
        # for the queues holding tasks.
        all_names = list(chain.from_iterable(map(_QUEUE_NAMES, pollers)))
        self._queue_count = len(all_names)
        wanted = all_names if full else \
            list(chain.from_iterable(p.queue_names() for p in pollers if p.is_active(now)))
        listing = None
        if self._list_all and now >= self._by_queue_until and (full or not self._by_name_is_cheaper(wanted)):
            listing = self._all_sizes(now, len(all_names))
        if listing is None:
            sizes: Mapping[str, object] = self._sizes_of(wanted) if wanted else {}
            read = list(filter(sizes.__contains__, wanted))
            nonempty = list(filter(sizes.get, wanted))
        else:
            # The listing reads every listed queue of every poller, active or not.
            asked, missing = self._unlisted_sizes(wanted, listing, now, full=full)
            read = list(filter(listing.__contains__, all_names))
            nonempty = list(filter(listing.get, all_names))
            if missing:  # asked now, or found empty when asked and not due again yet
                known = asked.keys() | self._unlisted_next.keys()
                read += filter(known.__contains__, missing)
                nonempty += (name for name, size in asked.items() if size)
        empty_at = self._empty_at  # updated in place: the watchdog's reads see each name's latest
        if nonempty:
            busy = set(nonempty)
            empty_at.update(dict.fromkeys(filterfalse(busy.__contains__, read), now))
            for name in busy:
                empty_at.pop(name, None)
            self._ring_owners(pollers, busy)
        else:
            empty_at.update(dict.fromkeys(read, now))
        if full and len(empty_at) > len(all_names):
            own = set(all_names)
            for name in [name for name in empty_at if name not in own]:
                empty_at.pop(name, None)

    def _by_name_is_cheaper(self, names: list[str]) -> bool:
        """Whether a fast round asks for ``names`` by name rather than listing every queue: in one request, and
        the last listing held ``_LISTED_PER_NAME`` queues per name or more."""
        return _fits_one_request(names) and len(self._listed) >= _LISTED_PER_NAME * len(names)

    @staticmethod
    def _ring_owners(pollers: list[DomainPoller], names: set[str]) -> None:
        """Ring, once each, the pollers serving one of ``names``, naming their queues that hold tasks."""
        for poller in pollers:
            own = poller.queue_names()
            if not names.isdisjoint(own):
                poller.ring(names.intersection(own))

    def _unlisted_sizes(self, wanted: list[str], listing: Mapping[str, object], now: float, *,
                        full: bool) -> tuple[dict[str, object], list[str]]:
        """The sizes asked by name now of the wanted queues a listing lacks, and those queues.

        A listing says nothing of a queue it lacks: a Redis node lists only the queues it touched,
        so a task on a queue the answering node never saw would wait unrung. Asking for it by name
        touches it there (that node lists it from then on, and a later listing without it switches
        the watcher to queue by queue). On a SQL server an unlisted queue never had a task (its row
        comes with the first one), so an idle listener's queue stays unlisted: one found empty is
        asked again after 1 s, then at doubling intervals up to ``unlisted_recheck_max`` (30 s at most; on a
        grid, so that many come due in the same round and go in one request), and counts as empty
        in between (it is in ``_unlisted_next``).
        """
        missing = list(filterfalse(listing.__contains__, wanted))
        tracked = self._unlisted_next
        if full and len(tracked) > len(missing):  # forget the queues listed again or no longer ours
            missing_set = set(missing)
            for name in [name for name in tracked if name not in missing_set]:
                del tracked[name]
            self._unlisted_due_at = min((at for at, _ in tracked.values()), default=math.inf)
        if not missing:
            return {}, missing
        if now >= self._unlisted_due_at:  # some found empty are due again (they come due on a grid)
            due = [name for name in missing if tracked.get(name, _NEVER_ASKED)[0] <= now]
        else:  # only those never asked
            due = list(filterfalse(tracked.__contains__, missing))
        if not due:
            return {}, missing
        asked = self._sizes_of(due)
        for name in due:
            if name not in asked:
                continue  # not in the answer: unread, asked again next round
            if asked[name]:
                tracked.pop(name, None)
            else:
                delay = min(self._unlisted_max, 2 * tracked[name][1]) if name in tracked \
                    else _UNLISTED_RECHECK_SECONDS
                tracked[name] = (_on_grid(now + delay, delay), delay)
        self._unlisted_due_at = min((at for at, _ in tracked.values()), default=math.inf)
        return asked, missing

    def is_empty(self, names: tuple[str, ...], *, within: float) -> bool:
        """Whether every queue of ``names`` was read empty by a round of the last ``within`` seconds.

        False when the watcher is not healthy, or has not read one of them lately: the caller
        must then ask the server itself. The runtime's watchdog uses it to skip sampling an idle
        run (a task waiting in one of its queues would have been counted here).
        """
        if not self._healthy or not names:
            return False
        empty_at = self._empty_at
        oldest = self._clock.monotonic() - within
        return all(empty_at.get(name, float("-inf")) >= oldest for name in names)

    def _all_sizes(self, now: float, own: int) -> Mapping[str, object] | None:
        """Every queue's size in one request, or None when asking queue by queue is the better way."""
        try:
            sizes = self._api.all_queue_sizes()
        except (HttpError, AuthenticationError) as err:
            if isinstance(err, HttpError) and err.transient:
                raise
            # A hosted server may keep the listing for administrators (403), an older one lack it (404).
            log.info("the server does not list its queues (%s); asking queue by queue", err)
            self._list_all = False
            return None
        listed = sizes.keys()
        if not self._listed <= listed:
            log.info("the server's queue listing lost a queue it held (several nodes behind a balancer, "
                     "or a Redis-backed node that forgets idle queues); asking queue by queue from now on")
            self._list_all = False
            self._listed = set()
            return None
        if len(listed) != len(self._listed):
            self._listed = set(listed)
        if len(sizes) > max(_ALL_QUEUES_LIMIT, _ALL_PER_OWN * own):
            log.debug("the server lists %d queues; asking for our %d queue by queue for %.0fs",
                      len(sizes), own, _SIZES_HOLD_SECONDS)
            self._by_queue_until = now + _SIZES_HOLD_SECONDS
        return sizes

    def _sizes_of(self, names: list[str]) -> dict[str, object]:
        sizes: dict[str, object] = {}
        chunk: list[str] = []
        length = 0
        for name in names:
            chunk.append(name)
            length += _query_chars(name)
            if length >= _SIZES_QUERY_CHARS:
                sizes.update(self._api.queue_sizes(chunk))
                chunk, length = [], 0
        if chunk:
            sizes.update(self._api.queue_sizes(chunk))
        return sizes
