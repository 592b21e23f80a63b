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
