"""Unit tests for conductor_agents._takeover: who polled a run's domain lately, on the server's clock."""

from __future__ import annotations

from email.utils import formatdate

import pytest

from conductor_agents._api import ConductorApi
from conductor_agents._takeover import find_live_poller, freshness_window
from conductor_agents._transport import Transport
from tests.unit.fakes import BASE_URL, FakeClock

POLL_DATA_URL = BASE_URL + "/tasks/queue/polldata"
SERVER_NOW = 1_800_000_000.0  # the server's clock; the client's is hours off in these tests


def serve(http, rows, *, date=True):
    headers = {"Date": formatdate(SERVER_NOW, usegmt=True)} if date else {}
    http.add("GET", POLL_DATA_URL, json=rows, headers=headers)


def row(domain, worker, seconds_ago, task="act"):
    return {"queueName": task, "domain": domain, "workerId": worker,
            "lastPollTime": int((SERVER_NOW - seconds_ago) * 1000)}


def find(clock=None, **kwargs):
    api = ConductorApi(Transport(BASE_URL))
    return find_live_poller(api, ["act"], "dom-1", own_worker_id="me", clock=clock or FakeClock(skew=-7200),
                            **kwargs)


def test_the_window_covers_the_pollers_quiet_spell():
    assert freshness_window() == 75.0


def test_a_recent_poll_by_another_worker_is_live_whatever_the_client_clock(http):
    serve(http, [row("dom-1", "other-1", 10), row("dom-2", "other-2", 1)])
    live = find(clock=FakeClock(skew=+7200))
    assert (live.worker_id, live.task_type) == ("other-1", "act")
    assert 9 <= live.seconds_ago <= 11


@pytest.mark.parametrize("rows", [
    [row("dom-1", "other-1", 80)],          # too old: that worker has stopped
    [row("dom-1", "me", 1)],                # our own poll
    [row("dom-2", "other-2", 1)],           # another run's domain
    [],
], ids=["stale", "own", "other-domain", "never-polled"])
def test_nothing_live(http, rows):
    serve(http, rows)
    assert find() is None


def test_without_a_date_header_the_local_clock_is_used(http):
    serve(http, [row("dom-1", "other-1", 10)], date=False)
    assert find(clock=FakeClock(wall_start=SERVER_NOW)) is not None


def test_cli_resume_takes_force():
    from conductor_agents.cli._main import build_parser

    assert build_parser().parse_args(["resume", "m:a", "ID", "--force"]).force is True
    assert build_parser().parse_args(["resume", "m:a", "ID"]).force is False
