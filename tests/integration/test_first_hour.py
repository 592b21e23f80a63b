"""What a newcomer meets in the first hour (issue 34): the documented examples run as written, and
a run that ended without an answer says why, from Python and from the CLI."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conductor_agents import Agent, tool
from conductor_agents.testing import ToolCall

pytestmark = pytest.mark.integration

REPO_ROOT = Path(__file__).resolve().parents[2]


def python_block(doc: str, marker: str) -> str:
    """The first ```python block of ``docs/<doc>`` that contains ``marker``."""
    text = (REPO_ROOT / "docs" / doc).read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    return next(block for block in blocks if marker in block)


class ActionTools:
    def __init__(self) -> None:
        self.reports: list = []

    @tool
    def generate_report(self, kind: str) -> dict:
        """Generate a report."""
        self.reports.append(kind)
        return {"report": kind}


def test_the_listener_example_of_docs_testing_runs_as_written(scripted_llm, agent_runtime, unique_name) -> None:
    """docs/testing.md's listener example: after stop() the run COMPLETED with no answer, ended_by "stop"
    (point 3: the doc said output == "stopped", the run said a tool-call placeholder)."""
    block = python_block("testing.md", "handle.stop()")
    assert 'assert result.ended_by == "stop"' in block
    code = block.replace('name="listener"', f'name="{unique_name("doc_listener")}"')
    scope = {"llm": scripted_llm, "runtime": agent_runtime, "ActionTools": ActionTools}
    code = code.replace("result = handle.wait()", "result = handle.wait(timeout=60)")
    try:
        exec(compile(code, "docs/testing.md", "exec"), scope)  # noqa: S102 - the documentation's own code
    except AssertionError:
        result = scope.get("result")
        raise AssertionError(f"{result!r}: {getattr(result, 'raw_output', None)}") from None
    assert scope["result"].ok


def test_a_listener_stopped_while_it_waits_has_no_answer(scripted_llm, agent_runtime, unique_name) -> None:
    """Stopped while blocked in its wait: ended_by "stop", output None, not the tool-call placeholder (point 3)."""
    from conductor_agents import ToolRegistry, WaitForMessageTool
    from conductor_agents.testing import listener_policy

    model = scripted_llm.script(policy=listener_policy(lambda p: ToolCall("generate_report", {"kind": p["action"]})))
    agent = Agent(name=unique_name("waiting_listener"), model=model, stateful=True, max_turns=100,
                  tools=[WaitForMessageTool.create(name="wait_for_message"), *ToolRegistry.from_instance(ActionTools())])
    handle = agent_runtime.start(agent, "Listen.")
    handle.send_message({"action": "sales"})
    from ..helpers import eventually
    eventually(lambda: len(scripted_llm.requests_for(model)) >= 3 and handle.status().is_waiting, timeout=60,
               interval=0.2, message="the listener acted and waits again")
    handle.stop()
    result = handle.wait(timeout=60)
    assert (result.ok, result.ended_by, result.output, result.finish_reason) == (True, "stop", None, "TOOL_CALLS")


AGENT_MODULE = '''
from conductor_agents import Agent, tool


@tool
def take_note(text: str) -> dict:
    """Take a note."""
    return {{"noted": text}}


def make_agent():
    return Agent(name={name!r}, model={model!r}, max_turns=1, tools=[take_note])
'''


def test_the_turn_limit_is_said_not_passed_off_as_an_answer(scripted_llm, agent_runtime, agent_settings,
                                                              unique_name, tmp_path: Path) -> None:
    """max_turns=1 with a 3-turn script: ended_by "turn_limit", no output; the CLI's last line says so (point 5)."""
    script = [ToolCall("take_note", {"text": "a"}), ToolCall("take_note", {"text": "b"}), "done"]
    model = scripted_llm.script(script)
    name = unique_name("limited")
    (tmp_path / "limited.py").write_text(AGENT_MODULE.format(name=name, model=model))

    env = {**os.environ, "CONDUCTOR_SERVER_URL": agent_settings.server_url}
    ran = subprocess.run([sys.executable, "-m", "conductor_agents", "run", "limited.py:make_agent", "go"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout == ""  # no answer to print (was the tool-call placeholder)
    last = ran.stderr.strip().splitlines()[-1]
    assert last.startswith("COMPLETED (turn limit reached: max_turns ran out") and "1 tool call" in last

    model = scripted_llm.script(script)
    agent = Agent(name=unique_name("limited_py"), model=model, max_turns=1,
                  tools=[_note()])
    result = agent_runtime.run(agent, "go", timeout=60)
    assert (result.ok, result.ended_by, result.output, result.finish_reason) == (True, "turn_limit", None,
                                                                               "TOOL_CALLS")


def _note():
    @tool(name="take_note")
    def take_note(text: str) -> dict:
        """Take a note."""
        return {"noted": text}
    return take_note


def test_the_local_stack_example_of_docs_testing_runs(scripted_llm, agent_settings, unique_name) -> None:
    """docs/testing.md documents LocalStack, as the README says it does (point 10). Its example runs
    with the session's own server and ScriptedLLM standing in for a fresh pair (one server per session)."""
    block = python_block("testing.md", "with LocalStack() as stack:")

    class SessionStack:
        def __init__(self) -> None:
            self.llm, self.settings, self.url = scripted_llm, agent_settings, agent_settings.server_url

        def __enter__(self) -> "SessionStack":
            return self

        def __exit__(self, *exc: object) -> None:
            pass

    code = block.replace("from conductor_agents.testing import LocalStack\n", "")
    code = code.replace('name="hello"', f'name="{unique_name("hello")}"')
    scope = {"LocalStack": SessionStack}
    exec(compile(code, "docs/testing.md", "exec"), scope)  # noqa: S102 - the documentation's own code
    assert scope["result"].output == "Hello from the scripted model."


def test_a_model_the_server_cannot_call_fails_at_once_with_the_fix(scripted_llm, agent_runtime, agent_settings,
                                                                    unique_name, tmp_path: Path) -> None:
    """The provider refuses the server's key (HTTP 401, every attempt): run() raises ModelUnavailableError at
    the first failed attempt, naming the key and CONDUCTOR_AGENT_MODEL, and the run is cancelled; the CLI
    says it in one line, exit 2 (point 1: was a minute of retried turns and cut-off repeated errors)."""
    from conductor_agents import ModelUnavailableError, RunStatus

    model = scripted_llm.script(["never reached"])
    scripted_llm.fail_next(model, status=401, count=8, body={"error": {"message": "Incorrect API key"}})
    agent = Agent(name=unique_name("keyless"), model=model, max_turns=2, tools=[_note()])
    with pytest.raises(ModelUnavailableError) as caught:
        agent_runtime.run(agent, "go", timeout=60)
    err = caught.value
    assert (err.cause, err.variable, err.model) == ("rejected_key", "OPENAI_API_KEY", model)
    assert "CONDUCTOR_AGENT_MODEL" in str(err) and "Incorrect API key" not in str(err)
    assert len(scripted_llm.requests_for(model)) == 1  # one attempt, not the server's four
    assert agent_runtime.attach(err.execution_id).status().status is RunStatus.TERMINATED

    model = scripted_llm.script(["never reached"])
    scripted_llm.fail_next(model, status=401, count=8)
    (tmp_path / "keyless.py").write_text(AGENT_MODULE.format(name=unique_name("keyless_cli"), model=model))
    env = {**os.environ, "CONDUCTOR_SERVER_URL": agent_settings.server_url}
    ran = subprocess.run([sys.executable, "-m", "conductor_agents", "run", "keyless.py:make_agent", "go"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    errors = [line for line in ran.stderr.splitlines() if "error" in line.lower()]
    assert ran.returncode == 2, ran.stderr
    assert len(errors) == 1, ran.stderr
    assert errors[0].startswith("conductor-agents: error: the server cannot call the model"), ran.stderr
    assert "OPENAI_API_KEY" in errors[0] and "CONDUCTOR_AGENT_MODEL" in errors[0]


def test_a_model_nobody_scripted_is_refused_by_name(scripted_llm, agent_runtime, unique_name) -> None:
    """Offline, a model the scripted fake has no script for is refused as a provider refuses a model it does not
    have (404): run() raises ModelUnavailableError at the first attempt (was: COMPLETED with the text
    "scripted-llm: no script for model ..."), and the fake's anomaly names the models it scripts."""
    from conductor_agents import ModelUnavailableError

    scripted_llm.script(["unused"])  # at least one model is scripted: the refusal names it (or the first ten)
    model = f"openai/{unique_name('nobody-scripted')}"
    agent = Agent(name=unique_name("unscripted"), model=model, max_turns=2, tools=[_note()])
    with pytest.raises(ModelUnavailableError) as caught:
        agent_runtime.run(agent, "go", timeout=60)
    assert caught.value.cause == "unknown_model" and caught.value.model == model
    assert "has no such model" in str(caught.value)
    [anomaly] = scripted_llm.anomalies_for(model)
    assert anomaly.kind == "unknown_model" and "the models scripted here are openai/" in anomaly.message


def test_a_wait_called_after_the_model_failed_says_so_too(scripted_llm, agent_runtime, agent_settings,
                                                          unique_name) -> None:
    """A wait() that was not running at the first model call (another process, later) raises the same
    ModelUnavailableError, and `wait ID` says it in one line, exit 2 (issue 41, point 5: it returned or
    printed the ended run with the server's raw text and no reason)."""
    from conductor_agents import AgentRuntime, ModelUnavailableError

    model = scripted_llm.script(["never reached"])
    scripted_llm.fail_next(model, status=401, count=8)
    agent = Agent(name=unique_name("keyless_later"), model=model, max_turns=2, tools=[_note()])
    with pytest.raises(ModelUnavailableError) as first:
        agent_runtime.run(agent, "go", timeout=60)
    execution_id = first.value.execution_id
    with AgentRuntime(agent_settings) as elsewhere:
        handle = elsewhere.attach(execution_id)
        for _ in range(2):  # and again: every wait() that reads the end
            with pytest.raises(ModelUnavailableError) as later:
                handle.wait(timeout=30)
            assert (later.value.cause, later.value.model, later.value.execution_id) == (
                "rejected_key", model, execution_id)
    ran = _cli(agent_settings, "wait", execution_id, "--timeout", "30")
    assert ran.returncode == 2, ran.stderr
    last = ran.stderr.strip().splitlines()[-1]
    assert last.startswith("conductor-agents: error: the server cannot call the model"), ran.stderr
    assert "OPENAI_API_KEY" in last and last.endswith(f"run {execution_id} was cancelled"), ran.stderr


def _cli(agent_settings, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "CONDUCTOR_SERVER_URL": agent_settings.server_url}
    return subprocess.run([sys.executable, "-m", "conductor_agents", *args], env=env, capture_output=True, text=True,
                          timeout=120)


def test_status_says_what_the_run_waits_for_and_wait_reports_the_runs_own_counts(
        scripted_llm, agent_runtime, agent_settings, unique_name) -> None:
    """``status --json`` has ``waitingFor: "message"`` while a listener waits (point 12: ``isWaiting`` alone read
    as "waits for a person"); ``wait`` on a cancelled run reports its own duration and tool calls (point 9: it
    printed ``TERMINATED after 0.0s: 0 tool calls``)."""
    import json

    from conductor_agents import ToolRegistry, WaitForMessageTool
    from conductor_agents.testing import listener_policy
    from ..helpers import eventually

    model = scripted_llm.script(policy=listener_policy(lambda p: ToolCall("generate_report", {"kind": p["action"]})))
    agent = Agent(name=unique_name("status_listener"), model=model, stateful=True, max_turns=100,
                  tools=[WaitForMessageTool.create(name="wait_for_message"), *ToolRegistry.from_instance(ActionTools())])
    handle = agent_runtime.start(agent, "Listen.")
    handle.send_message({"action": "sales"})
    eventually(lambda: len(scripted_llm.requests_for(model)) >= 3, timeout=60, interval=0.2,
               message="the listener acted on its message")
    status = {}

    def waits_for_a_message() -> bool:
        ran = _cli(agent_settings, "status", handle.execution_id, "--json")
        status.update(json.loads(ran.stdout))
        return status["waitingFor"] == "message"

    eventually(waits_for_a_message, timeout=60, interval=0.5, message=f"status says it waits: {status}")
    assert status["status"] == "RUNNING"

    handle.cancel("the test is done with it")
    result = handle.wait(timeout=60)
    ran = _cli(agent_settings, "wait", handle.execution_id, "--timeout", "60")
    assert ran.returncode == 1, ran.stderr
    last = ran.stderr.strip().splitlines()[-1]
    calls = len(result.tool_calls)
    assert calls >= 2 and result.duration_seconds and result.duration_seconds > 0
    assert last.startswith(f"TERMINATED after {result.duration_seconds:.1f}s: {calls} tool calls, "), last


def test_an_anthropic_model_is_scripted_as_an_openai_one(scripted_llm, agent_runtime, unique_name) -> None:
    """The fake answers the server's Anthropic provider too (its Messages API): ``anthropic/<model>`` gets the
    script of ``<model>``, tool calls and their results included, so the samples' and the README's default
    model (``anthropic/claude-sonnet-4-6``) runs offline (issue 41, point 5: it could not be scripted)."""
    model = scripted_llm.script([ToolCall("take_note", {"text": "hi"}), "done after the note"])
    anthropic = "anthropic/" + model.split("/", 1)[1]
    result = agent_runtime.run(Agent(name=unique_name("claude"), model=anthropic, max_turns=4, tools=[_note()]),
                               "go", timeout=60)
    assert (result.status.value, result.output) == ("COMPLETED", "done after the note")
    [call] = result.tool_calls
    assert call.name == "take_note" and call.arguments.get("text") == "hi"
    second = scripted_llm.requests_for(model)[1]
    assert second.path.endswith("/v1/messages") and [out.name for out in second.tool_outputs] == ["take_note"]
    scripted_llm.assert_no_anomalies(model)
