"""Which failed runs the SDK retries as the server's own fault, and the bound on it (the real server's case:
``tests/reliability/test_server_fault.py``)."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from conductor_agents._liveness.server_fault import is_scheduling_failure, retry_if_server_fault
from conductor_agents._wire.transport import HttpError

RUN = "0b7a5c1e-2f3d-4e5a-8b6c-7d8e9f0a1b2d"
FAULT = f"Error scheduling tasks: [t1, t2], for workflow: {RUN}"


class _Api:
    """A run as the server reports it; ``retry`` raises ``refuse`` (the run is then ``after_refusal``)."""

    def __init__(self, status: str, reason: str = FAULT, *, last_retry: int = 0, ended: int = 1_000_000,
                 refuse: Exception | None = None, after_refusal: str = "FAILED") -> None:
        self.run: dict[str, Any] = {"status": status, "reasonForIncompletion": reason, "endTime": ended,
                                      "lastRetriedTime": last_retry}
        self.refuse, self.after_refusal = refuse, after_refusal
        self.retries = 0

    def get_workflow(self, execution_id: str, *, include_tasks: bool = False) -> dict[str, Any]:
        return dict(self.run)

    def workflow_status(self, execution_id: str) -> dict[str, Any]:
        return {"status": self.after_refusal if self.refuse else self.run["status"]}

    def retry_workflow(self, execution_id: str) -> None:
        self.retries += 1
        if self.refuse is not None:
            raise self.refuse
        self.run["status"] = "RUNNING"


def _http(status: int, said: str) -> HttpError:
    return HttpError(f"POST /workflow/x/retry failed with HTTP {status}: {said}", status=status, server_message=said,
                     method="POST", path="/workflow/x/retry")


def test_only_a_failure_to_write_the_decided_tasks_counts_as_the_servers_fault():
    assert is_scheduling_failure("FAILED", FAULT)
    assert not is_scheduling_failure("TERMINATED", FAULT)
    assert not is_scheduling_failure("FAILED", "Task call_1 failed: the model refused the key")
    assert not is_scheduling_failure("FAILED", None)


def test_a_run_failed_by_the_server_is_retried_once_and_another_end_is_left_alone():
    api = _Api("FAILED")
    assert retry_if_server_fault(api, RUN) and api.retries == 1
    other = _Api("FAILED", "Task act failed after 3 retries")
    assert not retry_if_server_fault(other, RUN) and other.retries == 0
    # A caller's own read that shows another end: nothing more is read or retried.
    assert not retry_if_server_fault(other, RUN, seen={"status": "COMPLETED"})
    assert not retry_if_server_fault(other, RUN, seen={"status": "FAILED", "reason": "the model failed"})


def test_a_run_that_failed_again_within_a_minute_of_its_retry_is_left_failed(caplog):
    caplog.set_level(logging.WARNING)
    again = _Api("FAILED", last_retry=1_000_000 - 20_000)  # failed 20 s after its last retry
    assert not retry_if_server_fault(again, RUN) and again.retries == 0
    assert "not passing" in caplog.text
    later = _Api("FAILED", last_retry=1_000_000 - 120_000)  # two minutes after: a new fault, retried
    assert retry_if_server_fault(later, RUN) and later.retries == 1


def test_a_retry_another_process_made_first_counts_and_a_failed_retry_raises():
    raced = _Api("FAILED", refuse=_http(404, "Workflow is still running"),
                 after_refusal="RUNNING")
    assert retry_if_server_fault(raced, RUN)
    failed = _Api("FAILED", refuse=_http(500, "LOADING Redis is loading"))
    with pytest.raises(HttpError):
        retry_if_server_fault(failed, RUN)
