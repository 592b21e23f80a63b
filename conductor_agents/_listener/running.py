"""The running runs of an agent, one row per listener: what :meth:`AgentRuntime.running` and
``conductor-agents list`` show.

The server lists running workflows by name (``GET /workflow/running/{name}``). A continued listener
has two running runs while a switch drains the old one, and callers hold neither: they hold its
mailbox (:mod:`.._listener.mailbox`). So each running run is named by the id callers hold
(:meth:`ChainDirectory.anchor`) and a listener is one row, its newest running run the current one.
"""

from __future__ import annotations

from typing import Any

import attrs

from .._common.task_names import HUMAN_TASK_TYPE, is_message_wait
from .._people.pending import waits_on_person
from .._wire.api import ConductorApi
from ..agent import Agent, is_agent_name
from ..errors import AgentTypeError, ConductorAgentsError, ConfigurationError, ExecutionNotFoundError
from ..result import AgentStatus, RunStatus
from .directory import ChainDirectory

__all__ = ["RunningRun", "agent_name_of", "running_runs", "waiting_for"]

PERSON = "person"
MESSAGE = "message"


@attrs.frozen
class RunningRun:
    """A running run of an agent, as a list of runs shows it. Immutable; thread-safe.

    ``execution_id`` is the id callers hold (a continued listener's mailbox: the same for its whole
    life); ``current_execution_id`` the run that works now (its newest running run).
    ``waiting_for``: ``"person"`` (a run of it waits for an approval, an answer or a review),
    ``"message"`` (it waits for the next message) or None (it is working). ``start_time``: when the
    current run started (epoch seconds, the server's clock), None when the server did not say.
    ``served``, ``unserved_for``: whether a process serves the listener now, and for how many seconds
    none has, as :attr:`AgentStatus.served` (filled in by :meth:`AgentRuntime.running`).
    """

    execution_id: str
    current_execution_id: str
    status: RunStatus
    waiting_for: str | None = None
    start_time: float | None = None
    served: bool | None = None
    unserved_for: float | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (what ``conductor-agents list --json`` prints)."""
        return {"executionId": self.execution_id, "currentExecutionId": self.current_execution_id,
                "status": self.status.value, "waitingFor": self.waiting_for, "startTime": self.start_time,
                "served": self.served, "unservedFor": self.unserved_for}


def waiting_for(api: ConductorApi, status: AgentStatus) -> str | None:
    """``"person"``, ``"message"`` or None: what a running run waits for.

    The server's ``isWaiting`` covers both (a HUMAN or a wait-for-message task in progress) and misses
    a wait-for-message task between two of its polls (SCHEDULED again): then the run's open tasks tell
    (one small read).
    """
    if status.is_terminal:
        return None
    if status.is_waiting and not waits_on_person({"isWaiting": True, "pendingTool": status.pending_tool}):
        return MESSAGE
    try:
        page = api.workflow_tasks(status.current_execution_id or status.execution_id,
                                  statuses=("SCHEDULED", "IN_PROGRESS"), count=50)
    except ConductorAgentsError:
        return PERSON if status.is_waiting else None  # one look: the status itself was read
    if any(t.get("taskType") == HUMAN_TASK_TYPE and not is_message_wait(t) for t in page.tasks):
        return PERSON  # (a listener that waits on a HUMAN task looks like a person's wait in its status)
    return MESSAGE if any(is_message_wait(t) for t in page.tasks) else None


def running_runs(api: ConductorApi, directory: ChainDirectory, agent_name: str) -> tuple[RunningRun, ...]:
    """The running runs of agent ``agent_name``, one per listener, oldest first.

    One request for the running list, then per running run: its status (with its start), and (once
    per process) which listener it is, with one poll-data read for a run not named by its mailbox.
    """
    rows: dict[str, tuple[int, RunningRun]] = {}
    for execution_id in dict.fromkeys(api.running_workflow_ids(agent_name)):
        try:
            raw = api.agent_status(execution_id)  # its startTime too
            status = AgentStatus.from_dict(raw)
            if status.is_terminal:
                continue  # ended in between
            chain = directory.chain(execution_id)
            held = directory.anchor(chain).execution_id if chain.continuable else execution_id
            started = raw.get("startTime")
        except ExecutionNotFoundError:
            continue  # ended and removed in between
        row = RunningRun(held, execution_id, status.status, waiting_for(api, status),
                         started / 1000.0 if isinstance(started, (int, float)) and started > 0 else None)
        number, known = chain.first, rows.get(held)  # the link the running run is
        if known is not None:  # two runs of a listener mid-switch: one row, the newer current
            newest = row if number > known[0] else known[1]
            person = PERSON in (row.waiting_for, known[1].waiting_for)  # the old run may hold a request
            row = attrs.evolve(newest, waiting_for=PERSON if person else newest.waiting_for)
            number = max(number, known[0])
        rows[held] = (number, row)
    ordered: list[RunningRun] = [row for _, row in rows.values()]
    ordered.sort(key=lambda r: (r.start_time or 0.0, r.execution_id))
    return tuple(ordered)


def agent_name_of(agent: Agent | str) -> str:
    """The name of ``agent`` (an Agent or its name).

    Raises: AgentTypeError: anything else; ConfigurationError: a str that cannot be an agent's name.
    """
    name = agent.name if isinstance(agent, Agent) else agent
    if not isinstance(name, str) or not name:
        raise AgentTypeError(f"agent must be an Agent or its name, got {agent!r}", field="agent", value=agent)
    if not is_agent_name(name):  # e.g. a MODULE:AGENT target: no run has that name, so it lists nothing
        raise ConfigurationError(
            f"{name!r} is not an agent name (Agent.name: a letter or '_', then letters, digits, '_' and '-')"
            + ("; give the agent's name, not a MODULE:AGENT target" if ":" in name else ""))
    return name
