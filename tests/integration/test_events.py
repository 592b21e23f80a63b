"""handle.events() and runtime.stats() on the real server: order, cut connections, polling fallback."""

from __future__ import annotations

import threading
import time
from typing import List

import pytest
import requests

from conductor_agents._common.task_names import INTERNAL_TASK_TYPES
from conductor_agents._listener.chain import is_continued

from conductor_agents import AgentRuntime, AgentSettings, Continuation, RunStatus
from conductor_agents._wire.sse import SseDecoder
from conductor_agents.testing import listener_policy

from ..helpers import eventually, listener, sdk_threads
from ..proxy import LoopbackProxy
from .test_stateful_listener import ActionTools, act_on

pytestmark = pytest.mark.integration

#: What the server streams for the seed scenario: start, one message, stop.
SEED_KINDS = ["thinking", "waiting", "thinking", "tool_call", "tool_result", "thinking", "waiting", "done"]


class Watcher:
    """Iterates ``handle.events()`` on a thread of its own and keeps every event."""

    def __init__(self, handle, timeout: float = 120.0) -> None:
        self.stream = handle.events(timeout=timeout)
        self.events: List = []
        self.error = None
        self._thread = threading.Thread(target=self._run, name="test-watcher", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            with self.stream:
                for event in self.stream:
                    self.events.append(event)
        except BaseException as err:  # reported by join()
            self.error = err

    def count(self, kind: str, source: "str | None" = "stream") -> int:
        """Events of ``kind`` from ``source`` (None: from the server, streamed or polled)."""
        return sum(1 for e in list(self.events)
                   if e.kind == kind and (e.source == source if source else e.source != "local"))

    def join(self, timeout: float = 60.0) -> List:
        self._thread.join(timeout)
        assert not self._thread.is_alive(), "the event iterator did not end"
        if self.error is not None:
            raise self.error
        return self.events


def server_events(events) -> list:
    return [e for e in events if e.source != "local"]


def raw_stream(base_url: str, execution_id: str) -> "list[tuple[str, str]]":
    """(id, event) of every event the server replays for a run, read straight off the wire, but for the
    events of the SDK's own tasks (a listener's turn reports), which ``events()`` leaves out.

    A stream opened as the run ends may miss the server's end of it (its completion is sent apart from
    the run's status) and then only carries heartbeats: read again, a few times, each within 20 s. The stream of a
    run that a switch ended (TERMINATED as continued: a listener goes on in a new run) never ends: the server sends
    no ``done`` for it (seen in full runs, where a listener of this module was continued at its stop); what it
    replays is all, but for its closing run-level ``error``, which ``events()`` replaces with a local ``continued``
    event (one history across the listener's runs)."""
    run = requests.get(f"{base_url}/workflow/{execution_id}", params={"includeTasks": "false"}, timeout=10).json()
    if run.get("status") == "TERMINATED" and is_continued(run.get("reasonForIncompletion")):
        seen, _ = _read_stream(base_url, execution_id, deadline=time.monotonic() + 3)  # replayed at once
        return seen[:-1] if seen and seen[-1][1] == "error" else seen
    seen: list = []
    for _ in range(3):
        seen, done = _read_stream(base_url, execution_id, deadline=time.monotonic() + 20)
        if done:
            return seen
    raise AssertionError(f"the server's stream of {execution_id} did not end within 20 s, 3 times: {seen}")


def _read_stream(base_url: str, execution_id: str, *, deadline: float) -> "tuple[list, bool]":
    decoder = SseDecoder()
    out = []
    with requests.get(f"{base_url}/agent/stream/{execution_id}", stream=True, timeout=(5, 30),
                      headers={"Accept": "text/event-stream"}) as response:
        for chunk in response.iter_content(chunk_size=None):
            for message in decoder.feed(chunk):
                if any(f'"{name}"' in (message.data or "") for name in INTERNAL_TASK_TYPES):
                    continue
                out.append((message.id, message.event))
                if message.event == "done":
                    return out, True
            if time.monotonic() > deadline:  # heartbeats only: the stream has no end
                return out, False
    return out, True  # the server ended the stream


@pytest.mark.both_topologies
def test_seed_scenario_events_arrive_in_order(agent_runtime, scripted_llm, unique_name, topology):
    """waiting → thinking → tool_call → tool_result → waiting → done, with the local tool events
    in between; the events of the ended run read again give the same story; stats count the tool.

    On the cluster each node streams only the events it emitted (round-robin spreads them), so the
    stream alone is partial and may never say ``done``: the iterator must still end once the run
    has, with every event exactly once (the missing ones from the task list), ``done`` last."""
    model = scripted_llm.script(policy=listener_policy(act_on))
    tools = ActionTools("seed")
    handle = agent_runtime.start(listener(unique_name("listener"), model, tools), "Start listening.")
    watcher = Watcher(handle)
    source = None if topology == "cluster" else "stream"  # on the cluster the task list fills the stream's gaps
    eventually(lambda: watcher.count("waiting", source), timeout=30, message="the first waiting event")
    handle.send_message({"action": "generate-report"})
    eventually(lambda: watcher.count("waiting", source) >= 2, timeout=30, message="the second waiting event")
    handle.stop()
    assert handle.wait(timeout=60).status is RunStatus.COMPLETED
    events = watcher.join(timeout=15.0)

    if topology == "cluster":
        got = [e.kind for e in server_events(events)]
        assert sorted(got) == sorted(SEED_KINDS) and got[-1] == "done", got
    else:
        assert [e.kind for e in server_events(events)] == SEED_KINDS
        assert {e.source for e in server_events(events)} == {"stream"} and watcher.stream.mode == "stream"
        ids = [int(e.id) for e in server_events(events)]  # the SDK's own tasks' events are left out: gaps
        assert ids == sorted(set(ids)), ids
    kinds = [e.kind for e in events]
    assert kinds.index("tool_started") < kinds.index("tool_finished") < kinds.index("tool_call")
    by_kind = {e.kind: e for e in events}
    assert by_kind["tool_call"].tool_name == "act"
    assert by_kind["tool_call"].arguments == {"action": "generate-report", "tag": ""}
    assert by_kind["tool_result"].result == {"done": "generate-report", "by": "seed"}
    finished = by_kind["tool_finished"]
    assert (finished.tool_name, finished.ok, finished.error) == ("act", True, None)
    assert finished.task_id == by_kind["tool_started"].task_id and finished.duration_seconds >= 0
    assert all(e.execution_id == handle.current_execution_id for e in events)  # the run they happened in

    again = list(handle.events(timeout=30))  # the run has ended: rebuilt from its task list
    assert [e.kind for e in again] == SEED_KINDS and {e.source for e in again} == {"poll"}

    stats = handle.stats()
    assert (stats.tools_executed, stats.tools_failed, stats.tools_in_flight) == (1, 0, 0)
    assert stats.domain == handle.run_id and stats.pickup_latency.count == 1 and stats.pickup_latency.p50 >= 0
    totals = agent_runtime.stats()
    assert totals.tools_executed >= 1 and totals.polls > 0 and totals.poll_errors == 0
    scripted_llm.assert_no_anomalies(model)


def test_cut_connections_lose_and_repeat_no_event(agent_runtime, scripted_llm, unique_name, conductor_server):
    """A watcher behind a proxy whose connections are cut mid-stream, again and again, gets exactly
    the events the server streamed (same ids, same kinds, same order) as an uncut read."""
    model = scripted_llm.script(policy=listener_policy(act_on))
    tools = ActionTools("cut")
    # Continued every 4 turns (about every second message): each run's stream is read and cut, and a run a switch
    # ended has a stream the server never ends (seen in full runs before, when a switch came by chance).
    agent = listener(unique_name("listener"), model, tools, continuation=Continuation(max_turns=4))
    handle = agent_runtime.start(agent, "Start listening.")
    server_url = getattr(conductor_server, "url")
    with LoopbackProxy(server_url) as proxy, \
            AgentRuntime(AgentSettings.from_env(environ={}, server_url=proxy.url)) as watching_runtime:
        watcher = Watcher(watching_runtime.attach(handle.execution_id))
        eventually(lambda: watcher.count("waiting"), timeout=30, message="the first waiting event")
        for i in range(4):
            handle.send_message({"action": f"a-{i}"})
            eventually(lambda: watcher.count("tool_call") > i, timeout=30, message=f"tool call {i}")
            proxy.cut()  # mid-run: the stream is open and more events are coming
        handle.stop()
        assert handle.wait(timeout=60).status is RunStatus.COMPLETED
        events = watcher.join()
        streams = [(path.split("/agent/stream/", 1)[1].split("?", 1)[0], headers.get("last-event-id"))
                   for _, path, headers in proxy.requests_to("/agent/stream/")]

    assert proxy.cuts == 4 and watcher.stream.mode == "stream"
    # Each run's stream is read from its start once (a continued listener's next run, should it switch, has a
    # stream of its own: seen once in a full run), and every later request for it resumes after the last event.
    by_run: dict = {}
    for run, last in streams:
        by_run.setdefault(run, []).append(last)
    assert len(streams) >= 5 and all(lasts[0] is None and all(lasts[1:]) for lasts in by_run.values()), streams
    got = [(e.id, e.kind) for e in server_events(events)]
    try:
        replayed = [event for run in by_run for event in raw_stream(server_url, run)]
    except AssertionError as err:  # seen twice in full runs only: say which run it read and what it is
        raise AssertionError(f"{err}; {explain_run(server_url, handle)}; the SDK's events: {got}") from err
    assert got == replayed, (streams, explain_run(server_url, handle))
    assert len({(e.execution_id, e.id, e.kind) for e in server_events(events)}) == len(got)
    assert [a for a, _ in tools.actions] == [f"a-{i}" for i in range(4)]


def explain_run(base_url: str, handle) -> str:
    """The handle's view of the listener (runs, current and first run) and the server's of its current and first
    runs: status, reason, and the last tasks with their status and reason."""
    current = handle.current_execution_id
    first = handle._chain().link(0).execution_id

    def server_view(run_id: str) -> str:
        run = requests.get(f"{base_url}/workflow/{run_id}", params={"includeTasks": "true"}, timeout=10).json()
        tasks = [(t.get("referenceTaskName"), t.get("status"), t.get("reasonForIncompletion") or "")
                 for t in run.get("tasks") or ()]
        return (f"{run.get('status')} ({run.get('reasonForIncompletion')}), workflow {run.get('workflowName')}, "
                f"correlation {run.get('correlationId')}, {len(tasks)} tasks, the last ones {tasks[-6:]}")

    return (f"handle: execution_id {handle.execution_id}, runs {handle.runs}, current {current}, first run {first}; "
            f"current run: {server_view(current)}; first run: {server_view(first)}")


def test_polling_fallback_gives_the_same_story(agent_settings, scripted_llm, unique_name, conductor_server):
    """The stream endpoint answers 404 (a proxy refuses it): the events come from the task list,
    same kinds in the same order as the server's own stream, plus the local tool events."""
    server_url = getattr(conductor_server, "url")
    model = scripted_llm.script(policy=listener_policy(act_on))
    tools = ActionTools("poll")
    before = sdk_threads()
    with LoopbackProxy(server_url) as proxy:
        proxy.refuse(["/agent/stream/"], status=404)
        with AgentRuntime(AgentSettings.from_env(environ={}, server_url=proxy.url)) as runtime:
            handle = runtime.start(listener(unique_name("listener"), model, tools), "Start listening.")
            watcher = Watcher(handle)
            eventually(lambda: watcher.count("waiting", "poll"), timeout=30, message="the first waiting event")
            handle.send_message({"action": "generate-report"})
            eventually(lambda: watcher.count("waiting", "poll") >= 2, timeout=30, message="the second waiting")
            handle.stop()
            assert handle.wait(timeout=60).status is RunStatus.COMPLETED
            events = watcher.join()
            open_stream = handle.events(timeout=30)  # left open: closing the runtime must close it
            next(open_stream)
        assert proxy.requests_to("/agent/stream/")
    assert watcher.stream.mode == "poll"
    assert [e.kind for e in server_events(events)] == SEED_KINDS
    assert [kind for _, kind in raw_stream(server_url, handle.current_execution_id)] == SEED_KINDS
    assert {"tool_started", "tool_finished"} <= {e.kind for e in events}
    with pytest.raises(StopIteration):
        next(open_stream)
    assert not [t for t in sdk_threads() if t.startswith("conductor-agents-events-")]
    eventually(lambda: set(sdk_threads()) <= set(before), timeout=15, message="no thread left behind")
