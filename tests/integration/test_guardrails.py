"""Guardrails on the real server: a regex check the model is asked to fix, Python checks as workers."""

from __future__ import annotations

import threading

import pytest

from conductor_agents import Agent, Guardrail, GuardrailResult, PendingRequest, RunStatus, Termination, tool
from conductor_agents.testing import Reply, ToolCall, Usage

from ..helpers import eventually

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


def review_of(handle, timeout: float = 60) -> PendingRequest:
    requests = eventually(lambda: [r for r in handle.pending() if r.kind == PendingRequest.REVIEW], timeout=timeout,
                          interval=0.2, message="a pending review")
    assert len(requests) == 1, requests
    return requests[0]


@pytest.mark.parametrize("answer", ["approve", "edit"])
def test_a_failed_guardrail_with_on_fail_human_waits_for_a_person(answer, agent_runtime, scripted_llm, unique_name):
    """on_fail='human': the run waits (a review in pending(), a waiting event for a person); approve
    keeps the answer, an edit (respond) becomes the run's output."""
    model = scripted_llm.script(["Your key is sk-live-12345."])
    guard = Guardrail.regex("no_keys", [r"sk-live-\d+"], message="Do not reveal keys.", on_fail="human")
    handle = agent_runtime.start(Agent(name=unique_name("reviewed"), model=model, guardrails=[guard]), "Key?")
    with handle.events(timeout=120) as events:
        waiting = next(e for e in events if e.kind == "waiting" and e.for_person)
    assert waiting.for_review
    request = review_of(handle)
    assert (request.output, request.guardrail, request.guardrail_message) == \
        ("Your key is sk-live-12345.", "no_keys", "Do not reveal keys.")
    status = handle.status()
    assert status.is_waiting and not status.is_terminal
    if answer == "approve":
        taken = handle.approve(by="ann")
        assert (taken.action, taken.approved, taken.answered_by) == ("approve", True, "ann")
        expected = "Your key is sk-live-12345."
    else:
        taken = handle.respond("Your key is [hidden].", by="ann")
        assert (taken.action, taken.answer) == ("edit", "Your key is [hidden].")
        expected = "Your key is [hidden]."
    result = handle.wait(timeout=90)
    assert (result.status, result.output) == (RunStatus.COMPLETED, expected), result.error
    assert handle.pending() == ()
    assert len(scripted_llm.requests_for(model)) == 1  # no retry: the person decided
    assert not [c for c in result.tool_calls if "guardrail" in c.name]


def test_a_review_in_a_stateful_run_after_its_tool_ran_here(agent_runtime, scripted_llm, unique_name):
    """A stateful run: its tool runs on the run's domain, the final answer waits for review, the edit
    is the output; rejecting a review ends the run FAILED with the reason."""
    ran: list = []

    @tool(name=unique_name("lookup"))
    def lookup(user: str) -> dict:
        """Look a user up."""
        ran.append(threading.current_thread().name)
        return {"user": user, "key": "sk-live-999"}

    def policy(request):
        if request.turn_index == 0:
            return ToolCall(lookup.name, {"user": "ann"})
        return f"Ann's key is {request.tool_outputs[0].output['key']}."

    guard = Guardrail.regex("no_keys", [r"sk-live-\d+"], message="Do not reveal keys.", on_fail="human")
    model = scripted_llm.script(policy=policy)
    agent = Agent(name=unique_name("stateful_review"), model=model, tools=[lookup], guardrails=[guard],
                  stateful=True, max_turns=5)
    handle = agent_runtime.start(agent, "Ann's key?")
    request = review_of(handle)
    assert request.output == "Ann's key is sk-live-999."
    assert agent_runtime.pending(handle.execution_id) == (request,)
    assert handle.respond("Ann's key is on file.").action == "edit"
    result = handle.wait(timeout=90)
    assert (result.status, result.output) == (RunStatus.COMPLETED, "Ann's key is on file."), result.error
    assert len(ran) == 1 and ran[0].startswith("conductor-agents-tool")
    tasks = agent_runtime._api.get_workflow(handle.execution_id, include_tasks=True)["tasks"]
    assert {t.get("domain") for t in tasks if t.get("taskDefName") == lookup.name} == {handle.run_id}

    handle = agent_runtime.start(agent, "Ann's key?")
    review_of(handle)
    rejected = handle.reject("it leaks a key", by="bob")
    assert (rejected.action, rejected.reason) == ("reject", "it leaks a key")
    result = handle.wait(timeout=90)
    assert result.status is RunStatus.FAILED
    assert "it leaks a key" in (result.error or "")


def test_a_token_usage_termination_ends_the_loop_once_the_run_has_used_too_many(agent_runtime, scripted_llm,
                                                                               unique_name):
    """Termination.token_usage: the worker reads the server's count; 30 tokens a turn, limit 70: three turns."""
    calls: list = []

    @tool(name=unique_name("spend"))
    def spend() -> str:
        """Spend a turn."""
        calls.append(1)
        return "spent"

    model = scripted_llm.script(policy=lambda request: Reply(tool_calls=[ToolCall(spend.name, {})],
                                                             usage=Usage(input_tokens=20, output_tokens=10)))
    agent = Agent(name=f"spender_{unique_name('t')[-7:]}", model=model, tools=[spend], max_turns=20,
                  termination=Termination.token_usage(max_total_tokens=70))
    result = agent_runtime.run(agent, "Spend.", timeout=120)
    assert result.status is RunStatus.COMPLETED, result.error
    assert len(scripted_llm.requests_for(model)) == 3 and len(calls) == 3
    assert (result.token_usage.prompt_tokens, result.token_usage.completion_tokens,
            result.token_usage.total_tokens) == (60, 30, 90)


def test_a_completion_token_limit_joined_with_another_condition(agent_runtime, scripted_llm, unique_name):
    """token_usage(max_completion_tokens=...) | max_messages(...): whichever comes first ends the loop."""

    @tool(name=unique_name("step"))
    def step() -> str:
        """Take a step."""
        return "ok"

    model = scripted_llm.script(policy=lambda request: Reply(tool_calls=[ToolCall(step.name, {})],
                                                             usage=Usage(input_tokens=1, output_tokens=40)))
    condition = Termination.token_usage(max_completion_tokens=50) | Termination.max_messages(10)
    agent = Agent(name=f"talker_{unique_name('t')[-7:]}", model=model, tools=[step], max_turns=20, termination=condition)
    result = agent_runtime.run(agent, "Go.", timeout=120)
    assert result.status is RunStatus.COMPLETED, result.error
    assert len(scripted_llm.requests_for(model)) == 2  # 40, then 80 > 50


def shell_tool(name: str, ran: list, *guardrails):
    @tool(name=name, guardrails=list(guardrails))
    def shell(cmd: str) -> str:
        """Run a shell command."""
        ran.append(cmd)
        return f"ran {cmd}"

    return shell


def test_a_tool_guardrail_that_raises_stops_the_run_before_the_call_runs(agent_runtime, scripted_llm, unique_name):
    """tool(guardrails=[regex on_fail='raise']): a call matching the pattern never runs; a clean one does."""
    ran: list = []
    guard = Guardrail.regex("no_rm", [r"rm -rf"], message="No deletions.", on_fail="raise")
    shell = shell_tool(unique_name("shell"), ran, guard)

    def policy(request):
        if request.turn_index == 0:
            return ToolCall(shell.name, {"cmd": "ls"})
        if request.turn_index == 1:
            return ToolCall(shell.name, {"cmd": "rm -rf /"})
        return "done"

    model = scripted_llm.script(policy=policy)
    agent = Agent(name=unique_name("ops"), model=model, tools=[shell], max_turns=6)
    result = agent_runtime.run(agent, "Clean up.", timeout=120)
    assert result.status is RunStatus.FAILED
    assert "No deletions." in (result.error or "")
    assert ran == ["ls"]


@pytest.mark.parametrize("stateful", [False, True])
def test_a_python_tool_guardrail_sees_the_calls_and_its_retry_reaches_the_model(stateful, agent_runtime,
                                                                               scripted_llm, unique_name):
    """A function tool guardrail runs here (on the run's domain when stateful) with the turn's calls as text."""
    seen: list = []
    ran: list = []

    def no_sudo(text: str) -> GuardrailResult:
        seen.append(text)
        return GuardrailResult("sudo" not in text, message="Never use sudo.")

    guard = Guardrail.function(no_sudo, name=unique_name("no_sudo"), on_fail="retry", max_retries=3)
    shell = shell_tool(unique_name("shell"), ran, guard)

    def policy(request):
        if request.turn_index == 0:
            return ToolCall(shell.name, {"cmd": "sudo ls"})
        if request.turn_index == 1:
            return ToolCall(shell.name, {"cmd": "ls"})
        return "done"

    model = scripted_llm.script(policy=policy)
    agent = Agent(name=unique_name("ops"), model=model, tools=[shell], max_turns=6, stateful=stateful)
    handle = agent_runtime.start(agent, "List files.")
    result = handle.wait(timeout=120)
    assert result.status is RunStatus.COMPLETED, result.error
    assert result.output == "done"
    assert len(seen) == 2 and "sudo ls" in seen[0] and shell.name in seen[0]
    assert "Output validation failed: Never use sudo." in scripted_llm.requests_for(model)[1].user_text
    assert ran == ["sudo ls", "ls"]  # 3.32.3: a tool guardrail's retry tells the model, the turn's calls still run
    if stateful:
        tasks = agent_runtime._api.get_workflow(handle.execution_id, include_tasks=True)["tasks"]
        assert {t.get("domain") for t in tasks if t.get("taskDefName") == guard.name} == {handle.run_id}


def test_a_tool_guardrail_with_on_fail_human_holds_the_calls_until_approved(agent_runtime, scripted_llm,
                                                                           unique_name):
    """tool guardrail on_fail='human': nothing runs while the review waits; approve() lets the call run."""
    ran: list = []
    guard = Guardrail.regex("no_prod", [r"prod"], message="Production needs a person.", on_fail="human")
    shell = shell_tool(unique_name("shell"), ran, guard)

    def policy(request):
        if request.turn_index == 0:
            return ToolCall(shell.name, {"cmd": "deploy prod"})
        return f"result: {request.tool_outputs[0].output}"

    model = scripted_llm.script(policy=policy)
    handle = agent_runtime.start(Agent(name=unique_name("deployer"), model=model, tools=[shell], max_turns=4),
                                 "Deploy.")
    review = review_of(handle)
    assert "deploy prod" in (review.output or "") and review.guardrail == "no_prod"
    assert ran == []
    assert handle.approve(by="ops").action == "approve"
    result = handle.wait(timeout=90)
    assert result.status is RunStatus.COMPLETED, result.error
    assert ran == ["deploy prod"]
    assert "ran deploy prod" in (result.output or "")
