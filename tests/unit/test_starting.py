"""Unit tests for conductor_agents._wire.starting: the definition race of first starts is retried, and a keyed start
whose answer was lost is sent again; nothing else."""

from __future__ import annotations

import json

import pytest
import requests

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


KEYED = {**BODY, "idempotencyKey": "conductor-agents/start/0123456789abcdef0123456789abcdef"}


@pytest.mark.parametrize("lost", [
    requests.exceptions.ConnectionError("reset after the request was sent"),
    {"status": 504, "json": {"message": "gateway timeout"}},
    {"status": 500, "json": {"status": 500, "message": "Error acquiring lock when creating workflow: {}"}},
], ids=["connection-lost", "gateway-504", "run-being-evaluated"])
def test_a_keyed_start_whose_answer_is_lost_is_sent_again_and_gives_the_run(http, lost):
    if isinstance(lost, Exception):
        http.add("POST", START_URL, body=lost)
    else:
        http.add("POST", START_URL, **lost)
    http.add("POST", START_URL, json={"executionId": "wf-1"})
    pauses = []
    assert start_run(api(), KEYED, pause=lambda s: pauses.append(s) or False)["executionId"] == "wf-1"
    assert len(pauses) == 1 and [c.request.body for c in http.calls][0] == [c.request.body for c in http.calls][1]


def test_an_unkeyed_start_whose_answer_is_lost_is_not_sent_again(http):
    """Without a key, a second start would make a second run: the caller hears of the lost answer."""
    from conductor_agents.errors import ServerUnavailableError

    http.add("POST", START_URL, body=requests.exceptions.ConnectionError("reset"))
    with pytest.raises(ServerUnavailableError):
        start_run(api(), BODY, pause=lambda s: False)
    assert len(http.calls) == 1


def test_a_keyed_start_whose_answers_stay_lost_is_raised_after_about_half_a_minute(http):
    from conductor_agents.errors import ServerUnavailableError

    http.add("POST", START_URL, body=requests.exceptions.ConnectionError("reset"))
    pauses = []
    with pytest.raises(ServerUnavailableError):
        start_run(api(), KEYED, pause=lambda s: pauses.append(s) or False)
    assert len(http.calls) == len(pauses) + 1 and 20 <= sum(pauses) <= 40


def test_a_start_never_answered_names_the_id_the_run_would_have(http, monkeypatch):
    """Every start carries a key (the SDK's own here); when no answer comes for all the resends, the error says the
    run may exist, and its id (the server derives it from the agent's name and the key)."""
    from conductor_agents import Agent, AgentRuntime, AgentSettings
    from conductor_agents._listener.chain import link_id
    from conductor_agents._wire import starting
    from conductor_agents.errors import ServerUnavailableError

    monkeypatch.setattr(starting, "_LOST_ANSWER_PAUSES", (0.01, 0.01))
    http.add("POST", START_URL, body=requests.exceptions.ConnectionError("reset"))
    with AgentRuntime(AgentSettings(server_url=BASE_URL, liveness_enabled=False)) as runtime:
        with pytest.raises(ServerUnavailableError, match="would be") as info:
            runtime.start(Agent(name="quiet", model="openai/gpt-4o"), "go")
    sent = [json.loads(c.request.body) for c in http.calls if c.request.url == START_URL]
    assert len(sent) == 3 and len({s["idempotencyKey"] for s in sent}) == 1
    assert link_id("quiet", sent[0]["idempotencyKey"]) in str(info.value)


def test_a_keyed_start_whose_connection_was_refused_is_not_sent_again(http):
    """No connection, no request: the server cannot have made the run, and the caller hears at once (a server that is
    down is said in seconds, not after half a minute of resends)."""
    import urllib3

    from conductor_agents.errors import ServerUnavailableError

    refused = urllib3.exceptions.MaxRetryError(None, "/api/agent/start",  # type: ignore[arg-type]
                                               urllib3.exceptions.NewConnectionError(None, "refused"))  # type: ignore[arg-type]
    http.add("POST", START_URL, body=requests.exceptions.ConnectionError(refused))
    with pytest.raises(ServerUnavailableError) as info:
        start_run(api(), KEYED, pause=lambda s: False)
    assert len(http.calls) == 1 and info.value.request_sent is False
