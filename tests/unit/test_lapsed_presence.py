"""Unit tests: a process whose presence has lapsed runs no task of a run it holds the lease on, even before its
fence's thread lets the run go (a starved process answers its polls late; another may have adopted the run)."""

from __future__ import annotations

import time

from conductor_agents._serving.leases import Lease
from conductor_agents._serving.service import Service
from conductor_agents._worker.poller import DomainPoller
from tests.unit.fakes import FakeClock

DOMAIN = "0123456789abcdef0123456789abcdef"
OTHER = "fedcba9876543210fedcba9876543210"


class _Executor:
    def __init__(self):
        self.submitted = []

    def free_slots(self):
        return 4

    def submit(self, task, tool_def):
        self.submitted.append(task["taskId"])


class _Api:
    def __init__(self):
        self.updates = []

    def poll_tasks(self, task_type, *, worker_id, domain, count, timeout_ms, http_timeout):
        return [{"taskType": task_type, "taskId": "t0", "workflowInstanceId": "run"}]

    def update_task(self, result):
        self.updates.append(result)


def _poller(may_serve):
    api, executor = _Api(), _Executor()
    poller = DomainPoller(api, executor, domain=DOMAIN, worker_id="w", long_poll_ms=1000, poll_interval_ms=1,
                          clock=FakeClock(), may_serve=may_serve)
    poller._tools = {"act": object()}
    poller._polled.add("act")
    poller._next_safety = 1e9
    return poller, api, executor


def test_a_task_polled_while_the_process_may_not_serve_its_domain_is_handed_back_not_run():
    poller, api, executor = _poller(lambda: False)
    poller._poll_round(("act",), 0.0, short_only=True, rung=True)
    assert executor.submitted == []
    [update] = api.updates
    assert (update["taskId"], update["status"], update["workerId"]) == ("t0", "IN_PROGRESS", "w")


def test_a_task_polled_while_the_process_may_serve_its_domain_runs():
    poller, api, executor = _poller(lambda: True)
    poller._poll_round(("act",), 0.0, short_only=True, rung=True)
    assert executor.submitted == ["t0"] and api.updates == []


def test_the_gate_closes_only_on_a_domain_whose_lease_is_held_while_the_presence_has_lapsed():
    service = Service(object(), worker_id="me", dead_after=6.0, adopt=lambda *a: None,  # type: ignore[arg-type]
                      serving_here=lambda domain: False, let_go=lambda domain: None, pause=lambda s: False)
    service.adopter.hold(Lease(DOMAIN, 1, "me"))
    service.presence._own = (time.monotonic(), 0.5)  # its row read back half a second old, just now
    assert service.may_serve(DOMAIN) and service.may_serve(OTHER)
    service.presence._own = (time.monotonic() - 4.0, 0.6)  # 4.6 s: past the fence's 3/4 of 6 s
    assert not service.may_serve(DOMAIN)
    assert service.may_serve(OTHER)  # a run it holds no lease on (a plain start()) is its own


class _Book:
    """The server's leases of DOMAIN: lease ``taken_by`` holds the next one if set (another process adopted)."""

    def __init__(self, taken_by=None):
        self.taken_by, self.claims = taken_by, []

    def claim(self, domain, epoch, owner, *, execution_id=""):
        self.claims.append((domain, epoch, owner))
        return Lease(domain, epoch, self.taken_by or owner)

    def forget(self, domain):
        pass


def _fenced_service(book):
    let_go = []
    service = Service(object(), worker_id="me", dead_after=6.0, adopt=lambda *a: None,  # type: ignore[arg-type]
                      serving_here=lambda domain: False, let_go=let_go.append, pause=lambda s: False)
    service.adopter._book = book
    service.adopter.hold(Lease(DOMAIN, 1, "me"))
    service._fenced()  # what the presence thread does once the row could not be renewed for 3/4 of 6 s
    service.presence._own = (time.monotonic(), 0.5)  # the server is back: the row renewed just now
    return service, let_go


def test_after_a_fence_a_renewed_presence_alone_does_not_reopen_the_gate_the_renewed_lease_does():
    """Seen in a soak: after a server restart longer than 3/4 of the stall, processes that let their runs go at the
    fence did not all take them up again, and nobody else did (their presence was renewed). Now the runs stay
    registered; their tasks wait until the run's next lease is this process's, and serving goes on as it was."""
    book = _Book()
    service, let_go = _fenced_service(book)
    try:
        assert service.adopter.lapsed(DOMAIN) and not service.may_serve(DOMAIN)
        assert service.adopter.renew_lapsed() == 1
        assert book.claims == [(DOMAIN, 2, "me")]
        assert service.may_serve(DOMAIN) and not service.adopter.lapsed(DOMAIN)
        assert service.adopter.held() == [DOMAIN] and let_go == []
    finally:
        service.adopter.close()


def test_after_a_fence_a_run_another_process_took_meanwhile_is_let_go_of():
    book = _Book(taken_by="other")
    service, let_go = _fenced_service(book)
    try:
        assert service.adopter.renew_lapsed() == 0
        assert let_go == [DOMAIN]
        assert service.adopter.held() == [] and not service.adopter.lapsed(DOMAIN)
    finally:
        service.adopter.close()


def test_a_renewed_lease_that_another_process_superseded_a_round_later_is_let_go_of():
    """The other side of the soak's split: a process adopted on a view read before this one's renewal and made a newer
    lease. A round after the renewal, the domain's newest lease is read once more; a newer one of another process
    lets the runs go here (only one process serves them)."""
    book = _Book()
    service, let_go = _fenced_service(book)
    try:
        assert service.adopter.renew_lapsed() == 1
        book.newest = lambda domain: Lease(domain, 3, "other")  # adopted just after the renewal
        service.adopter.check_renewed()
        assert let_go == []  # not before a round has passed
        service.adopter._renewed[DOMAIN] = (Lease(DOMAIN, 2, "me"), 0.0)  # a round later
        service.adopter.check_renewed()
        assert let_go == [DOMAIN] and service.adopter.held() == []
        service.adopter.check_renewed()  # looked at once
        assert let_go == [DOMAIN]
    finally:
        service.adopter.close()


def test_a_renewed_lease_still_the_newest_a_round_later_keeps_its_runs():
    book = _Book()
    service, let_go = _fenced_service(book)
    try:
        assert service.adopter.renew_lapsed() == 1
        book.newest = lambda domain: Lease(domain, 2, "me")
        service.adopter._renewed[DOMAIN] = (Lease(DOMAIN, 2, "me"), 0.0)
        service.adopter.check_renewed()
        assert let_go == [] and service.adopter.held() == [DOMAIN]
    finally:
        service.adopter.close()
