"""The calls the runtime makes at a run's start, end and take-up and around each tool body: no-ops until
:class:`~conductor_agents._tracing.ConductorAgentsInstrumentor` instruments the process.

Every function returns at once when tracing is off (one global read), and none raises: a failure of
the telemetry is logged, never passed to the run or the tool. Thread-safe.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from .carrier import carrier_of

__all__ = ["NO_RUN", "NO_TOOL", "active", "begin_run", "carrier_of", "install", "run_ended", "runs_closed", "tool_call"]

log = logging.getLogger("conductor_agents.tracing")

#: The instrumentation in effect (a ``telemetry.Telemetry``), or None: tracing is off.
_active: Any | None = None


def install(telemetry: Any | None) -> None:
    """Put ``telemetry`` in effect (None: off); the one it replaces ends the spans it holds open."""
    global _active
    old, _active = _active, telemetry
    if old is not None:
        _quietly(old.close)


def active() -> Any | None:
    """The instrumentation in effect, or None."""
    return _active


class _NoRun:
    """A run nobody traces: no carrier, nothing to record."""

    traceparent: str | None = None

    def started(self, execution_id: str, *, conversation_id: str | None = None) -> None:
        """Nothing to record."""

    def failed(self, err: BaseException) -> None:
        """Nothing to record."""


NO_RUN = _NoRun()


def begin_run(agent_name: str, *, parent: str | None = None, taken_up: str | None = None,
              owner: Any = None, model: str | None = None) -> Any:
    """Open the ``invoke_agent`` span of a run about to start (or taken up): a child of ``parent`` (a W3C
    ``traceparent``) or else of the caller's current span. Returns an object whose ``traceparent`` the
    run's start carries (None when tracing is off), whose ``started(execution_id)`` names the run and
    whose ``failed(err)`` ends the span of a start that failed. ``owner`` (the worker id of the runtime that
    serves the run) ends it in :func:`runs_closed` if the run is still going then. ``model`` (the agent's
    ``provider/model``) names the provider and the model on the span, as the GenAI conventions ask."""
    telemetry = _active
    if telemetry is None:
        return NO_RUN
    try:
        return telemetry.begin_run(agent_name, parent=parent, taken_up=taken_up, owner=owner, model=model)
    except Exception:
        log.warning("tracing: could not open the span of a run of %s", agent_name, exc_info=True)
        return NO_RUN




def run_ended(execution_id: str, read_workflow: Callable[[], Mapping[str, Any]], *,
              continued: Callable[[str | None], bool] = lambda reason: False,
              read_run: Callable[[str], Mapping[str, Any]] | None = None) -> None:
    """Run ``execution_id`` ended: if its span is open here, record its model turns (``read_workflow()``
    gives the run with its tasks; called only then) and end it. ``continued(reasonForIncompletion)`` says
    whether its end was a continuation (a listener's next run took over: not an error). ``read_run(id)``
    reads a sub-run with its tasks: each sub-agent's or agent tool's run then gets its span and its model
    turns theirs."""
    telemetry = _active
    if telemetry is not None:
        _quietly(telemetry.run_ended, execution_id, read_workflow, continued, read_run)


def runs_closed(owner: Any) -> None:
    """The runtime of worker id ``owner`` closed: end the spans of its runs still going (they go on on the
    server)."""
    telemetry = _active
    if telemetry is not None:
        _quietly(telemetry.runs_closed, owner)


class _NoTool:
    def failed(self, err: BaseException, *, message: str | None = None, stacktrace: str | None = None) -> None:
        """Nothing to record."""

    def finished(self, status: str | None) -> None:
        """Nothing to record."""


NO_TOOL = _NoTool()


@contextlib.contextmanager
def tool_call(execution_id: str, tool_name: str, *, call_id: str, attempt: int,
              read_workflow: Callable[[str], Mapping[str, Any]]) -> Iterator[Any]:
    """The ``execute_tool`` span of one tool body, current while the body runs (the tool's own spans nest
    under it); its parent is the run's span (``read_workflow(id)`` finds the carrier of a run not started
    here). Yields an object to tell it ``failed(err)`` and ``finished(task status)``."""
    telemetry = _active
    span = None
    if telemetry is not None:
        try:
            span = telemetry.tool_call(execution_id, tool_name, call_id=call_id, attempt=attempt,
                                       read_workflow=read_workflow)
        except Exception:
            log.warning("tracing: could not open the span of tool %s", tool_name, exc_info=True)
    if span is None:
        yield NO_TOOL
        return
    with span as current:
        yield current


def _quietly(call: Callable[..., Any], *args: Any) -> None:
    try:
        call(*args)
    except Exception:
        log.warning("tracing: %s failed", getattr(call, "__name__", call), exc_info=True)
