"""ModelSettings (checks, how they change a start's config) and signal() (how a signal is posted), no server."""

from __future__ import annotations

from typing import Any, List

import pytest
import responses

from conductor_agents import (Agent, AgentDefinitionError, AgentRuntime, AgentSettings, AgentTypeError,
                              ModelSettings, ServerError, tool)
from conductor_agents._listener.signals import SIGNAL_VARIABLE, post_signal
from conductor_agents._runs.start import start_body
from conductor_agents._teams.model_settings import METADATA_KEY, apply_model_settings, recorded_model_settings
from conductor_agents.testing import LLMRequest

from .fakes import BASE_URL, FakeClock



@tool
def lookup(key: str) -> str:
    """Look a key up."""
    return key


def agent(**fields: Any) -> Agent:
    return Agent(name=fields.pop("name", "a"), model=fields.pop("model", "openai/own"), **fields)


@pytest.mark.parametrize("fields, error, word", [
    ({"temperature": -0.1}, AgentDefinitionError,
     r"^ModelSettings\.temperature must be a number from 0 to 2 or None, got -0\.1$"),
    ({"temperature": 2.5}, AgentDefinitionError,
     r"^ModelSettings\.temperature must be a number from 0 to 2 or None, got 2\.5$"),
    ({"temperature": "hot"}, AgentTypeError, "temperature"),
    ({"temperature": True}, AgentTypeError, "temperature"),
    ({"max_tokens": 0}, AgentDefinitionError, r"^ModelSettings\.max_tokens must be an int >= 1 or None, got 0$"),
    ({"max_tokens": -5}, AgentDefinitionError, r"^ModelSettings\.max_tokens must be an int >= 1 or None, got -5$"),
    ({"max_tokens": 1.5}, AgentTypeError, "max_tokens"),
    ({"reasoning_effort": "extreme"}, AgentDefinitionError, "minimal, low, medium, high"),
    ({"model": "gpt-4o"}, AgentDefinitionError, "provider/model"),
    ({"model": 4}, AgentTypeError, "model"),
    ({"sub_agents": "yes"}, AgentTypeError, "sub_agents"),
])
def test_bad_values_are_refused_at_construction(fields, error, word):
    with pytest.raises(error, match=word) as caught:
        ModelSettings(**fields)
    assert caught.value.field == next(iter(fields))


def test_the_limits_themselves_are_valid():
    settings = ModelSettings(temperature=0, max_tokens=1, reasoning_effort="minimal")
    assert ModelSettings(temperature=2).temperature == 2 and not settings.is_empty and ModelSettings().is_empty


def test_settings_change_the_start_config_and_reach_the_team_but_not_the_agent():
    first, second = agent(name="first"), agent(name="second", temperature=0.9)
    team = agent(name="team", agents=[first, second], strategy="sequential")
    settings = ModelSettings(model="openai/other", temperature=0.2, max_tokens=64, reasoning_effort="high")
    body = start_body(team, "hi", None, None, context=None, idempotency_key=None, model_settings=settings)
    config = body["agentConfig"]
    for each in (config, *config["agents"]):
        assert (each["model"], each["temperature"], each["maxTokens"], each["reasoningEffort"]) == \
            ("openai/other", 0.2, 64, "high")
    assert config["metadata"][METADATA_KEY] == settings.to_dict()
    assert team.to_config()["model"] == "openai/own" and second.temperature == 0.9  # the definitions are unchanged
    only_top = apply_model_settings(team.to_config(), ModelSettings(model="openai/other", sub_agents=False))
    assert only_top["model"] == "openai/other" and {a["model"] for a in only_top["agents"]} == {"openai/own"}
    assert apply_model_settings(team.to_config(), ModelSettings()) == team.to_config()  # empty: nothing recorded


def test_an_agent_tool_cannot_take_per_run_settings_unless_left_out():
    helper = agent(name="helper", tools=[lookup])
    caller = agent(name="caller", tools=[helper.as_tool(name="ask")])
    with pytest.raises(AgentDefinitionError, match="agent tool ask") as caught:
        apply_model_settings(caller.to_config(), ModelSettings(max_tokens=10))
    assert caught.value.field == "model_settings"
    config = apply_model_settings(caller.to_config(), ModelSettings(max_tokens=10, sub_agents=False))
    assert config["maxTokens"] == 10


@responses.activate
def test_start_refuses_before_any_request():
    helper = agent(name="helper", tools=[lookup])
    caller = agent(name="caller", tools=[helper.as_tool(name="ask")])
    with AgentRuntime(AgentSettings(server_url=BASE_URL, auto_start_workers=False)) as runtime:
        with pytest.raises(AgentDefinitionError):
            runtime.start(caller, "hi", model_settings=ModelSettings(model="openai/other"))
        with pytest.raises(AgentTypeError, match="model_settings"):
            runtime.start(caller, "hi", model_settings={"model": "openai/other"})
        with pytest.raises(AgentTypeError, match="signal must be a str"):
            runtime.signal("some-id", None)
    assert len(responses.calls) == 0


def test_the_settings_a_run_was_started_with_are_read_back_from_its_workflow():
    settings = ModelSettings(model="openai/other", max_tokens=5, sub_agents=False)
    config = apply_model_settings(agent().to_config(), settings)
    assert recorded_model_settings({"workflowDefinition": {"metadata": {"agentDef": config}}}) == settings
    assert recorded_model_settings({"workflowDefinition": {"metadata": {"agentDef": agent().to_config()}}}) is None
    assert recorded_model_settings({}) is None


def test_the_scripted_model_reads_the_signal_apart_from_the_prompt():
    text = "[SIGNALS]\nbe brief\n[/SIGNALS]\n\n[TOOL RESULTS]\n[]\n[/TOOL RESULTS]\n\nHello."
    request = LLMRequest.from_body({"model": "m", "input": text}, received_at=0.0)
    assert (request.signal, request.prompt) == ("be brief", "Hello.")
    assert LLMRequest.from_body({"model": "m", "input": "Hello."}, received_at=0.0).signal is None


class FakeApi:
    """The few calls post_signal makes, against a run whose signal variable a test controls."""

    def __init__(self, *, status: str = "RUNNING", initialised: bool = True, overwrite: int = 0) -> None:
        self.status, self.initialised, self.overwrite = status, initialised, overwrite
        self.value = ""
        self.posts: List[str] = []

    def workflow_status(self, execution_id: str, include_variables: bool = False) -> dict:
        return {"status": self.status, "variables": {SIGNAL_VARIABLE: self.value} if self.initialised else {}}

    def workflow_tasks(self, execution_id: str, **kwargs: Any) -> Any:
        init = {"taskType": "SET_VARIABLE", "inputData": {SIGNAL_VARIABLE: ""},
                "status": "COMPLETED" if self.initialised else "SCHEDULED"}
        return type("Page", (), {"tasks": [init] if not kwargs.get("statuses") else []})()

    def signal_agent(self, execution_id: str, message: str) -> None:
        self.posts.append(message)
        if self.overwrite:  # the server's own update of the run wrote back the value it read before
            self.overwrite -= 1
        else:
            self.value = message


def test_a_signal_overwritten_by_the_server_is_posted_again():
    api = FakeApi(overwrite=2)
    assert post_signal(api, "r", "be brief", pause=lambda s: None, clock=FakeClock(auto_advance=0.1))
    assert api.posts == ["be brief"] * 3 and api.value == "be brief"


def test_an_ended_run_takes_no_signal_and_one_that_never_sticks_is_an_error():
    assert not post_signal(FakeApi(status="COMPLETED"), "r", "x", pause=lambda s: None, clock=FakeClock())
    with pytest.raises(ServerError, match="did not stick"):
        post_signal(FakeApi(overwrite=99), "r", "x", pause=lambda s: None, clock=FakeClock(auto_advance=0.1))


def test_a_signal_waits_for_the_runs_first_state_task():
    api = FakeApi(initialised=False)
    calls = []

    def pause(seconds: float) -> None:
        calls.append(seconds)
        api.initialised = len(calls) >= 3

    assert post_signal(api, "r", "x", pause=pause, clock=FakeClock(auto_advance=0.1))
    assert api.posts == ["x"] and len(calls) >= 3
