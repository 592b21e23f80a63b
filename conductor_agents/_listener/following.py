"""Following a listener from link to link: its current status, and the link its outcome is in.

A link that was continued ends TERMINATED with a reason saying so; the listener goes on in the next
link. A link given up because its switch could not happen (the previous link ended on its own)
ends TERMINATED too; the listener's outcome is then the previous link's.
"""

from __future__ import annotations

from typing import Optional

from .._wire.api import ConductorApi
from .chain import is_abandoned, is_continued
from .directory import Chain, ChainDirectory, Link
from ..result import AgentStatus

__all__ = ["current_status", "live_links"]


def current_status(api: ConductorApi, directory: ChainDirectory, chain: Chain, *,
                   timeout: Optional[float] = None) -> "tuple[Link, AgentStatus]":
    """The link the listener is in now (or ended in) and its status (one request when nothing moved)."""
    link = directory.newest(chain)
    while True:
        status = AgentStatus.from_dict(api.agent_status(link.execution_id, timeout=timeout))
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
        return link, status


def live_links(api: ConductorApi, directory: ChainDirectory, chain: Chain) -> "list[Link]":
    """The links that may still be running: the newest, and the one before while a switch is under way."""
    newest = directory.refresh(chain) if chain.continuable else directory.newest(chain)
    links = [newest]
    if newest.number > chain.first:
        previous = chain.link(newest.number - 1)
        status = AgentStatus.from_dict(api.agent_status(previous.execution_id))
        if not status.is_terminal:
            links.append(previous)
    return links
