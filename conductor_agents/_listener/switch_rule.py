"""When a continued listener's link is due to switch to a new run (pure: no I/O, no clock, no state).

The serving process (:mod:`.driver`) asks at some of a link's model turns. The rule, in order:

1. continuation off (``Continuation(enabled=False)``, or turned off for the listener): never;
2. two turns or fewer left before the agent's ``max_turns``: never (the listener ends by its turn
   limit before a new run would help);
3. the link has taken ``Continuation.max_turns`` turns: now;
4. otherwise the link's size decides: the caller reads it (two small requests, and once per agent a
   whole-run measurement: :mod:`.budget`) and asks again with how many more turns fit below
   ``Continuation.max_bytes``; fewer than two (a switch takes a turn or two to come to rest): now;
5. else not yet, and the size is read again after half the turns left, but at least as often as the
   turns so far (messages can grow at any time: a check at turns 1, 2, 4, 8... never misses more
   than a doubling), and no later than the turn cap.
"""

from __future__ import annotations

import attrs

from ..continuation import Continuation

__all__ = ["RECHECK_FRACTION", "SWITCH_TURNS", "SwitchVerdict", "switch_verdict"]

#: The size is read again after about this share of the turns it had left at the last read.
RECHECK_FRACTION = 0.5
#: A switch takes a turn or two to come to rest: it is due when fewer turns than this are left (of the
#: byte budget), and pointless when no more than this are left before the agent's turn limit.
SWITCH_TURNS = 2


@attrs.frozen
class SwitchVerdict:
    """What :func:`switch_verdict` decided.

    Attributes:
        due: switch now.
        needs_size: no decision without the link's size: read it, then ask again with ``turns_left``.
        next_check: the link turn at which to ask again (``None``: leave it as it is).
    """

    due: bool = False
    needs_size: bool = False
    next_check: int | None = None


def switch_verdict(continuation: Continuation, *, turn: int, turns_before: int, agent_max_turns: int,
                   disabled: bool = False, turns_left: float | None = None) -> SwitchVerdict:
    """Whether the link at its model turn ``turn`` (its own count, from 1) is due to switch.

    Args:
        continuation: the listener's settings.
        turn: the link's turn; ``turns_before``: the turns its earlier links took (the agent's
            ``agent_max_turns`` counts the whole listener).
        disabled: continuation turned off for this listener (its switch cannot work).
        turns_left: about how many more turns fit below ``continuation.max_bytes``
            (:meth:`.budget.SizeModel.turns_until`); ``None`` before the size was read.
    """
    if not continuation.enabled or disabled:
        return SwitchVerdict()
    if agent_max_turns - (turns_before + turn) <= SWITCH_TURNS:
        return SwitchVerdict()
    if turn >= continuation.max_turns:
        return SwitchVerdict(due=True)
    if turns_left is None:
        return SwitchVerdict(needs_size=True)
    if turns_left < SWITCH_TURNS:
        return SwitchVerdict(due=True)
    step = max(1, int(min(turns_left * RECHECK_FRACTION, turn)))
    return SwitchVerdict(next_check=min(continuation.max_turns, turn + step))
