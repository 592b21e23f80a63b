"""The exception hierarchy of conductor-agents.

Every error raised on purpose by this package derives from :class:`ConductorAgentsError`
and, where a caller would naturally catch a builtin, from that builtin too
(``WaitTimeoutError`` is a ``TimeoutError``, definition errors are ``ValueError``
or ``TypeError``, transport failures are ``ConnectionError``).

Errors carry typed fields (``execution_id``, ``status``, ``task_reference_name``)
so code can react without parsing messages. No message ever contains a secret.
"""

from __future__ import annotations

import math
from typing import Any


class ConductorAgentsError(Exception):
    """Base class of every error raised by conductor-agents.

    Every error pickles with its fields (across ``multiprocessing`` or ``concurrent.futures``): it is
    rebuilt from its message and fields, not by calling ``__init__`` with the message alone (which would
    leave out the keyword-only fields such as ``execution_id``).
    """

    def __reduce__(self) -> tuple[Any, ...]:
        return _rebuild, (type(self), self.args, dict(self.__dict__))


def _rebuild(cls: type[ConductorAgentsError], args: tuple[Any, ...], fields: dict[str, Any]) -> ConductorAgentsError:
    """An error of ``cls`` with ``args`` and ``fields``, made without its ``__init__`` (see ``__reduce__``)."""
    error = cls.__new__(cls)
    error.args = args
    error.__dict__.update(fields)
    return error


# --- definitions and configuration -------------------------------------------------


class ConfigurationError(ConductorAgentsError, ValueError):
    """A setting (argument or environment variable) has a bad value.

    ``variable`` names the setting or environment variable at fault.
    """

    def __init__(self, message: str, *, variable: str | None = None) -> None:
        super().__init__(message)
        self.variable = variable


class ModelUnavailableError(ConfigurationError):
    """The server cannot call the run's model: no route to the provider, a key it refused, or no such model.

    Raised by ``wait()`` (and ``run()``) when the run's first model turn fails so, at the first failed
    attempt instead of after the server's retries (about a minute); the run is cancelled, since it could
    not have gone on. Keys are the *server's* business: ``variable`` names the environment variable the
    server reads for the provider (``OPENAI_API_KEY``...). ``cause`` is ``"no_route"``,
    ``"rejected_key"`` or ``"unknown_model"`` (the provider has no model of that name); ``detail`` what the server
    said, shortened (never a key).
    """

    def __init__(self, message: str, *, execution_id: str, model: str, cause: str, detail: str,
                 variable: str | None = None) -> None:
        super().__init__(message, variable=variable)
        self.execution_id = execution_id
        self.model = model
        self.cause = cause
        self.detail = detail


class AgentDefinitionError(ConductorAgentsError, ValueError):
    """An :class:`~conductor_agents.Agent` field has a bad value.

    ``field`` names the field, ``value`` holds what arrived.
    """

    def __init__(self, message: str, *, field: str | None = None, value: object = None) -> None:
        super().__init__(message)
        self.field = field
        self.value = value


class AgentTypeError(ConductorAgentsError, TypeError):
    """An :class:`~conductor_agents.Agent` field has a value of the wrong type."""

    def __init__(self, message: str, *, field: str | None = None, value: object = None) -> None:
        super().__init__(message)
        self.field = field
        self.value = value


class ToolDefinitionError(ConductorAgentsError, TypeError):
    """A function cannot become a tool (unsupported type hint, bad name, ...)."""


class ToolDescriptionWarning(ConductorAgentsError, UserWarning):  # noqa: N818 - a warning, named as Python's are
    """A warning, not raised: a tool has no description (no docstring, no ``description=``), so the model
    sees only its name to decide when to call it. Silence it with ``warnings.filterwarnings("ignore",
    category=ToolDescriptionWarning)``, or turn it into an error with ``"error"``."""


# --- raised by tools ---------------------------------------------------------------


class ToolRetry(ConductorAgentsError):  # noqa: N818 - a public name; a request to retry, not an error
    """Raise it in a tool to have the same call delivered again, ``after_seconds`` later (whole
    seconds, rounded up, at least 1).

    The model does not see this failure: the server keeps the call open and delivers it again
    (``ctx.attempt`` goes up by one, ``ctx.idempotency_key`` stays). Deliveries are limited by the
    task's retry budget on the server (agent tool tasks: ``retryCount`` 2, so 3 deliveries in all);
    a ``ToolRetry`` on the last one ends the call as a failure the model sees, with ``reason``.

    Raises:
        ValueError: ``after_seconds`` is negative or not a number.
    """

    def __init__(self, reason: str = "the tool asked to be retried", *, after_seconds: float = 0.0) -> None:
        if isinstance(after_seconds, bool) or not isinstance(after_seconds, (int, float)) \
                or not math.isfinite(after_seconds) or after_seconds < 0:
            raise ValueError(f"after_seconds must be a number >= 0, got {after_seconds!r}")
        super().__init__(reason)
        self.reason = str(reason)
        self.after_seconds = float(after_seconds)


class ToolCancelled(ConductorAgentsError):  # noqa: N818 - a public name; a signal, not an error
    """Raised by :meth:`ToolContext.check_cancelled` once the call is cancelled.

    Let it propagate: it is not reported as a tool failure (see ``docs/tools.md``). ``reason`` is
    a ``CancelReason`` value (``"run_ended"``, ``"task_lost"``, ``"runtime_closing"``), or None
    when a tool raised it itself.
    """

    def __init__(self, message: str = "the tool call was cancelled", *, reason: str | None = None) -> None:
        super().__init__(message)
        self.reason = reason


class PayloadError(ConductorAgentsError, TypeError):
    """A message payload cannot be sent (it is not JSON-serialisable)."""


# --- talking to the server ---------------------------------------------------------


class ServerError(ConductorAgentsError):
    """The Conductor server answered with an error the SDK does not map further.

    ``status`` is the HTTP status (``None`` when there was no answer).
    """

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class ServerUnavailableError(ServerError, ConnectionError):
    """The server could not be reached (connection refused, timed out, reset).

    ``request_sent`` is False when the request never left this process (no connection could be made): the server
    cannot have acted on it. True otherwise (a timeout or a reset may hide a request the server carried out).
    """

    request_sent: bool = True


class AuthenticationError(ServerError, PermissionError):
    """The server rejected the credentials (a bad key/secret or an expired token)."""


class ExecutionNotFoundError(ServerError, LookupError):
    """No execution with this id exists on the server."""

    def __init__(self, message: str, *, execution_id: str, status: int | None = 404) -> None:
        super().__init__(message, status=status)
        self.execution_id = execution_id


class ScheduleNotFoundError(ServerError, LookupError):
    """No schedule with this name exists on the server (``runtime.schedules``)."""

    def __init__(self, message: str, *, name: str, status: int | None = 404) -> None:
        super().__init__(message, status=status)
        self.name = name


class ExecutionNotRunningError(ServerError):
    """The execution exists but is no longer RUNNING (messages cannot be delivered)."""

    def __init__(self, message: str, *, execution_id: str, status: int | None = 409) -> None:
        super().__init__(message, status=status)
        self.execution_id = execution_id


class RunPausedError(ServerError):
    """The run is paused (``handle.pause()``, or the server's ``PUT /workflow/{id}/pause``): it takes no
    message until it is unpaused. Nothing was queued: send the message again after ``handle.unpause()``."""

    def __init__(self, message: str, *, execution_id: str, status: int | None = 409) -> None:
        super().__init__(message, status=status)
        self.execution_id = execution_id


class MessageQueueFullError(ServerError):
    """The execution's message queue is full (HTTP 429); retry after the agent drains it."""

    def __init__(self, message: str, *, execution_id: str, status: int | None = 429) -> None:
        super().__init__(message, status=status)
        self.execution_id = execution_id


class MessageQueueDisabledError(ServerError):
    """The server's workflow message queue is switched off.

    Start the server with ``conductor.workflow-message-queue.enabled=true``.
    """

    def __init__(self, message: str, *, execution_id: str, status: int | None = 404) -> None:
        super().__init__(message, status=status)
        self.execution_id = execution_id


# --- waiting on runs ---------------------------------------------------------------


class WaitTimeoutError(ConductorAgentsError, TimeoutError):
    """``wait()`` reached its deadline. The run goes on on the server; it is not cancelled."""

    def __init__(self, message: str, *, execution_id: str, timeout: float) -> None:
        super().__init__(message)
        self.execution_id = execution_id
        self.timeout = timeout


class MessageLostError(ConductorAgentsError, LookupError):
    """A message the server accepted can no longer reach its run.

    Raised by ``wait_delivered()``. ``reason`` says how it is known:
    :attr:`RUN_ENDED`: the run ended (``run_status``) and never pulled the message;
    :attr:`NOT_IN_QUEUE`: the run waited for messages with the message neither pulled nor in
    its queue (the queue is in memory on a SQLite server and a restart empties it);
    :attr:`NOT_ACTED_ON`: a wait took the message in behind the stop message: a listener told to stop
    does not act on what follows the stop.
    """

    RUN_ENDED = "run_ended"
    NOT_IN_QUEUE = "not_in_queue"
    NOT_ACTED_ON = "not_acted_on"

    def __init__(self, message: str, *, execution_id: str, message_id: str, reason: str,
                 run_status: str | None = None) -> None:
        super().__init__(message)
        self.execution_id = execution_id
        self.message_id = message_id
        self.reason = reason
        self.run_status = run_status


class WorkerStallError(ConductorAgentsError):
    """A task routed to this run's domain has not been polled by any worker.

    The task is still SCHEDULED on the server. The process that served the run's
    domain has most likely died; resume the run from a live process with
    ``runtime.resume(execution_id, agent)``.
    """

    def __init__(
        self,
        message: str,
        *,
        execution_id: str,
        task_reference_name: str,
        domain: str | None,
        waited_seconds: float,
    ) -> None:
        super().__init__(message)
        self.execution_id = execution_id
        self.task_reference_name = task_reference_name
        self.domain = domain
        self.waited_seconds = waited_seconds


class WorkerStartupError(ConductorAgentsError):
    """The run exists on the server but this process could not take it up.

    Its workers did not start polling their domain in time, or a request made after the
    server accepted the run failed (the cause is chained as ``__cause__``). Nothing of this
    process serves the run. The run itself exists (``execution_id``): cancel it, or resume
    it from a process that can reach the server.
    """

    def __init__(self, message: str, *, execution_id: str | None = None) -> None:
        super().__init__(message)
        self.execution_id = execution_id


class ResumeError(ConductorAgentsError, ValueError):
    """A run cannot be resumed with this agent (no domain, disagreeing domains...)."""

    def __init__(self, message: str, *, execution_id: str) -> None:
        super().__init__(message)
        self.execution_id = execution_id


class RuntimeClosedError(ConductorAgentsError, RuntimeError):
    """The :class:`~conductor_agents.AgentRuntime` was closed."""


# --- people in the loop ------------------------------------------------------------


class NothingPendingError(ConductorAgentsError, LookupError):
    """The run does not wait for this answer: nothing waits for a person, or something else does.

    Raised by ``approve()``, ``reject()`` and ``respond()``. ``execution_id`` is the run,
    ``expected`` what the call answers (``"approval"`` or ``"question"``), ``waiting_for`` what
    the run waits for instead (a :class:`~conductor_agents.PendingRequest` kind), or None when it
    waits for no person. ``last_answer`` is the latest answer of the expected kind the run took
    (a :class:`~conductor_agents.HumanAnswer`, e.g. someone else's a moment ago), or None. To be
    told when someone else answered first, answer a request from ``pending()`` with
    ``request=``: then it is an :class:`AnswerConflictError`.
    """

    def __init__(self, message: str, *, execution_id: str, expected: str | None = None,
                 waiting_for: str | None = None, last_answer: object = None) -> None:
        super().__init__(message)
        self.execution_id = execution_id
        self.expected = expected
        self.waiting_for = waiting_for
        self.last_answer = last_answer


class AnswerConflictError(ConductorAgentsError, RuntimeError):
    """Another answer to the same request won: the run goes on with that one, not with this one.

    Two people (or processes) answered the same pending request at about the same time; the
    server took exactly one. ``winner`` is the :class:`~conductor_agents.HumanAnswer` the run
    went on with (``winner.answer_id`` differs from ``answer_id``, the losing one).
    """

    def __init__(self, message: str, *, execution_id: str, task_reference_name: str, answer_id: str,
                 winner: object = None) -> None:
        super().__init__(message)
        self.execution_id = execution_id
        self.task_reference_name = task_reference_name
        self.answer_id = answer_id
        self.winner = winner


class InvalidAnswerError(ConductorAgentsError, ValueError):
    """The answer is none of those the request takes; nothing was sent.

    Raised by ``respond()`` for a request with ``options`` (a ``manual`` team's pick of its next
    sub-agent). ``execution_id`` is the run, ``answer`` the refused answer, ``options`` the answers
    the request takes.
    """

    def __init__(self, message: str, *, execution_id: str, answer: object = None,
                 options: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.execution_id = execution_id
        self.answer = answer
        self.options = tuple(options)


# --- typed answers, run context and secrets --------------------------------------------


class OutputValidationError(ConductorAgentsError, ValueError):
    """The run's answer does not fit the agent's ``output_type``.

    Either the run COMPLETED with such an answer (the server does not check the answer against the
    schema; ``wait()`` does), or it FAILED because no answer fit: the check in the run gave up after
    ``output_retries`` more answers (the run's error starts with ``Answer does not fit output_type``),
    or, with ``output_retries=0``, the server's JSON mode failed the model call on an answer that was
    not a JSON object. ``raw_output`` is the model's (last) answer as text (None when the server did
    not say), ``problems`` says what does not fit (one text per problem), ``output_type`` is the
    expected class and ``result`` the run's :class:`~conductor_agents.AgentResult` (``result.status``
    COMPLETED or FAILED; ``result.error`` the server's reason).
    """

    def __init__(self, message: str, *, execution_id: str, output_type: object, raw_output: str | None,
                 problems: tuple[str, ...] = (), result: object = None) -> None:
        super().__init__(message)
        self.execution_id = execution_id
        self.output_type = output_type
        self.raw_output = raw_output
        self.problems = tuple(problems)
        self.result = result


class RunContextError(ConductorAgentsError, ValueError):
    """A run context (``start(context=...)``, ``ctx.update_state(...)``) breaks the server's limits.

    ``key`` names the entry at fault (None for the whole context), ``size`` is its size in bytes
    and ``limit`` the limit it breaks (4,096 bytes per value, 32,768 in all).
    """

    def __init__(self, message: str, *, key: str | None = None, size: int | None = None,
                 limit: int | None = None) -> None:
        super().__init__(message)
        self.key = key
        self.size = size
        self.limit = limit


class MissingSecretError(ConductorAgentsError, LookupError):
    """A tool asked for a secret the server did not deliver with its task.

    ``name`` is the secret, ``tool_name`` the tool; ``declared`` says whether the tool (or its
    agent) lists it in ``credentials``: when it does, the server has no value under that name
    (on a Conductor OSS server: set ``CONDUCTOR_SECRET_<name>`` in the server's environment).
    The message never contains a secret's value.
    """

    def __init__(self, message: str, *, name: str, tool_name: str = "", declared: bool = False) -> None:
        super().__init__(message)
        self.name = name
        self.tool_name = tool_name
        self.declared = declared


# --- the local server --------------------------------------------------------------


class LocalServerError(ConductorAgentsError, RuntimeError):
    """The local Conductor server could not be obtained, started or stopped.

    ``log_tail`` holds the last lines of the server log when there is one.
    """

    def __init__(self, message: str, *, log_tail: str = "") -> None:
        super().__init__(message)
        self.log_tail = log_tail


class JavaNotFoundError(LocalServerError):
    """No Java 21+ runtime was found."""


class JarDownloadError(LocalServerError):
    """The server jar could not be downloaded or failed its checksum."""
