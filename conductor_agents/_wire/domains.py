"""The task domain a run is pinned to, read from its workflow's ``taskToDomain``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..errors import ResumeError

__all__ = ["single_domain"]


def single_domain(workflow: Mapping[str, Any], execution_id: str, *, required: bool) -> str | None:
    """The one domain of a run's ``taskToDomain``; None when it has none."""
    domains = {str(d) for d in (workflow.get("taskToDomain") or {}).values() if d}
    if len(domains) > 1:
        raise ResumeError(
            f"run {execution_id} routes its tasks to several domains {sorted(domains)}; "
            "this SDK pins a run to one domain and cannot tell which to serve",
            execution_id=execution_id,
        )
    if not domains:
        if required:
            raise ResumeError(
                f"run {execution_id} has no task domain, but the agent is stateful: it was not "
                "started as a stateful run (or by another SDK without a run id), so its tasks are "
                "not pinned to any process",
                execution_id=execution_id,
            )
        return None
    return domains.pop()
