"""The Conductor endpoints this SDK uses, one method each, with their error mapping.

Each method names the REST call it makes and turns endpoint-specific statuses into the
typed errors of :mod:`conductor_agents.errors` (a 404 on ``/agent/{id}/status`` means an
unknown execution; a 404 on ``/workflow/{id}/messages`` may also mean a disabled queue).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any
from urllib.parse import quote

import attrs

from ..errors import (
    ExecutionNotFoundError,
    ExecutionNotRunningError,
    MessageQueueDisabledError,
    MessageQueueFullError,
    RunPausedError,
    ScheduleNotFoundError,
    ServerError,
)
from .transport import ByteStream, HttpError, Transport

__all__ = ["ConductorApi", "TaskPage"]


@attrs.frozen
class TaskPage:
    """A page of a run's task list: the tasks, how many matched in all, the server's ``Date``."""

    total: int
    tasks: list[dict[str, Any]]
    date: str | None = None


#: The server's 404 from ``/signal/sync`` for a run that has no ``WAIT`` task waiting (3.32).
_NO_WAIT = "Found no blocked task"


def _seg(value: str) -> str:
    return quote(str(value), safe="")


@contextmanager
def _not_found_is_unknown_execution(execution_id: str) -> Iterator[None]:
    try:
        yield
    except HttpError as err:
        if err.status == 404:
            raise ExecutionNotFoundError(
                f"no execution {execution_id!r} on the server", execution_id=execution_id
            ) from err
        raise


class ConductorApi:
    """Typed calls over a :class:`Transport`. Thread-safe (stateless over the transport)."""

    def __init__(self, transport: Transport) -> None:
        self.transport = transport

    # -- agents ---------------------------------------------------------------------

    def start_agent(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """``POST /agent/start`` → ``{executionId, agentName, requiredWorkers}``."""
        result = self.transport.request("POST", "/agent/start", json_body=dict(body))
        if not isinstance(result, dict) or not result.get("executionId"):
            raise ServerError(f"POST /agent/start returned no executionId: {str(result)[:200]}")
        return result

    def deploy_agent(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """``POST /agent/deploy``: compile and register the agent's workflow, start nothing → ``{agentName,
        requiredWorkers}``."""
        result = self.transport.request("POST", "/agent/deploy", json_body=dict(body))
        return result if isinstance(result, dict) else {}

    # -- the scheduler (``/scheduler``) --------------------------------------------------

    def create_schedule(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """``POST /scheduler/schedules`` (creates, or replaces the schedule of that name)."""
        result = self.transport.request("POST", "/scheduler/schedules", json_body=dict(body))
        return result if isinstance(result, dict) else {}

    def get_schedule(self, name: str) -> dict[str, Any]:
        """``GET /scheduler/schedules/{name}``.

        Raises:
            ScheduleNotFoundError: no such schedule.
        """
        try:
            result = self.transport.request("GET", f"/scheduler/schedules/{_seg(name)}")
        except HttpError as err:
            if err.status == 404:
                raise ScheduleNotFoundError(f"no schedule named {name!r} on the server", name=name) from err
            raise
        if not isinstance(result, dict):
            raise ScheduleNotFoundError(f"no schedule named {name!r} on the server", name=name)
        return result

    def list_schedules(self) -> list[dict[str, Any]]:
        """``GET /scheduler/schedules``: every schedule."""
        result = self.transport.request("GET", "/scheduler/schedules")
        return [s for s in result if isinstance(s, dict)] if isinstance(result, list) else []

    def pause_schedule(self, name: str) -> None:
        """``PUT /scheduler/schedules/{name}/pause``."""
        self.transport.request("PUT", f"/scheduler/schedules/{_seg(name)}/pause")

    def resume_schedule(self, name: str) -> None:
        """``PUT /scheduler/schedules/{name}/resume``."""
        self.transport.request("PUT", f"/scheduler/schedules/{_seg(name)}/resume")

    def delete_schedule(self, name: str) -> None:
        """``DELETE /scheduler/schedules/{name}``."""
        self.transport.request("DELETE", f"/scheduler/schedules/{_seg(name)}")

    def next_schedule_times(self, cron: str, count: int) -> list[int]:
        """``GET /scheduler/nextFewSchedules``: the next ``count`` start times of ``cron`` (epoch ms)."""
        result = self.transport.request("GET", "/scheduler/nextFewSchedules",
                                        params={"cronExpression": cron, "limit": str(count)})
        return [int(t) for t in result if isinstance(t, (int, float))] if isinstance(result, list) else []

    def agent_status(self, execution_id: str, *, timeout: float | None = None) -> dict[str, Any]:
        """``GET /agent/{id}/status``."""
        with _not_found_is_unknown_execution(execution_id):
            result = self.transport.request("GET", f"/agent/{_seg(execution_id)}/status", timeout=timeout)
        if not isinstance(result, dict) or "status" not in result:
            raise ServerError(f"GET /agent/{execution_id}/status returned a malformed body")
        return result

    def agent_execution(self, execution_id: str) -> dict[str, Any]:
        """``GET /agent/execution/{id}`` (run detail with token usage)."""
        with _not_found_is_unknown_execution(execution_id):
            result = self.transport.request("GET", f"/agent/execution/{_seg(execution_id)}")
        return result if isinstance(result, dict) else {}

    def stop_agent(self, execution_id: str) -> None:
        """``POST /agent/{id}/stop`` (graceful)."""
        with _not_found_is_unknown_execution(execution_id):
            self.transport.request("POST", f"/agent/{_seg(execution_id)}/stop")

    def signal_agent(self, execution_id: str, message: str) -> None:
        """``POST /agent/{id}/signal``: set the run's standing signal (the server answers 200 for an ended run)."""
        with _not_found_is_unknown_execution(execution_id):
            self.transport.request("POST", f"/agent/{_seg(execution_id)}/signal", json_body={"message": message})

    def pause_workflow(self, execution_id: str) -> None:
        """``PUT /workflow/{id}/pause``: nothing new is scheduled until resumed (idempotent; 409 once ended)."""
        with _not_found_is_unknown_execution(execution_id):
            self.transport.request("PUT", f"/workflow/{_seg(execution_id)}/pause")

    def resume_workflow(self, execution_id: str) -> None:
        """``PUT /workflow/{id}/resume`` of a paused run (the server refuses one that is not paused)."""
        with _not_found_is_unknown_execution(execution_id):
            self.transport.request("PUT", f"/workflow/{_seg(execution_id)}/resume")

    def retry_workflow(self, execution_id: str) -> None:
        """``POST /workflow/{id}/retry`` of a failed run: its last failed task is scheduled again, the run RUNNING."""
        with _not_found_is_unknown_execution(execution_id):
            self.transport.request("POST", f"/workflow/{_seg(execution_id)}/retry",
                                   params={"resumeSubworkflowTasks": "false"})

    def cancel_agent(self, execution_id: str, reason: str) -> None:
        """``DELETE /agent/{id}/cancel?reason=`` (hard)."""
        with _not_found_is_unknown_execution(execution_id):
            self.transport.request(
                "DELETE", f"/agent/{_seg(execution_id)}/cancel", params={"reason": reason}
            )

    def agent_stream(self, execution_id: str, *, last_event_id: str | None = None,
                     timeout: tuple[float, float] = (5.0, 45.0)) -> ByteStream:
        """``GET /agent/stream/{id}`` (server-sent events), resuming after ``last_event_id``.

        Raises: as :meth:`Transport.open_stream` (a 404 stays an HttpError: it may mean an
        unknown execution or a server without the stream endpoint).
        """
        headers = {"Accept": "text/event-stream", "Cache-Control": "no-cache"}
        if last_event_id:
            headers["Last-Event-ID"] = last_event_id
        return self.transport.open_stream(f"/agent/stream/{_seg(execution_id)}", headers=headers, timeout=timeout)

    # -- workflows and messages -------------------------------------------------------

    def get_workflow(self, execution_id: str, *, include_tasks: bool = False,
                     timeout: float | None = None) -> dict[str, Any]:
        """``GET /workflow/{id}?includeTasks=`` (``timeout``: seconds, default the transport's)."""
        with _not_found_is_unknown_execution(execution_id):
            result = self.transport.request(
                "GET",
                f"/workflow/{_seg(execution_id)}",
                params={"includeTasks": "true" if include_tasks else "false"},
                timeout=timeout,
            )
        if not isinstance(result, dict):
            raise ServerError(f"GET /workflow/{execution_id} returned a malformed body")
        return result

    def workflow_status(self, execution_id: str, *, include_variables: bool = False,
                        include_output: bool = False) -> dict[str, Any]:
        """``GET /workflow/{id}/status`` → ``{workflowId, correlationId, status[, variables][, output]}``.

        The smallest read of a run (no tasks, no definition, no input); ``include_variables`` adds
        the run's variables (its tool-results digest and state), ``include_output`` its output.
        """
        params = {}
        if include_variables:
            params["includeVariables"] = "true"
        if include_output:
            params["includeOutput"] = "true"
        with _not_found_is_unknown_execution(execution_id):
            result = self.transport.request("GET", f"/workflow/{_seg(execution_id)}/status", params=params or None)
        if not isinstance(result, dict) or "status" not in result:
            raise ServerError(f"GET /workflow/{execution_id}/status returned a malformed body")
        return result

    def workflow_tasks(self, execution_id: str, *, start: int = 0, count: int = 15,
                       statuses: tuple[str, ...] = ()) -> TaskPage:
        """``GET /workflow/{id}/tasks?start=&count=&status=``: one page of a run's tasks, in order.

        The server still loads the whole run, but sends only the page: reads of a long run that
        need a few of its tasks cost the network (and this process) what those tasks weigh.
        """
        params: dict[str, Any] = {"start": int(start), "count": int(count)}
        if statuses:
            params["status"] = list(statuses)
        with _not_found_is_unknown_execution(execution_id):
            result, headers = self.transport.get_with_headers(f"/workflow/{_seg(execution_id)}/tasks", params=params)
        if not isinstance(result, dict) or not isinstance(result.get("results"), list):
            raise ServerError(f"GET /workflow/{execution_id}/tasks returned a malformed body")
        total = result.get("totalHits")
        return TaskPage(total=int(total) if isinstance(total, (int, float)) else len(result["results"]),
                        tasks=result["results"], date=headers.get("Date"))

    def liveness_sample(self, execution_id: str) -> tuple[dict[str, Any], str | None]:
        """The run's status and its SCHEDULED tasks (``{status, tasks}``) plus the server's ``Date``.

        Two small reads whatever the run's age (``/workflow/{id}/status`` and one page of
        ``/workflow/{id}/tasks?status=SCHEDULED``) instead of the whole task list.
        """
        status = self.workflow_status(execution_id)
        page = self.workflow_tasks(execution_id, statuses=("SCHEDULED",), count=100)
        return {"status": status.get("status"), "tasks": page.tasks}, page.date

    def running_workflow_ids(self, workflow_name: str, version: int | None = None) -> list[str]:
        """``GET /workflow/running/{name}`` → the ids of the runs of that workflow not yet ended.

        One indexed read on the server (SQL ``workflow_pending``, a Redis set) whatever the number
        of runs; the SQL and Redis stores list every version of the name.
        """
        params = {"version": str(version)} if version is not None else None
        result = self.transport.request("GET", f"/workflow/running/{_seg(workflow_name)}", params=params,
                                        timeout=(5.0, 10.0))
        if not isinstance(result, list):
            raise ServerError(f"GET /workflow/running/{workflow_name} returned a malformed body")
        return [str(item) for item in result]

    def remove_workflow(self, execution_id: str, *, archive: bool, timeout: float = 15.0) -> None:
        """``DELETE /workflow/{id}/remove?archiveWorkflow=``: delete a run from the server's store.

        ``archive=False`` deletes every row or key of the run, its index entry included (on a SQLite
        server with task indexing on it nests a second connection and can hold the server for 30 s:
        ``docs/operations.md``); ``archive=True`` keeps the index entries and needs an ended run (400
        otherwise). Afterwards the id answers 404. The run's message queue is not touched.

        Raises:
            ExecutionNotFoundError: the server does not know the run (already removed).
            ServerUnavailableError: no answer within ``timeout`` seconds.
            HttpError: any other refusal (a 400 for archiving a running run, a 500).
        """
        with _not_found_is_unknown_execution(execution_id):
            self.transport.request("DELETE", f"/workflow/{_seg(execution_id)}/remove",
                                   params={"archiveWorkflow": "true" if archive else "false"},
                                   timeout=(5.0, float(timeout)))

    def workflow_def(self, name: str) -> dict[str, Any]:
        """``GET /metadata/workflow/{name}``: the newest version of a workflow's definition."""
        result = self.transport.request("GET", f"/metadata/workflow/{_seg(name)}")
        if not isinstance(result, dict) or not result.get("name"):
            raise ServerError(f"GET /metadata/workflow/{name} returned no definition")
        return result

    def register_definitions(self, task_defs: list[dict[str, Any]], workflow_defs: list[dict[str, Any]]) -> None:
        """``POST /metadata/taskdefs`` then ``PUT /metadata/workflow``: create or update definitions."""
        if task_defs:
            self.transport.request("POST", "/metadata/taskdefs", json_body=list(task_defs))
        if workflow_defs:
            self.transport.request("PUT", "/metadata/workflow", json_body=list(workflow_defs))

    def start_workflow(self, body: Mapping[str, Any]) -> str:
        """``POST /workflow`` (a StartWorkflowRequest) → the new run's id (the server picks it)."""
        result = self.transport.request("POST", "/workflow", json_body=dict(body))
        execution_id = str(result).strip() if result is not None else ""
        if not execution_id:
            raise ServerError("POST /workflow returned no execution id")
        return execution_id

    def terminate_workflow(self, execution_id: str, reason: str) -> None:
        """``DELETE /workflow/{id}?reason=``: end a run now (its message queue is deleted with it).

        Raises:
            ExecutionNotFoundError: the server does not know the run.
            HttpError: another refusal (409 once it has ended).
        """
        with _not_found_is_unknown_execution(execution_id):
            self.transport.request("DELETE", f"/workflow/{_seg(execution_id)}", params={"reason": reason[:1000]})

    def push_message(self, execution_id: str, payload: Mapping[str, Any]) -> str:
        """``POST /workflow/{id}/messages`` → the message id.

        Raises:
            ExecutionNotFoundError, MessageQueueDisabledError, ExecutionNotRunningError,
            MessageQueueFullError.
        """
        try:
            result = self.transport.request(
                "POST", f"/workflow/{_seg(execution_id)}/messages", json_body=dict(payload)
            )
        except HttpError as err:
            if err.status == 404:
                raise self._explain_message_404(execution_id) from err
            if err.status == 409 and "current: PAUSED" in (err.server_message or ""):
                raise RunPausedError(
                    f"execution {execution_id!r} is paused; it takes no messages until it is unpaused "
                    "(handle.unpause())", execution_id=execution_id) from err
            if err.status == 409:
                raise ExecutionNotRunningError(
                    f"execution {execution_id!r} is not running; it cannot receive messages "
                    f"({err.server_message})",
                    execution_id=execution_id,
                ) from err
            if err.status == 429:
                raise MessageQueueFullError(
                    f"the message queue of execution {execution_id!r} is full; "
                    "retry once the agent has consumed some messages",
                    execution_id=execution_id,
                ) from err
            raise
        return str(result).strip() if result is not None else ""

    def decide_workflow(self, execution_id: str) -> None:
        """``PUT /workflow/decide/{id}``: the server decides the run now (a mailbox: ends a rest over a second old).

        Raises:
            ExecutionNotFoundError: the server does not know the run.
        """
        with _not_found_is_unknown_execution(execution_id):
            self.transport.request("PUT", f"/workflow/decide/{_seg(execution_id)}")

    def signal_wait(self, execution_id: str) -> bool:
        """``POST /tasks/{id}/COMPLETED/signal/sync?timeoutMillis=0`` (3.32.0+): complete the run's first
        ``WAIT`` task not yet ended (empty output); whether it had one.

        The synchronous variant, because it says whether a ``WAIT`` was there (the asynchronous
        ``/signal`` answers 200 either way); with ``timeoutMillis=0`` it answers as soon as the task is
        completed (a few tens of ms; the server logs one "timed out" line), not once the run settles.

        Raises:
            ExecutionNotFoundError: the server does not know the run.
            HttpError: another refusal.
        """
        try:
            self.transport.request("POST", f"/tasks/{_seg(execution_id)}/COMPLETED/signal/sync",
                                   params={"timeoutMillis": "0"}, json_body={}, timeout=(5.0, 10.0))
        except HttpError as err:
            if err.status == 404 and _NO_WAIT in (err.server_message or ""):
                return False
            if err.status == 404:
                raise ExecutionNotFoundError(f"no execution {execution_id!r} on the server",
                                             execution_id=execution_id) from err
            raise
        return True

    def _explain_message_404(self, execution_id: str) -> Exception:
        try:
            self.get_workflow(execution_id)
        except ExecutionNotFoundError as missing:
            return missing
        return MessageQueueDisabledError(
            f"execution {execution_id!r} exists but the server's workflow message queue is "
            "disabled; start the server with conductor.workflow-message-queue.enabled=true",
            execution_id=execution_id,
        )

    # -- workers ----------------------------------------------------------------------

    def poll_tasks(
        self, task_type: str, *, worker_id: str, domain: str | None, count: int, timeout_ms: int,
        http_timeout: float,
    ) -> list[dict[str, Any]]:
        """``GET /tasks/poll/batch/{type}`` (a long poll of up to ``timeout_ms``)."""
        params: dict[str, Any] = {"workerid": worker_id, "count": count, "timeout": timeout_ms}
        if domain:
            params["domain"] = domain
        result = self.transport.get_json(
            f"/tasks/poll/batch/{_seg(task_type)}", params=params, timeout=(5.0, http_timeout)
        )
        return result if isinstance(result, list) else []

    def mark_presence(self, task_type: str, *, worker_id: str, domain: str) -> None:
        """A poll that takes nothing (``count=0``, no wait): the server records it in the poll data."""
        self.transport.get_json(f"/tasks/poll/batch/{_seg(task_type)}",
                                params={"workerid": worker_id, "domain": domain, "count": 0, "timeout": 0},
                                timeout=(5.0, 10.0))

    def get_task(self, task_id: str) -> dict[str, Any]:
        """``GET /tasks/{taskId}`` (a 404 stays an HttpError: the task is unknown)."""
        result = self.transport.request("GET", f"/tasks/{_seg(task_id)}", timeout=(5.0, 10.0))
        if not isinstance(result, dict):
            raise ServerError(f"GET /tasks/{task_id} returned a malformed body")
        return result

    def update_task(self, result: Mapping[str, Any]) -> None:
        """``POST /tasks`` with a TaskResult."""
        self.transport.request("POST", "/tasks", json_body=dict(result))

    def queue_sizes(self, queue_names: list[str]) -> dict[str, Any]:
        """``GET /tasks/queue/sizes?taskType=...`` → ``{queue name: messages}``, one count per name."""
        result = self.transport.get_json(
            "/tasks/queue/sizes", params={"taskType": list(queue_names)}, timeout=(5.0, 10.0))
        if not isinstance(result, dict):
            raise ServerError("GET /tasks/queue/sizes returned a malformed body")
        return result

    def all_queue_sizes(self) -> dict[str, Any]:
        """``GET /tasks/queue/all`` → ``{queue name: messages not yet polled}`` for every queue the server knows.

        One query on the server whatever the number of queues asked about; queues that never
        held a message are absent (their size is 0).
        """
        result = self.transport.get_json("/tasks/queue/all", timeout=(5.0, 10.0))
        if not isinstance(result, dict):
            raise ServerError("GET /tasks/queue/all returned a malformed body")
        return result

    def poll_data(self, task_type: str) -> list[dict[str, Any]]:
        """``GET /tasks/queue/polldata?taskType=`` → one row per (type, domain)."""
        return self.poll_data_sample(task_type)[0]

    def poll_data_sample(self, task_type: str) -> tuple[list[dict[str, Any]], str | None]:
        """:meth:`poll_data` plus the server's ``Date`` header (its clock, for ``lastPollTime`` ages)."""
        result, headers = self.transport.get_with_headers("/tasks/queue/polldata", params={"taskType": task_type})
        return (result if isinstance(result, list) else []), headers.get("Date")
