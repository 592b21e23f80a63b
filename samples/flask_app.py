"""Stateful listeners behind a small Flask API.

One :class:`AgentRuntime` per process, kept at module level and shared by every request
(it is thread-safe). Each listener's tools run in this process, on its own ``ActionTools``
instance, so ``GET /listeners/<id>`` can show state the tools built up.

    POST /listeners                     start a listener          -> 201 {"execution_id", ...}
    POST /listeners/<id>/messages       send it a JSON message    -> 202 {"message_id"}
    GET  /listeners/<id>                its status, reports, stall -> 200
    POST /listeners/<id>/stop           stop it and wait (<= 30 s) -> 200 {"status", "output", ...}

Run it offline (a real Conductor server on this machine, with a scripted model):

    pip install 'conductor-agents[samples]'
    python samples/flask_app.py                     # http://127.0.0.1:5000
    curl -X POST localhost:5000/listeners
    curl -X POST localhost:5000/listeners/ID/messages -H 'content-type: application/json' \\
         -d '{"action": "generate-report", "topic": "sales"}'
    curl localhost:5000/listeners/ID
    curl -X POST localhost:5000/listeners/ID/stop

Or against your own server and a real model:

    CONDUCTOR_SERVER_URL=http://localhost:8080/api CONDUCTOR_AGENT_MODEL=anthropic/claude-sonnet-4-6 \\
        flask --app samples/flask_app.py run

Run a single process (``flask run``, or gunicorn with one worker and threads): a
listener's tools run in the process that started it, and its handle lives there too.
"""

from __future__ import annotations

import argparse
import atexit
import logging
import os
import threading
from typing import Any, Dict, Optional, Tuple

from flask import Flask, jsonify, request

from conductor_agents import (
    Agent,
    AgentHandle,
    AgentRuntime,
    ExecutionNotRunningError,
    ToolRegistry,
    WaitForMessageTool,
    WaitTimeoutError,
    tool,
)

STOP_TIMEOUT = 30.0


class ActionTools:
    """One listener's tools and their state."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.reports: list[str] = []

    @tool
    def generate_report(self, topic: str = "weekly") -> dict:
        """Generate a report on a topic and return where it was saved."""
        with self._lock:
            self.reports.append(topic)
        return {"saved_to": f"/reports/{topic}.pdf"}


def build_agent(model: str, tools: ActionTools) -> Agent:
    return Agent(
        name="flask_listener",
        model=model,
        stateful=True,
        max_turns=10_000,
        tools=[
            WaitForMessageTool.create(name="wait_for_message",
                                      description="Wait for the next external message, then return its content."),
            *ToolRegistry.from_instance(tools),
        ],
        instructions="Loop: wait_for_message; for {action: generate-report, topic}, call generate_report "
                     "with that topic; repeat until told to stop.",
    )


# --- one runtime per process -----------------------------------------------------------------

_runtime: Optional[AgentRuntime] = None
_runtime_lock = threading.Lock()
#: execution id -> (handle, tools) of the listeners this process started.
listeners: Dict[str, Tuple[AgentHandle, ActionTools]] = {}


def runtime() -> AgentRuntime:
    """The process's runtime, created on first use from the environment (CONDUCTOR_SERVER_URL...)."""
    global _runtime
    with _runtime_lock:
        if _runtime is None:
            _runtime = AgentRuntime(on_stall=_stalled)
            atexit.register(_runtime.close)
        return _runtime


def _stalled(handle: AgentHandle, err: Exception) -> None:
    """Nobody waits on a listener here: the runtime's watchdog calls this (on its thread) when one stalls."""
    logging.getLogger("flask_app").error("listener %s is not being served: %s", handle.execution_id, err)


def model() -> str:
    return os.environ.get("CONDUCTOR_AGENT_MODEL", "anthropic/claude-sonnet-4-6")


app = Flask(__name__)


def _listener(execution_id: str) -> Tuple[AgentHandle, ActionTools]:
    found = listeners.get(execution_id)
    if found is None:
        raise KeyError(execution_id)
    return found


@app.errorhandler(KeyError)
def _unknown(err: KeyError) -> Any:
    return jsonify(error=f"no listener {err.args[0]!r} in this process"), 404


@app.post("/listeners")
def start_listener() -> Any:
    body = request.get_json(silent=True) or {}
    tools = ActionTools()
    handle = runtime().start(build_agent(model(), tools), str(body.get("prompt") or "Start listening."))
    listeners[handle.execution_id] = (handle, tools)
    return jsonify(execution_id=handle.execution_id, run_id=handle.run_id, status="RUNNING"), 201


@app.post("/listeners/<execution_id>/messages")
def send_message(execution_id: str) -> Any:
    handle, _ = _listener(execution_id)
    payload = request.get_json(silent=True)
    if payload is None:
        return jsonify(error="send a JSON body"), 400
    try:
        message_id = handle.send_message(payload)
    except ExecutionNotRunningError as err:
        return jsonify(error=str(err)), 409
    return jsonify(message_id=message_id), 202


@app.get("/listeners/<execution_id>")
def listener_status(execution_id: str) -> Any:
    handle, tools = _listener(execution_id)
    status = handle.status()
    stall = handle.stall  # set by the runtime's watchdog when no worker polls the listener's tasks
    return jsonify(execution_id=execution_id, status=status.status.value, waiting=status.is_waiting,
                   reports=list(tools.reports), stalled=str(stall) if stall else None)


@app.post("/listeners/<execution_id>/stop")
def stop_listener(execution_id: str) -> Any:
    handle, tools = _listener(execution_id)
    handle.stop()
    try:
        result = handle.wait(timeout=STOP_TIMEOUT)
    except WaitTimeoutError:
        return jsonify(execution_id=execution_id, status="STOPPING"), 202
    listeners.pop(execution_id, None)
    return jsonify(execution_id=execution_id, status=result.status.value, output=result.output,
                   reports=list(tools.reports), tool_calls=[c.name for c in result.tool_calls])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--remote", action="store_true",
                        help="use CONDUCTOR_SERVER_URL and CONDUCTOR_AGENT_MODEL instead of a local server")
    parser.add_argument("--port", type=int, default=5000)
    args = parser.parse_args()
    if args.remote:
        app.run(host="127.0.0.1", port=args.port, threaded=True)
        return 0

    from conductor_agents.testing import LocalStack, ToolCall, listener_policy

    print("starting a local Conductor server with a scripted model (first run downloads the server)...")
    with LocalStack() as stack:
        os.environ["CONDUCTOR_SERVER_URL"] = stack.url
        os.environ["CONDUCTOR_AGENT_MODEL"] = stack.llm.script(policy=listener_policy(
            lambda payload: ToolCall("generate_report", {"topic": payload.get("topic", "weekly")})
            if isinstance(payload, dict) and payload.get("action") == "generate-report" else None
        ))
        try:
            app.run(host="127.0.0.1", port=args.port, threaded=True)
        finally:
            if _runtime is not None:
                _runtime.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
