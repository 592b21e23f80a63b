"""The queue watcher's choice of endpoint, on answers a real server cannot be made to give.

The real-server path (``GET /tasks/queue/all`` on the OSS server) runs under every
integration test that starts a run; here: a server that refuses the listing (a hosted
server's permissions), one that lists more queues than is worth reading, and one that
answers neither.
"""

from __future__ import annotations

from typing import List

import pytest
import responses

from conductor_agents._wire.api import ConductorApi
from conductor_agents._wire.transport import HttpError, Transport
from conductor_agents._worker.watcher import QueueWatcher
from conductor_agents._worker.workers import WorkerSet
from conductor_agents.settings import AgentSettings
from tests.helpers import eventually
from tests.unit.fakes import BASE_URL, FakeClock

ALL = f"{BASE_URL}/tasks/queue/all"
SIZES = f"{BASE_URL}/tasks/queue/sizes"


class StubPoller:
    """The three things the watcher asks a poller."""

    def __init__(self, domain: str, *, active: bool = False) -> None:
        self.domain = domain
        self.active = active
        self.rings = 0

    def queue_names(self) -> List[str]:
        return [f"{self.domain}:act"]

    def is_active(self, now: float) -> bool:
        return self.active

    def ring(self, queues=None) -> None:
        self.rings += 1
        self.rung_queues = None if queues is None else sorted(queues)


@pytest.fixture
def api():
    transport = Transport(BASE_URL)
    yield ConductorApi(transport)
    transport.close()


def watcher_over(api, pollers, clock=None):
    return QueueWatcher(api, lambda: list(pollers), clock=clock or FakeClock())


def paths(http):
    return [c.request.url.split("?")[0][len(BASE_URL):] for c in http.calls]


def test_one_listing_rings_exactly_the_pollers_with_waiting_tasks(http, api):
    pollers = [StubPoller(f"d{i}") for i in range(50)]
    listing = {f"d{i}:act": 0 for i in range(50)}  # a SQLite server lists every queue it ever had
    listing.update({"d3:act": 1, "other:act": 5, "JOIN": 200})
    http.get(ALL, json=listing)
    watcher_over(api, pollers)._round(pollers, 0.0, full=True)
    assert paths(http) == ["/tasks/queue/all"]
    assert [p.domain for p in pollers if p.rings] == ["d3"]


def test_queues_a_listing_lacks_are_asked_for_by_name(http, api):
    """A Redis node lists only the queues it touched: a task on a queue it never saw still rings."""
    seen, unseen = StubPoller("seen"), StubPoller("unseen")
    http.get(ALL, json={"seen:act": 0, "JOIN": 3})
    http.get(SIZES, json={"unseen:act": 1})
    watcher_over(api, [seen, unseen])._round([seen, unseen], 0.0, full=True)
    assert paths(http) == ["/tasks/queue/all", "/tasks/queue/sizes"]
    asked = http.calls[1].request.url
    assert "unseen%3Aact" in asked and "seen%3Aact" not in asked.replace("unseen%3Aact", "")
    assert (seen.rings, unseen.rings) == (0, 1)


def test_a_refused_listing_switches_to_asking_queue_by_queue_for_good(http, api):
    pollers = [StubPoller("d1"), StubPoller("d2")]
    http.get(ALL, status=403, json={"message": "forbidden"})
    http.get(SIZES, json={"d1:act": 0, "d2:act": 2})
    watcher = watcher_over(api, pollers)
    watcher._round(pollers, 0.0, full=True)
    watcher._round(pollers, 1.0, full=True)
    assert paths(http) == ["/tasks/queue/all", "/tasks/queue/sizes", "/tasks/queue/sizes"]
    assert [p.rings for p in pollers] == [0, 2]


def test_queue_by_queue_asks_only_for_active_pollers_between_full_rounds(http, api):
    busy, idle = StubPoller("busy", active=True), StubPoller("idle")
    http.get(ALL, status=404, json={"message": "no such endpoint"})
    http.get(SIZES, json={})
    watcher = watcher_over(api, [busy, idle])
    watcher._round([busy, idle], 0.0, full=True)
    watcher._round([busy, idle], 0.1, full=False)
    asked = [c.request.url for c in http.calls if "/queue/sizes" in c.request.url]
    assert "idle%3Aact" in asked[0] and "busy%3Aact" in asked[0]
    assert "idle%3Aact" not in asked[1] and "busy%3Aact" in asked[1]


def test_fast_rounds_ask_the_active_pollers_queues_by_name_on_a_server_with_many_queues(http, api):
    """The listing counts every queue the server ever had (a long-lived server's grows); a fast round wants only
    the active pollers' queues (issue 32). The answer by name rings as a listing would."""
    busy, idle = StubPoller("busy", active=True), StubPoller("idle")
    listing = {f"old{i}:act": 0 for i in range(500)}
    listing.update({"busy:act": 0, "idle:act": 0})
    http.get(ALL, json=listing)
    http.get(SIZES, json={"busy:act": 1})
    watcher = watcher_over(api, [busy, idle])
    watcher._round([busy, idle], 0.0, full=True)
    watcher._round([busy, idle], 0.05, full=False)
    watcher._round([busy, idle], 0.3, full=True)
    assert paths(http) == ["/tasks/queue/all", "/tasks/queue/sizes", "/tasks/queue/all"]
    asked = http.calls[1].request.url
    assert "busy%3Aact" in asked and "idle%3Aact" not in asked
    assert (busy.rings, idle.rings) == (1, 0) and busy.rung_queues == ["busy:act"]


def test_fast_rounds_keep_the_listing_on_a_server_with_few_queues(http, api):
    """Below the break-even (measured: three names cost the server what a listing of ~450 queues does)."""
    busy, idle = StubPoller("busy", active=True), StubPoller("idle")
    http.get(ALL, json={f"old{i}:act": 0 for i in range(100)} | {"busy:act": 0, "idle:act": 1})
    watcher = watcher_over(api, [busy, idle])
    watcher._round([busy, idle], 0.0, full=True)
    watcher._round([busy, idle], 0.05, full=False)
    assert paths(http) == ["/tasks/queue/all", "/tasks/queue/all"]


def test_a_fast_round_with_more_active_queues_than_one_request_takes_lists_them(http, api):
    """Asked by name, a hundred active listeners' queues would take several requests: the listing is one."""
    pollers = [StubPoller(f"{i:036d}", active=True) for i in range(100)]
    http.get(ALL, json={name: 0 for p in pollers for name in p.queue_names()})
    watcher = watcher_over(api, pollers)
    watcher._round(pollers, 0.0, full=True)
    watcher._round(pollers, 0.05, full=False)
    assert paths(http) == ["/tasks/queue/all", "/tasks/queue/all"]


def test_a_server_with_too_many_queues_is_asked_queue_by_queue_for_a_while(http, api):
    pollers = [StubPoller("d1")]
    huge = {f"q{i}": 0 for i in range(2500)}
    huge["d1:act"] = 1
    http.get(ALL, json=huge)
    http.get(SIZES, json={"d1:act": 1})
    watcher = watcher_over(api, pollers)
    watcher._round(pollers, 0.0, full=True)  # this answer is used, then the watcher holds off
    watcher._round(pollers, 30.0, full=True)
    watcher._round(pollers, 61.0, full=True)  # the hold is over: list again
    assert paths(http) == ["/tasks/queue/all", "/tasks/queue/sizes", "/tasks/queue/all"]
    assert pollers[0].rings == 3


def test_long_queue_lists_are_split_under_the_header_limit(http, api):
    pollers = [StubPoller("d" * 40 + str(i)) for i in range(200)]
    http.get(ALL, status=403)
    http.get(SIZES, json={})
    watcher_over(api, pollers)._round(pollers, 0.0, full=True)
    sizes_calls = [c for c in http.calls if "/queue/sizes" in c.request.url]
    assert len(sizes_calls) > 1
    assert all(len(c.request.url) < 8000 for c in sizes_calls)
    asked = sum(c.request.url.count("taskType=") for c in sizes_calls)
    assert asked == 200


def test_a_server_answering_neither_is_an_http_error(http, api):
    pollers = [StubPoller("d1")]
    http.get(ALL, status=404)
    http.get(SIZES, status=404)
    with pytest.raises(HttpError):
        watcher_over(api, pollers)._round(pollers, 0.0, full=True)


def test_a_malformed_listing_is_a_server_error_not_a_crash(http, api):
    from conductor_agents.errors import ServerError

    pollers = [StubPoller("d1")]
    http.get(ALL, json=["not", "a", "map"])
    with pytest.raises(ServerError):
        watcher_over(api, pollers)._round(pollers, 0.0, full=True)


# --- lifecycle: no poller, no thread, no request ------------------------------------------------


def test_the_watcher_thread_ends_when_no_poller_is_left_and_its_owner_agrees(http, api):
    """With no poller it asks its owner; a yes ends the thread before any request is sent."""
    asked = []
    watcher = QueueWatcher(api, lambda: [], clock=FakeClock(), may_stop=lambda w: asked.append(w) or True)
    watcher.start()
    watcher.join(5.0)
    assert not watcher.is_alive and asked == [watcher]
    assert [] == list(http.calls)


def test_the_watcher_goes_on_while_its_owner_has_a_poller_coming(http, api):
    """A no (a poller was registered meanwhile) keeps the thread; it stops when told."""
    http.get(ALL, json={})
    pollers: List[StubPoller] = []
    answers = iter([False])

    def may_stop(watcher):
        pollers.append(StubPoller("late"))  # the owner registered one while the watcher asked
        return next(answers)

    watcher = QueueWatcher(api, lambda: list(pollers), clock=FakeClock(), slow=0.01, may_stop=may_stop)
    watcher.start()
    try:
        eventually(lambda: paths(http), timeout=5.0, message="the watcher read the queues")
        assert watcher.is_alive
    finally:
        watcher.stop()
        watcher.join(5.0)
    assert not watcher.is_alive


def test_a_workerset_starts_a_fresh_watcher_after_the_last_one_stopped(http, api):
    """WorkerSet: the watcher that stopped for want of pollers is replaced by the next poller's."""
    from tests.helpers import eventually

    workers = WorkerSet(api, AgentSettings(server_url=BASE_URL), worker_id="w")
    try:
        with workers._lock:
            first = workers._new_poller("d1")._watcher
        eventually(lambda: not first.is_alive, timeout=5.0, message="the poller-less watcher stopped")
        assert workers._watcher is None
        http.get(ALL, json={})
        with workers._lock:  # registered (not started): the new watcher has a poller to watch
            poller = workers._new_poller("d2")
            workers._pollers["d2"] = poller
            second = poller._watcher
        assert second is not first and second.is_alive
        eventually(lambda: paths(http), timeout=5.0, message="the new watcher read the queues")
        assert second.is_alive
    finally:
        workers.close()
    assert not second.is_alive


def test_a_listing_that_loses_one_of_our_queues_switches_to_queue_by_queue(http, api):
    """Behind a balancer each Redis node lists only the queues it touched: node A lists d1:act,
    node B does not, while d1:act holds a task. The first answer without it tells the watcher
    the listing is partial; from then on it asks for our queues by name and rings d1."""
    pollers = [StubPoller("d1"), StubPoller("d2")]
    http.get(ALL, json={"d1:act": 0, "d2:act": 0, "JOIN": 0})  # node A
    http.get(ALL, json={"d2:act": 0, "JOIN": 0})  # node B, which never touched d1:act
    http.get(SIZES, json={"d1:act": 1, "d2:act": 0})
    watcher = watcher_over(api, pollers)
    watcher._round(pollers, 0.0, full=True)
    watcher._round(pollers, 0.25, full=True)
    watcher._round(pollers, 0.5, full=True)
    assert paths(http) == ["/tasks/queue/all", "/tasks/queue/all", "/tasks/queue/sizes", "/tasks/queue/sizes"]
    assert [p.rings for p in pollers] == [2, 0]


def test_a_listing_that_only_grows_is_trusted(http, api):
    """One SQL server only adds queues to its listing: it stays trusted (and read in every round)."""
    pollers = [StubPoller("d1"), StubPoller("d2")]
    http.get(ALL, json={"d1:act": 0})
    http.get(SIZES, json={"d2:act": 0})  # not listed yet: asked for by name this once
    http.get(ALL, json={"d1:act": 0, "d2:act": 1})
    watcher = watcher_over(api, pollers)
    watcher._round(pollers, 0.0, full=True)
    watcher._round(pollers, 0.25, full=True)
    del pollers[0]  # d1's run ended; a SQL server keeps listing its queue (rows stay)
    http.get(ALL, json={"d1:act": 0, "d2:act": 0, "JOIN": 0})
    watcher._round(pollers, 0.5, full=True)
    assert paths(http) == ["/tasks/queue/all", "/tasks/queue/sizes"] + ["/tasks/queue/all"] * 2


def test_is_empty_reports_queues_read_empty_lately_and_only_while_healthy(http, api):
    """The watchdog may skip an idle run's sample only on a fresh, healthy reading of all its queues."""
    idle, busy = StubPoller("idle"), StubPoller("busy")
    http.get(ALL, json={"idle:act": 0, "busy:act": 2})
    clock = FakeClock()
    watcher = watcher_over(api, [idle, busy], clock=clock)
    watcher._healthy = True
    watcher._round([idle, busy], clock.monotonic(), full=True)
    fresh = (watcher.is_empty(("idle:act",), within=2.0), watcher.is_empty(("busy:act",), within=2.0),
             watcher.is_empty(("idle:act", "busy:act"), within=2.0), watcher.is_empty(("never:act",), within=2.0))
    clock.advance(3.0)
    stale = watcher.is_empty(("idle:act",), within=2.0)
    watcher._round([idle, busy], clock.monotonic(), full=True)
    watcher._healthy = False
    unhealthy = watcher.is_empty(("idle:act",), within=2.0)
    assert (True, False, False, False) == fresh
    assert (False, False) == (stale, unhealthy)


def test_a_listing_that_loses_any_queue_switches_to_queue_by_queue(http, api):
    """Two Redis nodes that both touched our queue still list different sets of other queues: the
    first listing that lacks a queue an earlier one held (here an unrelated one) is enough."""
    pollers = [StubPoller("d1")]
    http.get(ALL, json={"d1:act": 0, "other:a": 0, "JOIN": 0})  # node A
    http.get(ALL, json={"d1:act": 0, "other:b": 0, "JOIN": 0})  # node B
    http.get(SIZES, json={"d1:act": 1})
    watcher = watcher_over(api, pollers)
    for step in range(3):
        watcher._round(pollers, step * 0.25, full=True)
    assert paths(http) == ["/tasks/queue/all", "/tasks/queue/all", "/tasks/queue/sizes", "/tasks/queue/sizes"]
    assert pollers[0].rings == 2


def test_an_unlisted_empty_queue_is_asked_for_at_doubling_intervals_not_every_round(http, api):
    """An idle listener's queue on a SQL server is unlisted until its first task: asked by name when
    first missing, then (while empty) after 1 s, 2 s, 4 s... (30 s at most), counted empty in between
    (the watchdog may skip the run); a task found there rings at once."""
    idle = StubPoller("idle")
    http.get(ALL, json={"JOIN": 0})
    http.get(SIZES, json={"idle:act": 0})
    watcher = watcher_over(api, [idle])
    asked_at = []
    for step in range(33):  # 8 s of full rounds, every 0.25 s
        before = paths(http).count("/tasks/queue/sizes")
        watcher._round([idle], step * 0.25, full=True)
        if paths(http).count("/tasks/queue/sizes") > before:
            asked_at.append(step * 0.25)
        assert watcher._empty_at.get("idle:act") == step * 0.25  # read (or known) empty in every round
    assert asked_at == [0.0, 1.0, 3.0, 7.0]
    http.replace(responses.GET, SIZES, json={"idle:act": 1})
    for step in range(33, 61):
        watcher._round([idle], step * 0.25, full=True)
    assert idle.rings == 1 and "idle:act" not in watcher._empty_at  # asked at 15 s
    watcher._round([idle], 15.25, full=True)
    assert idle.rings == 2  # a non-empty queue is asked for again in the next round


def test_the_unlisted_recheck_interval_stops_doubling_at_thirty_seconds(http, api):
    idle = StubPoller("idle")
    http.get(ALL, json={"JOIN": 0})
    http.get(SIZES, json={"idle:act": 0})
    watcher = watcher_over(api, [idle])
    now = 0.0
    while now < 200.0:
        watcher._round([idle], now, full=True)
        now += 0.25
    assert watcher._unlisted_next["idle:act"][1] == 30.0


def test_fast_rounds_for_an_active_poller_do_not_reset_the_others_unlisted_backoff(http, api):
    """Fast rounds ask only for the active pollers' queues: the idle ones keep their recheck interval."""
    idle, busy = StubPoller("idle"), StubPoller("busy")
    http.get(ALL, json={"JOIN": 0, "busy:act": 0})
    http.get(SIZES, json={"idle:act": 0})
    watcher = watcher_over(api, [idle, busy])
    watcher._round([idle, busy], 0.0, full=True)
    watcher._round([idle, busy], 1.0, full=True)  # asked again after 1 s: next after 2 s more
    busy.active = True
    for step in range(1, 60):
        watcher._round([idle, busy], 1.0 + step * 0.015, full=False)
    assert watcher._unlisted_next["idle:act"] == (3.0, 2.0)


def test_unlisted_rechecks_that_fall_due_close_together_go_in_one_request(http, api):
    """Queues first seen at different moments come due on a common grid once their interval is long."""
    first, second = StubPoller("first"), StubPoller("second")
    http.get(ALL, json={"JOIN": 0})
    http.get(SIZES, json={"first:act": 0, "second:act": 0})
    watcher = watcher_over(api, [first])
    now = 0.0
    while now < 2.6:
        watcher._round([first], now, full=True)
        now += 0.25
    while now < 120.0:
        watcher._round([first, second], now, full=True)
        now += 0.25
    assert watcher._unlisted_next["first:act"][0] == watcher._unlisted_next["second:act"][0]


def test_the_idle_interval_grows_with_the_queues_a_round_reads(http, api):
    """Each idle round is a pass over every queue: a thousand runs' queues are read every 0.5 s
    instead of every 0.25 s (at most every 1 s), a few hundred as before."""
    http.get(ALL, json={"JOIN": 0})
    http.get(SIZES, json={})
    intervals = []
    for count in (10, 500, 1000, 5000):
        pollers = [StubPoller(f"d{i}") for i in range(count)]
        watcher = watcher_over(api, pollers)
        assert watcher.idle_interval() == 0.25  # before the first round
        watcher._round(pollers, 0.0, full=True)
        intervals.append(watcher.idle_interval())
    assert intervals == [0.25, 0.25, 0.5, 1.0]


def test_a_pollers_activity_reaches_its_watcher_without_a_pass_over_the_pollers(api):
    """A new run or a task noted by a poller keeps the watcher on fast rounds for a while; the
    watcher no longer asks each poller every round."""
    from conductor_agents._worker.poller import DomainPoller
    from tests.unit.fakes import FakeClock

    clock = FakeClock()
    watcher = QueueWatcher(api, lambda: [], clock=clock)
    assert watcher._activity_at == float("-inf")
    poller = DomainPoller(api, object(), domain="d", worker_id="w", long_poll_ms=1000, poll_interval_ms=1,
                          clock=clock, watcher=watcher)
    assert watcher._activity_at == clock.monotonic()  # a new poller is active
    clock.advance(10.0)
    poller.reserve({})
    assert watcher._activity_at == clock.monotonic()
    watcher.note_activity(clock.monotonic() - 5.0)  # an older note never moves it back
    assert watcher._activity_at == clock.monotonic()


def test_the_unlisted_recheck_interval_is_capped_by_the_owner(http, api):
    """A runtime with a short stall threshold caps the recheck at half of it (issue 19): an unlisted
    queue never counts as empty for longer than that without being asked again."""
    idle = StubPoller("idle")
    http.get(ALL, json={"JOIN": 0})
    http.get(SIZES, json={"idle:act": 0})
    watcher = QueueWatcher(api, lambda: [idle], clock=FakeClock(), unlisted_recheck_max=2.0)
    now = 0.0
    while now < 60.0:
        watcher._round([idle], now, full=True)
        now += 0.25
    assert watcher._unlisted_next["idle:act"][1] == 2.0


def test_a_workerset_gives_its_pollers_and_watcher_back_offs_below_the_stall_threshold(http, api):
    http.get(ALL, json={})
    short = WorkerSet(api, AgentSettings(server_url=BASE_URL, liveness_stall_seconds=4.0), worker_id="w")
    default = WorkerSet(api, AgentSettings(server_url=BASE_URL), worker_id="w")
    try:
        with short._lock:
            poller = short._new_poller("d")
        assert (poller._max_backoff, short._watcher._unlisted_max) == (1.0, 2.0)
        with default._lock:
            poller = default._new_poller("d")
        assert (poller._max_backoff, default._watcher._unlisted_max) == (5.0, 15.0)
    finally:
        short.close()
        default.close()
