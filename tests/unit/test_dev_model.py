"""The scripted model of ``server start --scripted-model`` (issue 34, point 2): it plays any listener (the
message's action becomes the agent's tool, its other keys the arguments) and answers other agents' prompts."""

from __future__ import annotations

from typing import Iterator

import pytest

from conductor_agents.testing import ScriptedLLM
from conductor_agents.testing._dev_model import DEV_MODEL, DevModel

from .test_scripted_llm import Conversation, message_queue


@pytest.fixture
def model() -> Iterator[tuple]:
    with ScriptedLLM() as llm:
        yield llm, llm.script(model=DEV_MODEL, policy=DevModel())


def test_a_listener_gets_its_tool_called_with_the_messages_arguments_and_stops(model) -> None:
    llm, name = model
    assert name == "openai/scripted"
    reports = []
    run = Conversation(llm, name, {
        "wait_for_message": message_queue([{"action": "generate-report", "topic": "sales"}],
                                          [{"action": "no-such-tool"}, {"message": "hello"}],
                                          [{"_signal": "stop"}]),
        "generate_report": lambda arguments: reports.append(arguments) or {"saved_to": "/reports/x.pdf"},
    }, prompt="Start listening.")
    assert run.run() == "stopped"
    assert reports == [{"topic": "sales"}]  # the unknown action and the text were read and left alone
    assert [call for call, _ in run.calls] == ["wait_for_message", "generate_report", "wait_for_message",
                                               "wait_for_message"]
    llm.assert_no_anomalies()


def test_any_other_agent_gets_an_answer_to_its_prompt(model) -> None:
    llm, name = model
    assert Conversation(llm, name, {"take_note": lambda arguments: {}}, prompt="Say hi.").run() == \
        "Scripted answer to: Say hi."
