"""``runtime.schedules``: create, list, pause, unpause and delete the server's cron schedules of an agent.

The server's scheduler (on by default in 3.32.3; ``/api/scheduler``) starts a *workflow* by name, with
the input and task routing it was given once, when the schedule was made. So a schedule is made in two
requests: ``POST /agent/deploy`` registers the agent's compiled workflow (what ``start()`` does on every
start), then ``POST /scheduler/schedules`` names that workflow, the input the server itself would give
a start (``prompt``, ``context``, ``media``, ``session_id``, ``cwd``), a task domain, and the agent's compiled
definition itself: the scheduler then starts exactly the agent as it was when the schedule was made (measured on
3.32.3: a run started from a schedule runs the definition the schedule carries), whatever later starts of the agent,
which replace the definition the server keeps under its name, did to it. Make the schedule again to
pick up a changed agent.

No process holds a scheduled run when the scheduler starts it. The SDK's answer is :meth:`AgentRuntime.serve`:
a serving process adopts runs that nobody serves. Adoption is by task domain, so every run of a schedule
is routed to one domain of its own, derived from the schedule's name: the first run is adopted like an
orphan (within about ``liveness_stall_seconds``), and the process that took it serves the schedule's
later runs at once (it polls that domain). The agent must therefore be ``stateful=True``; a listener
(an agent with a ``WaitForMessageTool``) is started once and lives on, so it is refused.
"""

from __future__ import annotations

import uuid
import zoneinfo
from collections.abc import Mapping
from datetime import datetime, timezone
from typing import Any

import attrs

from .._common.checks import an_int
from .._wire.api import ConductorApi
from .._wire.transport import HttpError
from ..agent import Agent
from ..errors import AgentDefinitionError, AgentTypeError, ScheduleNotFoundError

__all__ = ["Schedule", "Schedules", "schedule_domain"]

_NAMESPACE = uuid.UUID("6f1d2a0c-8b1e-4d55-9a43-5c0f3e7b2d19")
#: Input keys the scheduler adds to each run it starts (``_startedByScheduler`` names the schedule).
STARTED_BY = "_startedByScheduler"


def schedule_domain(name: str) -> str:
    """The task domain of every run of schedule ``name`` (32 hex digits, like a run's own)."""
    return uuid.uuid5(_NAMESPACE, f"schedule:{name}").hex


def _when(ms: Any) -> datetime | None:
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc) if isinstance(ms, (int, float)) and ms > 0 else None


@attrs.frozen
class Schedule:
    """A cron schedule of an agent, as the server keeps it (``runtime.schedules.get(name)``).

    ``cron`` is the server's six-field expression (seconds first: ``"0 0 9 * * MON-FRI"``), read in
    ``zone``; ``next_run`` is when the server will start the next run (None while paused); ``domain``
    is the task domain of its runs (see the module's docstring).
    """

    name: str
    agent_name: str
    cron: str
    zone: str
    paused: bool
    prompt: str
    context: Mapping[str, Any] = attrs.field(factory=dict, repr=False)
    description: str | None = None
    domain: str | None = attrs.field(default=None, repr=False)
    next_run: datetime | None = None
    created: datetime | None = attrs.field(default=None, repr=False)

    @classmethod
    def from_server(cls, raw: Mapping[str, Any]) -> Schedule:
        start = raw.get("startWorkflowRequest") or {}
        run_input = start.get("input") or {}
        domains = set((start.get("taskToDomain") or {}).values())
        return cls(
            name=str(raw.get("name") or ""), agent_name=str(start.get("name") or ""),
            cron=str(raw.get("cronExpression") or ""), zone=str(raw.get("zoneId") or "UTC"),
            paused=bool(raw.get("paused")), prompt=str(run_input.get("prompt") or ""),
            context=dict(run_input.get("context") or {}), description=raw.get("description") or None,
            domain=domains.pop() if len(domains) == 1 else None,
            next_run=None if raw.get("paused") else _when(raw.get("nextRunTime")),
            created=_when(raw.get("createTime")),
        )


def _check_name(name: Any) -> str:
    if not isinstance(name, str) or not name.strip():
        raise AgentTypeError(f"a schedule's name must be a non-blank str, got {name!r}", field="name", value=name)
    return name.strip()


class Schedules:
    """The server's cron schedules of agents (``runtime.schedules``). Thread-safe (it keeps no state)."""

    def __init__(self, api: ConductorApi) -> None:
        self._api = api

    def __repr__(self) -> str:
        return "Schedules()"

    def create(self, agent: Agent, prompt: str, *, name: str, cron: str, zone: str = "UTC",
               context: Mapping[str, Any] | None = None, paused: bool = False,
               description: str | None = None) -> Schedule:
        """Have the server start ``agent`` with ``prompt`` on ``cron`` (six fields, seconds first) in ``zone``.

        A schedule with the same name is replaced. The runs are served by the processes that call
        ``runtime.serve(agent)`` (see the module's docstring); none is served until one does.

        Raises:
            AgentTypeError: ``agent`` is not an Agent, or a name, prompt or cron is not a non-blank str.
            AgentDefinitionError: the agent is not stateful, or it is a listener.
            ValueError: the server refused the cron expression or the zone (its reason in the message).
            ServerError, ServerUnavailableError: a request failed.
        """
        if not isinstance(agent, Agent):
            raise AgentTypeError(f"agent must be an Agent, got {agent!r}", field="agent", value=agent)
        name = _check_name(name)
        for field, value in (("prompt", prompt), ("cron", cron), ("zone", zone)):
            if not isinstance(value, str) or not value.strip():
                raise AgentTypeError(f"{field} must be a non-blank str, got {value!r}", field=field, value=value)
        if agent.is_listener:
            raise AgentDefinitionError(
                f"agent {agent.name!r} is a listener (it has a WaitForMessageTool): a listener is started once "
                "and lives on, a schedule starts a new run each time; start it with an idempotency_key instead",
                field="tools", value=agent.name)
        if not agent.is_stateful:
            raise AgentDefinitionError(
                f"agent {agent.name!r} must be stateful=True to be scheduled: no process holds a scheduled run "
                "when the server starts it, and runtime.serve(agent) adopts only stateful agents' runs",
                field="stateful", value=False)
        self.next_runs(cron, 1)  # the server stores any text, and its scheduler then never starts a run
        try:
            zoneinfo.ZoneInfo(zone.strip())
        except (zoneinfo.ZoneInfoNotFoundError, ValueError) as err:
            raise ValueError(f"unknown time zone {zone!r} (an IANA name such as 'Europe/Paris' or 'UTC')") from err
        deployed = self._api.deploy_agent({"agentConfig": agent.to_config()})
        workflow = str(deployed.get("agentName") or agent.name)
        domain = schedule_domain(name)
        workers = [str(w) for w in deployed.get("requiredWorkers") or ()]
        body = {
            "name": name, "cronExpression": cron.strip(), "zoneId": zone.strip(), "paused": bool(paused),
            "startWorkflowRequest": {
                "name": workflow,
                # The definition as deployed now, carried by the schedule: every start of the agent replaces
                # the one the server keeps under its name (a start with other ModelSettings too).
                "workflowDef": self._api.workflow_def(workflow),
                "input": {"prompt": prompt, "media": [], "context": dict(context or {}), "session_id": "",
                          "cwd": "."},
                "taskToDomain": dict.fromkeys(workers, domain),
            },
        }
        if description is not None:
            body["description"] = str(description)
        try:
            return Schedule.from_server(self._api.create_schedule(body))
        except HttpError as err:
            if err.status == 400:
                raise ValueError(f"the server refused schedule {name!r}: {err.server_message}") from err
            raise

    def get(self, name: str) -> Schedule:
        """The schedule named ``name``.

        Raises:
            ScheduleNotFoundError: no such schedule.
        """
        return Schedule.from_server(self._api.get_schedule(_check_name(name)))

    def list(self, agent: Agent | str | None = None) -> tuple[Schedule, ...]:
        """Every schedule on the server, or only those of ``agent`` (an Agent or its name), by name."""
        wanted = agent.name if isinstance(agent, Agent) else agent
        schedules = (Schedule.from_server(raw) for raw in self._api.list_schedules())
        return tuple(sorted((s for s in schedules if wanted is None or s.agent_name == wanted),
                            key=lambda s: s.name))

    def pause(self, name: str) -> Schedule:
        """Start no more runs until :meth:`unpause` (runs already started go on). Idempotent.

        Raises:
            ScheduleNotFoundError: no such schedule.
        """
        name = _check_name(name)
        self._api.get_schedule(name)  # the server pauses an unknown name without a word
        self._api.pause_schedule(name)
        return self.get(name)

    def unpause(self, name: str) -> Schedule:
        """Start runs again from the next time the cron expression names (missed ones are not made up).

        Raises:
            ScheduleNotFoundError: no such schedule.
        """
        name = _check_name(name)
        self._api.get_schedule(name)
        self._api.resume_schedule(name)
        return self.get(name)

    def delete(self, name: str) -> bool:
        """Delete the schedule (runs already started go on); whether it existed."""
        name = _check_name(name)
        try:
            self._api.get_schedule(name)
        except ScheduleNotFoundError:
            return False
        self._api.delete_schedule(name)
        return True

    def next_runs(self, cron: str, count: int = 5) -> tuple[datetime, ...]:
        """When the server would start runs on ``cron`` (UTC), the next ``count`` times: check an expression.

        Raises:
            ValueError: the server refused the expression, or ``count`` is not 1 to 100.
        """
        an_int(at_least=1, at_most=100).check("count", count)
        try:
            times = self._api.next_schedule_times(cron, count)
        except HttpError as err:
            if err.status in (400, 500):
                raise ValueError(f"the server refused the cron expression {cron!r} ({err.server_message}): it "
                                 "takes six fields, seconds first ('0 0 9 * * MON-FRI': 9:00 on weekdays)") from err
            raise
        return tuple(t for t in (_when(ms) for ms in times) if t is not None)
