"""Guardrails on the real server: a regex check the model is asked to fix, Python checks as workers."""

from __future__ import annotations

import threading

import pytest

from conductor_agents import Agent, Guardrail, GuardrailResult, RunStatus, tool
from conductor_agents.testing import ToolCall

pytestmark = pytest.mark.integration

RETRY_NOTE = "Output validation failed: Do not reveal keys.. Please revise your response."


def test_a_regex_guardrail_retry_is_shown_to_the_model(agent_runtime, scripted_llm, unique_name):
    """The first answer leaks a key: the server blocks it, the model sees why and answers again."""
    model = scripted_llm.script(["Your key is sk-live-12345.", "I cannot share keys."])
    guard = Guardrail.regex("no_keys", [r"sk-live-\d+"], message="Do not reveal keys.", max_retries=2)
    agent = Agent(name=unique_name("guarded"), model=model, guardrails=[guard])
    result = agent_runtime.run(agent, "What is my key?", timeout=120)
    assert result.status is RunStatus.COMPLETED, result.error
    assert result.output == "I cannot share keys."
    first, second = scripted_llm.requests_for(model)
    assert RETRY_NOTE not in first.user_text
    assert RETRY_NOTE in second.user_text


def test_a_regex_guardrail_that_raises_fails_the_run(agent_runtime, scripted_llm, unique_name):
    """on_fail='raise': the leaking answer never leaves; the run fails with the guardrail's message."""
    model = scripted_llm.script(["Your key is sk-live-12345."])
    guard = Guardrail.regex("no_keys", [r"sk-live-\d+"], message="Do not reveal keys.", on_fail="raise")
    result = agent_runtime.run(Agent(name=unique_name("strict"), model=model, guardrails=[guard]), "Key?",
                               timeout=120)
    assert result.status is RunStatus.FAILED
    assert "Do not reveal keys." in (result.error or "")
    assert result.output is None or "sk-live" not in str(result.output)


@pytest.mark.parametrize("stateful", [False, True])
def test_a_python_guardrail_runs_here_and_its_retry_reaches_the_model(stateful, agent_runtime, scripted_llm,
                                                                      unique_name):
    """A function guardrail is a worker of this process (on the run's domain when stateful)."""
    checked: list = []
    lock = threading.Lock()

    def polite(text: str) -> GuardrailResult:
        with lock:
            checked.append((text, threading.current_thread().name))
        return GuardrailResult("stupid" not in text, message="Be polite.")

    model = scripted_llm.script(["That is a stupid question.", "Good question!"])
    guard = Guardrail.function(polite, name=unique_name("polite"))
    agent = Agent(name=unique_name("polite_agent"), model=model, guardrails=[guard], stateful=stateful)
    handle = agent_runtime.start(agent, "Ask me anything.")
    result = handle.wait(timeout=120)
    assert result.status is RunStatus.COMPLETED, result.error
    assert result.output == "Good question!"
    assert [text for text, _ in checked] == ["That is a stupid question.", "Good question!"]
    assert all(name.startswith("conductor-agents-tool") for _, name in checked)
    assert "Output validation failed: Be polite.. Please revise your response." in \
        scripted_llm.requests_for(model)[1].user_text
    if stateful:
        tasks = agent_runtime._api.get_workflow(handle.execution_id, include_tasks=True)["tasks"]
        domains = {t.get("domain") for t in tasks if t.get("taskDefName") == guard.name}
        assert domains == {handle.run_id}


def test_a_python_guardrail_can_fix_the_answer(agent_runtime, scripted_llm, unique_name):
    """on_fail='fix': the function's fixed_output replaces the answer."""
    model = scripted_llm.script(["Call me at 555-0100."])

    def redact(text: str) -> GuardrailResult:
        return GuardrailResult("555-" not in text, "No phone numbers.", fixed_output=text.replace("555-0100", "[redacted]"))

    guard = Guardrail.function(redact, name=unique_name("redact"), on_fail="fix")
    result = agent_runtime.run(Agent(name=unique_name("fixer"), model=model, guardrails=[guard]), "Contact?",
                               timeout=120)
    assert result.status is RunStatus.COMPLETED, result.error
    assert result.output == "Call me at [redacted]."


def test_stop_when_ends_the_loop_from_python(agent_runtime, scripted_llm, unique_name):
    """A model that would call its tool forever stops after the turn the Python rule says so."""
    calls: list = []
    turns: list = []

    @tool(name=unique_name("step"))
    def step() -> str:
        """Take one step."""
        calls.append(1)
        return "stepped"

    def enough(text: str, turn: int) -> bool:
        turns.append(turn)
        return turn >= 3

    model = scripted_llm.script(policy=lambda request: ToolCall(step.name, {}))
    agent = Agent(name=unique_name("walker"), model=model, tools=[step], max_turns=20, stop_when=enough)
    result = agent_runtime.run(agent, "Walk.", timeout=120)
    assert result.status is RunStatus.COMPLETED, result.error
    assert turns == [1, 2, 3]
    assert len(calls) == 3


def test_an_llm_guardrail_asks_its_model_and_the_retry_reaches_the_agent(agent_runtime, scripted_llm, unique_name):
    """Guardrail.llm: the server asks the judge model with the policy; a failed verdict is a retry."""
    judge = scripted_llm.script(['{"passed": false, "reason": "It is rude."}', '{"passed": true, "reason": "ok"}'])
    model = scripted_llm.script(["Go away.", "Happy to help!"])
    guard = Guardrail.llm("courtesy", model=judge, policy="Answers must be courteous.", max_retries=2)
    result = agent_runtime.run(Agent(name=unique_name("judged"), model=model, guardrails=[guard]), "Help?",
                               timeout=120)
    assert result.status is RunStatus.COMPLETED, result.error
    assert result.output == "Happy to help!"
    first_check, second_check = scripted_llm.requests_for(judge)
    assert "POLICY: Answers must be courteous." in first_check.instructions
    assert first_check.user_text.startswith("Go away.") and second_check.user_text.startswith("Happy to help!")
    assert "Output validation failed: It is rude." in scripted_llm.requests_for(model)[1].user_text
