"""Unit tests for conductor_agents._serving.live_workers: who polled a run's domain lately, on the server's clock."""

from __future__ import annotations

from email.utils import formatdate

import pytest

from conductor_agents._wire.api import ConductorApi
from conductor_agents._serving.live_workers import find_live_poller, freshness_window
from conductor_agents._wire.transport import Transport
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


# --- a worker of this host whose process is gone (issue 19) -----------------------------------------

import os
import socket
import subprocess
import sys
import time

from conductor_agents._serving import live_workers
from conductor_agents._serving.live_workers import make_worker_id, worker_is_dead_here


@pytest.fixture
def dead_child():
    """A child process that ran and was killed and reaped: its pid no longer exists."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    worker = make_worker_id("abc123", pid=proc.pid)
    proc.kill()
    proc.wait(timeout=10)
    return proc.pid, worker


def test_a_worker_id_names_host_pid_and_on_linux_start_time_and_machine():
    worker = make_worker_id("abc123")
    host, pid, rest = worker.rsplit("-", 2)
    assert (host, pid, rest.split(".")[0]) == (socket.gethostname(), str(os.getpid()), "abc123")
    if os.path.exists("/proc/self/stat"):
        assert len(rest.split(".")) == 3


def test_a_killed_process_of_this_host_is_dead_a_live_one_is_not(dead_child):
    _, worker = dead_child
    assert worker_is_dead_here(worker)
    assert not worker_is_dead_here(make_worker_id("abc123"))  # this process
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert not worker_is_dead_here(make_worker_id("live01", pid=live.pid))
        live.kill()
        live_id = make_worker_id("live01", pid=live.pid)  # made before the kill would be the same
        deadline = time.monotonic() + 10
        while not worker_is_dead_here(live_id) and time.monotonic() < deadline:
            pass  # killed and not reaped yet: a zombie counts as dead too
        assert worker_is_dead_here(live_id)
    finally:
        live.kill()
        live.wait(timeout=10)


@pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="start times come from /proc")
def test_a_reused_pid_is_told_by_its_start_time():
    host, pid, rest = make_worker_id("abc123").rsplit("-", 2)
    nonce, started, tag = rest.split(".")
    assert not worker_is_dead_here(f"{host}-{pid}-x{nonce}.{started}.{tag}")  # this process, as another id
    parent = os.getppid()  # alive, but started at another time than the id says
    assert worker_is_dead_here(f"{host}-{parent}-{nonce}.{int(started) + 12345}.{tag}")
    assert not worker_is_dead_here(f"{host}-{parent}-{nonce}.{live_workers._proc_stat(parent)[1]}.{tag}")


@pytest.mark.parametrize("worker", [
    "another-host-{pid}-abc123",          # another machine: only its poll's age tells
    "{host}-{pid}-abc123.1.ffffff",       # this host name, but another boot or pid namespace (a container)
    "{host}-notapid-abc123",
    "python-sdk-worker",                  # not an id this SDK made
    "",
])
def test_a_dead_pid_is_only_believed_for_this_machine(dead_child, worker):
    pid, _ = dead_child
    if live_workers._machine_tag() == "ffffff":  # pragma: no cover - one machine in 16 million
        pytest.skip("this machine's tag is the test's")
    assert not worker_is_dead_here(worker.format(pid=pid, host=socket.gethostname()))


def test_a_fresh_poll_by_a_dead_worker_of_this_host_is_not_live(http, dead_child):
    _, worker = dead_child
    serve(http, [row("dom-1", worker, 1)])
    assert find() is None
    serve(http, [row("dom-1", worker, 1), row("dom-1", "another-host-1-abcdef", 30, task="act")])
    assert find().worker_id == "another-host-1-abcdef"


class _PresenceRows:
    """The server's poll data of the presence task types: one fresh row per worker given."""

    def __init__(self, workers: "list[str]") -> None:
        self.workers = workers

    def mark_presence(self, task_type: str, *, worker_id: str, domain: str) -> None:
        pass

    def poll_data_sample(self, task_type: str) -> "tuple[list, None]":
        now_ms = time.time() * 1000.0
        return [{"workerId": w, "lastPollTime": now_ms - 500.0} for w in self.workers], None


def test_a_dead_process_of_this_host_is_gone_from_the_view_though_its_row_is_fresh(dead_child):
    # Left among the present, it was the assignee of a share of the orphans (its own runs among them), which the
    # others then took only after the grace, whoever looked first: 30 runs came out spread 21/7/2.
    from conductor_agents._serving.presence import Presence

    _, dead = dead_child
    me = make_worker_id("me0001")
    other = "elsewhere-4242-peer01"  # another host's process: only its row can tell
    presence = Presence(_PresenceRows([dead, me, other]), me, dead_after=10.0, interval=1.0,  # type: ignore[arg-type]
                        on_fenced=lambda: None)
    presence.add("agent")
    presence.beacon()
    view = presence.view("agent")
    assert view is not None
    assert set(view.alive) == {me, other} and dead in view.gone
    assert {view.assignee(f"domain-{i}") for i in range(200)} == {me, other}
