"""A handle's repr says what it knows without a request (issue 34, point 12: ``status=unknown`` right after
``start`` read as if the run's state were unknown; issue 41: ``status=not-read-yet`` was no better: what was
not read is left out)."""

from __future__ import annotations

import re

from conductor_agents import AgentRuntime, AgentSettings
from tests.unit.fakes import BASE_URL, status_body


def test_repr_leaves_out_the_status_until_it_was_read_then_shows_it(http):
    http.add(http.GET, re.compile(BASE_URL + r"/agent/wf-1/status.*"), json=status_body("wf-1", "RUNNING"))
    http.add(http.GET, re.compile(BASE_URL + r"/workflow/wf-1.*"),
             json={"workflowId": "wf-1", "status": "RUNNING", "input": {}, "variables": {}, "tasks": []})
    with AgentRuntime(AgentSettings(server_url=BASE_URL)) as runtime:
        handle = runtime.attach("wf-1")
        calls = len(http.calls)
        assert repr(handle) == "AgentHandle(execution_id='wf-1', workers=none)"
        assert len(http.calls) == calls  # repr sends nothing
        handle.status()
        assert "status=RUNNING" in repr(handle)


def test_a_results_repr_names_its_tool_calls_without_their_messages():
    """A listener's AgentResult repr printed every raw message its wait tool read, the internal
    ``{'_signal': 'stop'}`` included (issue 41, point 6): it says how many calls and their names."""
    from conductor_agents import AgentResult, RunStatus, ToolCallRecord

    waits = [ToolCallRecord(name="wait_for_message", task_reference_name=f"w{n}", status="COMPLETED",
                            output={"messages": [{"id": f"m{n}", "payload": {"_signal": "stop"}}]}) for n in range(7)]
    shown = repr(AgentResult(execution_id="wf-1", status=RunStatus.COMPLETED, tool_calls=tuple(waits)))
    assert "tool_calls=<7: wait_for_message, wait_for_message, wait_for_message, wait_for_message, " \
           "wait_for_message, ... 2 more>" in shown
    assert "_signal" not in shown and "m0" not in shown
    assert "tool_calls=()" in repr(AgentResult(execution_id="wf-1", status=RunStatus.COMPLETED))
