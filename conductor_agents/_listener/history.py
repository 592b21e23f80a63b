"""A continued listener's result over every run the server still holds, not only the run it ended in.

When a listener ends, :class:`~conductor_agents.AgentResult`'s ``tool_calls`` and ``token_usage`` cover
each of its runs still on the server, oldest first; ``retired_runs`` counts the older ones retention
removed (:mod:`.retention`: they are always the lowest links, after link 0 for a listener without a
mailbox), whose figures only the totals keep (:func:`~.following.listener_totals`).

Cost: one read per held run (``GET /workflow/{id}?includeTasks=true``), from the run before the one
the listener ended in down to the first one missing (then the first run, for a listener without a
mailbox, which retention never removes), once per result. A run's tokens come from the commit records
(:mod:`.carryover`: each run's carry task holds the tokens of every run before it, as the server
counted them), so they need no read of their own, except for a run whose successor is gone or holds
no record (then ``GET /agent/execution/{id}``, one small read).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs

from .._common.task_names import CARRY_TASK
from .._wire.api import ConductorApi
from ..errors import ConductorAgentsError, ExecutionNotFoundError
from ..result import AgentResult, TokenUsage, ToolCallRecord, tool_calls_from_tasks
from .carryover import CommitRecord, add_tokens
from .directory import Chain, ChainDirectory, Link
from .switch import run_tokens

__all__ = ["HeldRun", "carried_tokens", "held_tokens", "history_chain", "with_history"]


@attrs.frozen
class HeldRun:
    """One run of a listener the server still holds, as its result needs it. Immutable.

    ``carried``: the tokens of every run before this one, from its commit record (zeros for the
    listener's first run; None when it holds no record). ``own``: its own tokens, when already read.
    """

    number: int
    tool_calls: tuple[ToolCallRecord, ...] = ()
    carried: TokenUsage | None = None
    own: TokenUsage | None = None


def carried_tokens(tasks: Sequence[Mapping[str, Any]], number: int) -> TokenUsage | None:
    """The tokens of every run before link ``number``, from its carry task's commit record (no request):
    zeros for link 0, None when the record is missing (a switch not committed) or unreadable."""
    if number == 0:
        return TokenUsage()
    for task in tasks:
        if task.get("taskType") == CARRY_TASK:
            record = CommitRecord.from_output(task.get("outputData")) if task.get("status") == "COMPLETED" else None
            return record.tokens if record is not None else None
    return None


def _less(total: TokenUsage, part: TokenUsage) -> TokenUsage:
    return TokenUsage(prompt_tokens=max(0, total.prompt_tokens - part.prompt_tokens),
                      completion_tokens=max(0, total.completion_tokens - part.completion_tokens),
                      total_tokens=max(0, total.total_tokens - part.total_tokens))


def held_tokens(runs: Sequence[HeldRun], own: Callable[[HeldRun], TokenUsage]) -> TokenUsage:
    """The tokens of ``runs`` (held runs, oldest first): a run's own when known, else what its successor's
    record carries less what its own carries (when the successor is the next link), else ``own(run)``."""
    total = TokenUsage()
    for index, run in enumerate(runs):
        after = runs[index + 1] if index + 1 < len(runs) else None
        if run.own is not None:
            part = run.own
        elif (after is not None and after.number == run.number + 1 and after.carried is not None
              and run.carried is not None):
            part = _less(after.carried, run.carried)
        else:
            part = own(run)
        total = add_tokens(total, part)
    return total


def history_chain(directory: ChainDirectory, chain: Chain) -> Chain:
    """The chain by the id callers hold (its links from the listener's first run on); ``chain`` itself when
    that cannot be read (then its history starts at the link the caller holds)."""
    if chain.mailbox or chain.first == 0 or not chain.continuable:
        return chain
    try:
        return directory.anchor(chain, cached=True)
    except ConductorAgentsError:
        return chain


def _read(api: ConductorApi, link: Link) -> HeldRun:
    """Link ``link`` as its history needs it (one read). Raises ExecutionNotFoundError: it was retired."""
    tasks = api.get_workflow(link.execution_id, include_tasks=True).get("tasks") or []
    return HeldRun(link.number, tool_calls_from_tasks(tasks), carried_tokens(tasks, link.number))


def _older_runs(api: ConductorApi, base: Chain, ended: Link) -> tuple[list[HeldRun], int]:
    """The held runs before ``ended``, oldest first, and how many runs between them retention removed."""
    low = base.first  # the listener's first link (0 but for a chain whose anchor could not be read)
    older: list[HeldRun] = []
    gap_top = None  # the highest link found retired
    for number in range(ended.number - 1, low - 1, -1):
        try:
            older.append(_read(api, base.link(number)))
        except ExecutionNotFoundError:
            gap_top = number
            break
    retired = 0
    if gap_top is not None:
        retired = gap_top - low + 1
        if base.held(low) and low < gap_top:  # the first run of a listener without a mailbox: never retired
            try:
                older.append(_read(api, base.link(low)))
                retired -= 1
            except ExecutionNotFoundError:
                pass
    older.reverse()
    return older, retired


def with_history(api: ConductorApi, directory: ChainDirectory, chain: Chain, result: AgentResult, ended: Link,
                 tasks: Sequence[Mapping[str, Any]]) -> AgentResult:
    """``result`` (of the run ``ended``, whose ``tasks`` the caller has read) with ``tool_calls`` and
    ``token_usage`` over every held run of the listener, and ``retired_runs`` (see the module's docstring).

    Raises:
        ServerUnavailableError, ServerError: a read failed.
    """
    base = history_chain(directory, chain)
    if not base.continuable or ended.number <= base.first:
        return result
    older, retired = _older_runs(api, base, ended)
    runs = [*older, HeldRun(ended.number, result.tool_calls, carried_tokens(tasks, ended.number), result.token_usage)]
    tokens = held_tokens(runs, lambda run: run_tokens(api, base.link(run.number).execution_id))
    calls = tuple(call for run in runs for call in run.tool_calls)
    return attrs.evolve(result, tool_calls=calls, token_usage=tokens, retired_runs=retired)
