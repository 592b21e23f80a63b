"""A tool with no description warns, naming the tool and the fix, at the caller's line (issue 41, point 6: a
tool with no docstring was accepted silently, and the model saw only its name)."""

from __future__ import annotations

import warnings

import pytest

from conductor_agents import Agent, ToolDescriptionWarning, ToolRegistry, tool


def test_a_tool_with_no_docstring_warns_at_the_line_that_made_it() -> None:
    with pytest.warns(ToolDescriptionWarning) as caught:
        @tool
        def lookup(q: str) -> str:
            return q
    [warning] = caught.list
    assert "tool 'lookup'" in str(warning.message) and "@tool(description=...)" in str(warning.message)
    assert warning.filename == __file__  # the user's line, not the SDK's
    assert lookup.description == "lookup"  # accepted as before: the name stands in


def test_a_plain_function_made_a_tool_by_the_agent_warns_at_the_agents_line() -> None:
    def bare(q: str) -> str:
        return q

    with pytest.warns(ToolDescriptionWarning) as caught:
        Agent(name="a", model="openai/x", tools=[bare])
    assert caught.list[0].filename == __file__


def test_a_docstring_or_a_description_is_enough_and_methods_warn_too() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")

        @tool
        def described(q: str) -> str:
            """Look it up."""
            return q

        @tool(description="Look it up.")
        def given(q: str) -> str:
            return q

    with pytest.warns(ToolDescriptionWarning) as caught:  # when the class body decorates it, once
        class Tools:
            @tool
            def method(self, q: str) -> str:
                return q

        ToolRegistry.from_instance(Tools())
    assert len(caught.list) == 1
    assert (described.description, given.description) == ("Look it up.", "Look it up.")


def test_it_can_be_made_an_error() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error", ToolDescriptionWarning)
        with pytest.raises(ToolDescriptionWarning):
            @tool
            def lookup(q: str) -> str:
                return q
