"""Unit tests for DomainPoller's keep-alive: a poller whose tool pool is full polls for no task."""

from conductor_agents._worker.poller import DomainPoller
from tests.unit.fakes import FakeClock

DOMAIN = "0123456789abcdef0123456789abcdef"


class FullExecutor:
    """A tool pool with ``slots`` free slots (0: full)."""

    def __init__(self, slots=0):
        self.slots = slots

    def free_slots(self):
        return self.slots

    def submit(self, task, tool_def):  # pragma: no cover - these tests take no task
        raise AssertionError("no task expected")


class PollRecorder:
    def __init__(self):
        self.polls = []

    def poll_tasks(self, task_type, *, worker_id, domain, count, timeout_ms, http_timeout):
        self.polls.append((task_type, domain, count, timeout_ms))
        return []


def poller(domain=DOMAIN, keepalive=10.0, slots=0):
    clock, api = FakeClock(), PollRecorder()
    made = DomainPoller(api, FullExecutor(slots), domain=domain, worker_id="w", long_poll_ms=1000,
                        poll_interval_ms=1, clock=clock, keepalive_seconds=keepalive)
    made._polled.add("lookup")  # polled once already (start-up): not a fresh type
    return made, api, clock


def test_a_full_pool_polls_for_no_task_once_per_keepalive():
    """With no free slot the poller sends count=0 polls, at most one per keep-alive period."""
    made, api, clock = poller()
    for _ in range(3):  # t=0: due; t=0 again and t=9.9: not due
        made._poll_round(("lookup",), 0.0)
        clock.advance(4.95)
    made._poll_round(("lookup",), 0.0)  # t=14.85: due again
    assert [("lookup", DOMAIN, 0, 0)] * 2 == api.polls
    assert 2 == made.keepalives


def test_a_pool_with_room_polls_for_tasks_not_keepalives():
    """With free slots the poll asks for tasks as before (a long poll for one)."""
    made, api, _ = poller(slots=3)
    made._poll_round(("lookup",), 0.0)
    assert ([("lookup", DOMAIN, 1, 1000)], 0) == (api.polls, made.keepalives)


def test_the_shared_poller_sends_no_keepalive():
    """The domain-less poller of non-stateful runs has no domain to keep alive."""
    made, api, _ = poller(domain=None)
    made._poll_round(("lookup",), 0.0)
    assert [] == api.polls


def test_the_first_empty_answer_to_a_ring_is_asked_again_at_once_the_second_is_not():
    """Behind a balancer a rung poll may reach the node that did not fetch the task ahead: the first
    empty answer sets the ring again (the next poll goes to another node); a second one does not."""
    made, api, _ = poller(slots=3)
    made._poll_round(("lookup",), 0.0, short_only=True, rung=True)
    again_after_first = made._rung
    made._rung = False
    made._poll_round(("lookup",), 0.0, short_only=True, rung=True)
    assert (again_after_first, made._rung) == (True, False)
    assert [count for _, _, count, _ in api.polls] == [3, 3]
