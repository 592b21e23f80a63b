"""Turning replies and failures into Responses API JSON. Pure functions, no I/O."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from conductor_agents.testing._turns import Failure, Outcome, Reply, Usage

__all__ = ["error_body", "render"]

_DEFAULT_USAGE = Usage()


def render(outcome: Outcome, *, model: str, next_id: Callable[[], int], created_at: int) -> tuple[int, Any]:
    """The HTTP status and JSON body for ``outcome``.

    ``next_id`` hands out numbers unique within one ScriptedLLM; they become the response
    id (``resp_<n>``), item ids (``fc_<n>``, ``msg_<n>``) and generated call ids (``call_<n>``).
    """
    if isinstance(outcome, Failure):
        return outcome.status, outcome.body_or_default()
    return 200, _response(outcome, model=model, next_id=next_id, created_at=created_at)


def _response(reply: Reply, *, model: str, next_id: Callable[[], int], created_at: int) -> dict[str, Any]:
    if reply.text is not None:
        n = next_id()
        output = [
            {
                "type": "message",
                "id": f"msg_{n}",
                "status": "completed",
                "role": "assistant",
                "content": [{"type": "output_text", "text": reply.text, "annotations": []}],
            }
        ]
    else:
        output = []
        for call in reply.tool_calls:
            n = next_id()
            output.append(
                {
                    "type": "function_call",
                    "id": f"fc_{n}",
                    "call_id": call.call_id or f"call_{n}",
                    "name": call.name,
                    "arguments": json.dumps(call.arguments),
                    "status": "completed",
                }
            )
    return {
        "id": f"resp_{next_id()}",
        "object": "response",
        "created_at": created_at,
        "status": "completed",
        "model": model,
        "output": output,
        "usage": (reply.usage or _DEFAULT_USAGE).to_dict(),
    }


def error_body(message: str, *, kind: str = "invalid_request_error") -> dict[str, Any]:
    """An OpenAI-style error object."""
    return {"error": {"message": message, "type": kind, "param": None, "code": None}}
