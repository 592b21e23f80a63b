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
