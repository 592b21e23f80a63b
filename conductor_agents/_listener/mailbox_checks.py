"""The serving process's checks of the mailboxes it serves: the safety net for a push nobody woke.

A mailbox of version 4 rests in a ``HUMAN`` task that any decide of the mailbox ends once it has rested a second
(:mod:`.mailbox`), and the server decides a run after every push to it: so a push, raw or the SDK's, is taken at
once, except one that lands within a second of the mailbox's previous round (its rest too young to end), which
waits for the next decide. The SDK's own sender asks for that decide itself (:func:`~.sending.wake`); a raw sender
does not. So the process that serves a listener has the server decide its mailbox (``PUT /workflow/decide/{id}``):

- twice, :data:`AFTER_ROUND_SECONDS` apart, after each round that forwarded (:meth:`MailboxChecks.soon`), and a
  few seconds after it begins to serve the mailbox (its first rest begins as it opens): a raw sender that pushes
  again as soon as its last message was acted on, or right after the start, lands in such a window;
- ``every`` seconds (``AgentSettings.mailbox_check_seconds``, 30 by default) after its last round or first check,
  then at gaps that double while the mailbox stays idle, up to ``most`` (``AgentSettings.mailbox_check_max_seconds``,
  480 by default): the bound on how long any such push can wait. Each check of an idle mailbox is itself a round,
  which leaves a young rest behind it, so checks at a fixed period cost the server a round per period per idle
  listener for ever (1,000 idle listeners checked every 30 s: 29 % of a core of a SQLite node, 0.38x with the
  gaps doubling, measured in their 6th-12th minute of idleness); a
  mailbox that had no round for long is the one least likely to be sent a raw push in the second after a check.
  Any forward (a message, from any sender) starts the gaps again from ``every``. These decides are also the
  only sweep a mailbox gets: a run whose ``HUMAN`` task was ended by a decide (not by a task update) is not put back
  in the server's decider queue, so a forward whose result was lost (a restart of the whole cluster) is timed out
  (its 60 s lease) and delivered again only at such a decide.

A decide of a mailbox at rest is one small round of the server's (the rest ended, a non-blocking pull, a rest
again); of a mailbox mid-round, nothing. Version 3 mailboxes (a ``WAIT`` of ``checkEvery``) are left as they are
by it. One thread for every mailbox (started on first use, ended when nothing is watched), no request for a mailbox
not due. Thread-safe.
"""

from __future__ import annotations

import heapq
import logging
import random
import threading

from .._common.clock import SYSTEM_CLOCK, Clock
from .._common.loops import BackgroundLoop
from .._wire.api import ConductorApi
from ..errors import ConductorAgentsError, ExecutionNotFoundError

__all__ = ["AFTER_ROUND_SECONDS", "MailboxChecks"]

log = logging.getLogger("conductor_agents.continuation")

#: After a forward ends, its mailbox is decided this much later, twice (:data:`_AFTER_ROUND_CHECKS`): the rest that
#: follows (after the forward's result is posted, a decide, a pull and another decide) has rested a second by the
#: first, or, on a loaded server, by the second.
AFTER_ROUND_SECONDS = 1.5
_AFTER_ROUND_CHECKS = 2
#: The first checks of mailboxes watched together are spread over this many seconds.
_FIRST_SPREAD = 5.0
#: The longest the checks' thread sleeps between two looks at what is due (a watch or a round wakes it at once).
_IDLE_LOOK = 5.0
#: A check that failed (a loaded or restarting server) is tried again this much later.
_AFTER_FAILURE = 5.0


class MailboxChecks:
    """Has the server decide each watched mailbox twice soon after each of its rounds, then ``every`` seconds later
    and at gaps doubling up to ``most`` (at least ``every``) while it stays idle."""

    def __init__(self, api: ConductorApi, *, every: float, stopping: threading.Event, most: float | None = None,
                 clock: Clock = SYSTEM_CLOCK) -> None:
        self._api = api
        self._every = every
        self._most = max(every, every if most is None else most)
        self._stopping = stopping
        self._clock = clock
        self._lock = threading.Lock()
        self._due: dict[str, float] = {}  # mailbox id -> when it is decided next (monotonic)
        self._soon: dict[str, int] = {}  # mailbox id -> checks left to make AFTER_ROUND_SECONDS apart
        self._gap: dict[str, float] = {}  # mailbox id -> the gap after its next idle check (doubles up to _most)
        self._heap: list[tuple[float, str]] = []  # (due, mailbox id); entries not in _due any more are skipped
        self._changed = threading.Event()
        self._thread: BackgroundLoop | None = None
        self.decided = 0  # decides sent (tests, stats)

    def watch(self, mailbox_id: str) -> None:
        """Check mailbox ``mailbox_id`` from now on. The first check comes soon (:data:`AFTER_ROUND_SECONDS`, plus
        up to :data:`_FIRST_SPREAD` at random so that mailboxes served together, a process adopting many, are not
        all checked at once): a mailbox just opened rests from its first second, and a push in that second (a sender
        right after the start) would otherwise wait a whole period."""
        with self._lock:
            if mailbox_id not in self._due:
                spread = random.uniform(0.0, min(_FIRST_SPREAD, self._every))  # noqa: S311 - in time, not a secret
                self._gap[mailbox_id] = self._every
                self._schedule_locked(mailbox_id, self._clock.monotonic() + AFTER_ROUND_SECONDS + spread)

    def soon(self, mailbox_id: str) -> None:
        """Mailbox ``mailbox_id`` just forwarded: decide it :data:`AFTER_ROUND_SECONDS` from now and as long after
        that, then ``every`` seconds later (if watched)."""
        with self._lock:
            if mailbox_id in self._due:
                self._soon[mailbox_id] = _AFTER_ROUND_CHECKS
                self._gap[mailbox_id] = self._every
                self._schedule_locked(mailbox_id, min(self._due[mailbox_id],
                                                      self._clock.monotonic() + AFTER_ROUND_SECONDS))

    def forget(self, mailbox_id: str) -> None:
        """Stop checking mailbox ``mailbox_id`` (its listener ended, or is no longer served here)."""
        with self._lock:
            self._due.pop(mailbox_id, None)
            self._soon.pop(mailbox_id, None)
            self._gap.pop(mailbox_id, None)

    def watched(self) -> int:
        with self._lock:
            return len(self._due)

    def gap(self, mailbox_id: str) -> float | None:
        """The gap after the next idle check of ``mailbox_id`` (None: not watched) (tests, stats)."""
        with self._lock:
            return self._gap.get(mailbox_id)

    def close(self, timeout: float) -> None:
        """Stop the thread and join it (bounded); a watch after that starts none. Idempotent."""
        self._stopping.set()
        self._changed.set()
        with self._lock:
            thread = self._thread
        if thread is not None:
            thread.stop()
            thread.join(timeout)

    def _schedule_locked(self, mailbox_id: str, due: float) -> None:
        self._due[mailbox_id] = due
        heapq.heappush(self._heap, (due, mailbox_id))
        self._changed.set()
        if not self._stopping.is_set() and (self._thread is None or not self._thread.is_alive):
            self._thread = BackgroundLoop("mailbox-checks", self._run, daemon=True, stop=self._stopping,
                                          wake=self._changed)  # daemon: a check lost at exit only delays a raw push
            self._thread.start()

    def _next_due(self) -> tuple[str | None, float]:
        """The mailbox due now (else None) and how long until the next one is (called under the lock)."""
        now = self._clock.monotonic()
        while self._heap:
            due, mailbox_id = self._heap[0]
            if self._due.get(mailbox_id) != due:  # forgotten, or moved: a stale entry
                heapq.heappop(self._heap)
                continue
            if due > now:
                return None, min(due - now, _IDLE_LOOK)
            heapq.heappop(self._heap)
            return mailbox_id, 0.0
        return None, _IDLE_LOOK

    def _run(self) -> None:
        while not self._stopping.is_set():
            with self._lock:
                if not self._due:
                    self._heap.clear()
                    self._thread = None  # nothing watched: the thread ends (the next watch starts one)
                    return
                mailbox_id, wait = self._next_due()
                self._changed.clear()
            if mailbox_id is None:
                self._changed.wait(wait)
                continue
            try:
                self._api.decide_workflow(mailbox_id)
                self.decided += 1
            except ExecutionNotFoundError:
                self.forget(mailbox_id)
                continue
            except ConductorAgentsError as err:
                log.debug("mailbox %s: its check failed (%s); trying again in %g s", mailbox_id, err, _AFTER_FAILURE)
                failed = True
            else:
                failed = False
            with self._lock:
                if mailbox_id in self._due:
                    left = self._soon.pop(mailbox_id, 0) - (not failed)
                    if left > 0:
                        self._soon[mailbox_id] = left
                    if failed:
                        after = _AFTER_FAILURE
                    elif left > 0:
                        after = AFTER_ROUND_SECONDS
                    else:  # an idle check: the next one is further off
                        after = self._gap.get(mailbox_id, self._every)
                        self._gap[mailbox_id] = min(after * 2, self._most)
                    self._schedule_locked(mailbox_id, self._clock.monotonic() + after)
