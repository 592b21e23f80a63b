"""``run``/``resume`` serve until the run ends: no deadline unless ``--timeout`` is given (issue 11.8).

Serving past an hour cannot be watched in real time, so these tests pin the default where it
is decided: the parser's value, what :func:`wait_in_foreground` passes to ``wait()``, and that
``wait(timeout=math.inf)`` keeps polling long past the 600 s default and returns the result.
"""

import math

import pytest

from conductor_agents._listener.directory import Chain
from conductor_agents._wire.api import ConductorApi
from conductor_agents._wire.transport import Transport
from conductor_agents.cli._foreground import wait_in_foreground
from conductor_agents.cli._main import build_parser
from conductor_agents.cli._progress import ProgressDisplay
from conductor_agents.handle import AgentHandle
from conductor_agents.settings import AgentSettings
from tests.unit.fakes import BASE_URL, FakeClock, FakeEvent, status_body

EXEC = "wf-1"
STATUS = f"{BASE_URL}/agent/{EXEC}/status"


class RecordingHandle:
    """Stands in for an AgentHandle: records the timeout ``wait`` is given."""

    execution_id = EXEC

    def __init__(self) -> None:
        self.timeouts: list = []

    def wait(self, timeout=None):
        self.timeouts.append(timeout)
        return "result"


@pytest.mark.parametrize("verb", [["run", "m:a", "prompt"], ["resume", "m:a", "wf-1"]])
def test_serving_verbs_have_no_default_timeout(verb):
    args = build_parser().parse_args(verb)
    assert args.timeout is None
    assert build_parser().parse_args([*verb, "--timeout", "3"]).timeout == 3.0


@pytest.mark.parametrize("verb", [["wait", "wf-1"], ["stop", "wf-1", "--wait"]])
def test_waiting_verbs_keep_their_600_second_default(verb):
    assert build_parser().parse_args(verb).timeout == 600.0


def test_foreground_passes_no_deadline_without_timeout():
    handle = RecordingHandle()
    assert wait_in_foreground(handle, ProgressDisplay(), timeout=None, stop_grace=1.0) == "result"
    assert handle.timeouts == [math.inf]


def test_foreground_passes_the_given_timeout():
    handle = RecordingHandle()
    wait_in_foreground(handle, ProgressDisplay(), timeout=3.0, stop_grace=1.0)
    assert handle.timeouts == [3.0]


def test_wait_without_deadline_outlasts_the_old_hour_and_returns_the_result(http):
    """wait(timeout=inf) polls a RUNNING run for two hours of (fake) time, then returns when it ends."""
    for _ in range(100):
        http.add("GET", STATUS, json=status_body(EXEC, "RUNNING"))
    http.add("GET", STATUS, json=status_body(EXEC, "COMPLETED", output={"result": "all done"}))
    http.add("GET", f"{BASE_URL}/agent/execution/{EXEC}", json={})
    http.add("GET", f"{BASE_URL}/workflow/{EXEC}", json={"status": "COMPLETED", "tasks": []})
    clock = FakeClock()
    handle = AgentHandle(chain=Chain(EXEC), api=ConductorApi(Transport(BASE_URL, clock=clock)), execution_id=EXEC,
                         agent_name="listener", run_id=None, clock=clock,
                         settings=AgentSettings(server_url=BASE_URL, status_poll_interval_seconds=72.0))
    handle._wake = FakeEvent(clock)  # wait() sleeps on _wake; the fake moves the clock instead
    result = handle.wait(timeout=math.inf)
    assert result.ok and result.output == "all done"
    assert sum(1 for c in http.calls if c.request.url.split("?")[0] == STATUS) == 101
    assert clock.elapsed == 7200.0
