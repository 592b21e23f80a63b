"""Ready-made policies for common agent shapes.

:func:`listener_policy` plays the model of a *listener* agent: one that waits for a message,
acts on it with a tool, and waits again, until it is told to stop.
"""

from __future__ import annotations

import collections
import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs

from conductor_agents.testing._errors import ScriptError
from conductor_agents.testing._llm_request import LLMRequest, ToolOutput
from conductor_agents.testing._turns import Failure, Reply, ToolCall, Turn, to_outcome

__all__ = ["is_stop_signal", "listener_policy"]

OnMessage = Callable[[Any], Any]
"""payload → ``None`` (ignore it), a ``ToolCall`` or list of them (act on it), or ``str`` (end the run)."""

_log = logging.getLogger("conductor_agents.testing")

#: How many answered wait calls a policy remembers (per policy object, all its runs).
_ANSWERED_LIMIT = 4096


def is_stop_signal(payload: Any) -> bool:
    """True for the payload ``{"_signal": "stop"}`` that ``AgentHandle.stop()`` pushes."""
    return isinstance(payload, Mapping) and payload.get("_signal") == "stop"


def listener_policy(
    on_message: OnMessage | None = None,
    *,
    wait_tool: str = "wait_for_message",
    stop_text: str = "stopped",
    is_stop: Callable[[Any], bool] = is_stop_signal,
    wait_arguments: Mapping[str, Any] | None = None,
) -> Callable[[LLMRequest], Turn]:
    """A policy that loops *wait for a message → act on it → wait again*.

    - First turn, or after the action tools ran: call ``wait_tool`` (with ``wait_arguments``).
    - After ``wait_tool`` delivered messages: call ``on_message(payload)`` for each payload in
      order and answer with every tool call they return, in one reply (the server runs them
      in parallel). ``None`` ignores a payload; a ``str`` ends the run with that text.
    - A payload for which ``is_stop`` is true (by default ``{"_signal": "stop"}``) ends the run
      with ``stop_text``.
    - When a batch holds actions *and* an end (a stop signal or a text), the actions run
      first and the run ends on the next turn; payloads after the end are not looked at.

    Works with any number of concurrent runs: it reads the conversation from the request.
    It remembers, per delivered batch, how a batch ends until the next turn; if it is asked
    about a batch it has not seen (a new policy object mid-run) it calls ``on_message``
    again, so ``on_message`` should be a pure function of the payload. Thread-safe.
    - A request whose last tool output is a wait it already answered with actions (the same
      call) is the same turn asked again (a retried model task: answered the same way), or, when
      the prompt's tool-results digest lists results after that wait's, a history one turn behind
      (a Conductor cluster on Redis sometimes builds one): answered as the turn after those actions
      instead of asking for them again. A message delivered again by a *new* wait call is acted on
      again, so a duplicate delivery stays visible to the test.
    """
    return _ListenerPolicy(
        on_message=on_message,
        wait_tool=wait_tool,
        stop_text=stop_text,
        is_stop=is_stop,
        wait_arguments=dict(wait_arguments or {}),
    )


class _ListenerPolicy:
    """The callable :func:`listener_policy` returns. Thread-safe (a lock guards the memo)."""

    def __init__(
        self,
        *,
        on_message: OnMessage | None,
        wait_tool: str,
        stop_text: str,
        is_stop: Callable[[Any], bool],
        wait_arguments: dict[str, Any],
    ) -> None:
        if not isinstance(wait_tool, str) or not wait_tool:
            raise ScriptError(f"wait_tool must be a tool name, got {wait_tool!r}")
        if on_message is not None and not callable(on_message):
            raise ScriptError(f"on_message must be callable, got {type(on_message).__name__}")
        self._on_message = on_message
        self._wait_tool = wait_tool
        self._stop_text = stop_text
        self._is_stop = is_stop
        self._wait_call = ToolCall(wait_tool, wait_arguments)
        self._lock = threading.Lock()
        #: batch key → how that batch ends (text or None), kept until the turn after it.
        self._endings: dict[tuple[str, ...], str | None] = {}
        #: the wait calls answered with actions, most recent last (bounded).
        self._answered: collections.OrderedDict[tuple[str, ...], None] = collections.OrderedDict()

    def __call__(self, request: LLMRequest) -> Turn:
        turns = request.tool_output_turns
        if not turns:
            carried = request.carried_over  # a continued run begins with the messages handed over to it
            if carried is not None:
                return self._answer_batch([attrs.evolve(carried, name=self._wait_tool)])
            return self._wait_call
        if len(turns) == 1 and not self._waits(turns[0]):
            carried = request.carried_over  # the turn after acting on handed-over messages
            if carried is not None:
                ending = self._ending_of([attrs.evolve(carried, name=self._wait_tool)])
                if ending is not None:
                    return ending
        waits = self._waits(turns[-1])
        if waits and self._was_answered(waits) and self._acted_after_last_wait(request):
            # The history lags one turn: the actions asked for last time ran (the digest says so).
            _log.info("listener_policy: turn %d shows wait %s again, already acted on (history one turn "
                      "behind)", request.turn_index, ",".join(_call_key(waits)))
            ending = self._ending_of(waits)
            return ending if ending is not None else self._wait_call
        if waits:
            return self._answer_batch(waits)
        if len(turns) >= 2 and self._waits(turns[-2]):
            ending = self._ending_of(self._waits(turns[-2]))
            if ending is not None:
                return ending
        return self._wait_call

    def _waits(self, outputs: Sequence[ToolOutput]) -> list[ToolOutput]:
        return [o for o in outputs if o.name == self._wait_tool]

    def _answer_batch(self, waits: Sequence[ToolOutput]) -> Turn:
        calls, ending = self._plan(waits)
        if calls:
            with self._lock:
                self._endings[_batch_key(waits)] = ending
                self._answered[_call_key(waits)] = None
                if len(self._answered) > _ANSWERED_LIMIT:
                    self._answered.popitem(last=False)
            return list(calls)
        return ending if ending is not None else self._wait_call

    def _acted_after_last_wait(self, request: LLMRequest) -> bool:
        """Whether the prompt's tool-results digest (the run's results so far, kept by the server in
        the run's variables) lists results after the last wait's: then the actions answered for that
        wait ran, and a request showing the wait as its latest output was built from a history one
        turn behind. Without that proof (no digest, or the wait's entry is its last) the same turn is
        being asked again, as when the server retries the model's task: it gets the same answer."""
        entries = request.tool_results_digest
        if not entries:
            return False
        names = [e.get("name") if isinstance(e, Mapping) else None for e in entries]
        return self._wait_tool in names and names[-1] != self._wait_tool

    def _was_answered(self, waits: Sequence[ToolOutput]) -> bool:
        with self._lock:
            return _call_key(waits) in self._answered

    def _ending_of(self, waits: Sequence[ToolOutput]) -> str | None:
        key = _batch_key(waits)
        with self._lock:
            found = key in self._endings
            ending = self._endings.pop(key, None)
        if not found:
            return self._plan(waits)[1]
        return ending

    def _plan(self, waits: Sequence[ToolOutput]) -> tuple[list[ToolCall], str | None]:
        """The tool calls a batch asks for and the text it ends the run with (or None)."""
        calls: list[ToolCall] = []
        for wait in waits:
            for payload in wait.messages:
                if self._is_stop(payload):
                    return calls, self._stop_text
                result = None if self._on_message is None else self._on_message(payload)
                if result is None:
                    continue
                outcome = to_outcome(result)
                if isinstance(outcome, Failure):
                    raise ScriptError("on_message may not return a Failure; script failures with fail_next()")
                assert isinstance(outcome, Reply)
                if outcome.text is not None:
                    return calls, outcome.text
                calls.extend(outcome.tool_calls)
        return calls, None

    def __repr__(self) -> str:
        return f"listener_policy(wait_tool={self._wait_tool!r}, stop_text={self._stop_text!r})"


def _batch_key(waits: Sequence[ToolOutput]) -> tuple[str, ...]:
    """Identify a delivered batch by its message ids (unique on the server), else its call ids."""
    key: list[str] = []
    for wait in waits:
        envelopes = wait.output.get("messages", []) if isinstance(wait.output, Mapping) else []
        ids = [str(e.get("id")) for e in envelopes if isinstance(e, Mapping) and e.get("id")]
        key.extend(ids or [wait.call_id])
    return tuple(key)


def _call_key(waits: Sequence[ToolOutput]) -> tuple[str, ...]:
    """Identify the wait calls themselves (a message delivered again comes in a new call)."""
    return tuple(wait.call_id for wait in waits)
