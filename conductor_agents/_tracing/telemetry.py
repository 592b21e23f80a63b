"""The spans and metrics themselves, after OpenTelemetry's GenAI semantic conventions: ``invoke_agent``
per run, ``execute_tool`` per tool body run here, ``chat`` per model turn the server reports, and the
``gen_ai.client.token.usage`` and ``gen_ai.client.operation.duration`` histograms.

The only module that imports ``opentelemetry`` (the API only), and only
:meth:`ConductorAgentsInstrumentor.instrument` imports it. Thread-safe.
"""

from __future__ import annotations

import collections
import os
import threading
import time
import weakref
from collections.abc import Callable, Mapping
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import metrics, trace
from opentelemetry.trace import SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from opentelemetry.util.types import AttributeValue

from .._version import __version__
from .carrier import carrier_of, is_traceparent

__all__ = ["Telemetry"]

_SCOPE = "conductor_agents"
_PROPAGATOR = TraceContextTextMapPropagator()
_MODEL_TASK_TYPE = "LLM_CHAT_COMPLETE"  # the server's model turn (as _common.task_names.MODEL_TASK_TYPE)
_SUB_RUN_TASK = "SUB_WORKFLOW"  # a sub-agent's or an agent tool's run (as _liveness.tree.SUB_RUN_TASK)
_FAILED_RUN = {"FAILED", "TERMINATED", "TIMED_OUT"}
_FAILED_TASK = {"FAILED", "FAILED_WITH_TERMINAL_ERROR", "TIMED_OUT", "CANCELED"}
#: The buckets the GenAI conventions advise for the two histograms.
_TOKEN_BUCKETS = [1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216, 67108864]
_SECOND_BUCKETS = [0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92]
#: (carrier, parent run) of runs not started here, by execution id (a tool's first call there reads its run once).
_CARRIER_CACHE = 1024
#: Sub-runs (sub-agents, agent tools) are followed up to this many parents to find a traced run.
_PARENT_DEPTH = 4


def error_type(err: BaseException) -> str:
    """The ``error.type`` of an exception: its fully qualified class name (builtins unqualified)."""
    cls = type(err)
    return cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"


def _after_fork_in_child(ref: weakref.ref[Telemetry]) -> None:
    """In a forked child: a new lock (the parent's may be held by a thread that does not exist here), and
    none of the parent's open runs (their spans are the parent's to end)."""
    telemetry = ref()
    if telemetry is not None:
        telemetry._lock = threading.Lock()
        telemetry._runs = {}


class _OpenRun:
    __slots__ = ("agent_name", "ended", "execution_id", "owner", "provider", "span", "started")

    def __init__(self, span: Any, agent_name: str, owner: Any, provider: str | None = None) -> None:
        self.span = span
        self.agent_name = agent_name
        self.provider = provider
        self.owner = owner
        self.started = time.monotonic()
        self.execution_id: str | None = None
        self.ended = False  # its span was ended (guarded by the Telemetry's lock)


class _RunTrace:
    """The handle :func:`hooks.begin_run` returns while tracing is on."""

    def __init__(self, telemetry: Telemetry, run: _OpenRun) -> None:
        self._telemetry = telemetry
        self._run = run
        carrier: dict[str, str] = {}
        _PROPAGATOR.inject(carrier, context=trace.set_span_in_context(run.span))
        self.traceparent: str | None = carrier.get("traceparent")

    def started(self, execution_id: str, *, conversation_id: str | None = None) -> None:
        self._telemetry.register(self._run, execution_id, conversation_id or execution_id)

    def failed(self, err: BaseException) -> None:
        if not self._telemetry.forget(self._run):
            return  # already ended (uninstrumented meanwhile)
        span = self._run.span
        span.set_attribute("error.type", error_type(err))
        span.set_status(Status(StatusCode.ERROR, str(err)[:200]))
        span.end()


class _ToolSpan:
    """One ``execute_tool`` span, current between enter and exit."""

    def __init__(self, span: Any) -> None:
        self._span = span
        self._token: Any = None
        self._error: str | None = None

    def __enter__(self) -> _ToolSpan:
        self._token = otel_context.attach(trace.set_span_in_context(self._span))
        return self

    def __exit__(self, kind: Any, err: Any, tb: Any) -> None:
        otel_context.detach(self._token)
        if err is not None and self._error is None:
            self.failed(err)
        self._span.end()

    def failed(self, err: BaseException, *, message: str | None = None, stacktrace: str | None = None) -> None:
        self._error = error_type(err)
        self._span.set_attribute("error.type", self._error)
        shown = {} if message is None else {"exception.message": message}  # the executor's, secrets redacted
        if stacktrace is not None:
            shown["exception.stacktrace"] = stacktrace
        self._span.record_exception(err, attributes=shown)
        self._span.set_status(Status(StatusCode.ERROR, f"{type(err).__name__}"))

    def finished(self, status: str | None) -> None:
        self._span.set_attribute("conductor_agents.task.status", status or "CANCELED")
        if self._error is None and status != "COMPLETED":
            self._error = "cancelled" if status is None else "retry" if status == "IN_PROGRESS" else "tool_error"
            self._span.set_attribute("error.type", self._error)
            self._span.set_status(Status(StatusCode.ERROR))


class Telemetry:
    """Spans and instruments of one ``instrument()`` call, and the runs whose span is open here."""

    def __init__(self, *, tracer_provider: Any | None, meter_provider: Any | None) -> None:
        self._tracer = trace.get_tracer(_SCOPE, __version__, tracer_provider=tracer_provider)
        meter = metrics.get_meter(_SCOPE, __version__, meter_provider=meter_provider)
        self._tokens = meter.create_histogram(
            "gen_ai.client.token.usage", unit="{token}", description="Number of input and output tokens used",
            explicit_bucket_boundaries_advisory=_TOKEN_BUCKETS)
        self._duration = meter.create_histogram(
            "gen_ai.client.operation.duration", unit="s", description="GenAI operation duration",
            explicit_bucket_boundaries_advisory=_SECOND_BUCKETS)
        self._lock = threading.Lock()
        self._runs: dict[str, _OpenRun] = {}
        ref = weakref.ref(self)
        os.register_at_fork(after_in_child=lambda: _after_fork_in_child(ref))
        self._carriers: collections.OrderedDict[str, tuple[str | None, str | None]] = collections.OrderedDict()

    # -- runs -------------------------------------------------------------------------

    def begin_run(self, agent_name: str, *, parent: str | None, taken_up: str | None,
                  owner: Any, model: str | None = None) -> _RunTrace:
        context = _PROPAGATOR.extract({"traceparent": parent}) if is_traceparent(parent) else None
        attributes = {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": agent_name}
        provider, _, requested = (model or "").partition("/")
        if provider and requested:  # the agent's "provider/model": the conventions require the provider
            attributes["gen_ai.provider.name"] = provider
            attributes["gen_ai.request.model"] = requested
        if taken_up:
            attributes["conductor_agents.run.taken_up"] = taken_up
        span = self._tracer.start_span(f"invoke_agent {agent_name}", context=context, kind=SpanKind.CLIENT,
                                       attributes=attributes)
        return _RunTrace(self, _OpenRun(span, agent_name, owner, provider=(provider if requested else None)))

    def register(self, run: _OpenRun, execution_id: str, conversation_id: str) -> None:
        with self._lock:
            if run.ended:
                return
            run.execution_id = execution_id
            run.span.set_attribute("gen_ai.conversation.id", conversation_id)
            run.span.set_attribute("conductor_agents.execution_id", execution_id)
            replaced = self._runs.get(execution_id)
            self._runs[execution_id] = run
            if replaced is run or (replaced is not None and replaced.ended):
                replaced = None
            elif replaced is not None:
                replaced.ended = True
        if replaced is not None:  # taken up again here: the older span is done
            replaced.span.end()

    def forget(self, run: _OpenRun) -> bool:
        """Stop tracking ``run`` (its start failed); False when its span was already ended."""
        with self._lock:
            if run.execution_id is not None and self._runs.get(run.execution_id) is run:
                del self._runs[run.execution_id]
            ended, run.ended = run.ended, True
        return not ended

    def run_ended(self, execution_id: str, read_workflow: Callable[[], Mapping[str, Any]],
                  continued: Callable[[str | None], bool],
                  read_run: Callable[[str], Mapping[str, Any]] | None = None) -> None:
        with self._lock:
            run = self._runs.pop(execution_id, None)
            if run is None or run.ended:
                return
            run.ended = True
        span = run.span
        status = ""
        try:
            workflow = read_workflow() or {}
            status = str(workflow.get("status") or "")
            if status == "TERMINATED" and continued(workflow.get("reasonForIncompletion")):
                status = "CONTINUED"  # a listener's next run took over: its normal end
            self._model_turns(workflow.get("tasks") or (), span)
            if read_run is not None:
                self._sub_runs(workflow.get("tasks") or (), span, read_run, _PARENT_DEPTH)
        except Exception as err:  # noqa: BLE001 - whatever reading the run raises, the span still ends
            span.set_attribute("conductor_agents.turns_unread", error_type(err))
        attributes = {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": run.agent_name}
        if run.provider:
            attributes["gen_ai.provider.name"] = run.provider
        if status:
            span.set_attribute("conductor_agents.run.status", status)
        if status in _FAILED_RUN:
            attributes["error.type"] = status.lower()
            span.set_attribute("error.type", status.lower())
            span.set_status(Status(StatusCode.ERROR, f"run {status}"))
        self._duration.record(time.monotonic() - run.started, attributes)
        span.end()

    def runs_closed(self, owner: Any) -> None:
        with self._lock:
            closing = [(k, r) for k, r in self._runs.items() if r.owner is owner]
            for key, run in closing:
                del self._runs[key]
                run.ended = True
        for _, run in closing:
            run.span.set_attribute("conductor_agents.run.open", True)  # it goes on on the server
            run.span.end()

    def close(self) -> None:
        with self._lock:
            runs, self._runs = list(self._runs.values()), {}
            for run in runs:
                run.ended = True
        for run in runs:
            run.span.set_attribute("conductor_agents.run.open", True)
            run.span.end()

    def _model_turns(self, tasks: Any, parent: Any) -> None:
        """A ``chat`` span (with the server's times) and the metrics of each model turn of the run."""
        context = trace.set_span_in_context(parent)
        for task in tasks:
            if task.get("taskType") != _MODEL_TASK_TYPE or not task.get("endTime"):
                continue
            given, output = task.get("inputData") or {}, task.get("outputData") or {}
            model = str(given.get("model") or "")
            common = {"gen_ai.operation.name": "chat", "gen_ai.request.model": model}
            if given.get("llmProvider"):
                common["gen_ai.provider.name"] = str(given["llmProvider"])
            status = str(task.get("status") or "")
            attributes: dict[str, AttributeValue] = dict(common)
            tokens: dict[str, int] = {}
            for key, field in (("gen_ai.usage.input_tokens", "promptTokens"),
                               ("gen_ai.usage.output_tokens", "completionTokens")):
                if isinstance(output.get(field), int):
                    attributes[key] = tokens[key] = output[field]
            if output.get("finishReason"):
                attributes["gen_ai.response.finish_reasons"] = [str(output["finishReason"]).lower()]
            if output.get("responseId"):
                attributes["gen_ai.response.id"] = str(output["responseId"])
            if task.get("referenceTaskName"):
                attributes["conductor_agents.task.reference_name"] = str(task["referenceTaskName"])
            start_ms = int(task.get("startTime") or task.get("scheduledTime") or task["endTime"])
            span = self._tracer.start_span(f"chat {model}".strip(), context=context, kind=SpanKind.CLIENT,
                                           attributes=attributes, start_time=start_ms * 1_000_000)
            if status in _FAILED_TASK:
                common["error.type"] = status.lower()
                span.set_attribute("error.type", status.lower())
                span.set_status(Status(StatusCode.ERROR, str(task.get("reasonForIncompletion") or "")[:200]))
            span.end(end_time=int(task["endTime"]) * 1_000_000)
            self._duration.record(max(0.0, (int(task["endTime"]) - start_ms) / 1000.0), common)
            for kind, key in (("input", "gen_ai.usage.input_tokens"), ("output", "gen_ai.usage.output_tokens")):
                if key in tokens:
                    self._tokens.record(tokens[key], {**common, "gen_ai.token.type": kind})

    def _sub_runs(self, tasks: Any, parent: Any, read_run: Callable[[str], Mapping[str, Any]], depth: int) -> None:
        """An ``invoke_agent`` span (the server's times) for each ended sub-run of a run (a sub-agent, an agent
        tool), its model turns as its ``chat`` spans, and its own sub-runs likewise, ``depth`` levels down."""
        if depth <= 0:
            return
        context = trace.set_span_in_context(parent)
        for task in tasks:
            child = task.get("subWorkflowId")
            if task.get("taskType") != _SUB_RUN_TASK or not child or not task.get("endTime"):
                continue
            try:
                sub = read_run(str(child)) or {}
            except Exception as err:  # noqa: BLE001 - an unread sub-run costs its spans only
                parent.set_attribute("conductor_agents.sub_runs_unread", error_type(err))
                continue
            name = str(sub.get("workflowName") or task.get("taskDefName") or "")
            status = str(sub.get("status") or "")
            start_ms = int(task.get("startTime") or task.get("scheduledTime") or task["endTime"])
            attributes: dict[str, AttributeValue] = {
                "gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": name,
                "conductor_agents.execution_id": str(child), "conductor_agents.run.status": status}
            span = self._tracer.start_span(f"invoke_agent {name}".strip(), context=context, kind=SpanKind.INTERNAL,
                                           attributes=attributes, start_time=start_ms * 1_000_000)
            if status in _FAILED_RUN:
                span.set_attribute("error.type", status.lower())
                span.set_status(Status(StatusCode.ERROR, f"run {status}"))
            self._model_turns(sub.get("tasks") or (), span)
            self._sub_runs(sub.get("tasks") or (), span, read_run, depth - 1)
            span.end(end_time=int(task["endTime"]) * 1_000_000)

    # -- tools ------------------------------------------------------------------------

    def tool_call(self, execution_id: str, tool_name: str, *, call_id: str, attempt: int,
                  read_workflow: Callable[[str], Mapping[str, Any]]) -> _ToolSpan:
        attributes: dict[str, AttributeValue] = {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": tool_name,
                      "gen_ai.tool.type": "function", "gen_ai.tool.call.id": call_id,
                      "conductor_agents.tool.attempt": attempt, "conductor_agents.execution_id": execution_id}
        parent = self._parent_of(execution_id, read_workflow)
        span = self._tracer.start_span(f"execute_tool {tool_name}", context=parent, kind=SpanKind.INTERNAL,
                                       attributes=attributes)
        return _ToolSpan(span)

    def _parent_of(self, execution_id: str, read_workflow: Callable[[str], Mapping[str, Any]]) -> Any:
        """The context a tool of run ``execution_id`` nests in: its run's open span here, else the carrier
        its run (or the nearest traced run it is a sub-run of) was started with; an empty one if none."""
        run_id: str | None = execution_id
        for _ in range(_PARENT_DEPTH):
            if run_id is None:
                break
            with self._lock:
                run = self._runs.get(run_id)
                known = self._carriers.get(run_id)
            if run is not None:
                return trace.set_span_in_context(run.span)
            if known is None:
                workflow = read_workflow(run_id)
                parent = workflow.get("parentWorkflowId")
                known = (carrier_of(workflow), str(parent) if parent else None)
                with self._lock:
                    self._carriers[run_id] = known
                    while len(self._carriers) > _CARRIER_CACHE:
                        self._carriers.popitem(last=False)
            carrier, run_id = known
            if carrier is not None:
                return _PROPAGATOR.extract({"traceparent": carrier})
        return otel_context.Context()  # a root: never the pool thread's leftover context
