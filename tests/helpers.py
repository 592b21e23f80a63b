"""Helpers shared by the test suites."""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Any, Callable, Iterator, Optional, TypeVar

import requests

from conductor_agents import Agent, Continuation, ToolRegistry, WaitForMessageTool
from conductor_agents._listener.chain import link_id, link_key, parse_link_key, parse_mailbox_key
from conductor_agents._listener.head import head_task_type
from conductor_agents._serving.leases import lease_execution_id

T = TypeVar("T")


def eventually(check: Callable[[], T], *, timeout: float = 10.0, interval: float = 0.05,
               message: str = "condition", explain: Optional[Callable[[], str]] = None) -> T:
    """Call ``check`` until it returns something truthy or ``timeout`` passes (then AssertionError).

    ``explain`` is called only on a timeout; what it returns ends the error (the state a failure needs).
    """
    deadline = time.monotonic() + timeout
    last: T = check()
    while not last:
        if time.monotonic() > deadline:
            detail = ""
            if explain is not None:
                try:
                    detail = "\n" + explain()
                except Exception as err:  # noqa: BLE001 (a failing explanation must not hide the failure)
                    detail = f"\n(explain failed: {err!r})"
            raise AssertionError(f"{message} not reached within {timeout}s (last value: {last!r}){detail}")
        time.sleep(interval)
        last = check()
    return last


def run_tasks_summary(base_url: str, execution_id: str, *, last: int = 15) -> str:
    """The run's status and its last ``last`` tasks (type, reference, status, poll count, seconds since the
    last update): the state a timed-out wait in a test reports."""
    response = requests.get(f"{base_url}/workflow/{execution_id}", params={"includeTasks": "true"}, timeout=10)
    if response.status_code != 200:
        return f"run {execution_id}: HTTP {response.status_code}"
    run = response.json()
    now_ms = time.time() * 1000
    lines = [f"run {execution_id}: {run.get('status')} {run.get('reasonForIncompletion') or ''}".rstrip()]
    for task in (run.get("tasks") or [])[-last:]:
        updated = task.get("updateTime") or task.get("scheduledTime") or 0
        lines.append(f"  {task.get('taskType')} {task.get('referenceTaskName')} {task.get('status')} "
                     f"polls={task.get('pollCount')} worker={task.get('workerId') or '-'} "
                     f"updated {max(0.0, (now_ms - updated) / 1000):.0f}s ago")
    return "\n".join(lines)


def lease_owner(base_url: str, domain: str, epoch: int) -> Optional[str]:
    """The worker id that owns lease ``epoch`` of ``domain``, read straight from the server: None if
    that lease was never taken (no such record), "" if it was taken as a release (no owner)."""
    response = requests.get(f"{base_url}/workflow/{lease_execution_id(domain, epoch)}",
                            params={"includeTasks": "false"}, timeout=10)
    if response.status_code == 404:
        return None
    response.raise_for_status()
    return response.json()["input"]["context"]["owner"]


def listener_runs(base_url: str, execution_id: str) -> "list[str]":
    """Every run of the listener whose first run is ``execution_id`` that the server still holds, first
    to newest (retention removes the older ended ones: see ``listener_links``)."""
    return [run for _, run in listener_links(base_url, execution_id)]


def read_through_balancer(url: str, params: dict, *, attempts: int = 5) -> requests.Response:
    """A test's own GET, tried again (at most ``attempts`` times, 1 s apart) when the cluster's balancer
    answers 502/503/504 or the connection drops: a node too busy to answer in time on a loaded machine,
    which the SDK's own reads retry too."""
    for attempt in range(attempts):
        try:
            response = requests.get(url, params=params, timeout=10)
        except requests.ConnectionError:
            if attempt == attempts - 1:
                raise
            time.sleep(1.0)
            continue
        if response.status_code not in (502, 503, 504) or attempt == attempts - 1:
            return response
        time.sleep(1.0)
    raise AssertionError("unreachable")


def listener_links(base_url: str, execution_id: str) -> "list[tuple[int, str]]":
    """``(link number, execution id)`` of every run of the listener that the server still holds.

    Found the way any process finds them: the first run's correlation id names its chain, each later
    run has a known id, and the head hint (poll data) says where the newest is once retention removed
    the runs in between; from the newest, the links are probed down until one is missing.
    """
    def exists(candidate: str) -> bool:
        response = read_through_balancer(f"{base_url}/workflow/{candidate}", {"includeTasks": "false"})
        if response.status_code == 404:
            return False
        response.raise_for_status()
        return True

    first = read_through_balancer(f"{base_url}/workflow/{execution_id}", {"includeTasks": "false"})
    first.raise_for_status()
    correlation = first.json().get("correlationId")
    box = parse_mailbox_key(correlation)  # a listener's mailbox: every link is probed, link 0 included
    key = box or parse_link_key(correlation)
    if key is None:
        return [(0, execution_id)]

    def link(number: int) -> str:
        return link_id(key.agent_name, link_key(key.run_id, number, key.agent_name))

    rows = read_through_balancer(f"{base_url}/tasks/queue/polldata", {"taskType": head_task_type(key.run_id)}).json()
    hints = [int(str(r.get("workerId"))[5:]) for r in rows or () if str(r.get("workerId") or "").startswith("head:")]
    top = max([key.number, *hints])
    while exists(link(top + 1)):
        top += 1
    links = []
    number = top
    while number > key.number and exists(link(number)):
        links.append((number, link(number)))
        number -= 1
    if box is not None:
        return [*([(0, link(0))] if number == 0 and exists(link(0)) else []), *reversed(links)]
    return [(key.number, execution_id), *reversed(links)]


def sdk_threads() -> "list[str]":
    """Names of the live threads this SDK started."""
    return sorted(t.name for t in threading.enumerate() if t.name.startswith("conductor-agents-")
                  and not t.name.startswith("conductor-agents-scripted-llm"))


def push_raw(base: str, execution_id: str, body: dict, *, timeout: float = 30) -> requests.Response:
    """A sender that is not this SDK: the server's own push to a listener's id, then the signal that has its
    mailbox take it at once (docs/concepts.md); the push's response."""
    response = requests.post(f"{base}/workflow/{execution_id}/messages", json=body, timeout=timeout)
    if response.status_code == 200:
        requests.post(f"{base}/tasks/{execution_id}/COMPLETED/signal", json={}, timeout=timeout)
    return response


def listener(name: str, model: str, tools: object, *, batch_size: int = 1,
             continuation: "Continuation | None" = None) -> Agent:
    """A stateful listener: wait for messages (up to ``batch_size`` at once), act with ``tools``' methods."""
    receive = WaitForMessageTool.create(name="wait_for_message", batch_size=batch_size)
    return Agent(
        name=name,
        model=model,
        stateful=True,
        max_turns=10_000,
        tools=[receive, *ToolRegistry.from_instance(tools)],
        instructions="Loop: wait_for_message, act on it, repeat until told to stop.",
        continuation=continuation,
    )


@contextlib.contextmanager
def otel_capture() -> "Iterator[Any]":
    """Instrument this process with in-memory OpenTelemetry providers: yields ``.spans()`` (finished spans),
    ``.metric(name)`` (its data points), ``.tracer`` (for the caller's own spans); uninstrumented after."""
    from types import SimpleNamespace

    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from conductor_agents import ConductorAgentsInstrumentor

    exporter, reader = InMemorySpanExporter(), InMemoryMetricReader()
    tracers = TracerProvider()
    tracers.add_span_processor(SimpleSpanProcessor(exporter))
    meters = MeterProvider(metric_readers=[reader])

    def metric(name: str) -> list:
        data = reader.get_metrics_data()
        return [point for rm in (data.resource_metrics if data else ()) for sm in rm.scope_metrics
                for m in sm.metrics if m.name == name for point in m.data.data_points]

    instrumentor = ConductorAgentsInstrumentor()
    instrumentor.instrument(tracer_provider=tracers, meter_provider=meters)
    try:
        yield SimpleNamespace(spans=exporter.get_finished_spans, metric=metric, tracer=tracers.get_tracer("test"))
    finally:
        instrumentor.uninstrument()
        tracers.shutdown()
        meters.shutdown()
