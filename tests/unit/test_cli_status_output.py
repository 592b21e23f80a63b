"""``conductor-agents status`` shows the run's answer as ``wait`` does (issue 41, point 4): it printed the server's
tool-call placeholder as the output of a stopped listener, where ``wait --json`` says ``"output": null``."""

from __future__ import annotations

from conductor_agents.cli._agents import _answer
from conductor_agents.result import AgentStatus


def status(output: dict) -> AgentStatus:
    return AgentStatus.from_dict({"executionId": "wf-1", "status": "COMPLETED", "output": output})


def test_status_shows_no_output_after_a_turn_of_tool_calls() -> None:
    placeholder = '[{"name":"wait_for_message","inputs":{}}]'  # as the 3.32.3 server answers a stopped listener
    assert _answer(status({"result": placeholder, "finishReason": "TOOL_CALLS"})) is None


def test_status_shows_an_answer_as_text_and_an_object_as_json() -> None:
    assert _answer(status({"result": "all done", "finishReason": "STOP"})) == "all done"
    assert _answer(status({"result": {"total": 3}, "finishReason": "STOP"})) == '{"total": 3}'  # not a Python repr
    assert _answer(status({})) is None
