"""What a mailbox's forward holds for a busy listener that waits on a ``HUMAN`` task (mailbox workflow version 3).

A forward that finds the listener busy (its wait not in progress) completes with the messages it did not hand over in
its output (``held``), instead of handing its task back with them: the mailbox's next round starts at once, pulls
what was pushed meanwhile, and its forward is given the held messages first, then what its own pull took (each in
push order). So at the listener's next wait one forward hands over everything that arrived while it was busy (up to
the wait's batch size), as the server's own wait takes everything queued at once.

Where the held messages come from. The round's forward is given ``${forward.output.held}`` and
``${forward.referenceTaskName}``: inside the loop the server resolves ``forward`` to the forward scheduled last
(``forward__N``, the iteration in the name). Three cases:

- the previous round's forward (``forward__{N-1}``): its held messages, taken;
- an older round's forward (the previous round rested): that forward held nothing, or the round after it would
  have forwarded, not rested; whatever it says is not taken again (never delivered twice);
- the forward's own name: the server delivers a forward again after a crash as a new task whose inputs it resolves
  again, when the newest ``forward`` is the attempt that timed out, not the previous round's: the held messages are
  read from the previous round's forward on the server (the loop keeps the last two rounds: it is there).

Held messages live in a completed task's output (durable); the marks of :mod:`.mailbox` keep exactly-once across a
crash, since a held message is one whose id no completed wait holds. At most :data:`MAX_HELD` are held: beyond that
the forward hands its task back as before, and what is pushed meanwhile stays in the mailbox's queue.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from typing import Any

from .._wire.api import ConductorApi

__all__ = ["MAX_HELD", "carried", "round_of"]

log = logging.getLogger("conductor_agents.continuation")

#: The most messages one forward holds in its output (its input is then at most this plus one pull).
MAX_HELD = 100
_ROUND = re.compile(r"^(?P<name>.+)__(?P<round>\d+)$")


def round_of(reference_name: Any) -> int | None:
    """The round (the loop's iteration) of a task of the mailbox's loop, from its reference name (``forward__3``)."""
    match = _ROUND.match(str(reference_name or ""))
    return int(match.group("round")) if match is not None else None


def _envelopes(messages: Any) -> list[Mapping[str, Any]]:
    return [m for m in messages or () if isinstance(m, Mapping) and m.get("id")] \
        if isinstance(messages, (list, tuple)) else []


def carried(api: ConductorApi, mailbox_id: str, reference_name: str, messages: Any, held: Any,
            held_by: Any) -> list[Mapping[str, Any]]:
    """The messages forward ``reference_name`` of ``mailbox_id`` delivers: the previous round's held ones first, then
    what its round pulled (``messages``), each once, in order.

    Raises: as :meth:`ConductorApi.workflow_tasks` (only for a forward delivered again after a crash).
    """
    mine = round_of(reference_name)
    by = round_of(held_by)
    if mine is not None and by == mine:  # delivered again as a new task: its inputs were resolved again
        name = reference_name[:reference_name.rindex("__")]
        earlier = _held_on_server(api, mailbox_id, f"{name}__{mine - 1}")
    elif mine is not None and by is not None and by != mine - 1:
        earlier = []
        if _envelopes(held):
            log.warning("mailbox %s: forward %s was given what an older round's forward (%s) held, handed over "
                        "since; not delivered again", mailbox_id, reference_name, held_by)
    else:
        earlier = _envelopes(held)
    seen: set[str] = set()
    merged: list[Mapping[str, Any]] = []
    for envelope in [*earlier, *_envelopes(messages)]:
        key = str(envelope["id"])
        if key not in seen:
            seen.add(key)
            merged.append(envelope)
    return merged


def _held_on_server(api: ConductorApi, mailbox_id: str, wanted: str) -> list[Mapping[str, Any]]:
    """What the previous round's forward (reference name ``wanted``) of ``mailbox_id`` held, read from the server."""
    page = api.workflow_tasks(mailbox_id, statuses=("COMPLETED",), start=0, count=50).tasks
    found = [t for t in page if t.get("referenceTaskName") == wanted]
    return _envelopes((found[-1].get("outputData") or {}).get("held")) if found else []
