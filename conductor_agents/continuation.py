""":class:`Continuation`: how a long-lived listener is continued as a fresh run before it grows too big.

A Conductor run keeps every turn it ever took: each model call stores the whole conversation so far,
each loop iteration keeps its outputs, and the run's tool-results digest grows with every result
(``docs/concepts.md``, *Long-lived listeners*). A listener left to itself fails after a few dozen
messages (a task payload over the server's 10 MB limit). So a stateful agent that waits for messages
is *continued*: at a safe point (waiting for a message, no tool running) the serving process starts a
fresh run of the same agent on the same task domain, carries the conversation over, and ends the old
run. Callers keep the first execution id; the SDK finds the current run from it.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import attrs

from ._common.checks import Check, Refusal, an_int, optional
from .errors import AgentDefinitionError, AgentTypeError

__all__ = ["Continuation", "CarryOver", "KEEP_ALL_RUNS"]

#: ``Continuation(keep_runs=KEEP_ALL_RUNS)``: never retire a listener's runs.
KEEP_ALL_RUNS = None

#: The defaults, chosen from measurement (``benchmarks/results.md``, *Long-lived listeners*): a run of
#: the seed agent stores about 64 KB per turn plus about six copies of its tool-results digest, so a
#: megabyte is 10-15 turns of small messages and a handful of few-KB ones; far below the server's
#: 3 MB (external storage) and 10 MB (failure) payload limits and the 2 MB the project allows a run.
DEFAULT_MAX_TURNS = 40
DEFAULT_MAX_BYTES = 1_000_000
DEFAULT_KEEP_EXCHANGES = 5
DEFAULT_RECORD_CHARS = 4_000
#: Ended runs of a listener kept on the server besides its first one (the id callers hold).
DEFAULT_KEEP_RUNS = 2


#: A field of the wrong type raises AgentTypeError, one out of bounds AgentDefinitionError (``field``, ``value``).
_CONTINUATION = Refusal(AgentDefinitionError, type_error=AgentTypeError, prefix="Continuation.")


def _check_count(minimum: int) -> Check:
    return an_int(at_least=minimum, refusal=_CONTINUATION)


_check_keep = optional(_check_count(0))


def _check_keep_for(instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if value is None:
        return
    if not isinstance(value, timedelta):
        raise AgentTypeError(f"Continuation.keep_for must be a datetime.timedelta or None, got {value!r} "
                             "(for example timedelta(days=30))", field="keep_for", value=value)
    if value <= timedelta(0):
        raise AgentDefinitionError(f"Continuation.keep_for must be longer than zero, got {value!r} (keep_runs=0 "
                                   "retires every ended run at once)", field="keep_for", value=value)


def _check_carry(instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if value is not None and not callable(value):
        raise AgentTypeError(f"Continuation.carry must be callable or None, got {value!r}",
                             field="carry", value=value)


@attrs.frozen
class CarryOver:
    """What a continued run is told about the runs before it; handed to :attr:`Continuation.carry`.

    ``exchanges`` are the conversation's items, oldest first, each a dict with ``role``
    (``"assistant"``, ``"tool_call"``, ``"tool"``) and ``text`` (what the model said, or the tool
    call / result as JSON), ``kept`` of them at the end to be shown verbatim; ``pending`` are messages
    that reached the old run but not its model (act on them first); ``runs`` is how many runs the
    listener has had (this one included), ``turns`` how many model turns it has taken in all.
    """

    prompt: str
    exchanges: tuple[dict[str, Any], ...]
    kept: int
    pending: tuple[Any, ...]
    runs: int
    turns: int
    messages_handled: int


@attrs.frozen
class Continuation:
    """When a listener is continued as a fresh run, and what the new run is told.

    Immutable. Set it on the agent (``Agent(..., continuation=Continuation(max_turns=20))``); an
    agent without one uses the runtime's settings (``CONDUCTOR_AGENT_CONTINUE_AFTER_TURNS``,
    ``CONDUCTOR_AGENT_CONTINUE_AFTER_BYTES``). Only stateful agents with a
    :class:`~conductor_agents.WaitForMessageTool` are continued.

    Args:
        max_turns: continue once a run has taken this many model turns.
        max_bytes: continue once a run's stored size (its task list, as the server returns it) is
            estimated at this many bytes.
        keep_exchanges: how many of the last conversation items the new run sees verbatim; the
            ones before are summarised in a compact record (at most ``record_chars`` characters).
        record_chars: the compact record's size.
        carry: ``carry(CarryOver) -> str`` replaces the default text the new run is given (see
            ``docs/concepts.md``); it must be a pure function of its argument (several processes
            may compute it).
        enabled: ``False`` never continues (a run then grows until the server refuses it).
        keep_runs: how many of the listener's ended runs stay on the server besides its first one
            (the id callers hold, which always stays); older ones are removed from the server after
            each switch, with their sub-runs (see ``docs/operations.md``, *What the server keeps*).
            ``None`` keeps every run (for audit). Totals (runs, turns, messages, tokens) survive
            retirement: :meth:`AgentHandle.totals`. With a mailbox the first run is retired like
            the others (the mailbox is the id callers hold).
        keep_for: the longest an ended run stays on the server (a :class:`~datetime.timedelta`, counted
            from when it ended), whatever ``keep_runs`` allows: a run is retired once it is beyond
            ``keep_runs`` *or* older than ``keep_for``. ``None`` (the default) puts no age limit;
            ``keep_runs=None, keep_for=timedelta(days=30)`` keeps every run for 30 days.
        mailbox: give the listener a mailbox, a small run of the SDK's whose id is the one callers
            hold (``execution_id``) for the listener's whole life: a sender that pushes with the
            server's own REST call (``POST /workflow/{id}/messages``) to that id reaches the listener
            after any number of continuations, at once (one that lands within a second of the mailbox's
            previous round at the serving process's next look: ``AgentSettings.mailbox_check_seconds`` after
            the listener's last message, then at gaps doubling up to ``mailbox_check_max_seconds``). It costs one
            more run per listener and, while idle, one short round of it per look on the server.
            ``False``: the id callers hold is the first run's, and outside senders get 409 once it was
            continued (see ``docs/operations.md``).
    """

    max_turns: int = attrs.field(default=DEFAULT_MAX_TURNS, validator=_check_count(2))
    max_bytes: int = attrs.field(default=DEFAULT_MAX_BYTES, validator=_check_count(100_000))
    keep_exchanges: int = attrs.field(default=DEFAULT_KEEP_EXCHANGES, validator=_check_count(0))
    record_chars: int = attrs.field(default=DEFAULT_RECORD_CHARS, validator=_check_count(0))
    carry: Callable[[CarryOver], str] | None = attrs.field(default=None, validator=_check_carry,
                                                              eq=False, repr=False)
    enabled: bool = attrs.field(default=True)
    keep_runs: int | None = attrs.field(default=DEFAULT_KEEP_RUNS, validator=_check_keep)
    keep_for: timedelta | None = attrs.field(default=None, validator=_check_keep_for)
    mailbox: bool = attrs.field(default=True)

    @classmethod
    def disabled(cls) -> Continuation:
        """A continuation that never happens."""
        return cls(enabled=False)
