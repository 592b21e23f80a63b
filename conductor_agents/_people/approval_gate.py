"""The worker's half of an approval: run an approved call, report a rejected one instead of running it.

The server routes a turn whose tool calls need approval through a ``HUMAN`` task and, once it is
answered ``approved: true``, schedules the calls (see :mod:`conductor_agents._people.pending`). A
rejection this SDK sends is also ``approved: true`` (so the run goes on) with
``decision: "rejected"``: before a tool marked ``approval_required`` runs, its worker reads the
run's latest approval decision before the task and, when it says rejected (or no decision is
found: it fails closed), reports the rejection as the call's result. The model sees it as the
tool's output and the body never runs.

One ``GET /workflow/{id}?includeTasks=true`` per delivery of an approval-required call.
Stateless; thread-safe.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .._wire.api import ConductorApi
from ..errors import ServerError, ToolRetry
from .pending import approval_decision

__all__ = ["rejection"]

#: How soon a delivery whose decision could not be read is tried again.
_RETRY_SECONDS = 2.0


def rejection(api: ConductorApi, *, execution_id: str, seq: int, tool_name: str) -> Mapping[str, Any] | None:
    """The output to report instead of running an approval-required call; None when it was approved.

    Raises:
        ToolRetry: the run's decision could not be read (the call is delivered again shortly).
    """
    try:
        workflow = api.get_workflow(execution_id, include_tasks=True)
    except ServerError as err:
        raise ToolRetry(f"could not read the approval decision of this call ({err})",
                        after_seconds=_RETRY_SECONDS) from err
    decision = approval_decision(workflow.get("tasks") or (), execution_id, before_seq=seq)
    if decision is not None and decision.approved:
        return None
    if decision is None:
        reason = "no approval decision was found for this call"
        text = f"{tool_name} did not run: {reason}"
    else:
        reason = decision.reason or "no reason given"
        text = f"a person rejected this call of {tool_name}: {reason}; it did not run"
    output = {"rejected": True, "reason": reason, "error": text}
    if decision is not None and decision.answered_by:
        output["rejected_by"] = decision.answered_by
    return output
