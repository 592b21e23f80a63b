"""The switch rule of continued listeners (pure), and the driver's reads around it."""

from __future__ import annotations

import types
from typing import Any, List

import pytest

from conductor_agents import Continuation
from conductor_agents._listener.budget import RunSize
from conductor_agents._listener.driver import ContinuationDriver
from conductor_agents._listener.switch_rule import SwitchVerdict, switch_verdict
from conductor_agents._wire.api import TaskPage

CONT = Continuation(max_turns=40, max_bytes=1_000_000)


def verdict(turn: int, *, continuation: Continuation = CONT, turns_before: int = 0, agent_max_turns: int = 1000,
            disabled: bool = False, turns_left: Any = None) -> SwitchVerdict:
    return switch_verdict(continuation, turn=turn, turns_before=turns_before, agent_max_turns=agent_max_turns,
                          disabled=disabled, turns_left=turns_left)


# -- the pure rule ------------------------------------------------------------------------------


@pytest.mark.parametrize("turns_left", [None, 0.0, 100.0])
def test_continuation_off_never_switches_and_reads_nothing(turns_left):
    assert verdict(50, continuation=Continuation.disabled(), turns_left=turns_left) == SwitchVerdict()


@pytest.mark.parametrize("turns_left", [None, 0.0])
def test_a_listener_whose_switch_cannot_work_never_switches(turns_left):
    assert verdict(50, disabled=True, turns_left=turns_left) == SwitchVerdict()


@pytest.mark.parametrize("turns_before, turn", [(0, 98), (0, 99), (90, 8), (95, 5)])
def test_two_turns_or_fewer_before_the_agents_turn_limit_never_switch(turns_before, turn):
    """The listener ends by its turn limit before a new run would help, even past the turn cap."""
    assert verdict(turn, turns_before=turns_before, agent_max_turns=100, continuation=Continuation(max_turns=5),
                   turns_left=0.0) == SwitchVerdict()


def test_three_turns_before_the_agents_turn_limit_the_rule_still_looks():
    assert verdict(97, agent_max_turns=100, continuation=Continuation(max_turns=5)).due


@pytest.mark.parametrize("turn", [40, 41])
def test_the_turn_cap_switches_without_reading_the_size(turn):
    assert verdict(turn) == SwitchVerdict(due=True)


def test_below_the_cap_the_size_decides():
    assert verdict(39) == SwitchVerdict(needs_size=True)


@pytest.mark.parametrize("turns_left", [0.0, 1.0, 1.99])
def test_fewer_than_two_turns_left_of_the_byte_budget_switches(turns_left):
    assert verdict(10, turns_left=turns_left) == SwitchVerdict(due=True)


@pytest.mark.parametrize("turn, turns_left, next_check", [
    (1, 100.0, 2),    # no later than twice the turns so far
    (4, 100.0, 8),
    (10, 6.0, 13),    # half the turns left
    (10, 2.0, 11),    # at least one turn on
    (10, 3.5, 11),
    (30, 100.0, 40),  # never past the turn cap
    (39, 100.0, 40),
])
def test_not_yet_reads_again_after_half_the_turns_left_at_most_a_doubling_and_by_the_cap(turn, turns_left,
                                                                                        next_check):
    assert verdict(turn, turns_left=turns_left) == SwitchVerdict(next_check=next_check)


# -- the driver around it ------------------------------------------------------------------------


class SizeApi:
    """The three reads the driver may make for the rule, recorded."""

    def __init__(self, tasks: int = 10, variables: Any = None) -> None:
        self.calls: List[str] = []
        self.tasks = tasks
        self.variables = variables if variables is not None else {"digest": "x" * 100}

    def workflow_tasks(self, execution_id: str, **_: Any) -> TaskPage:
        self.calls.append("tasks")
        return TaskPage(total=self.tasks, tasks=[], date=None)

    def workflow_status(self, execution_id: str, **_: Any) -> dict:
        self.calls.append("status")
        return {"variables": self.variables}

    def get_workflow(self, execution_id: str, **_: Any) -> dict:
        self.calls.append("whole")
        return {"tasks": ["y" * 8_000] * self.tasks}


def served(continuation: Continuation = CONT, *, max_turns: int = 1000, disabled: bool = False) -> Any:
    return types.SimpleNamespace(
        spec=types.SimpleNamespace(continuation=continuation, agent=types.SimpleNamespace(max_turns=max_turns,
                                                                                          name="a")),
        turns_before=0, disabled=disabled, agent_key="a:1", next_check=1,
        current=types.SimpleNamespace(execution_id="link-1", number=1),
        chain=types.SimpleNamespace(execution_id="first"))


def driver(api: SizeApi) -> ContinuationDriver:
    return ContinuationDriver(api, object(), worker_id="w", locally_busy=lambda _: False)  # type: ignore[arg-type]


@pytest.mark.parametrize("kwargs, turn", [({"continuation": Continuation.disabled()}, 5), ({"disabled": True}, 5),
                                          ({"max_turns": 7}, 5), ({}, 40)])
def test_the_driver_reads_nothing_when_the_rule_needs_no_size(kwargs, turn):
    api = SizeApi()
    listener = served(**kwargs)
    assert driver(api)._due(listener, turn) is (turn == 40)
    assert api.calls == []
    assert listener.next_check == 1


def test_the_driver_reads_the_size_and_keeps_when_to_look_again():
    api = SizeApi(tasks=10)
    listener = served()
    assert driver(api)._due(listener, 2) is False
    assert api.calls == ["tasks", "status"]  # no whole-run measurement before the third turn
    assert listener.next_check == 4


def test_the_driver_measures_a_run_of_the_agent_once_then_switches_near_max_bytes():
    api = SizeApi(tasks=100, variables={"digest": "x" * 2_000})
    loop = driver(api)
    listener = served()
    assert loop._due(listener, 5) is True  # 100 tasks of about 8 KB: near the 1 MB budget
    assert api.calls == ["tasks", "status", "whole"]
    assert loop._sizes.estimate("a:1", RunSize(tasks=1, turns=0, digest=0)) != 8_000  # the measured figure
    api.calls.clear()
    assert loop._due(served(), 6) is True
    assert api.calls == ["tasks", "status"]
