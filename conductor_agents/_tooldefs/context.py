"""What a running tool knows about its call: :class:`ToolContext` and :func:`current_tool_context`.

The exceptions a tool raises to steer its delivery (``ToolRetry``, ``ToolCancelled``) live in
:mod:`conductor_agents.errors`.

The executor builds one context per delivery of a tool task and hands it to a parameter annotated
``ToolContext``; :func:`current_tool_context` finds it from any function the tool calls (a context
variable, set on the worker thread around the call and visible inside an ``async def`` tool's loop).
"""

from __future__ import annotations

import contextvars
import threading
import types
from collections.abc import Mapping
from typing import Any

import attrs

from .._common.secrets import SecretValues
from ..errors import ToolCancelled
from .run_state import StateUpdates, state_of_task

__all__ = [
    "CancelReason", "ToolContext", "call_key", "cancel", "current_tool_context", "delivery_attempt",
]


class CancelReason:
    """Why a context was cancelled (the values of :attr:`ToolContext.cancel_reason`)."""

    RUN_ENDED = "run_ended"  #: the run was cancelled, or ended otherwise
    TASK_LOST = "task_lost"  #: the server no longer holds the task for this worker
    RUNTIME_CLOSING = "runtime_closing"  #: the AgentRuntime serving the tool is closing


class _Signals:
    """The mutable half of a context: its two events and why it was cancelled. Thread-safe."""

    __slots__ = ("_lock", "cancelled", "reason", "stop_requested")

    def __init__(self) -> None:
        self.cancelled = threading.Event()
        self.stop_requested = threading.Event()
        self.reason: str | None = None
        self._lock = threading.Lock()

    def cancel(self, reason: str) -> bool:
        """Set ``cancelled`` (the first reason sticks); True when this call set it."""
        with self._lock:
            if self.cancelled.is_set():
                return False
            self.reason = reason
            self.cancelled.set()
            return True


def call_key(workflow_id: str, reference_name: str, iteration: int = 0) -> str:
    """The key of one tool call: the run plus the call's reference name, which the server keeps
    on every delivery (and suffixes with ``__N`` for the agent loop's turn N)."""
    key = f"{workflow_id}/{reference_name}"
    if iteration and not reference_name.endswith(f"__{iteration}"):
        key += f"#{iteration}"
    return key


def _read_only(value: Mapping[str, Any]) -> Mapping[str, Any]:
    return types.MappingProxyType(dict(value))


def _secret_values(value: SecretValues | Mapping[str, Any]) -> SecretValues:
    return value if isinstance(value, SecretValues) else SecretValues(value)


@attrs.frozen
class ToolContext:
    """One delivery of one tool call, as the tool sees it.

    Declare a parameter annotated ``ToolContext`` to get it (the model never sees that parameter);
    helpers called by the tool get it from :func:`current_tool_context`.

    Attributes:
        execution_id: the run (workflow) the call belongs to.
        task_id: the server's id of this task.
        attempt: 1 on the first delivery of the call, 2 on the second (after a ``ToolRetry``, or
            when a worker died before reporting the result and the run was resumed), ...
        run_id: the run's task domain (its run id) for a stateful run, else None.
        reference_name: the call's reference name in the run (e.g. ``call_ab12_0__3``).
        idempotency_key: the same on every delivery of this call, different for every other call
            (of this run or any other): key side effects with it to make them happen once.
        tool_name: the tool's name.
        state: the run's context as this task received it (read-only; see :meth:`update_state`).

    Immutable identity plus two events that the SDK sets; thread-safe. Build one by hand
    (``ToolContext(execution_id="e", task_id="t", state={...}, secrets={...})``) to unit-test a
    tool. The secrets are never part of its ``repr``.
    """

    execution_id: str
    task_id: str
    attempt: int = 1
    run_id: str | None = None
    reference_name: str = ""
    idempotency_key: str = attrs.field()
    tool_name: str = ""
    state: Mapping[str, Any] = attrs.field(factory=dict, converter=_read_only, eq=False, repr=False)
    _secrets: SecretValues = attrs.field(factory=SecretValues, eq=False, repr=False, alias="secrets",
                                         converter=_secret_values)
    _signals: _Signals = attrs.field(factory=_Signals, eq=False, repr=False, alias="_signals")
    _updates: StateUpdates = attrs.field(factory=StateUpdates, eq=False, repr=False, alias="_updates")

    @idempotency_key.default
    def _default_key(self) -> str:
        return call_key(self.execution_id, self.reference_name or self.task_id)

    @property
    def cancelled(self) -> threading.Event:
        """Set when the call should stop: the run was cancelled or ended, the server no longer
        holds the task for this worker, or the runtime is closing. Poll it or wait on it."""
        return self._signals.cancelled

    @property
    def stop_requested(self) -> threading.Event:
        """Set when a graceful stop of the run was asked (``handle.stop()``, ``conductor-agents
        stop``): the run ends after this turn. The tool decides whether to cut its work short."""
        return self._signals.stop_requested

    @property
    def cancel_reason(self) -> str | None:
        """A :class:`CancelReason` value once :attr:`cancelled` is set, else None."""
        return self._signals.reason

    def check_cancelled(self) -> None:
        """Raise :class:`ToolCancelled` if the call was cancelled; do nothing otherwise.

        Raises:
            ToolCancelled: :attr:`cancelled` is set.
        """
        if self._signals.cancelled.is_set():
            raise ToolCancelled(
                f"tool call {self.reference_name or self.task_id} was cancelled ({self._signals.reason})",
                reason=self._signals.reason,
            )

    def secret(self, name: str) -> str:
        """The value of secret ``name``, which the server delivered with this task.

        The tool (or its agent) must list the name in ``credentials``. Keep the value out of the
        tool's output and exceptions: the SDK scrubs it from the failure texts it posts and logs,
        but it cannot know where else it goes.

        Raises:
            MissingSecretError: (a LookupError) not declared, or the server has no value for it.
        """
        return self._secrets.get(name, tool_name=self.tool_name)

    def update_state(self, values: Mapping[str, Any] | None = None, **more: Any) -> None:
        """Change the run's context when this call completes: each key replaces the old value (a
        list onto a list appends the new items). Later tasks and turns see the new context.

        Raises:
            PayloadError: a value is not JSON.
            RunContextError: a value is larger than the server shows to the model (4,096 bytes).
        """
        self._updates.update({**(values or {}), **more})

    @property
    def state_updates(self) -> dict[str, Any]:
        """The updates :meth:`update_state` recorded so far (a copy)."""
        return self._updates.snapshot()

    @classmethod
    def of_task(cls, task: Mapping[str, Any], *, tool_name: str = "") -> ToolContext:
        """The context of a polled task (the server's Task JSON)."""
        workflow_id = str(task.get("workflowInstanceId") or "")
        reference = str(task.get("referenceTaskName") or "")
        iteration = _int(task.get("iteration"))
        return cls(
            execution_id=workflow_id,
            task_id=str(task.get("taskId") or ""),
            attempt=delivery_attempt(task),
            run_id=str(task["domain"]) if task.get("domain") else None,
            reference_name=reference,
            idempotency_key=call_key(workflow_id, reference or str(task.get("taskId")), iteration),
            tool_name=tool_name or str(task.get("taskType") or ""),
            state=state_of_task(task.get("inputData") or {}),
            secrets=SecretValues.of_task(task),
        )


def state_updates_of(context: ToolContext) -> StateUpdates:
    """The holder of the context's state updates (for the executor)."""
    return context._updates


def secrets_of(context: ToolContext) -> SecretValues:
    """The secrets delivered with the context's task (for the executor's redaction)."""
    return context._secrets


def cancel(context: ToolContext, reason: str) -> bool:
    """Set ``context.cancelled`` for ``reason`` (a :class:`CancelReason`); True if this call set it."""
    return context._signals.cancel(reason)


def delivery_attempt(task: Mapping[str, Any]) -> int:
    """Which delivery of its call a polled task is: 1 + the server's retries + earlier polls.

    A retried task (a new task id) carries ``retryCount``; a task handed back for another
    delivery (same id) counts its polls in ``pollCount``.
    """
    return max(1, _int(task.get("retryCount")) + max(1, _int(task.get("pollCount"))))


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


_current: contextvars.ContextVar[ToolContext | None] = contextvars.ContextVar(
    "conductor_agents_tool_context", default=None
)


def current_tool_context() -> ToolContext | None:
    """The :class:`ToolContext` of the tool call running in this thread (or its event loop);
    None outside a tool. Threads the tool starts itself do not inherit it (pass it on)."""
    return _current.get()


def set_current(context: ToolContext | None) -> contextvars.Token[ToolContext | None]:
    """Make ``context`` current (for the executor); undo with :func:`reset_current`."""
    return _current.set(context)


def reset_current(token: contextvars.Token[ToolContext | None]) -> None:
    _current.reset(token)
