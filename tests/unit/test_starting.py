"""Unit tests for conductor_agents._wire.starting: the definition race of first starts is retried, nothing else."""

from __future__ import annotations

import pytest

from conductor_agents._wire.api import ConductorApi
from conductor_agents._wire.starting import start_run
from conductor_agents._wire.transport import HttpError, Transport
from tests.unit.fakes import BASE_URL

START_URL = BASE_URL + "/agent/start"
RACE = {"status": 500, "message": "Workflow with burst.1 already exists!", "retryable": False}
BODY = {"agentConfig": {"name": "burst"}, "prompt": "go"}


def api():
    return ConductorApi(Transport(BASE_URL))


def test_the_definition_race_is_retried_until_the_start_goes_through(http):
    http.add("POST", START_URL, status=500, json=RACE)
    http.add("POST", START_URL, status=409, json={**RACE, "status": 409})
    http.add("POST", START_URL, json={"executionId": "wf-1"})
    pauses = []
    assert start_run(api(), BODY, pause=lambda s: pauses.append(s) or False)["executionId"] == "wf-1"
    assert 2 == len(pauses) and all(0 < p <= 1.5 for p in pauses)


def test_other_server_errors_are_not_retried(http):
    http.add("POST", START_URL, status=500, json={"status": 500, "message": "Task def foo not found"})
    pauses = []
    with pytest.raises(HttpError):
        start_run(api(), BODY, pause=lambda s: pauses.append(s) or False)
    assert ([], 1) == (pauses, len(http.calls))


def test_a_race_that_never_ends_is_raised_after_bounded_attempts(http):
    http.add("POST", START_URL, status=500, json=RACE)
    pauses = []
    with pytest.raises(HttpError, match="already exists"):
        start_run(api(), BODY, pause=lambda s: pauses.append(s) or False)
    assert len(http.calls) == len(pauses) + 1 <= 10
    assert sum(pauses) < 10


def test_closing_ends_the_pause_and_raises(http):
    http.add("POST", START_URL, status=500, json=RACE)
    with pytest.raises(HttpError):
        start_run(api(), BODY, pause=lambda s: True)
    assert 1 == len(http.calls)
