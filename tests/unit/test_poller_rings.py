"""Unit tests for DomainPoller's rung rounds (issue 32): a ring names the queues the watcher saw holding
tasks, and the round that follows polls those task types only (plus any still draining or never polled),
so a listener's task costs the server one poll of its own type instead of one per type of the domain; a
ring that names none (the watcher's health changed, the watchdog) still polls every type."""

from __future__ import annotations

from conductor_agents._worker.poller import DomainPoller
from tests.unit.fakes import FakeClock

DOMAIN = "0123456789abcdef0123456789abcdef"


class Executor:
    def free_slots(self):
        return 4

    def submit(self, task, tool_def):
        pass


class Api:
    def __init__(self):
        self.polled = []

    def poll_tasks(self, task_type, *, worker_id, domain, count, timeout_ms, http_timeout):
        self.polled.append(task_type)
        return []


#: A healthy queue watcher, as the poller sees one.
WATCHER = type("Watcher", (), {"healthy": True, "note_activity": lambda self, now: None})()


def make(api=None, types=("act", "conductor_agents_turn")):
    api = api or Api()
    poller = DomainPoller(api, Executor(), domain=DOMAIN, worker_id="w", long_poll_ms=1000, poll_interval_ms=1,
                          clock=FakeClock())
    poller._tools = {t: object() for t in types}
    poller._polled.update(poller._tools)
    poller._next_safety = 1e9  # a safety poll is not due
    return poller, api


def test_a_ring_naming_one_queue_polls_that_type_only():
    poller, _ = make()
    poller.ring([f"{DOMAIN}:conductor_agents_turn"])
    assert poller._take_ring(True, ("act", "conductor_agents_turn")) == {"conductor_agents_turn"}
    assert poller._ring_types == set()  # taken: the next ring starts afresh


def test_a_ring_naming_no_queue_polls_every_type():
    poller, _ = make()
    poller.ring([f"{DOMAIN}:act"])
    poller.ring()  # e.g. the watcher became healthy, or the watchdog saw a task wait unpolled
    assert poller._take_ring(True, ("act", "conductor_agents_turn")) is None


def test_a_draining_or_never_polled_type_is_polled_with_the_rung_one():
    poller, _ = make()
    poller._draining.add("act")
    poller._polled.discard("extra")
    poller._tools["extra"] = object()
    poller.ring([f"{DOMAIN}:conductor_agents_turn"])
    assert poller._take_ring(True, ("act", "conductor_agents_turn", "extra")) == \
        {"act", "conductor_agents_turn", "extra"}


def test_queues_of_another_domain_are_not_taken_for_ours():
    poller, _ = make()
    poller.ring(["ffffffffffffffffffffffffffffffff:act"])
    assert poller._take_ring(True, ("act", "conductor_agents_turn")) is None  # nothing of ours named: all


def test_the_loop_polls_only_the_rung_type():
    poller, api = make()
    poller._watcher = WATCHER
    poller.ring([f"{DOMAIN}:act"])
    poller._wake.clear()
    rung, poller._rung = poller._rung, False
    only = poller._take_ring(rung, poller.task_types)
    poller._poll_round(tuple(t for t in poller.task_types if t in only), 0.0, short_only=True, rung=rung)
    assert api.polled == ["act"]


class _Serving(Api):
    """Answers each poll with the next of ``batches`` (then nothing)."""

    def __init__(self, batches):
        super().__init__()
        self.batches = list(batches)

    def poll_tasks(self, task_type, *, worker_id, domain, count, timeout_ms, http_timeout):
        super().poll_tasks(task_type, worker_id=worker_id, domain=domain, count=count, timeout_ms=timeout_ms,
                           http_timeout=http_timeout)
        batch = self.batches.pop(0) if self.batches else 0
        return [{"taskType": task_type, "taskId": f"t{i}", "workflowInstanceId": "run"} for i in range(batch)]


def _watched(api):
    poller, _ = make(api, types=("act",))
    poller._watcher = WATCHER
    return poller


def test_a_poll_that_got_fewer_tasks_than_it_asked_for_leaves_nothing_to_drain():
    """The queue was empty after it: no drain poll (it answered nothing for every task a listener handled);
    a task that comes later rings."""
    poller = _watched(_Serving([1]))
    poller._poll_round(("act",), 0.0, short_only=True, rung=True)  # asks for 4 (the free slots), gets 1
    assert poller._draining == set()


def test_a_poll_that_filled_its_count_drains_the_type_next_round():
    poller = _watched(_Serving([4]))
    poller._poll_round(("act",), 0.0, short_only=True, rung=True)
    assert poller._draining == {"act"}


class _Updates(_Serving):
    def __init__(self, batches):
        super().__init__(batches)
        self.updates = []

    def update_task(self, result):
        self.updates.append(result)


def test_a_task_polled_for_a_type_no_longer_served_is_handed_back_not_left_polled():
    """A listener's switch moved its tools off the poller between a poll and its answer (seen in the soak: the new
    run's turn task was polled, "ignored", and the listener waited for good): the task goes back to its queue."""
    api = _Updates([1])
    poller = _watched(api)
    poller._tools = {}  # the run whose tools this was left in the meantime
    poller._poll_round(("act",), 0.0, short_only=True, rung=True)
    [update] = api.updates
    assert (update["taskId"], update["workflowInstanceId"], update["status"]) == ("t0", "run", "IN_PROGRESS")
    assert update["callbackAfterSeconds"] >= 1 and update["workerId"] == "w"
