"""Finding the current run of a continued listener from any id of it (see :mod:`conductor_agents._listener.chain`).

:class:`ChainDirectory` answers, for an execution id a caller holds, which chain it belongs to
(once per id and process: one small request) and which link is the newest. The newest link it knows is cached per
chain; a caller that needs the truth asks :meth:`ChainDirectory.refresh`, which probes the links after it
(``GET /workflow/{id}/status``, a few hundred bytes each): about ``2 log2(n)`` for a process that
last looked ``n`` links ago, plus one read of the listener's head hint (:mod:`.head`) when the link
after the newest one known is missing.

Retention (:mod:`.retention`) removes ended links, always the lowest first and never the newest
``keep_runs`` ended ones, nor link 0 of a listener without a mailbox (:mod:`.mailbox`; with one, link 0
goes like the others), and only after the head hint names a link above them. So the links that exist
are (link 0, then) a gap (the links removed), then every link from *r+1* to the newest: "link *n*
exists" is true from the bottom of that run of links up to the newest and false after it. A probe from a
link known to exist that finds the next one missing has reached either the newest link or the gap; the
head hint, which is never below a removed link, says which.
"""

from __future__ import annotations

import collections
import logging
import threading
from collections.abc import Mapping
from typing import Any

import attrs

from .._common.fork import rebuild_after_fork
from .._wire.api import ConductorApi
from ..errors import ExecutionNotFoundError, ServerError
from .chain import LinkKey, is_human_wait_key, link_id, link_key, parse_link_key, parse_mailbox_key
from .head import read_head, read_mailbox

__all__ = ["Chain", "ChainDirectory", "Link"]

log = logging.getLogger("conductor_agents.continuation")

#: Chains remembered per process (least recently used forgotten first).
_CACHE_SIZE = 10_000


@attrs.frozen
class Link:
    """One run of a chain: its number (0 is the first run) and execution id."""

    number: int
    execution_id: str


@attrs.frozen
class Chain:
    """A listener as the server names it: the id a caller holds and where its links are.

    ``run_id`` (the task domain every link shares) and ``agent_name`` are None for a run that is
    not stateful: it is never continued and is its own only link.
    """

    execution_id: str
    run_id: str | None = None
    agent_name: str | None = None
    first: int = 0  # the link ``execution_id`` is (0 unless a caller holds a later link's id)
    #: ``execution_id`` is the listener's mailbox (:mod:`.mailbox`), not a link: every link's id is
    #: derived, and link 0 may have been retired like any other.
    mailbox: bool = False
    #: The listener waits on a ``HUMAN`` task that its mailbox's forward completes (``listener_wait="human"``,
    #: ``docs/idle-listeners.md``): every message goes through the mailbox. Known from the mailbox's key.
    human_wait: bool = False

    @property
    def continuable(self) -> bool:
        return self.run_id is not None and self.agent_name is not None

    def held(self, number: int) -> bool:
        """Whether link ``number`` is (or precedes) the link whose id the caller holds, so exists for sure
        (never for a mailbox's chain: the caller holds no link)."""
        return not self.mailbox and number <= self.first

    def link(self, number: int) -> Link:
        """Link ``number`` of this chain: any number, also one before ``first`` (its id is derived)."""
        if (number == self.first and not self.mailbox) or not self.continuable:
            return Link(self.first, self.execution_id)
        assert self.run_id is not None and self.agent_name is not None
        return Link(number, link_id(self.agent_name, link_key(self.run_id, number, self.agent_name)))

    def key(self, number: int) -> LinkKey:
        assert self.run_id is not None and self.agent_name is not None
        return LinkKey(self.run_id, number, self.agent_name)


class ChainDirectory:
    """Chains and their newest links, as learned from the server. Thread-safe.

    Requests are made outside the lock; two threads that miss at once may both ask.
    """

    def __init__(self, api: ConductorApi) -> None:
        self._api = api
        self._lock = threading.Lock()
        rebuild_after_fork(self)
        self._chains: collections.OrderedDict[str, Chain] = collections.OrderedDict()
        # (run id, agent) -> Link
        self._newest: collections.OrderedDict[tuple[str | None, str | None], Link] = collections.OrderedDict()
        self._accepted: collections.OrderedDict[str, Link] = collections.OrderedDict()  # message id -> link
        self._ended: collections.OrderedDict[str, None] = collections.OrderedDict()  # mailboxes ended here
        self._anchors: collections.OrderedDict[str, Chain] = collections.OrderedDict()  # run id -> anchor

    def _after_fork_in_child(self) -> None:
        # What it knows stays true in a child; only its lock may be held by a thread that is gone.
        self._lock = threading.Lock()

    # -- which chain ------------------------------------------------------------------

    def chain(self, execution_id: str, record: Mapping[str, Any] | None = None) -> Chain:
        """The chain ``execution_id`` belongs to (one or two requests the first time; none when the caller
        gives ``record``, the run's workflow or status it has just read).

        Raises:
            ExecutionNotFoundError: the server does not know the execution.
        """
        with self._lock:
            known = self._chains.get(execution_id)
            if known is not None:
                self._chains.move_to_end(execution_id)
                return known
        chain = self._lookup(execution_id, record)
        self.remember(chain)
        return chain

    def known(self, execution_id: str) -> Chain | None:
        """The chain of ``execution_id`` if this process already knows it (no request)."""
        with self._lock:
            return self._chains.get(execution_id)

    def remember(self, chain: Chain, newest: Link | None = None) -> None:
        """Record ``chain`` (and its newest link, when the caller knows it: it just started it)."""
        with self._lock:
            self._chains[chain.execution_id] = chain
            self._chains.move_to_end(chain.execution_id)
            while len(self._chains) > _CACHE_SIZE:
                self._chains.popitem(last=False)
            if newest is not None:
                self._advance_locked(chain, newest)

    def _lookup(self, execution_id: str, record: Mapping[str, Any] | None = None) -> Chain:
        # Every run of a listener this SDK started carries its link key; any other run is its own
        # only link (not stateful, not a listener, or started by another SDK): never continued.
        status = record if record is not None else self._api.workflow_status(execution_id)
        box = parse_mailbox_key(status.get("correlationId"))
        if box is not None:
            return Chain(execution_id, box.run_id, box.agent_name, 0, mailbox=True,
                         human_wait=is_human_wait_key(status.get("correlationId")))
        key = parse_link_key(status.get("correlationId"))
        if key is None:
            return Chain(execution_id)
        return Chain(execution_id, key.run_id, key.agent_name, key.number)

    def anchor(self, chain: Chain, *, cached: bool = False) -> Chain:
        """The chain by the id callers hold: the listener's mailbox when it has one (read from the
        server's poll data: one small request), else its link 0. ``cached``: the answer this process found
        before, when it has one (no request).

        Raises:
            ExecutionNotFoundError: that run is gone from the server.
            ServerUnavailableError, ServerError: a request failed.
        """
        if chain.mailbox or not chain.continuable:
            return chain
        if cached:
            with self._lock:
                known = self._anchors.get(str(chain.run_id))
            if known is not None:
                return known
        mailbox_id = read_mailbox(self._api, chain.run_id)
        if mailbox_id is not None:
            found = self.chain(mailbox_id)
        else:
            found = self.chain(chain.link(0).execution_id) if chain.first > 0 else chain
        with self._lock:
            self._anchors[str(chain.run_id)] = found
            while len(self._anchors) > _CACHE_SIZE:
                self._anchors.popitem(last=False)
        return found

    def mailbox_ended(self, mailbox_id: str, *, mark: bool) -> bool:
        """Whether this process has ended mailbox ``mailbox_id`` (``mark``: it just has)."""
        with self._lock:
            if mark:
                self._ended[mailbox_id] = None
                while len(self._ended) > _CACHE_SIZE:
                    self._ended.popitem(last=False)
            return mailbox_id in self._ended

    # -- which link took a message -------------------------------------------------------

    def note_accepted(self, message_id: str, link: Link) -> None:
        """Link ``link`` accepted message ``message_id`` (sent from this process)."""
        with self._lock:
            self._accepted[message_id] = link
            while len(self._accepted) > _CACHE_SIZE:
                self._accepted.popitem(last=False)

    def accepted_at(self, link: Link) -> list[str]:
        """The messages this process sent that ``link`` accepted, as far as it remembers (oldest first)."""
        with self._lock:
            return [m for m, at in self._accepted.items() if at.execution_id == link.execution_id]

    def accepted_by(self, message_id: str) -> Link | None:
        """The link that accepted a message this process sent, if it remembers."""
        with self._lock:
            return self._accepted.get(message_id)

    # -- which link -------------------------------------------------------------------

    def newest(self, chain: Chain) -> Link:
        """The newest link this process knows of (no request)."""
        if not chain.continuable:
            return chain.link(chain.first)
        with self._lock:
            known = self._newest.get((chain.run_id, chain.agent_name))
        if known is None or known.number < chain.first:
            return chain.link(chain.first)
        return known

    def advance(self, chain: Chain, link: Link) -> None:
        """Link ``link`` exists (this process started or found it)."""
        with self._lock:
            self._advance_locked(chain, link)

    def _advance_locked(self, chain: Chain, link: Link) -> None:
        key = (chain.run_id, chain.agent_name)
        known = self._newest.get(key)
        if known is None or link.number > known.number:
            self._newest[key] = link
        self._newest.move_to_end(key)
        while len(self._newest) > _CACHE_SIZE:
            self._newest.popitem(last=False)

    def exists(self, chain: Chain, number: int) -> bool:
        """Whether link ``number`` of ``chain`` exists on the server (one small request)."""
        if chain.held(number):
            return True
        link = chain.link(number)
        try:
            status = self._api.workflow_status(link.execution_id)
        except ExecutionNotFoundError:
            return False
        key = parse_link_key(status.get("correlationId"))
        if key is None or key.run_id != chain.run_id or key.number != number:
            raise ServerError(
                f"run {link.execution_id} should be link {number} of listener {chain.execution_id}, but the "
                f"server knows it as something else (correlation id {status.get('correlationId')!r})")
        self.advance(chain, link)
        return True

    def refresh(self, chain: Chain) -> Link:
        """The newest link on the server: probes forward from the newest one known (or the head hint).

        Raises:
            ServerUnavailableError, ServerError: a probe failed.
        """
        if not chain.continuable:
            return chain.link(chain.first)
        low = self.newest(chain).number  # known to exist (or retired since: then the hint is above it)
        found = self._gallop(chain, low)
        if found == low:  # the next link is missing: the newest, or the gap retention left (see above)
            hint = read_head(self._api, chain.run_id)
            if hint > found and self.exists(chain, hint):
                found = self._gallop(chain, hint)
        link = chain.link(found)
        self.advance(chain, link)
        return link

    def _gallop(self, chain: Chain, low: int) -> int:
        """The newest link at or after ``low`` (which exists) before the first missing one."""
        step = 1
        while True:  # gallop: low exists; find a number that does not
            probe = low + step
            if self.exists(chain, probe):
                low, step = probe, step * 2
                continue
            high = probe
            break
        while high - low > 1:  # low exists, high does not
            middle = (low + high) // 2
            if self.exists(chain, middle):
                low = middle
            else:
                high = middle
        return low

    def lowest_kept(self, chain: Chain, below: int) -> int | None:
        """The lowest link after ``chain.first`` (from link 0 for a mailbox's chain) and at most ``below`` that
        retention has not removed (links removed are the lowest ones: a binary search), or None when every one of
        them is gone.

        Raises:
            ServerUnavailableError, ServerError: a probe failed.
        """
        low = chain.first if chain.mailbox else chain.first + 1
        if below < low or not self.exists(chain, below):
            return None
        high = below  # exists
        while high > low:
            middle = (low + high) // 2
            if self.exists(chain, middle):
                high = middle
            else:
                low = middle + 1
        return high

    def next_link(self, chain: Chain, after: int) -> Link | None:
        """The first link after link ``after`` that the server still holds, or None when there is none
        (``after`` is the newest). Links retired meanwhile are skipped.

        Raises:
            ServerUnavailableError, ServerError: a probe failed.
        """
        if not chain.continuable:
            return None
        if self.exists(chain, after + 1):
            return chain.link(after + 1)
        newest = self.refresh(chain)
        if newest.number <= after:
            return None
        number = self.lowest_kept(chain, newest.number)
        return chain.link(max(after + 1, number if number is not None else newest.number))
