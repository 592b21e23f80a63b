"""What a continued listener's new run is told, and the record that commits a switch (pure; no I/O).

When link *n* of a listener is continued by link *n+1*, whoever completes the switch reads link
*n*'s final state (its last model turn, the tasks after it, its variables) and turns it into a
:class:`CommitRecord`, written as the output of link *n+1*'s carry task (see :mod:`conductor_agents._listener.switch`):

- ``text``: what the new run's model sees before its first turn (the server puts the carry task's
  ``result`` into the system prompt as "pre-loaded context"): a compact record of the older
  conversation, its last exchanges verbatim, and the messages that reached link *n* but not its
  model (``pending``: act on them first);
- ``pulled``: the id of every message link *n* pulled from its queue. A sender whose message link *n*
  accepted knows from it whether the message reached the listener (acted on, or pending) or was
  dropped with link *n*'s queue (then it sends it again to the new run);
- running totals: turns, messages, runs, model tokens, and the compact record carried forward. They
  are the listener's totals up to the continued link, so they outlive the links retention removes.

Every process computes the same record from the same final state; the first one written wins.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import attrs

from .._common.task_names import MODEL_TASK_TYPE, is_message_wait
from ..continuation import CarryOver, Continuation
from ..result import TokenUsage, is_control_message

__all__ = ["CommitRecord", "PENDING_CLOSE", "PENDING_OPEN", "build_record", "pulled_message_ids", "senders_messages"]

#: The markers around the pending messages in the text (JSON between them, the shape a
#: wait-for-message tool returns), so that a program playing the model can find them.
PENDING_OPEN = "<conductor-agents-pending>"
PENDING_CLOSE = "</conductor-agents-pending>"

_RECORD_KEY = "conductor_agents"
_VERSION = 1
#: Longest line of the compact record, per conversation item.
_LINE_CHARS = 200
_LLM = MODEL_TASK_TYPE
_SERVER_INPUT_KEYS = frozenset({"method", "_agent_state", "_agent_tool_name"})


@attrs.frozen
class CommitRecord:
    """The outcome of a switch, as written to the new link's carry task."""

    text: str
    previous: str  # the execution id of the link that was continued
    link: int  # the new link's number
    pulled: tuple[str, ...] = ()
    pending: tuple[dict[str, Any], ...] = ()
    turns: int = 0  # model turns of every link up to and including the continued one
    messages: int = 0  # messages pulled by every link up to and including the continued one
    record: str = ""  # the compact record, carried forward
    #: Model tokens of every link up to and including the continued one.
    tokens: TokenUsage = attrs.field(factory=TokenUsage)

    def to_output(self) -> dict[str, Any]:
        """The carry task's output: ``result`` for the model, the rest for the SDK."""
        return {
            "result": self.text,
            _RECORD_KEY: {
                "v": _VERSION, "previous": self.previous, "link": self.link, "pulled": list(self.pulled),
                "pending": list(self.pending), "turns": self.turns, "messages": self.messages,
                "record": self.record,
                "tokens": {"promptTokens": self.tokens.prompt_tokens,
                           "completionTokens": self.tokens.completion_tokens,
                           "totalTokens": self.tokens.total_tokens},
            },
        }

    @classmethod
    def from_output(cls, output: Mapping[str, Any] | None) -> CommitRecord | None:
        """The record in a carry task's output, or None when it holds none (not ours, or garbled)."""
        data = (output or {}).get(_RECORD_KEY)
        if not isinstance(data, Mapping) or data.get("v") != _VERSION:
            return None
        try:
            return cls(
                text=str((output or {}).get("result") or ""), previous=str(data["previous"]), link=int(data["link"]),
                pulled=tuple(str(i) for i in data.get("pulled") or ()),
                pending=tuple(p for p in data.get("pending") or () if isinstance(p, dict)),
                turns=int(data.get("turns") or 0), messages=int(data.get("messages") or 0),
                record=str(data.get("record") or ""),
                tokens=TokenUsage.from_dict(data.get("tokens") if isinstance(data.get("tokens"), Mapping) else None),
            )
        except (KeyError, TypeError, ValueError):
            return None


def _envelopes(output: Any) -> list[dict[str, Any]]:
    if not isinstance(output, Mapping) or not isinstance(output.get("messages"), list):
        return []
    return [m for m in output["messages"] if isinstance(m, dict) and m.get("id")]


def _pulled(variables: Mapping[str, Any], tasks: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Every message a run pulled, by id, in order: its tool-results digest (the results up to its last
    turn) and the wait-for-message tasks among ``tasks`` (the ones after it)."""
    seen: dict[str, dict[str, Any]] = {}
    for entry in variables.get("_last_tool_results") or ():
        if isinstance(entry, Mapping):
            for envelope in _envelopes(entry.get("output")):
                seen.setdefault(str(envelope["id"]), envelope)
    for task in tasks:
        if is_message_wait(task):
            for envelope in _envelopes(task.get("outputData")):
                seen.setdefault(str(envelope["id"]), envelope)
    return seen


def pulled_message_ids(variables: Mapping[str, Any], tasks: Iterable[Mapping[str, Any]]) -> list[str]:
    """Every message id a run pulled (the SDK's control messages too: a sender of one may ask whether it
    arrived): see :func:`_pulled`."""
    return list(_pulled(variables, tasks))


def senders_messages(variables: Mapping[str, Any], tasks: Iterable[Mapping[str, Any]]) -> int:
    """How many messages a run pulled that senders sent: the SDK's own control messages (the stop signal)
    are not counted (``ListenerTotals.messages``)."""
    return sum(1 for envelope in _pulled(variables, tasks).values()
               if not is_control_message(envelope.get("payload")))


def _clean_arguments(arguments: Any) -> Any:
    if isinstance(arguments, Mapping):
        return {k: v for k, v in arguments.items() if k not in _SERVER_INPUT_KEYS}
    return arguments


def _dump(value: Any) -> str:
    try:
        return json.dumps(value, ensure_ascii=False, sort_keys=True, default=str)
    except (TypeError, ValueError):
        return str(value)


def _call_text(call: Mapping[str, Any]) -> str:
    arguments = _clean_arguments(call.get("inputParameters") or {})
    return f"{call.get('name')}({_dump(arguments) if arguments else ''})"


def _result_text(name: Any, output: Any) -> str:
    if isinstance(output, str):
        with contextlib.suppress(ValueError):
            output = json.loads(output)
    envelopes = _envelopes(output)
    if envelopes:  # a wait-for-message result: the messages' payloads are what matters
        return f"{name} -> messages {_dump([e.get('payload') for e in envelopes])}"
    return f"{name} -> {_dump(output)}"


def _items_of_message(message: Mapping[str, Any]) -> list[dict[str, Any]]:
    role = message.get("role")
    calls = message.get("toolCalls") or ()
    if role == "tool_call":
        return [{"role": "tool_call", "name": str(c.get("name")), "text": _call_text(c)}
                for c in calls if isinstance(c, Mapping)]
    if role == "tool":
        items = []
        for call in calls:
            if isinstance(call, Mapping):
                output = call.get("output")
                if output is None:
                    output = message.get("message")
                items.append({"role": "tool", "name": str(call.get("name")),
                              "text": _result_text(call.get("name"), output)})
        if not items and message.get("message"):
            items.append({"role": "tool", "name": "", "text": str(message.get("message"))})
        return items
    if role == "assistant" and message.get("message"):
        return [{"role": "assistant", "name": "", "text": str(message.get("message"))}]
    return []  # system (the instructions, an earlier carry-over) and user (the prompt, the digest)


def conversation(last_llm: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    """The conversation items of a run up to and including its last model turn.

    The server writes the whole conversation so far into every model call's input (``messages``);
    the call's output is the turn itself.
    """
    if last_llm is None:
        return []
    items: list[dict[str, Any]] = []
    for message in (last_llm.get("inputData") or {}).get("messages") or ():
        if isinstance(message, Mapping):
            items.extend(_items_of_message(message))
    output = last_llm.get("outputData") or {}
    items.extend({"role": "tool_call", "name": str(call.get("name")), "text": _call_text(call)}
                 for call in output.get("toolCalls") or () if isinstance(call, Mapping))
    result = output.get("result")
    if isinstance(result, str) and result.strip():
        items.append({"role": "assistant", "name": "", "text": result})
    return items


def pending_messages(last_llm: Mapping[str, Any] | None, tail: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Messages pulled after the run's last finished model turn: no model saw them."""
    after = int(last_llm.get("seq") or 0) if last_llm is not None else -1
    pending: list[dict[str, Any]] = []
    for task in sorted(tail, key=lambda t: int(t.get("seq") or 0)):
        if is_message_wait(task) and task.get("status") == "COMPLETED" and int(task.get("seq") or 0) > after:
            pending.extend(_envelopes(task.get("outputData")))
    return pending


def _record_lines(record: str, items: Sequence[Mapping[str, Any]], limit: int) -> str:
    """The compact record: one line per older item, the newest kept within ``limit`` characters."""
    lines = [line for line in record.splitlines() if line and not line.startswith("(")]
    omitted = 0
    for line in record.splitlines():
        if line.startswith("(") and line.endswith("earlier items omitted)"):
            with contextlib.suppress(ValueError):
                omitted += int(line[1:].split()[0])
    for item in items:
        text = " ".join(str(item.get("text") or "").split())
        if len(text) > _LINE_CHARS:
            text = text[: _LINE_CHARS - 1] + "…"
        lines.append(f"- [{item.get('role')}] {text}")
    kept: list[str] = []
    size = 0
    for line in reversed(lines):
        if size + len(line) + 1 > limit:
            break
        kept.append(line)
        size += len(line) + 1
    omitted += len(lines) - len(kept)
    kept.reverse()
    if omitted and limit:
        kept.insert(0, f"({omitted} earlier items omitted)")
    return "\n".join(kept)


def default_text(carry: CarryOver, record: str) -> str:
    """The text a continued run's model is given by default (see ``docs/concepts.md``)."""
    parts = [(
        f"You are continuing an earlier conversation. This listener is on run {carry.runs} (it has taken "
        f"{carry.turns} model turns and received {carry.messages_handled} messages so far); it moved to a "
        "fresh run only to keep the server's records small. Nothing was lost, and your tools are the same."
    )]
    if record:
        parts.append("Earlier in the conversation, in short (oldest first):\n" + record)
    kept = carry.exchanges[len(carry.exchanges) - carry.kept:] if carry.kept else ()
    if kept:
        parts.append("The last items of the conversation, verbatim (oldest first):\n"
                     + "\n".join(f"[{item.get('role')}] {item.get('text')}" for item in kept))
    if carry.pending:
        block = json.dumps({"messages": list(carry.pending), "count": len(carry.pending)}, ensure_ascii=False)
        parts.append(
            "These messages reached the earlier run, but you have not acted on them yet. Act on each of them "
            "first, in order, exactly as if your wait tool had just returned them; then go on as before:\n"
            f"{PENDING_OPEN}\n{block}\n{PENDING_CLOSE}")
    parts.append("Carry on as your instructions say.")
    return "\n\n".join(parts)


def build_record(
    *,
    continuation: Continuation,
    prompt: str,
    previous_id: str,
    new_link: int,
    earlier: CommitRecord | None,
    last_llm: Mapping[str, Any] | None,
    tail: Sequence[Mapping[str, Any]],
    variables: Mapping[str, Any],
    tokens: TokenUsage | None = None,
) -> CommitRecord:
    """The commit record of continuing run ``previous_id`` (link ``new_link - 1``) as link ``new_link``."""
    items = conversation(last_llm)
    pending = pending_messages(last_llm, tail)
    pulled = pulled_message_ids(variables, tail)
    turns = (earlier.turns if earlier else 0) + int((last_llm or {}).get("iteration") or 0)
    # Every message a link pulled counts once: a pending one is acted on by the next link, which does
    # not pull it again. The SDK's own control messages are no sender's: not counted.
    messages = (earlier.messages if earlier else 0) + senders_messages(variables, tail)
    kept = min(continuation.keep_exchanges, len(items))
    # The record logs every item so far (carried forward link to link); the text shows it without
    # the last ``kept`` lines, which it gives verbatim instead.
    record = _record_lines(earlier.record if earlier else "", items, continuation.record_chars)
    shown = record.splitlines()
    if kept:
        shown = shown[:-kept] if len(shown) > kept else [line for line in shown if line.startswith("(")]
    carry = CarryOver(prompt=prompt, exchanges=tuple(items), kept=kept, pending=tuple(pending), runs=new_link + 1,
                      turns=turns, messages_handled=messages)
    text = continuation.carry(carry) if continuation.carry is not None else default_text(carry, "\n".join(shown))
    return CommitRecord(text=str(text), previous=previous_id, link=new_link, pulled=tuple(pulled),
                        pending=tuple(pending), turns=turns, messages=messages, record=record,
                        tokens=add_tokens(earlier.tokens if earlier else None, tokens))


def add_tokens(*usages: TokenUsage | None) -> TokenUsage:
    """The sum of token counts (None counts as nothing)."""
    present = [u for u in usages if u is not None]
    return TokenUsage(prompt_tokens=sum(u.prompt_tokens for u in present),
                      completion_tokens=sum(u.completion_tokens for u in present),
                      total_tokens=sum(u.total_tokens for u in present))
