"""Writing tools on the real server: the ToolContext, ToolRetry, cancellation and graceful stop."""

from __future__ import annotations

import asyncio
import threading

import pytest

from conductor_agents import (
    Agent,
    CancelReason,
    RunStatus,
    ToolContext,
    ToolRetry,
    current_tool_context,
    tool,
)
from conductor_agents.testing import ToolCall

from ..helpers import eventually

pytestmark = pytest.mark.integration


def one_call_then(tool_name: str, arguments: dict, final: str = "done"):
    """A stateless policy: call ``tool_name`` once, then answer ``final``."""
    return lambda request: final if request.tool_outputs else ToolCall(tool_name, arguments)


def test_a_tool_gets_its_context_and_helpers_find_it(agent_runtime, scripted_llm, unique_name):
    """ctx carries the run, the task and attempt 1; current_tool_context() finds it in helpers (also
    inside an async tool's loop); the model's schema has no trace of the ctx parameter."""
    sync_name, async_name = unique_name("ctx_sync"), unique_name("ctx_async")
    seen = {}

    def helper() -> "ToolContext | None":
        return current_tool_context()

    @tool(name=sync_name)
    def sync_tool(text: str, ctx: ToolContext) -> dict:
        """Record the context."""
        seen["sync"] = (ctx, helper() is ctx, text)
        return {"ok": True}

    @tool(name=async_name)
    async def async_tool(ctx: ToolContext) -> dict:
        """Record the context from inside the event loop."""
        await asyncio.sleep(0)
        seen["async"] = (ctx, helper() is ctx)
        return {"ok": True}

    model = scripted_llm.script([[ToolCall(sync_name, {"text": "hi"}), ToolCall(async_name)], "done"])
    agent = Agent(unique_name("ctx_agent"), model, tools=[sync_tool, async_tool], stateful=True)
    handle = agent_runtime.start(agent, "Go.")
    assert handle.wait(timeout=90).status is RunStatus.COMPLETED

    ctx, found, text = seen["sync"]
    assert found and text == "hi"
    assert ctx.execution_id == handle.execution_id and ctx.run_id == handle.run_id
    assert ctx.attempt == 1 and ctx.tool_name == sync_name and ctx.task_id
    assert ctx.reference_name and ctx.idempotency_key == f"{handle.execution_id}/{ctx.reference_name}"
    actx, afound = seen["async"]
    assert afound and actx.attempt == 1 and actx.idempotency_key != ctx.idempotency_key
    assert current_tool_context() is None  # outside a tool
    offered = {t["name"]: t for t in scripted_llm.requests_for(model)[0].body["tools"]}
    assert offered[sync_name]["parameters"]["properties"] == {"text": {"type": "string"}}
    assert offered[async_name]["parameters"]["properties"] == {}
    scripted_llm.assert_no_anomalies(model)


def test_idempotency_keys_differ_for_every_call_across_turns(agent_runtime, scripted_llm, unique_name):
    """The same tool called twice in one turn and once in each of two later turns: four keys."""
    name = unique_name("keyed")
    keys = []

    @tool(name=name)
    def keyed(n: int, ctx: ToolContext) -> int:
        """Record the key."""
        keys.append((n, ctx.idempotency_key, ctx.attempt))
        return n

    model = scripted_llm.script([[ToolCall(name, {"n": 1}), ToolCall(name, {"n": 2})], ToolCall(name, {"n": 3}),
                                 ToolCall(name, {"n": 4}), "done"])
    result = agent_runtime.run(Agent(unique_name("keys"), model, tools=[keyed]), "Go.", timeout=90)
    assert result.status is RunStatus.COMPLETED
    assert sorted(n for n, _, _ in keys) == [1, 2, 3, 4]
    assert len({key for _, key, _ in keys}) == 4
    assert {attempt for _, _, attempt in keys} == {1}


def test_tool_retry_delivers_the_call_again_and_the_model_sees_only_the_last_result(
        agent_runtime, scripted_llm, unique_name):
    """ToolRetry on attempt 1: attempt 2 comes with the same key; the model never sees the retried failure."""
    name = unique_name("flaky")
    deliveries = []

    @tool(name=name)
    def flaky(ctx: ToolContext) -> dict:
        """Fails once, then works."""
        deliveries.append((ctx.attempt, ctx.idempotency_key, ctx.task_id))
        if ctx.attempt == 1:
            raise ToolRetry("the upstream service is busy", after_seconds=1)
        return {"answer": 42}

    model = scripted_llm.script(policy=one_call_then(name, {}))
    result = agent_runtime.run(Agent(unique_name("retrying"), model, tools=[flaky]), "Go.", timeout=90)

    assert result.status is RunStatus.COMPLETED
    assert [d[0] for d in deliveries] == [1, 2]
    assert deliveries[0][1:] == deliveries[1][1:]  # the same call: same key, same task
    requests = scripted_llm.requests_for(model)
    assert len(requests) == 2
    assert [o.output for o in requests[1].tool_outputs] == [{"answer": 42}]
    assert "busy" not in str(requests[1].body)  # no trace of the retried failure anywhere the model looks
    [call] = [c for c in result.tool_calls if c.name == name]
    assert call.status == "COMPLETED"


def test_tool_retry_past_the_budget_is_a_failure_the_model_sees(agent_runtime, scripted_llm, unique_name):
    """The server grants agent tool tasks retryCount 2: three deliveries, then the model sees the reason."""
    name = unique_name("hopeless")
    attempts = []

    @tool(name=name)
    def hopeless(ctx: ToolContext) -> str:
        """Always asks for a retry."""
        attempts.append(ctx.attempt)
        raise ToolRetry("still down")

    model = scripted_llm.script(policy=one_call_then(name, {}, final="gave up"))
    result = agent_runtime.run(Agent(unique_name("budget"), model, tools=[hopeless]), "Go.", timeout=90)

    assert result.status is RunStatus.COMPLETED and result.output == "gave up"
    assert attempts == [1, 2, 3]
    [output] = scripted_llm.requests_for(model)[1].tool_outputs
    assert "still down (gave up after 3 attempts)" in str(output.output)


def test_cancelling_a_run_sets_ctx_cancelled_in_a_long_tool(agent_settings, agent_runtime, scripted_llm,
                                                           unique_name):
    """A 60 s tool waiting on ctx.cancelled ends soon after the run is cancelled from ANOTHER runtime
    (the server tells this one: no local hint), and again when cancelled through this process's handle."""
    from conductor_agents import AgentRuntime

    name = unique_name("patient")
    entered, outcome = threading.Event(), {}

    @tool(name=name)
    def patient(ctx: ToolContext) -> str:
        """Waits up to a minute unless cancelled."""
        entered.set()
        outcome["cancelled"] = ctx.cancelled.wait(60)
        outcome["reason"] = ctx.cancel_reason
        ctx.check_cancelled()  # raises ToolCancelled: not a failure, nothing is posted
        return "finished"

    model = scripted_llm.script(policy=one_call_then(name, {}))
    agent = Agent(unique_name("cancelled"), model, tools=[patient], stateful=True)
    handle = agent_runtime.start(agent, "Go.")
    assert entered.wait(60)
    with AgentRuntime(agent_settings) as other:
        other.attach(handle.execution_id).cancel("stop it")
    eventually(lambda: "cancelled" in outcome, timeout=10, interval=0.05,
               message="the tool to see the cancellation")
    assert outcome == {"cancelled": True, "reason": CancelReason.RUN_ENDED}
    assert handle.wait(timeout=30).status is RunStatus.TERMINATED

    # The same through this process's own handle: set at once, without a server read.
    entered.clear()
    outcome.clear()
    handle = agent_runtime.start(agent, "Again.")
    assert entered.wait(60)
    handle.cancel("stop it too")
    eventually(lambda: "cancelled" in outcome, timeout=10, interval=0.05, message="the tool to see it")
    assert outcome == {"cancelled": True, "reason": CancelReason.RUN_ENDED}


def test_a_graceful_stop_sets_ctx_stop_requested(agent_settings, agent_runtime, scripted_llm, unique_name):
    """stop() from another runtime (server-side flag) and from this process's handle: the tool sees
    stop_requested, returns early with its result, and the run ends COMPLETED after this turn."""
    from conductor_agents import AgentRuntime

    name = unique_name("stoppable")
    entered, saw_stop = threading.Event(), []

    @tool(name=name)
    def stoppable(ctx: ToolContext) -> dict:
        """Works up to a minute, or until a stop is asked."""
        entered.set()
        saw_stop.append(ctx.stop_requested.wait(60))
        return {"partial": True, "cancelled": ctx.cancelled.is_set()}

    model = scripted_llm.script(policy=one_call_then(name, {}))
    agent = Agent(unique_name("stopped"), model, tools=[stoppable], stateful=True)

    handle = agent_runtime.start(agent, "Go.")
    assert entered.wait(60)
    with AgentRuntime(agent_settings) as other:
        other.attach(handle.execution_id).stop()
    eventually(lambda: saw_stop, timeout=10, interval=0.05, message="the tool to see the stop")
    result = handle.wait(timeout=60)
    assert saw_stop == [True]
    assert result.status is RunStatus.COMPLETED
    [call] = result.tool_calls
    assert call.status == "COMPLETED" and call.output == {"partial": True, "cancelled": False}

    entered.clear()
    saw_stop.clear()
    handle = agent_runtime.start(agent, "Again.")
    assert entered.wait(60)
    handle.stop()
    eventually(lambda: saw_stop, timeout=10, interval=0.05, message="the tool to see the local stop")
    assert saw_stop == [True]
    assert handle.wait(timeout=60).status is RunStatus.COMPLETED


def test_many_parallel_calls_retried_at_once_each_come_back_once(agent_runtime, scripted_llm, unique_name):
    """Eight calls of one turn, run on the pool at the same time, each ToolRetry'd once: each is delivered
    exactly twice with its own key, and the model sees eight results and no failure."""
    name = unique_name("parallel_retry")
    lock = threading.Lock()
    deliveries = []

    @tool(name=name)
    def parallel(n: int, ctx: ToolContext) -> dict:
        """Fails once per call, then works."""
        with lock:
            deliveries.append((n, ctx.attempt, ctx.idempotency_key))
        if ctx.attempt == 1:
            raise ToolRetry("first try", after_seconds=1)
        return {"n": n}

    model = scripted_llm.script([[ToolCall(name, {"n": n}) for n in range(8)], "done"])
    agent = Agent(unique_name("parallel"), model, tools=[parallel], stateful=True)
    assert agent_runtime.run(agent, "Go.", timeout=120).status is RunStatus.COMPLETED

    assert sorted((n, attempt) for n, attempt, _ in deliveries) == [(n, a) for n in range(8) for a in (1, 2)]
    keys = {}
    for n, _, key in deliveries:
        keys.setdefault(n, set()).add(key)
    assert all(len(k) == 1 for k in keys.values()) and len({next(iter(k)) for k in keys.values()}) == 8
    outputs = sorted(o.output["n"] for o in scripted_llm.requests_for(model)[1].tool_outputs)
    assert outputs == list(range(8))


def test_a_tool_whose_task_the_server_gave_up_on_is_cancelled(agent_runtime, agent_settings, scripted_llm,
                                                               unique_name):
    """Someone else reports the task (as another worker would after a takeover): the server no longer
    holds it for this worker, so the running tool sees ctx.cancelled (task_lost) and nothing it does
    is posted; the run carries on with the other result."""
    import requests

    name = unique_name("overtaken")
    entered, outcome = threading.Event(), {}
    task_ids = []

    @tool(name=name)
    def overtaken(ctx: ToolContext) -> dict:
        """Waits to be cancelled."""
        task_ids.append(ctx.task_id)
        entered.set()
        outcome["cancelled"] = ctx.cancelled.wait(60)
        outcome["reason"] = ctx.cancel_reason
        return {"from": "the first worker"}  # posted, but the task is already over: the server ignores it

    hold_name, release = unique_name("hold"), threading.Event()

    @tool(name=hold_name)
    def hold() -> str:
        """Keeps the run going (so its end is not what the first tool learns)."""
        release.wait(60)
        return "held"

    def policy(request):
        if request.is_first_turn:
            return ToolCall(name)
        return ToolCall(hold_name) if request.turn_index == 1 else "done"

    model = scripted_llm.script(policy=policy)
    agent = Agent(unique_name("overtaken_agent"), model, tools=[overtaken, hold], stateful=True)
    handle = agent_runtime.start(agent, "Go.")
    assert entered.wait(60)
    requests.post(f"{agent_settings.server_url}/tasks", timeout=10, json={
        "workflowInstanceId": handle.execution_id, "taskId": task_ids[0], "workerId": "another-worker",
        "status": "COMPLETED", "outputData": {"from": "another worker"}})
    eventually(lambda: "cancelled" in outcome, timeout=10, interval=0.05, message="the tool to see it lost its task")
    assert outcome == {"cancelled": True, "reason": CancelReason.TASK_LOST}
    release.set()
    assert handle.wait(timeout=60).status is RunStatus.COMPLETED
    assert scripted_llm.requests_for(model)[1].tool_outputs[0].output == {"from": "another worker"}


def test_closing_the_runtime_cancels_a_tool_and_the_call_resumes_elsewhere(agent_settings, scripted_llm,
                                                                          unique_name):
    """close() sets ctx.cancelled (runtime_closing); the tool stops with ToolCancelled and its task is
    handed back; another runtime resumes the run and gets the same call as attempt 2; the model sees
    only that result."""
    import attrs

    from conductor_agents import AgentRuntime, ToolRegistry

    name = unique_name("interrupted")

    class Worker:
        def __init__(self, label: str) -> None:
            self.label = label
            self.entered = threading.Event()
            self.seen = []

        @tool(name=name)
        def interrupted(self, ctx: ToolContext) -> dict:
            """Long unless it is the second delivery."""
            self.seen.append((ctx.attempt, ctx.idempotency_key))
            self.entered.set()
            if ctx.attempt == 1:
                ctx.cancelled.wait(60)
                self.seen.append(ctx.cancel_reason)
                ctx.check_cancelled()
            return {"by": self.label, "attempt": ctx.attempt}

    def agent_for(worker: Worker) -> Agent:
        return Agent(agent_name, model, tools=ToolRegistry.from_instance(worker), stateful=True)

    model = scripted_llm.script(policy=one_call_then(name, {}))
    agent_name = unique_name("interrupted_agent")
    first, second = Worker("first"), Worker("second")
    runtime = AgentRuntime(attrs.evolve(agent_settings, shutdown_grace_seconds=10.0))
    try:
        handle = runtime.start(agent_for(first), "Go.")
        assert first.entered.wait(60)
    finally:
        runtime.close()  # returns once the tool ended: it watched ctx.cancelled
    assert first.seen[1:] == [CancelReason.RUNTIME_CLOSING]

    with AgentRuntime(agent_settings) as resumer:
        # force: the first runtime polled the run's domain seconds ago (it is closed, not dead).
        result = resumer.resume(handle.execution_id, agent_for(second), force=True).wait(timeout=90)
    assert result.status is RunStatus.COMPLETED
    assert second.seen == [(2, first.seen[0][1])]  # the same call, its second delivery
    [output] = scripted_llm.requests_for(model)[1].tool_outputs
    assert output.output == {"by": "second", "attempt": 2}
