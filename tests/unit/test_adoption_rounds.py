"""Adoption rounds (issue 44): a slow take-up does not hold up the rounds, a look at a domain held here leaves the
adopter free, and a round of one agent does not restart the grace of another agent's orphans.

A round used to wait for every take-up it began: one that was slow (a lease start whose answer was lost is sent
again for half a minute, each try bounded only by the HTTP timeout) kept every later round from starting, and runs
orphaned meanwhile stayed unserved. Found while looking for the soak's wedge (whose cause was the grace, last test)."""

from __future__ import annotations

import threading
import time
from typing import Any

import attrs

from conductor_agents._serving.adoption import Adopter, ServedAgent
from conductor_agents._serving.leases import Lease
from conductor_agents._serving.presence import PeerView

ME, GONE = "worker-me", "worker-gone"


@attrs.define
class _Agent:
    name: str = "listener"
    is_listener: bool = True
    worker_tools: tuple = ()


class _Api:
    def __init__(self) -> None:
        self.running: list[str] = []

    def running_workflow_ids(self, name: str, version: Any = None) -> list[str]:
        return list(self.running)

    def get_workflow(self, execution_id: str, **kwargs: Any) -> dict:
        return {"taskToDomain": {"act": f"domain-of-{execution_id}"}, "startTime": 1}


class _Book:
    """Every run's newest lease is a process's that is gone; claims always win."""

    def __init__(self) -> None:
        self.claims: list[str] = []
        self.lock = threading.Lock()

    def known(self, domain: str) -> Lease | None:
        return None

    def newest(self, domain: str) -> Lease | None:
        return Lease(domain, 0, GONE)

    def forget(self, domain: str) -> None:
        pass

    def claim(self, domain: str, epoch: int, owner: str | None, *, execution_id: str = "") -> Lease | None:
        with self.lock:
            self.claims.append(domain)
        return Lease(domain, epoch, owner)


class _Presence:
    interval, dead_after = 0.05, 10.0

    def view(self, name: str) -> PeerView:
        return PeerView(alive={ME: 0.0}, gone=frozenset({GONE}), read_at=0.0)

    def read_again(self, name: str) -> PeerView:
        return self.view(name)

    def holds(self) -> bool:
        return True


class _RenewedMeanwhile(_Presence):
    """The round's view says the previous owner is gone; read again, it is present (its presence was renewed since)."""

    def __init__(self) -> None:
        self.reads_again = 0

    def view(self, name: str) -> PeerView:
        return PeerView(alive={ME: 0.0}, gone=frozenset({"worker-back"}), read_at=0.0)

    def read_again(self, name: str) -> PeerView:
        self.reads_again += 1
        return PeerView(alive={ME: 0.0, "worker-back": 0.0}, gone=frozenset(), read_at=0.0)


def test_a_run_whose_owner_was_gone_in_the_rounds_view_and_is_present_now_is_not_claimed():
    """Seen in the cluster soak: a process back from a fence renewed its presence and its lease; another, on a view read
    before, found the owner gone and claimed the next lease: two processes served the listener, and one ended its
    mailbox. The owner's presence is read again before a claim."""
    api, book = _Api(), _Book()
    book.newest = lambda domain: Lease(domain, 4, "worker-back")  # type: ignore[method-assign]
    presence = _RenewedMeanwhile()
    adopter = Adopter(api, book, presence, worker_id=ME,  # type: ignore[arg-type]
                      adopt=lambda execution_id, agent: None, serving_here=lambda domain: False)
    try:
        api.running = ["run-1"]
        adopter.run_round(ServedAgent(_Agent()))
        assert presence.reads_again == 1 and "domain-of-run-1" not in book.claims
    finally:
        adopter.close()


def test_a_round_does_not_wait_for_a_slow_take_up_and_the_next_adopts_a_new_orphan():
    api, book, release = _Api(), _Book(), threading.Event()
    taken: list[str] = []

    def adopt(execution_id: str, agent: Any) -> None:
        if execution_id == "slow":
            release.wait(30)  # bounded: the test releases it
        taken.append(execution_id)

    adopter = Adopter(api, book, _Presence(), worker_id=ME,  # type: ignore[arg-type]
                      adopt=adopt, serving_here=lambda domain: False)
    served = ServedAgent(_Agent())
    try:
        api.running = ["slow"]
        began = time.monotonic()
        assert adopter.run_round(served) == 0  # the slow take-up goes on after the round
        assert time.monotonic() - began < 5.0
        api.running = ["slow", "fresh"]  # a run orphaned meanwhile
        assert adopter.run_round(served) == 1
        assert taken == ["fresh"]
        assert book.claims.count("domain-of-slow") == 1  # not looked at again while its take-up runs
        release.set()
        deadline = time.monotonic() + 10
        while "slow" not in taken and time.monotonic() < deadline:
            time.sleep(0.01)
        assert sorted(taken) == ["fresh", "slow"]
        assert sorted(adopter.held()) == ["domain-of-fresh", "domain-of-slow"]
    finally:
        release.set()
        adopter.close()


def test_a_round_over_a_domain_held_here_leaves_the_adopter_free():
    """The look at a domain this process holds must not wait on the adopter's own lock (a deadlock there stopped
    every poller of the process: each asks the adopter whether it may serve its domain)."""
    api, book = _Api(), _Book()
    adopter = Adopter(api, book, _Presence(), worker_id=ME,  # type: ignore[arg-type]
                      adopt=lambda execution_id, agent: None, serving_here=lambda domain: False)
    try:
        adopter.hold(Lease("domain-of-mine", 3, ME))
        api.running = ["mine"]
        adopter.run_round(ServedAgent(_Agent()))
        answered = threading.Event()
        threading.Thread(target=lambda: (adopter.holds_lease("domain-of-mine"), answered.set()), daemon=True).start()
        assert answered.wait(5.0), "the adopter's lock is still held after the round"
        assert book.claims == []
    finally:
        closing = threading.Thread(target=adopter.close, daemon=True)  # bounded, even if a look hangs
        closing.start()
        closing.join(10)


class _TwoAgentsApi(_Api):
    def __init__(self) -> None:
        super().__init__()
        self.by_agent: dict[str, list[str]] = {}

    def running_workflow_ids(self, name: str, version: Any = None) -> list[str]:
        return list(self.by_agent.get(name, []))


class _TwoPresent(_Presence):
    def view(self, name: str) -> PeerView:
        return PeerView(alive={ME: 0.0, "worker-other": 0.0}, gone=frozenset({GONE}), read_at=0.0)


def test_an_orphan_of_one_agent_is_taken_after_the_grace_though_rounds_of_another_agent_come_between():
    """A process serving several agents runs a round per agent. Each round used to forget what it did not list,
    also the other agents' orphans: their grace began again at every round, so an orphan that hashed to another
    process was never taken here (seen in a soak: a process that fenced itself took back only its runs that hashed
    to it; the others stayed unserved, for the process they hashed to saw their owner present)."""
    api, book = _TwoAgentsApi(), _Book()
    adopter = Adopter(api, book, _TwoPresent(), worker_id=ME,  # type: ignore[arg-type]
                      adopt=lambda execution_id, agent: None, serving_here=lambda domain: False)
    first, second = ServedAgent(_Agent("first")), ServedAgent(_Agent("second"))
    peers = _TwoPresent().view("second")
    runs = [f"run-{i}" for i in range(20)]
    theirs = next(r for r in runs if peers.assignee(f"domain-of-{r}") == "worker-other")  # not assigned here
    api.by_agent = {"first": ["run-of-first"], "second": [theirs]}
    try:
        deadline = time.monotonic() + 10
        while f"domain-of-{theirs}" not in book.claims and time.monotonic() < deadline:
            adopter.run_round(first)
            adopter.run_round(second)
            time.sleep(0.05)
        assert f"domain-of-{theirs}" in book.claims  # after the grace (2 rounds' time), as a stand-in
    finally:
        adopter.close()
