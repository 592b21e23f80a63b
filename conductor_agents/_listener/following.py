"""Following a listener from link to link: its current status, and the link its outcome is in.

A link that was continued ends TERMINATED with a reason saying so; the listener goes on in the next
link. A link given up because its switch could not happen (the previous link ended on its own)
ends TERMINATED too; the listener's outcome is then the previous link's.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import attrs

from .._answers.output_check import rejection_of
from .._answers.output_type import Rejection
from .._liveness.server_fault import retry_if_server_fault
from .._wire.api import ConductorApi
from .._wire.domains import single_domain
from .._wire.transport import HttpError
from ..errors import ConductorAgentsError, ExecutionNotFoundError
from ..result import AgentResult, AgentStatus, ListenerTotals, RunStatus
from .carryover import add_tokens, senders_messages
from .chain import is_abandoned, is_continued
from .directory import Chain, ChainDirectory, Link
from .history import with_history
from .naming import names_errors, run_name
from .pausing import run_status
from .switch import read_commit, read_final_state, run_tokens

if TYPE_CHECKING:
    from ..agent import Agent

__all__ = ["current_runs", "current_status", "end_mailbox", "ended_from_outside", "ended_result", "is_running",
           "listener_totals", "live_links", "newer_run", "newest_link", "run_identity", "with_mailbox_pause",
           "workflow_running"]

log = logging.getLogger("conductor_agents.continuation")

#: The reason a listener's mailbox is ended with.
MAILBOX_ENDED_REASON = "conductor-agents: the listener ended"


@names_errors
def current_status(api: ConductorApi, directory: ChainDirectory, chain: Chain, *,
                   timeout: float | None = None) -> tuple[Link, AgentStatus]:
    """The link the listener is in now (or ended in) and its status (one request when nothing moved)."""
    link = directory.newest(chain)
    retried: set[str] = set()
    while True:
        try:
            status = AgentStatus.from_dict(api.agent_status(link.execution_id, timeout=timeout))
        except ExecutionNotFoundError:
            if chain.held(link.number) or not chain.continuable:
                raise
            newer = directory.refresh(chain)  # retired since this process last looked
            if newer.number <= link.number:
                raise
            link = newer
            continue
        if status.is_terminal and link.execution_id not in retried and retry_if_server_fault(
                api, link.execution_id, seen={"status": status.status.value, "reason": status.reason}):
            retried.add(link.execution_id)  # once per look: a read that still says FAILED is the answer
            continue  # the server failed it for want of writing its tasks: retried, it runs again
        if not status.is_terminal or not chain.continuable:
            return link, status
        if is_continued(status.reason):
            newer = directory.refresh(chain)
            if newer.number > link.number:
                link = newer
                continue
        if is_abandoned(status.reason) and link.number > chain.first:
            previous = chain.link(link.number - 1)
            return previous, AgentStatus.from_dict(api.agent_status(previous.execution_id, timeout=timeout))
        if not is_continued(status.reason):
            newer = directory.refresh(chain)  # ended: unless a newer link exists after all
            if newer.number > link.number:
                link = newer
                continue
        if status.is_terminal and chain.mailbox:
            end_mailbox(api, directory, chain)  # whoever first sees the listener ended (idempotent)
        return link, status


def with_mailbox_pause(api: ConductorApi, chain: Chain, status: AgentStatus) -> AgentStatus:
    """``status`` of a running listener, PAUSED when its mailbox (the id callers hold) was paused on its own (from
    the Conductor UI or a raw ``PUT /workflow/{id}/pause``): pushes to the id are refused then, and nothing reaches
    the listener until the mailbox is resumed (``unpause()`` does it). One small read; none when the listener has
    no mailbox or is not RUNNING."""
    if status.status is not RunStatus.RUNNING or not chain.mailbox:
        return status
    mailbox = RunStatus.parse(api.workflow_status(chain.execution_id).get("status"))
    return attrs.evolve(status, status=RunStatus.PAUSED) if mailbox is RunStatus.PAUSED else status


def newest_link(directory: ChainDirectory, chain: Chain) -> Link:
    """The listener's newest run as the server has it (probed forward for a continued listener)."""
    return directory.refresh(chain) if chain.continuable else directory.newest(chain)


def live_links(api: ConductorApi, directory: ChainDirectory, chain: Chain) -> list[Link]:
    """The links that may still be running: the newest, and the one before while a switch is under way."""
    newest = newest_link(directory, chain)
    links = [newest]
    if newest.number > chain.first:
        previous = chain.link(newest.number - 1)
        if is_running(api, previous.execution_id):
            links.append(previous)
    return links


def current_runs(directory: ChainDirectory, chain: Chain) -> Callable[[bool], tuple[str, ...]]:
    """The watch of a listener's mailbox samples this too: the listener's current run, as this process knows
    it (no request), or as the server says (``refresh``: the one known has ended; a probe or two).

    Why: the SDK sends a message straight into that run, so the turn or tool task a frozen serving
    process leaves unpolled waits there, never in the mailbox.
    """
    def runs(refresh: bool) -> tuple[str, ...]:
        link = directory.refresh(chain) if refresh else directory.newest(chain)
        return (link.execution_id,)

    return runs


def newer_run(directory: ChainDirectory, chain: Chain) -> Callable[[], str | None]:
    """The watch of a continued listener with no mailbox asks this when the link it samples ends: the newest link as
    the server says (a probe or two); the watch follows it when it is another run (the link was continued)."""
    return lambda: directory.refresh(chain).execution_id


def is_running(api: ConductorApi, execution_id: str) -> bool:
    """Whether run ``execution_id`` has not ended (one small status request); a run retired from the
    server ended long ago."""
    try:
        return not AgentStatus.from_dict(api.agent_status(execution_id)).is_terminal
    except ExecutionNotFoundError:
        return False


def workflow_running(api: ConductorApi, execution_id: str) -> bool:
    """Whether a run of any workflow (a mailbox: not an agent run) has not ended; False once removed."""
    return not run_status(api, execution_id).is_terminal


@names_errors
def listener_totals(api: ConductorApi, directory: ChainDirectory, chain: Chain) -> ListenerTotals:
    """The listener's runs, turns, messages and tokens over all its runs, and its compact history.

    The newest committed link's record holds the totals of every link before it (carried forward at
    each switch, so retired links still count); the live link's own figures are added to them (a few
    small reads: its last model turn, the tasks after it, its variables, its token count).
    """
    newest = directory.refresh(chain) if chain.continuable else directory.newest(chain)
    record = None
    live = newest
    if newest.number > chain.first:
        record, _ = read_commit(api, newest)
        if record is None:  # a switch under way: the previous link is still the listener's
            live = chain.link(newest.number - 1)
            if live.number > chain.first:
                record, _ = read_commit(api, live)
    last_llm, tail, variables = read_final_state(api, live.execution_id)
    turns = int((last_llm or {}).get("iteration") or 0)
    return ListenerTotals(
        runs=live.number - chain.first + 1,
        turns=(record.turns if record else 0) + turns,
        messages=(record.messages if record else 0) + senders_messages(variables, tail),
        token_usage=add_tokens(record.tokens if record else None, run_tokens(api, live.execution_id)),
        history=record.record if record else "",
        current_execution_id=live.execution_id,
    )


def retry_failed_mailbox(api: ConductorApi, mailbox_id: str) -> bool:
    """Retry a listener's mailbox that failed (a task of it gave up, or it timed out): its failed task is scheduled
    again and it takes messages again, by the same id; whether it was retried. A mailbox that runs, or was ended
    (by the SDK, or from outside: see :func:`ended_from_outside`), is left as it is.

    Raises: as :meth:`ConductorApi.get_workflow` and :meth:`ConductorApi.retry_workflow`."""
    status = RunStatus.parse(api.get_workflow(mailbox_id, include_tasks=False).get("status"))
    if status not in (RunStatus.FAILED, RunStatus.TIMED_OUT):
        return False
    api.retry_workflow(mailbox_id)
    log.warning("the mailbox %s of a listener ended %s; retried, it takes messages again", mailbox_id, status.value)
    return True


def ended_from_outside(api: ConductorApi, mailbox_id: str) -> str | None:
    """Why a listener's mailbox was ended by someone else (the server's own cancel or terminate of the id
    callers hold, from its REST API or UI, or its removal), or None: it runs, or the SDK ended it, or it
    ended otherwise (then a warning: only an explicit end speaks for the listener)."""
    try:
        run = api.get_workflow(mailbox_id, include_tasks=False)
    except ExecutionNotFoundError:
        return "it was removed from the server"
    status, reason = RunStatus.parse(run.get("status")), str(run.get("reasonForIncompletion") or "")
    if not status.is_terminal or reason == MAILBOX_ENDED_REASON:
        return None
    if status is not RunStatus.TERMINATED:
        log.warning("the mailbox %s of a listener ended %s (%s); the listener goes on, reachable by the SDK's "
                    "senders only", mailbox_id, status.value, reason or "no reason given")
        return None
    return f"it was ended from outside the SDK ({reason})" if reason else "it was ended from outside the SDK"


def end_mailbox(api: ConductorApi, directory: ChainDirectory, chain: Chain) -> None:
    """End the mailbox of a listener that has ended, so that later pushes to it answer 409 (see
    :mod:`.mailbox`). Once per process and mailbox (one small read when it has ended already); never
    raises: the next look at the listener tries again."""
    if not chain.mailbox or directory.mailbox_ended(chain.execution_id, mark=False):
        return
    try:
        if workflow_running(api, chain.execution_id):
            api.terminate_workflow(chain.execution_id, MAILBOX_ENDED_REASON)
            log.info("listener %s ended: its mailbox is ended too", chain.execution_id)
    except (ExecutionNotFoundError, HttpError):
        pass
    except ConductorAgentsError as err:
        log.warning("the mailbox of listener %s could not be ended (%s); the next look tries again",
                    chain.execution_id, err)
        return
    directory.mailbox_ended(chain.execution_id, mark=True)


def run_identity(workflow: Mapping[str, Any], chain: Chain) -> tuple[str, str | None]:
    """The agent name and the task domain (run id; None without one) of the run ``chain`` names, from its
    ``workflow`` (no request).

    Raises: ResumeError: its tasks go to several domains.
    """
    name = chain.agent_name if chain.mailbox else str(workflow.get("workflowName") or "")
    return name or "", single_domain(workflow, chain.execution_id, required=False)


def ended_result(api: ConductorApi, status: AgentStatus, link: Link, *, execution_id: str, agent: Agent | None,
                 totals: Callable[[], ListenerTotals], directory: ChainDirectory | None = None,
                 chain: Chain | None = None) -> tuple[AgentResult, Rejection | None]:
    """The result of a run that ended in ``link``, named by ``execution_id`` (the id callers hold), and why
    its answer was refused (a FAILED run of an agent with an ``output_type``), from two reads (for a listener
    of several runs: ``totals()``, and with ``directory`` and ``chain`` one read per older run still held,
    whose tool calls and tokens the result covers too: :mod:`.history`); a read that fails is logged and
    left out."""
    detail: dict[str, Any] = {}
    workflow: dict[str, Any] = {}
    try:
        detail = api.agent_execution(link.execution_id)
        workflow = api.get_workflow(link.execution_id, include_tasks=True) or {}
    except ConductorAgentsError as err:
        log.warning("%s ended but its details could not be read: %s", run_name(execution_id, link.execution_id), err)
    names = agent.team_names if agent is not None else ()
    tasks = workflow.get("tasks") or []
    result = AgentResult.from_server(status, detail, tasks, agent_names=names, workflow=workflow or None)
    ended_by = result.ended_by
    if ended_by == "turn_limit" and agent is not None and (
            agent.stop_when is not None or agent.termination is not None):
        ended_by = None  # its stopping rule may have ended the loop after tool calls: cannot tell which
    result = attrs.evolve(result, execution_id=execution_id, current_execution_id=link.execution_id,
                          runs=status.runs, ended_by=ended_by)
    rejection = None
    if agent is not None and agent.output_type is not None and result.status is RunStatus.FAILED:
        rejection = rejection_of(tasks, agent.name)
    if status.runs > 1 and directory is not None and chain is not None and workflow:
        try:
            result = with_history(api, directory, chain, result, link, tasks)
        except ConductorAgentsError as err:
            log.warning("listener %s ended but its older runs could not be read (the result covers its last run "
                        "only): %s", execution_id, err)
    if status.runs > 1:
        try:
            result = attrs.evolve(result, totals=totals())
        except ConductorAgentsError as err:
            log.warning("listener %s ended but its totals could not be read: %s", execution_id, err)
    return result, rejection
