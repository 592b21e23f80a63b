"""The async face against the real server: every verb of ``AsyncAgentRuntime`` and ``AsyncAgentHandle`` works
while the event loop's heartbeat keeps ticking (a blocking verb would stall it for the length of a wait),
``events()`` is an async iterator, a cancelled ``wait()`` gives the loop back at once and frees its thread
within a slice, and closing leaves no thread behind."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import List

import pytest

from conductor_agents import AsyncAgentRuntime, ModelSettings, RunPausedError, RunStatus, WaitTimeoutError, aio
from conductor_agents.testing import listener_policy

from ..helpers import listener
from .test_stateful_listener import ActionTools, act_on

pytestmark = pytest.mark.integration

#: A gap in the heartbeat this long means the loop was blocked (each blocking stretch below lasts longer).
BLOCKED_GAP_SECONDS = 1.0


class Heartbeat:
    """A task that ticks every 10 ms and keeps the longest gap between two ticks."""

    def __init__(self) -> None:
        self.longest = 0.0
        self.ticks = 0
        self._task: "asyncio.Task[None] | None" = None

    async def _beat(self) -> None:
        last = time.monotonic()
        while True:
            await asyncio.sleep(0.01)
            now = time.monotonic()
            self.longest, last = max(self.longest, now - last), now
            self.ticks += 1

    def __enter__(self) -> "Heartbeat":
        self._task = asyncio.get_running_loop().create_task(self._beat())
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()


async def until(check, timeout: float, message: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"{message} not reached within {timeout}s"
        await asyncio.sleep(0.05)


def async_threads() -> "List[threading.Thread]":
    return [t for t in threading.enumerate() if t.name.startswith("conductor-agents-async") and t.is_alive()]


# One topology: each async verb hands the sync verb to a thread, and what is tested here is that the loop keeps
# ticking meanwhile (and gets a cancelled wait back at once): the sync verbs' server side runs on the cluster in
# the both_topologies tests of each verb (issue 44: a cluster variant here cost 16 s for nothing more).
def test_every_verb_awaits_without_blocking_the_loop(agent_settings, scripted_llm, unique_name, monkeypatch):
    monkeypatch.setattr(aio, "WAIT_SLICE_SECONDS", 0.5)  # a cancelled wait frees its thread within this
    model = scripted_llm.script(policy=listener_policy(act_on))
    tools = ActionTools("async")

    async def scenario() -> None:
        with Heartbeat() as beat:
            async with AsyncAgentRuntime(agent_settings) as runtime:
                handle = await runtime.start(listener(unique_name("async"), model, tools), "Start listening.",
                                             model_settings=ModelSettings(max_tokens=99))
                watcher = await runtime.attach(handle.execution_id)
                seen: "list" = []

                async def read_events() -> None:
                    async for event in watcher.events(timeout=120):
                        seen.append(event)

                reader = asyncio.create_task(read_events())
                first = await handle.send_message({"action": "a1"})
                assert (await handle.wait_delivered(first, timeout=60)).execution_id
                second = await runtime.send_message(handle.execution_id, {"action": "a2"})
                await runtime.wait_delivered(handle.execution_id, second, timeout=60)
                await until(lambda: [a for a, _ in tools.actions] == ["a1", "a2"], 60, "both actions")
                assert (await handle.status()).status is RunStatus.RUNNING
                assert await handle.pending() == () and await runtime.pending(handle.execution_id) == ()
                assert (await handle.totals()).runs == 1
                await handle.signal("Be terse.")
                await runtime.signal(handle.execution_id, "")
                await handle.pause()
                assert (await handle.status()).status is RunStatus.PAUSED
                with pytest.raises(RunPausedError):
                    await handle.send_message({"action": "refused"})
                await handle.unpause()

                started = time.monotonic()
                with pytest.raises(WaitTimeoutError) as timed_out:
                    await handle.wait(timeout=2.0)  # four slices: the heartbeat ticks through all of them
                assert timed_out.value.timeout == 2.0 and "2s" in str(timed_out.value)
                assert time.monotonic() - started >= 2.0

                waiting = asyncio.create_task(handle.wait(timeout=60))
                await asyncio.sleep(0.3)
                waiting.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await waiting  # the loop is back at once; the thread ends with its slice

                await handle.stop()
                result = await handle.wait(timeout=120)
                assert result.status is RunStatus.COMPLETED
                await asyncio.wait_for(reader, 60)
                kinds = [event.kind for event in seen]
                assert kinds[-1] == "done" and kinds.count("tool_finished") >= 2, kinds
        assert beat.longest < BLOCKED_GAP_SECONDS, f"the loop was blocked for {beat.longest:.2f}s"
        assert {r.body.get("max_output_tokens") for r in scripted_llm.requests_for(model)} == {99}
        assert beat.ticks > 100

    asyncio.run(scenario())
    deadline = time.monotonic() + 10
    while async_threads() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not async_threads(), async_threads()  # the pool and the event reader are gone with the runtime


def test_closing_an_event_iterator_early_closes_its_connection(agent_settings, scripted_llm, unique_name):
    model = scripted_llm.script(policy=listener_policy(act_on))
    tools = ActionTools("early")

    async def scenario() -> None:
        async with AsyncAgentRuntime(agent_settings) as runtime:
            handle = await runtime.start(listener(unique_name("early"), model, tools), "Start listening.")
            events = handle.events(timeout=120)
            async with events:
                first = await events.__anext__()
                assert first.kind
            # closed: the reader thread is gone although the run goes on
            assert not [t for t in async_threads() if "events" in t.name]
            assert (await handle.status()).status is RunStatus.RUNNING
            await handle.cancel()

    asyncio.run(scenario())
