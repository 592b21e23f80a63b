"""Unit tests for conductor_agents.agent: Agent validation, statefulness and to_config."""

import attrs
import pytest

from conductor_agents import Agent, WaitForMessageTool, tool
from conductor_agents.errors import AgentDefinitionError, AgentTypeError

MODEL = "openai/gpt-4o"


@tool
def lookup(city: str) -> str:
    """Look a city up."""
    return city


@tool(stateful=True)
def remember(note: str) -> str:
    """Keep a note in this process."""
    return note


def plain_function(x: int) -> int:
    """A function that is not yet a tool."""
    return x


# (keyword arguments, error class, field) -- every bad field of Agent.
BAD_FIELDS = [
    ({"name": 42}, AgentTypeError, "name"),
    ({"name": None}, AgentTypeError, "name"),
    ({"name": ""}, AgentDefinitionError, "name"),
    ({"name": "1starts-with-digit"}, AgentDefinitionError, "name"),
    ({"name": "has space"}, AgentDefinitionError, "name"),
    ({"name": "a" * 129}, AgentDefinitionError, "name"),
    ({"model": None}, AgentTypeError, "model"),
    ({"model": "gpt-4o"}, AgentDefinitionError, "model"),
    ({"model": "openai/"}, AgentDefinitionError, "model"),
    ({"model": "/gpt-4o"}, AgentDefinitionError, "model"),
    ({"instructions": 5}, AgentTypeError, "instructions"),
    ({"instructions": None}, AgentTypeError, "instructions"),
    ({"tools": "lookup"}, AgentTypeError, "tools"),
    ({"tools": 3}, AgentTypeError, "tools"),
    ({"tools": [42]}, AgentTypeError, "tools"),
    ({"tools": [lookup, lookup]}, AgentDefinitionError, "tools"),
    ({"max_turns": 0}, AgentDefinitionError, "max_turns"),
    ({"max_turns": -5}, AgentDefinitionError, "max_turns"),
    ({"max_turns": 2.0}, AgentTypeError, "max_turns"),
    ({"max_turns": True}, AgentTypeError, "max_turns"),
    ({"max_turns": "10"}, AgentTypeError, "max_turns"),
    ({"stateful": "yes"}, AgentTypeError, "stateful"),
    ({"stateful": 1}, AgentTypeError, "stateful"),
    ({"timeout_seconds": -1}, AgentDefinitionError, "timeout_seconds"),
    ({"timeout_seconds": 1.5}, AgentTypeError, "timeout_seconds"),
    ({"description": 3}, AgentTypeError, "description"),
    ({"temperature": -0.1}, AgentDefinitionError, "temperature"),
    ({"temperature": "hot"}, AgentTypeError, "temperature"),
    ({"temperature": True}, AgentTypeError, "temperature"),
    ({"max_tokens": -1}, AgentDefinitionError, "max_tokens"),
    ({"max_tokens": "100"}, AgentTypeError, "max_tokens"),
    ({"metadata": ["a"]}, AgentTypeError, "metadata"),
    ({"metadata": "x"}, AgentTypeError, "metadata"),
]


def make(**overrides):
    fields = {"name": "helper", "model": MODEL}
    fields.update(overrides)
    return Agent(**fields)


@pytest.mark.parametrize("overrides,error,field", BAD_FIELDS,
                         ids=[f"{f}={o[f]!r}"[:40] for o, _, f in BAD_FIELDS])
def test_bad_field_raises_naming_the_field(overrides, error, field):
    """Each bad field raises AgentDefinitionError (ValueError) or AgentTypeError (TypeError) naming it."""
    with pytest.raises(error) as info:
        make(**overrides)
    assert field == info.value.field
    assert field in str(info.value)
    builtin = ValueError if error is AgentDefinitionError else TypeError
    assert isinstance(info.value, builtin)


def test_fractional_max_tokens_is_a_type_error():
    """max_tokens is a token count: 1.5 is an AgentTypeError naming max_tokens."""
    with pytest.raises(AgentTypeError) as info:
        make(max_tokens=1.5)
    assert "max_tokens" == info.value.field


def test_defaults():
    """A minimal agent has no tools, 25 turns, is not stateful and has no timeout."""
    agent = make()
    assert ((), 25, False, 0, "", None, None, {}) == (
        agent.tools, agent.max_turns, agent.stateful, agent.timeout_seconds, agent.instructions,
        agent.temperature, agent.max_tokens, agent.metadata)


def test_edge_values_are_accepted():
    """The limits themselves are valid: a 128-character name, one turn, zero temperature."""
    agent = make(name="_" + "a" * 127, max_turns=1, temperature=0, max_tokens=10, timeout_seconds=0)
    assert (128, 1) == (len(agent.name), agent.max_turns)


def test_plain_functions_become_tools():
    """A plain function in tools is wrapped as a tool; tools is stored as a tuple."""
    agent = make(tools=[plain_function, lookup])
    assert ("plain_function", "lookup") == tuple(t.name for t in agent.tools)
    assert isinstance(agent.tools, tuple)


def test_tools_none_means_no_tools():
    """tools=None is the same as no tools."""
    assert () == make(tools=None).tools


def test_statefulness_comes_from_agent_or_tools():
    """A run is stateful when the agent or any of its tools is."""
    assert (False, True, True) == (
        make(tools=[lookup]).is_stateful,
        make(tools=[lookup], stateful=True).is_stateful,
        make(tools=[lookup, remember]).is_stateful,
    )


def test_message_queue_need_comes_from_a_wait_tool():
    """Only an agent with a wait-for-message tool needs the message queue."""
    waiter = WaitForMessageTool.create(name="wait_for_message", description="Wait for the next message.")
    assert (False, True) == (make(tools=[lookup]).needs_message_queue,
                             make(tools=[lookup, waiter], stateful=True).needs_message_queue)


def test_worker_tools_exclude_server_tools():
    """The wait-for-message tool runs on the server, so it is not a worker tool."""
    waiter = WaitForMessageTool.create(name="wait_for_message", description="Wait.")
    assert ("lookup",) == tuple(t.name for t in make(tools=[lookup, waiter], stateful=True).worker_tools)


def test_a_listener_with_local_tools_must_be_stateful():
    """A wait-for-message tool beside tools served here needs stateful=True: refused at once (issue 34, point 11)."""
    waiter = WaitForMessageTool.create(name="wait_for_message", description="Wait.")
    with pytest.raises(AgentDefinitionError, match=r"waits for messages .*\(lookup\).*stateful=True") as caught:
        make(tools=[lookup, waiter])
    assert caught.value.field == "stateful" and isinstance(caught.value, ValueError)
    with pytest.raises(AgentDefinitionError, match="stateful=True"):
        attrs.evolve(make(tools=[lookup, waiter], stateful=True), stateful=False)
    # Stateful by a tool, or waiting with server tools only, is fine.
    @tool(stateful=True)
    def note(text: str) -> str:
        """Note something down."""
        return text

    assert make(tools=[note, waiter]).is_listener
    assert not make(tools=[waiter]).is_stateful


def test_agent_is_frozen_and_evolve_validates():
    """An Agent cannot be changed in place, and attrs.evolve re-validates."""
    agent = make()
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        agent.max_turns = 3
    with pytest.raises(AgentDefinitionError):
        attrs.evolve(agent, max_turns=0)


def test_metadata_is_copied():
    """Changing the caller's metadata dict afterwards does not change the agent."""
    meta = {"team": "a"}
    agent = make(metadata=meta)
    meta["team"] = "b"
    assert {"team": "a"} == agent.metadata


def test_to_config_minimal():
    """A minimal agent's server config has name, model, instructions, tools and maxTurns only."""
    expected = {"name": "helper", "model": MODEL, "instructions": "", "tools": [], "maxTurns": 25}
    assert expected == make().to_config()


def test_to_config_full():
    """Optional fields appear in the config, camelCased, when set."""
    agent = make(instructions="Be brief.", tools=[lookup], max_turns=5, description="d", timeout_seconds=60,
                 temperature=0.2, max_tokens=100, metadata={"k": "v"})
    config = agent.to_config()
    assert {"name": "helper", "model": MODEL, "instructions": "Be brief.", "maxTurns": 5, "description": "d",
            "timeoutSeconds": 60, "temperature": 0.2, "maxTokens": 100, "metadata": {"k": "v"}} == {
        k: v for k, v in config.items() if k != "tools"}
    assert ["lookup"] == [t["name"] for t in config["tools"]]
