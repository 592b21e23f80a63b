"""A switch whose new run's start failed, while the run may exist all the same (its answer lost: issue 44).

Seen in the hour-long SQLite soak: the serving process's connections were cut as it started a listener's next run;
the server had made the run, the process heard ``cannot reach the server``, dropped the switch and waited for the
old run's next turn. That turn never came: the forward found the new run and handed it the messages, and the new
run takes no turn before its switch is done. The listener acted on nothing for 16 minutes, until another process
adopted it and finished the switch. Now the switch is kept while its new run may exist, and its start is sent again
(create-once) before the switch goes on."""

from __future__ import annotations

from typing import Any

import pytest

from conductor_agents import Agent
from conductor_agents._listener.directory import Chain
from conductor_agents._listener.driver import ContinuationDriver
from conductor_agents._listener.switch import LinkSpec, Switch
from conductor_agents._wire import starting
from conductor_agents._wire.api import TaskPage
from conductor_agents.continuation import Continuation
from conductor_agents.errors import ExecutionNotFoundError, ServerUnavailableError

NAME, RUN = "switching_listener", "e" * 32
MAILBOX = "0b7a5c1e-2f3d-4e5a-8b6c-7d8e9f0a1b2d"


class _Api:
    """A server whose first start's answer never arrives; ``made``: whether that start made the run anyway."""

    def __init__(self, made: bool) -> None:
        self.made = made
        self.starts = 0
        self.failing = 1  # how many starts fail

    def start_agent(self, body: "dict[str, Any]") -> "dict[str, Any]":
        self.starts += 1
        self.key = body["idempotencyKey"]
        if self.starts <= self.failing:
            raise ServerUnavailableError("POST /agent/start: cannot reach the server")
        self.made = True
        return {"executionId": self.new_id}

    def workflow_status(self, execution_id: str, **kwargs: Any) -> "dict[str, Any]":
        if execution_id == self.new_id and not self.made:
            raise ExecutionNotFoundError("unknown", execution_id=execution_id)
        return {"status": "RUNNING", "variables": {}}

    def workflow_tasks(self, execution_id: str, **kwargs: Any) -> TaskPage:
        return TaskPage(total=0, tasks=[])


class _Directory:
    def __init__(self, api: _Api) -> None:
        self.advanced: list = []
        self._api = api

    def exists(self, chain, number: int) -> bool:
        try:
            self._api.workflow_status(chain.link(number).execution_id)
        except ExecutionNotFoundError:
            return False
        return True

    def advance(self, chain, link) -> None:
        self.advanced.append(link.number)


@pytest.fixture
def driver_and_served(monkeypatch):
    monkeypatch.setattr(starting, "_LOST_ANSWER_PAUSES", ())  # no resend of the lost answer: the driver's case
    monkeypatch.setattr(Switch, "_carry_signal", lambda self: None)
    monkeypatch.setattr(Switch, "finish", lambda self: None)  # the steps after the start are not this test's

    def make(made: bool):
        api = _Api(made)
        directory = _Directory(api)
        driver = ContinuationDriver(api, directory, worker_id="w", locally_busy=lambda _: False)  # type: ignore[arg-type]
        chain = Chain(MAILBOX, RUN, NAME, 0, mailbox=True)
        spec = LinkSpec(Agent(name=NAME, model="openai/x"), "go", Continuation(max_turns=4))
        driver.serve(chain, spec, chain.link(0), turns_before=0, handle_link=lambda on, execution_id: None)
        api.new_id = chain.link(1).execution_id
        made_drivers.append(driver)
        return driver, driver._by_run[RUN], api, directory

    made_drivers: list = []
    yield make
    for driver in made_drivers:
        driver.close()


def test_a_start_whose_answer_was_lost_keeps_the_switch_and_sends_the_start_again(driver_and_served):
    driver, served, api, directory = driver_and_served(made=True)
    with pytest.raises(ServerUnavailableError):
        driver._begin(served)
    switch = served.switch
    assert switch is not None and not switch.started  # kept: the new run exists, senders find it
    assert directory.advanced == [0]  # only link 0, when it was served
    driver._finish(served)  # the job's next step
    assert api.starts == 2 and switch.started and directory.advanced == [0, 1]


def test_a_start_that_made_no_run_drops_the_switch_until_the_next_turn(driver_and_served):
    driver, served, api, _ = driver_and_served(made=False)
    with pytest.raises(ServerUnavailableError):
        driver._begin(served)
    assert served.switch is None and api.starts == 1


def test_a_kept_switch_whose_start_fails_again_while_its_run_does_not_exist_is_dropped(driver_and_served):
    driver, served, api, _ = driver_and_served(made=True)
    with pytest.raises(ServerUnavailableError):
        driver._begin(served)
    assert served.switch is not None
    api.failing, api.made = 2, False  # the run turned out not to exist (a status read says so): nothing to wait for
    with pytest.raises(ServerUnavailableError):
        driver._finish(served)
    assert served.switch is None and api.starts == 2
