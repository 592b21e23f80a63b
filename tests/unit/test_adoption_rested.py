"""A domain this process holds whose runs have all ended (a schedule's domain between two runs): its next run
is served on the same lease, with no new one, while that lease is still the domain's newest (seen in a full run:
a round in the gap dropped the domain, and the next run took lease 1 from this very process)."""

from __future__ import annotations

from typing import Any, Optional

import attrs

from conductor_agents._serving.adoption import Adopter, ServedAgent
from conductor_agents._serving.leases import Lease
from conductor_agents._serving.presence import PeerView

ME, OTHER, DOMAIN = "worker-me", "worker-other", "d" * 32


@attrs.define
class _Agent:
    name: str = "daily"
    is_listener: bool = False
    worker_tools: tuple = ()


class _Api:
    def __init__(self) -> None:
        self.running: "list[str]" = []

    def running_workflow_ids(self, name: str, version: Any = None) -> "list[str]":
        return list(self.running)

    def get_workflow(self, execution_id: str, **kwargs: Any) -> dict:
        return {"taskToDomain": {"report": DOMAIN}, "startTime": 1}


class _Book:
    def __init__(self, newest: Lease) -> None:
        self.lease, self.claims = newest, []

    def known(self, domain: str) -> Optional[Lease]:
        return None

    def newest(self, domain: str) -> Optional[Lease]:
        return self.lease

    def forget(self, domain: str) -> None:
        pass

    def claim(self, domain: str, epoch: int, owner: Optional[str], *, execution_id: str = "") -> Optional[Lease]:
        self.claims.append((epoch, owner))
        self.lease = Lease(domain, epoch, owner)
        return self.lease


class _Presence:
    interval, dead_after = 1.0, 10.0

    def __init__(self, alive: "tuple[str, ...]") -> None:
        self.peers = PeerView(alive={w: 0.0 for w in alive}, gone=frozenset(), read_at=0.0)

    def view(self, name: str) -> PeerView:
        return self.peers

    def holds(self) -> bool:
        return True


def _adopter(book: _Book, api: _Api, alive: "tuple[str, ...]") -> "tuple[Adopter, list[str]]":
    taken: "list[str]" = []
    adopter = Adopter(api, book, _Presence(alive), worker_id=ME,  # type: ignore[arg-type]
                      adopt=lambda execution_id, agent: taken.append(execution_id),
                      serving_here=lambda domain: False)
    return adopter, taken


def _held_then_rested(adopter: Adopter, api: _Api, served: ServedAgent) -> None:
    adopter.hold(Lease(DOMAIN, 0, ME))
    api.running = []
    adopter.run_round(served)  # its run ended and nothing else runs on it yet
    assert adopter.held() == []


def test_the_next_run_of_a_rested_domain_is_served_on_the_same_lease():
    api, book = _Api(), _Book(Lease(DOMAIN, 0, ME))
    adopter, taken = _adopter(book, api, (ME,))
    served = ServedAgent(_Agent())
    _held_then_rested(adopter, api, served)
    api.running = ["run-2"]
    assert adopter.run_round(served) == 1
    assert taken == ["run-2"] and book.claims == [] and adopter.held() == [DOMAIN] and adopter.adopted == 0


def test_a_rested_domain_another_process_took_since_is_left_to_it():
    api, book = _Api(), _Book(Lease(DOMAIN, 0, ME))
    adopter, taken = _adopter(book, api, (ME, OTHER))
    served = ServedAgent(_Agent())
    _held_then_rested(adopter, api, served)
    book.lease = Lease(DOMAIN, 1, OTHER)  # present, and the domain's newest lease is its
    api.running = ["run-2"]
    assert adopter.run_round(served) == 0
    assert taken == [] and book.claims == [] and adopter.held() == []
