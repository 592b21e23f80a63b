"""The runtime's watchdog on the real server: liveness without wait(), one thread for every run,
runs released when they end, a full tool pool that is busy and not dead, and the requests an idle
run costs (counted through a proxy)."""

from __future__ import annotations

import concurrent.futures
from collections import Counter
import threading
import time

import attrs
import pytest

from conductor_agents import Agent, AgentRuntime, RunStatus, ToolRegistry, WorkerStallError, tool
from conductor_agents.testing import ToolCall, listener_policy

from conductor_agents._liveness.watchdog import IDLE_SAMPLE_INTERVALS
from conductor_agents._listener.mailbox import MAILBOX_WORKFLOW

from ..helpers import eventually, listener, sdk_threads
from ..integration.test_stateful_listener import ActionTools, act_on
from ..proxy import LoopbackProxy
from .support import tasks_of

pytestmark = pytest.mark.reliability

WATCHDOG = "conductor-agents-watchdog"
SAFETY_POLL_SECONDS = 60.0  # an idle poller's own poll, conductor_agents._worker.poller.SAFETY_POLL_SECONDS


def watchdog_threads() -> int:
    return sum(1 for t in threading.enumerate() if t.name == WATCHDOG and t.is_alive())


def poller_alive(run_id: str) -> bool:
    return any(t.name == f"conductor-agents-poll-{run_id}" and t.is_alive() for t in threading.enumerate())


def one_tool_agent(name: str, model: str, tools: object) -> Agent:
    return Agent(name, model, stateful=True, tools=list(ToolRegistry.from_instance(tools)), max_turns=5)


class Stalls:
    """An on_stall listener that records what it was told, and on which thread."""

    def __init__(self) -> None:
        self.heard: list = []

    def __call__(self, handle, error) -> None:
        self.heard.append((handle, error, threading.current_thread().name))


def test_a_stall_is_visible_without_waiting_and_wait_raises_it_at_once(
        agent_settings, scripted_llm, unique_name, conductor_server):
    """Nobody polls the run's domain and nobody waits: handle.stall and on_stall report it from the
    watchdog thread; a later wait() raises it without sending a single status request."""
    stall, interval = 2.0, 0.25
    settings = attrs.evolve(agent_settings, auto_start_workers=False, liveness_stall_seconds=stall,
                            liveness_check_interval_seconds=interval)
    model = scripted_llm.script([ToolCall("act", {"action": "orphaned"}), "done"])
    stalls = Stalls()
    before = sdk_threads()
    with LoopbackProxy(conductor_server.url) as proxy, \
            AgentRuntime(attrs.evolve(settings, server_url=proxy.url), on_stall=stalls) as runtime:
        handle = runtime.start(one_tool_agent(unique_name("unwatched"), model, ActionTools()), "Go.")
        assert handle.stall is None
        eventually(lambda: handle.stall is not None, timeout=60, interval=0.05, message="the stall flag")
        eventually(lambda: stalls.heard, timeout=10, message="on_stall called")
        status_path = f"/agent/{handle.execution_id}/status"
        with pytest.raises(WorkerStallError) as info:
            handle.wait(timeout=60)
        assert [] == proxy.requests_to(status_path)  # raised at once: no status poll
        task = [t for t in tasks_of(agent_settings.server_url, handle.execution_id, "act")
                if t["status"] == "SCHEDULED"][0]
        [(told_handle, told_error, thread)] = stalls.heard
        assert (told_handle, thread) == (handle, WATCHDOG)
        assert told_error is handle.stall
        assert (info.value.task_reference_name, info.value.execution_id, info.value.domain) == \
            (task["referenceTaskName"], handle.execution_id, handle.run_id)
        assert (told_error.task_reference_name, told_error.domain) == (task["referenceTaskName"], task["domain"])

        handle.pause()  # paused on purpose: the task waits for the unpause, not for a worker
        eventually(lambda: handle.stall is None, timeout=30, interval=0.05, message="no stall while paused")
        handle.unpause()
        eventually(lambda: handle.stall is not None, timeout=30, interval=0.05, message="the stall again")

        handle.cancel()
        eventually(lambda: watchdog_threads() == 0, timeout=30, message="the watchdog gone after the run ended")
        assert handle.stall is None  # the run ended: no stall any more
    assert sdk_threads() == before


def test_a_hundred_runs_share_one_watchdog_thread_which_ends_after_the_last(
        agent_settings, scripted_llm, unique_name):
    """100 stateful runs started from 10 threads at once add exactly one thread, the watchdog; when
    they end (cancelled, not through the handles' wait), each is dropped and the thread ends."""
    settings = attrs.evolve(agent_settings, auto_start_workers=False, liveness_check_interval_seconds=0.5)
    model = scripted_llm.script(policy=listener_policy(act_on))
    agent = listener(unique_name("many"), model, ActionTools())
    before = sdk_threads()
    with AgentRuntime(settings) as runtime, concurrent.futures.ThreadPoolExecutor(10) as pool:
        # The first start registers the agent's definition (concurrent first starts are issue 11.1's).
        handles = [runtime.start(agent, "Listen #0.")]
        handles += list(pool.map(lambda i: runtime.start(agent, f"Listen #{i}."), range(1, 100)))
        added = sorted(set(sdk_threads()) - set(before))
        watchdog = runtime._process.workers.watchdog
        watched = len(watchdog.watched())
        eventually(lambda: all(h.status().status is RunStatus.RUNNING for h in handles[:3]), timeout=30)
        list(pool.map(lambda h: h.cancel(), handles))
        eventually(lambda: not watchdog.watched(), timeout=60, message="every ended run dropped")
        eventually(lambda: watchdog_threads() == 0, timeout=30, message="the watchdog thread to end")
        started = watchdog.threads_started
    assert (added, watched, started) == ([WATCHDOG], 100, 1)
    assert sdk_threads() == before


@pytest.mark.parametrize("liveness", [True, False], ids=["liveness-on", "liveness-off"])
def test_a_run_ended_elsewhere_releases_its_poller(agent_settings, scripted_llm, unique_name, liveness):
    """A listener nobody waits on, cancelled by another runtime: the watchdog's sample finds it ended
    and its poller thread stops, with liveness on (task-list sample) or off (status sample)."""
    settings = attrs.evolve(agent_settings, liveness_enabled=liveness, liveness_check_interval_seconds=0.5)
    model = scripted_llm.script(policy=listener_policy(act_on))
    before = sdk_threads()
    with AgentRuntime(settings) as serving, AgentRuntime(settings) as other:
        handle = serving.start(listener(unique_name("released"), model, ActionTools()), "Listen.")
        assert poller_alive(handle.run_id) and watchdog_threads() == 1
        other.attach(handle.execution_id).cancel()
        eventually(lambda: not poller_alive(handle.run_id), timeout=30, message="the poller released")
        eventually(lambda: watchdog_threads() == 0, timeout=30, message="the watchdog gone with the last run")
        assert () == serving.stats().active_runs
    assert sdk_threads() == before


def test_idle_runs_cost_one_request_each_per_three_intervals(agent_settings, scripted_llm, unique_name,
                                                             conductor_server):
    """20 idle listeners of one agent behind a counting proxy. Each listener is two runs the watchdog
    watches: its current run and its mailbox. In a window, each run's own samples (the requests naming
    its execution id) are at most one per three liveness intervals (the queue watcher reads their
    queues empty, so no task can be stalled), their end-of-run checks share one running list per
    workflow and interval (the agent's, and the one every listener's mailbox runs), every run is
    checked, and the polls of a listener's domain are at most its poller's safety polls (one a minute)."""
    n, interval = 20, 2.0
    settings = attrs.evolve(agent_settings, liveness_check_interval_seconds=interval)
    model = scripted_llm.script(policy=listener_policy(act_on))
    agent = listener(unique_name("idle"), model, ActionTools())
    with LoopbackProxy(conductor_server.url) as proxy, \
            AgentRuntime(attrs.evolve(settings, server_url=proxy.url)) as runtime:
        handles = [runtime.start(agent, "Listen.") for _ in range(n)]
        eventually(lambda: all(_waiting_for_message(agent_settings.server_url, h.execution_id) for h in handles),
                   timeout=120, message="every listener waiting for a message")
        runs = [(h, run_id) for h in handles for run_id in dict.fromkeys((h.execution_id, h.current_execution_id))]
        assert len(runs) == 2 * n, "each listener has a mailbox beside its run"
        watches = [runtime._process.workers.watch(run_id) for _, run_id in runs]  # the watchdog's RunWatch of each
        eventually(lambda: all(w.samples or w.listed for w in watches), timeout=30,
                   message="a first end check of each run (a sample, or the running list)")

        def per_run() -> "list[tuple[int, int, int]]":
            return [(len(proxy.requests_to(run_id)), len(proxy.requests_to(f"domain={h.run_id}")), w.listed)
                    for (h, run_id), w in zip(runs, watches)]

        first, lists_before, started = per_run(), len(proxy.requests_to("/workflow/running/")), time.monotonic()
        threading.Event().wait(2 * IDLE_SAMPLE_INTERVALS * interval + 0.5)  # the window (its length is measured)
        last, elapsed = per_run(), time.monotonic() - started
        listed = proxy.requests_to("/workflow/running/")[lists_before:]
        per_workflow = Counter(path.split("?")[0].rsplit("/", 1)[-1] for _, path, _ in listed)
        lists = max(per_workflow.values(), default=0)
        for h in handles:
            h.cancel()
    samples = [b[0] - a[0] for a, b in zip(first, last)]
    polls = [b[1] - a[1] for a, b in zip(first, last)]
    checks = [b[0] - a[0] + b[2] - a[2] for a, b in zip(first, last)]
    sample_bound = int(elapsed // (IDLE_SAMPLE_INTERVALS * interval)) + 1
    poll_bound = int(elapsed // SAFETY_POLL_SECONDS) + 1
    print(f"\n{n} idle listeners ({len(runs)} runs), {elapsed:.1f}s window, interval {interval}s: own samples per "
          f"run {samples} (bound {sample_bound}), running lists {dict(per_workflow)}, domain polls per run {polls} "
          f"(bound {poll_bound}); {(sum(samples) + sum(polls[::2]) + sum(per_workflow.values())) / n / elapsed:.3f} "
          "requests/s per listener")
    assert max(samples) <= sample_bound, samples
    assert max(polls) <= poll_bound, polls
    assert set(per_workflow) <= {agent.name, MAILBOX_WORKFLOW}, per_workflow
    assert lists <= int(elapsed // interval) + 1, per_workflow
    assert min(checks) >= 1, checks  # every run's end is checked while idle (its own sample or the list)
    assert sum(samples) < len(runs), samples  # most checks were answered by the shared list


def _waiting_for_message(base_url: str, execution_id: str) -> bool:
    from .support import waiting_for_message, workflow

    return waiting_for_message(workflow(base_url, execution_id).get("tasks") or ())


class SlowTools:
    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.runs = 0
        self.lock = threading.Lock()

    @tool
    def slow(self, n: int = 0) -> dict:
        """Work for a while."""
        threading.Event().wait(self.seconds)  # a tool body that takes its time, as real ones do
        with self.lock:
            self.runs += 1
        return {"slept": self.seconds, "n": n}


def test_a_full_tool_pool_is_busy_not_dead(agent_settings, scripted_llm, unique_name):
    """worker_threads=1 (room for 2 tasks) and three parallel tool calls of three times the stall
    threshold: the third task waits unpolled that long while the pool is full. Neither the serving
    runtime nor an observer in another runtime (it sees the busy domain only through the server's
    poll data, refreshed every third of the threshold) reports a stall; the run completes."""
    stall, interval = 2.0, 0.25
    short = dict(liveness_stall_seconds=stall, liveness_check_interval_seconds=interval)
    tools = SlowTools(3 * stall)
    model = scripted_llm.script([[ToolCall("slow", {"n": 1}), ToolCall("slow", {"n": 2}), ToolCall("slow", {"n": 3})],
                                 "done"])
    agent = Agent(unique_name("busy"), model, stateful=True, tools=list(ToolRegistry.from_instance(tools)))
    serving_stalls, observer_stalls = Stalls(), Stalls()
    with AgentRuntime(attrs.evolve(agent_settings, worker_threads=1, **short), on_stall=serving_stalls) as serving, \
            AgentRuntime(attrs.evolve(agent_settings, auto_start_workers=False, **short),
                         on_stall=observer_stalls) as observer:
        handle = serving.start(agent, "Work.")
        watcher = observer.resume(handle.execution_id, agent)
        assert not watcher.workers_attached
        result = handle.wait(timeout=120)
        observed = watcher.wait(timeout=30)
    assert (result.status, observed.status, tools.runs) == (RunStatus.COMPLETED, RunStatus.COMPLETED, 3)
    assert (serving_stalls.heard, observer_stalls.heard) == ([], [])
    # The test exercised the case: a task of the run's domain waited unpolled past the threshold.
    waits = sorted((t["startTime"] - t["scheduledTime"]) / 1000.0
                   for t in tasks_of(agent_settings.server_url, handle.execution_id, "slow"))
    print(f"\nunpolled waits of the slow tasks: {waits} (threshold {stall}s)")
    assert waits[-1] > 2 * stall
