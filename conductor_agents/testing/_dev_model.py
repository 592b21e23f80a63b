"""The scripted model of ``conductor-agents server start --scripted-model``: a ScriptedLLM in a process of its own.

A newcomer with no model key drives the samples and their own agents from the shell with it: the server's
OpenAI and Anthropic providers point at this process, and every agent whose model is ``openai/scripted``, or
the README's and the samples' default ``anthropic/claude-sonnet-4-6`` (:data:`DEFAULT_MODEL`), gets
:class:`DevModel`'s answers (any other model name is refused as a provider refuses a model it does not
have, HTTP 404 naming the models it answers, and logged as an anomaly: the run's ``wait()`` raises
``ModelUnavailableError``). Run as ``python -m conductor_agents.testing._dev_model --ready-file PATH``: once
it listens it writes to ``PATH`` (JSON) its port, the model name and the environment a server needs to call
it, and it serves until SIGTERM or SIGINT.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from conductor_agents.testing._llm_request import LLMRequest
from conductor_agents.testing._policies import listener_policy
from conductor_agents.testing._scripted_llm import ScriptedLLM
from conductor_agents.testing._turns import ToolCall, Turn

__all__ = ["DEFAULT_MODEL", "DEV_MODEL", "DevModel", "main"]

#: The model name the dev server's scripted model answers (``openai/`` + this).
DEV_MODEL = "scripted"
#: The model the README and the samples fall back to without ``CONDUCTOR_AGENT_MODEL``: answered offline too.
DEFAULT_MODEL = "anthropic/claude-sonnet-4-6"

_log = logging.getLogger("conductor_agents.testing")
_current = threading.local()  # the request being answered (a policy's on_message sees only the payload)


class DevModel:
    """What the scripted model does, for any agent. Thread-safe (state per wait tool, behind listener_policy's lock).

    - A **listener** (one of its tools is named like ``wait_for_message``): it waits for a message, and for
      ``{"action": "generate-report", "topic": "sales"}`` calls the tool ``generate_report(topic="sales")``
      (the action with ``-`` as ``_``, the other keys as arguments) when the agent has that tool; other
      messages are read and left alone; ``stop()`` ends the run.
    - **Any other agent** answers its prompt at once: ``Scripted answer to: <prompt>``.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._listeners: dict[str, Any] = {}

    def __call__(self, request: LLMRequest) -> Turn:
        wait_tool = _wait_tool(request)
        if wait_tool is None:
            return f"Scripted answer to: {request.prompt}"
        with self._lock:
            policy = self._listeners.get(wait_tool)
            if policy is None:
                policy = self._listeners[wait_tool] = listener_policy(_act, wait_tool=wait_tool)
        _current.tools = set(request.tools)
        try:
            return policy(request)
        finally:
            _current.tools = set()

    def __repr__(self) -> str:
        return "DevModel()"


def _wait_tool(request: LLMRequest) -> str | None:
    """The agent's wait-for-message tool: one whose output was a message batch, else one named like it."""
    for output in request.all_tool_outputs:
        if output.messages or (isinstance(output.output, Mapping) and "messages" in output.output):
            return output.name
    named = [name for name in request.tools if "wait" in name.lower() and "message" in name.lower()]
    return named[0] if named else None


def _act(payload: Any) -> ToolCall | None:
    """``{"action": "generate-report", ...}`` → ``generate_report(...)`` when the agent has that tool."""
    if not isinstance(payload, Mapping) or not isinstance(payload.get("action"), str):
        return None
    name = payload["action"].strip().replace("-", "_").replace(" ", "_")
    if name not in getattr(_current, "tools", ()):
        _log.info("scripted model: no tool %r for the message %s; left alone", name, json.dumps(payload)[:200])
        return None
    return ToolCall(name, {key: value for key, value in payload.items() if key != "action"})


def main(argv: list[Any] | None = None) -> int:
    """Serve the scripted model until SIGTERM/SIGINT; write where it is to ``--ready-file`` once listening."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ready-file", type=Path, required=True,
                        help="where to write the port, model and server environment (JSON) once listening")
    parser.add_argument("--port", type=int, default=0, help="port on 127.0.0.1 (default: a free one)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", stream=sys.stderr)
    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())
    with ScriptedLLM(port=args.port) as llm:
        dev = DevModel()
        model = llm.script(model=DEV_MODEL, policy=dev)
        llm.script(model=DEFAULT_MODEL.split("/", 1)[1], policy=dev)
        partial = args.ready_file.with_suffix(".partial")
        partial.write_text(json.dumps({"port": llm.port, "model": model, "server_env": llm.server_env()}))
        os.replace(partial, args.ready_file)
        _log.info("scripted model openai/%s at %s", DEV_MODEL, llm.base_url)
        while not done.wait(1.0):
            pass
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
