"""Whose end of a listener's mailbox speaks for the listener: only an explicit one from outside the SDK."""

from __future__ import annotations

import logging

import pytest

from conductor_agents._listener.following import MAILBOX_ENDED_REASON, ended_from_outside
from conductor_agents.errors import ExecutionNotFoundError


class _Api:
    def __init__(self, run: "dict | None") -> None:
        self.run = run

    def get_workflow(self, execution_id: str, *, include_tasks: bool = False, timeout: object = None) -> dict:
        if self.run is None:
            raise ExecutionNotFoundError("gone", execution_id=execution_id)
        return self.run


@pytest.mark.parametrize("run, expected", [
    ({"status": "TERMINATED", "reasonForIncompletion": "from the ops console"},
     "it was ended from outside the SDK (from the ops console)"),
    ({"status": "TERMINATED"}, "it was ended from outside the SDK"),
    (None, "it was removed from the server"),
    ({"status": "TERMINATED", "reasonForIncompletion": MAILBOX_ENDED_REASON}, None),  # the SDK's own, after the end
    ({"status": "RUNNING"}, None),
    ({"status": "PAUSED"}, None),
])
def test_an_explicit_end_from_outside_is_told_from_the_sdks_own(run: "dict | None", expected: "str | None") -> None:
    assert ended_from_outside(_Api(run), "mailbox-1") == expected  # type: ignore[arg-type]


def test_a_mailbox_that_failed_leaves_the_listener_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    """Not a caller's decision: the listener goes on (the SDK's senders still reach it)."""
    with caplog.at_level(logging.WARNING, logger="conductor_agents.continuation"):
        failed = _Api({"status": "FAILED", "reasonForIncompletion": "boom"})
        assert ended_from_outside(failed, "m") is None  # type: ignore[arg-type]
    assert "FAILED" in caplog.text and "boom" in caplog.text
