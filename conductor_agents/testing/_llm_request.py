"""What the Conductor server sent: a parsed Responses API request and its tool outputs.

How the server writes the conversation (observed with Conductor 3.32.3): ``input`` always
carries the whole history. The first user message comes first (from the second turn on,
prefixed with a ``[TOOL RESULTS] ... [/TOOL RESULTS]`` digest), then, for every earlier
model turn, its ``function_call`` items followed by their ``function_call_output`` items,
then a closing user message ("Please continue where you left off."). The server renames
call ids to ``<call_id>_<index>`` and adds ``method`` (the tool name) to the arguments.

So "this turn's" tool outputs are those of the last calls/outputs block, and a policy can
stay stateless: everything it needs is in the request.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from conductor_agents._common.task_names import CARRY_TASK
from conductor_agents._listener.carryover import PENDING_CLOSE, PENDING_OPEN

#: How the server heads the carried-over conversation in a continued run's system prompt.
CARRY_HEADING = f"## {CARRY_TASK}"

__all__ = ["LLMRequest", "ToolOutput", "is_message_batch"]

#: The run's standing signal the server puts first in the user message (``signal()``), when it has one.
_SIGNALS = re.compile(r"\A\[SIGNALS\]\n(.*?)\n\[/SIGNALS\]\s*", re.DOTALL)
_DIGEST = re.compile(r"\A\[TOOL RESULTS\](.*?)\[/TOOL RESULTS\]\s*", re.DOTALL)
#: The run's context block the server puts before the prompt (after the digest), when it has one.
_CONTEXT = re.compile(r"\AContext:\n```json\n(.*?)\n```\s*", re.DOTALL)
#: The line the server adds to the instructions after an approval with a reason or extra fields.
_FEEDBACK = re.compile(r"^Human reviewer feedback:\s*(.*)$", re.MULTILINE)


@attrs.frozen
class ToolOutput:
    """A tool's result as the model sees it, paired with the call that asked for it.

    ``arguments`` are the call's arguments as a dict, without the ``method`` key the server
    adds when it is just the tool name. ``output`` is parsed from JSON when it is JSON (the
    server sends the tool's whole output map), otherwise the raw string. ``name`` is
    ``None`` only if the server sent an output with no matching call.
    """

    name: str | None
    call_id: str
    arguments: dict[str, Any] = attrs.field(factory=dict, hash=False)
    output: Any = attrs.field(default=None, hash=False)

    @property
    def rejected(self) -> bool:
        """Whether a person rejected this call (the SDK reported the rejection instead of running it)."""
        return isinstance(self.output, Mapping) and self.output.get("rejected") is True

    @property
    def rejection_reason(self) -> str | None:
        """The reason a person gave for rejecting this call (None when it was not rejected)."""
        return str(self.output.get("reason")) if self.rejected else None

    @property
    def answer(self) -> Any:
        """A person's answer, when this is the output of a ``HumanTool`` call (else None)."""
        return self.output.get("answer") if isinstance(self.output, Mapping) else None

    @property
    def messages(self) -> list[Any]:
        """The message payloads in this output if it is a wait-for-message result, else ``[]``."""
        if not is_message_batch(self.output):
            return []
        return [m["payload"] for m in self.output["messages"] if isinstance(m, Mapping) and "payload" in m]


def is_message_batch(output: Any) -> bool:
    """True when ``output`` looks like a wait-for-message result ``{messages: [...], count}``."""
    return isinstance(output, Mapping) and isinstance(output.get("messages"), list)


def _loads(value: Any) -> Any:
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except ValueError:
        return value


def _arguments(call: Mapping[str, Any]) -> dict[str, Any]:
    parsed = _loads(call.get("arguments"))
    if not isinstance(parsed, dict):
        return {}
    if parsed.get("method") == call.get("name"):
        parsed = {k: v for k, v in parsed.items() if k != "method"}
    return parsed


def _text_of(content: Any) -> str:
    """The text of a message ``content``: a string, or a list of text parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [p.get("text", "") for p in content if isinstance(p, Mapping)]
        return "".join(p for p in parts if isinstance(p, str))
    return ""


def _blocks(items: Sequence[Any]) -> list[tuple[list[Mapping[str, Any]], list[Mapping[str, Any]]]]:
    """Split ``input`` into model turns: each is (its function_calls, their outputs).

    A function_call that follows an output starts a new turn; messages are skipped.
    """
    blocks: list[tuple[list[Mapping[str, Any]], list[Mapping[str, Any]]]] = []
    for item in items:
        if not isinstance(item, Mapping):
            continue
        kind = item.get("type")
        if kind == "function_call":
            if not blocks or blocks[-1][1]:
                blocks.append(([], []))
            blocks[-1][0].append(item)
        elif kind == "function_call_output":
            if not blocks:
                blocks.append(([], []))
            blocks[-1][1].append(item)
    return blocks


def _pair(calls: Sequence[Mapping[str, Any]], outputs: Sequence[Mapping[str, Any]],
          every_call: Mapping[str, Mapping[str, Any]]) -> tuple[ToolOutput, ...]:
    by_id = {c.get("call_id"): c for c in calls}
    paired = []
    for out in outputs:
        call_id = str(out.get("call_id", ""))
        call = by_id.get(call_id) or every_call.get(call_id) or {}
        paired.append(
            ToolOutput(
                name=call.get("name"),
                call_id=call_id,
                arguments=_arguments(call) if call else {},
                output=_loads(out.get("output")),
            )
        )
    return tuple(paired)


@attrs.frozen(eq=False)
class LLMRequest:
    """One request the server made to the fake model, parsed for assertions and policies.

    ``model`` is the bare model name (without ``openai/``), ``input`` the raw input items,
    ``tools`` the names of the tools offered, ``body`` the raw JSON body, ``received_at``
    wall-clock seconds. Instances compare by identity. Immutable apart from the raw dicts
    it exposes (do not modify them); safe to read from any thread.
    """

    model: str
    instructions: str | None
    input: tuple[Any, ...]
    tools: tuple[str, ...]
    body: dict[str, Any]
    received_at: float
    path: str = "/v1/responses"

    @classmethod
    def from_body(cls, body: Mapping[str, Any], *, received_at: float, path: str = "/v1/responses") -> LLMRequest:
        """Parse a Responses API request body. Tolerates missing or odd fields."""
        raw_input = body.get("input")
        if isinstance(raw_input, str):
            items: tuple[Any, ...] = ({"type": "message", "role": "user", "content": raw_input},)
        elif isinstance(raw_input, list):
            items = tuple(raw_input)
        else:
            items = ()
        tools = tuple(
            str(t.get("name") or t.get("type"))
            for t in body.get("tools") or ()
            if isinstance(t, Mapping) and (t.get("name") or t.get("type"))
        )
        instructions = body.get("instructions")
        return cls(
            model=str(body.get("model") or ""),
            instructions=instructions if isinstance(instructions, str) else None,
            input=items,
            tools=tools,
            body=dict(body),
            received_at=received_at,
            path=path,
        )

    # --- the conversation --------------------------------------------------------

    @property
    def is_first_turn(self) -> bool:
        """True when no tool has run yet in this conversation."""
        return not any(isinstance(i, Mapping) and i.get("type") == "function_call_output" for i in self.input)

    @property
    def turn_index(self) -> int:
        """How many tool-calling turns came before this request (0 on the first turn).

        Computed from the history the server sends, so it is per run, not per model:
        a stateless policy can use it even when several runs share one model.
        """
        return sum(1 for _, outputs in _blocks(self.input) if outputs)

    @property
    def tool_output_turns(self) -> tuple[tuple[ToolOutput, ...], ...]:
        """Every tool output in the conversation, grouped by the model turn that asked for it, oldest first."""
        every = self._calls_by_id()
        return tuple(_pair(calls, outputs, every) for calls, outputs in _blocks(self.input) if outputs)

    @property
    def tool_outputs(self) -> tuple[ToolOutput, ...]:
        """The outputs of the tools the model called in its previous turn, in order."""
        turns = self.tool_output_turns
        return turns[-1] if turns else ()

    @property
    def all_tool_outputs(self) -> tuple[ToolOutput, ...]:
        """Every tool output in the conversation so far, oldest first."""
        return tuple(out for turn in self.tool_output_turns for out in turn)

    @property
    def messages(self) -> list[Any]:
        """The payloads of the messages delivered by wait-for-message tools in the previous turn.

        In delivery order, across every wait output of the turn (there may be several
        messages per output when the tool's batch size is above 1).
        """
        payloads: list[Any] = []
        for out in self.tool_outputs:
            payloads.extend(out.messages)
        return payloads

    @property
    def user_text(self) -> str:
        """The text of every user message in ``input``, joined by newlines (raw, digest included)."""
        return "\n".join(
            _text_of(i.get("content"))
            for i in self.input
            if isinstance(i, Mapping) and i.get("type", "message") == "message" and i.get("role") == "user"
        )

    @property
    def prompt(self) -> str:
        """The run's prompt: the first user message without the server's tool-results digest and
        context block."""
        return _CONTEXT.sub("", _DIGEST.sub("", self._after_signals(), count=1), count=1)

    @property
    def context(self) -> dict[str, Any] | None:
        """The run's context as the server showed it to the model (each value as text), or None
        when it showed none."""
        match = _CONTEXT.match(_DIGEST.sub("", self._after_signals(), count=1))
        if match is None:
            return None
        try:
            parsed = json.loads(match.group(1))
        except ValueError:
            return None
        return parsed if isinstance(parsed, dict) else None

    @property
    def media(self) -> list[str]:
        """The media attached to the first user message (``image_url``/``file_url`` of its parts;
        the server inlines downloads as ``data:`` URLs)."""
        for item in self.input:
            if isinstance(item, Mapping) and item.get("type", "message") == "message" and item.get("role") == "user":
                content = item.get("content")
                if not isinstance(content, list):
                    return []
                return [str(p.get("image_url") or p.get("file_url") or p.get("file_data")) for p in content
                        if isinstance(p, Mapping) and p.get("type") in ("input_image", "input_file")]
        return []

    @property
    def human_feedback(self) -> str | None:
        """What the server told the model about the latest approval (its reason and extra fields),
        from the instructions; None when there is none."""
        found = _FEEDBACK.findall(self.instructions or "")
        return found[-1].strip() if found else None

    @property
    def tool_results_digest(self) -> list[Any] | None:
        """The server's digest of the run's tool results at the head of the first user message
        (``[{"output": ..., "name": ...}, ...]``, kept from the run's variables), or None when
        there is none or it does not parse (the server cuts a long one short)."""
        match = _DIGEST.match(self._after_signals())
        if match is None:
            return None
        try:
            entries = json.loads(match.group(1))
        except ValueError:
            return None
        return entries if isinstance(entries, list) else None

    @property
    def carried_over(self) -> ToolOutput | None:
        """The messages a continued listener's run was handed over unanswered (see
        ``docs/concepts.md``, *Long-lived listeners*), as a wait-for-message output, or None.

        They sit in the system prompt of every turn of that run, between the SDK's markers; a
        model acts on them in the run's first turn, as if its wait tool had just returned them.
        """
        text = self.instructions or ""
        start, end = text.find(PENDING_OPEN), text.find(PENDING_CLOSE)
        if start < 0 or end < start:
            return None
        batch = _loads(text[start + len(PENDING_OPEN):end].strip())
        if not is_message_batch(batch):
            return None
        ids = [str(m.get("id")) for m in batch["messages"] if isinstance(m, Mapping)]
        return ToolOutput(name=None, call_id="carried:" + ",".join(ids), arguments={}, output=batch)

    @property
    def is_continuation(self) -> bool:
        """Whether this run continues an earlier run of a listener (its system prompt says so)."""
        return CARRY_HEADING in (self.instructions or "")

    @property
    def signal(self) -> str | None:
        """The run's standing signal as the server showed it to the model (``AgentHandle.signal``), or None."""
        match = _SIGNALS.match(self._first_user_text())
        return match.group(1) if match else None

    def _after_signals(self) -> str:
        return _SIGNALS.sub("", self._first_user_text(), count=1)

    def _first_user_text(self) -> str:
        for item in self.input:
            if isinstance(item, Mapping) and item.get("type", "message") == "message" and item.get("role") == "user":
                return _text_of(item.get("content"))
        return ""

    def _calls_by_id(self) -> dict[str, Any]:
        return {
            i["call_id"]: i
            for i in self.input
            # only a string id is ever looked up (an output's call_id, as a string)
            if isinstance(i, Mapping) and i.get("type") == "function_call" and isinstance(i.get("call_id"), str)
        }
