"""The scripted model behind Anthropic's Messages API: requests read as the Responses API's, answers written back.

The server (3.32.3) calls ``POST {ANTHROPIC_BASE_URL}/v1/messages`` for an ``anthropic/...`` model. So that
``anthropic/`` models (the samples' and the README's default, ``anthropic/claude-sonnet-4-6``) can be scripted
too, a Messages request is turned into the Responses API body :class:`LLMRequest` reads (``system`` as the
instructions; ``tool_use`` blocks as ``function_call`` items, ``tool_result`` blocks as
``function_call_output`` items, text as messages, in order), and the outcome is written as a Messages
answer (a ``text`` or ``tool_use`` content block, or an Anthropic error object). Pure functions, no I/O.

Observed with 3.32.3: the server sends an Anthropic model no ``tool_use``/``tool_result`` history, only the
digest of the run's tool results at the head of the user message (``[TOOL RESULTS] [{"output": ...,
"name": ...}, ...] [/TOOL RESULTS]``). When there are no result blocks, each digest entry is read as one
turn's call (its arguments unknown: ``{}``) and output, oldest first; so ``tool_outputs`` is the newest
result and a listener's policy sees the messages its wait tool returned last (a digest the server cut short
does not parse: no outputs).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from typing import Any

from conductor_agents.testing._turns import Failure, Outcome, Usage

__all__ = ["render_message", "responses_body"]

_DEFAULT_USAGE = Usage()
#: The server's digest of the run's tool results, after its standing signal (if any) in the user message.
_DIGEST = re.compile(r"\A(?:\[SIGNALS\].*?\[/SIGNALS\]\s*)?\[TOOL RESULTS\](.*?)\[/TOOL RESULTS\]", re.DOTALL)


def responses_body(body: Mapping[str, Any]) -> dict[str, Any]:
    """The Responses API body saying what the Messages API ``body`` says (model, instructions, input, tools)."""
    items: list[dict[str, Any]] = []
    for message in body.get("messages") or ():
        if not isinstance(message, Mapping):
            continue
        role = str(message.get("role") or "user")
        content = message.get("content")
        if isinstance(content, str):
            items.append({"type": "message", "role": role, "content": content})
            continue
        for block in content if isinstance(content, list) else ():
            item = _item(role, block) if isinstance(block, Mapping) else None
            if item is not None:
                items.append(item)
    if not any(item["type"] == "function_call_output" for item in items):
        items.extend(_from_digest(items))
    tools = [{"type": "function", "name": tool.get("name"), "description": tool.get("description", ""),
              "parameters": tool.get("input_schema") or {}}
             for tool in body.get("tools") or () if isinstance(tool, Mapping) and tool.get("name")]
    return {"model": body.get("model") or "", "instructions": _text(body.get("system")) or None,
            "input": items, "tools": tools}


def _item(role: str, block: Mapping[str, Any]) -> dict[str, Any] | None:
    kind = block.get("type")
    if kind == "text":
        return {"type": "message", "role": role, "content": str(block.get("text") or "")}
    if kind == "tool_use":
        return {"type": "function_call", "call_id": str(block.get("id") or ""), "name": str(block.get("name") or ""),
                "arguments": json.dumps(block.get("input") or {})}
    if kind == "tool_result":
        return {"type": "function_call_output", "call_id": str(block.get("tool_use_id") or ""),
                "output": _text(block.get("content"))}
    return None


def _from_digest(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A call and an output item for each entry of the tool-results digest heading the first user message."""
    first = next((item["content"] for item in items if item["type"] == "message" and item["role"] == "user"), "")
    match = _DIGEST.match(first)
    try:
        entries = json.loads(match.group(1)) if match else []
    except ValueError:
        return []
    found: list[dict[str, Any]] = []
    for number, entry in enumerate(entries if isinstance(entries, list) else ()):
        if isinstance(entry, Mapping) and entry.get("name"):
            call_id = f"digest_{number}"
            found.append({"type": "function_call", "call_id": call_id, "name": str(entry["name"]), "arguments": "{}"})
            found.append({"type": "function_call_output", "call_id": call_id,
                          "output": json.dumps(entry.get("output"))})
    return found


def _text(content: Any) -> str:
    """A string, or the text of a list of content blocks (joined by newlines)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(str(part.get("text") or "") for part in content
                         if isinstance(part, Mapping) and part.get("type") == "text")
    return ""


def render_message(outcome: Outcome, *, model: str, next_id: Callable[[], int]) -> tuple[int, Any]:
    """The HTTP status and Messages API JSON for ``outcome`` (ids from ``next_id``, as the Responses wire's)."""
    if isinstance(outcome, Failure):
        body = outcome.body_or_default()
        error = body.get("error") if isinstance(body, Mapping) else None
        if isinstance(error, Mapping):  # an OpenAI-style error object: Anthropic's shape, same words
            body = {"type": "error", "error": {"type": str(error.get("type") or "api_error"),
                                               "message": str(error.get("message") or "")}}
        return outcome.status, body
    if outcome.text is not None:
        content: list[dict[str, Any]] = [{"type": "text", "text": outcome.text}]
    else:
        content = [{"type": "tool_use", "id": call.call_id or f"toolu_{next_id()}", "name": call.name,
                    "input": dict(call.arguments)} for call in outcome.tool_calls]
    usage = outcome.usage or _DEFAULT_USAGE
    return 200, {"id": f"msg_{next_id()}", "type": "message", "role": "assistant", "model": model,
                 "content": content, "stop_reason": "end_turn" if outcome.text is not None else "tool_use",
                 "stop_sequence": None,
                 "usage": {"input_tokens": usage.input_tokens, "output_tokens": usage.output_tokens}}
