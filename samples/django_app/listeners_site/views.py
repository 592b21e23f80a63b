"""The API: start listeners, message them, read them, stop them (from any worker process).

    GET  /listeners                     this process: pid, worker id, its listeners    -> 200
    POST /listeners                     start a listener (its tools run in this process) -> 201
    POST /listeners/<id>/messages       send it a JSON message (from any process)       -> 202
    GET  /listeners/<id>                its status; its reports when it runs here       -> 200
    POST /listeners/<id>/stop           stop it and wait (<= 30 s), from any process    -> 200

A message or a stop may arrive at any worker: it goes to the run through the server, by
execution id, and the run's tools still execute in the process that started it (its task
domain is served only there). Every answer names the ``pid`` that handled the request, and
each tool output the ``pid`` that ran the tool.
"""

from __future__ import annotations

import json
import os
from typing import Any

from django.http import HttpRequest, JsonResponse
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from conductor_agents import ExecutionNotFoundError, ExecutionNotRunningError, WaitTimeoutError

from . import agents

STOP_TIMEOUT = 30.0


def _json_body(request: HttpRequest) -> Any:
    try:
        return json.loads(request.body or b"null")
    except ValueError:
        return None


def _answer(http_status: int = 200, **body: Any) -> JsonResponse:
    """``body`` as JSON, with the pid of the process that handled the request."""
    return JsonResponse({**body, "pid": os.getpid()}, status=http_status)


@require_http_methods(["GET", "POST"])
def listeners(request: HttpRequest) -> JsonResponse:
    runtime = agents.the_runtime()
    if request.method == "GET":
        with agents.listeners_lock:
            here = sorted(agents.listeners)
        return _answer(worker_id=runtime.worker_id, runtime_built_in_pid=agents.runtime_built_in_pid,
                       listeners=here)
    body = _json_body(request) or {}
    tools = agents.ActionTools()
    handle = runtime.start(agents.build_agent(tools), str(body.get("prompt") or "Start listening."))
    with agents.listeners_lock:
        agents.listeners[handle.execution_id] = (handle, tools)
    return _answer(201, execution_id=handle.execution_id, run_id=handle.run_id, status="RUNNING",
                   worker_id=runtime.worker_id)


@require_POST
def send_message(request: HttpRequest, execution_id: str) -> JsonResponse:
    payload = _json_body(request)
    if payload is None:
        return _answer(400, error="send a JSON body")
    try:
        message_id = agents.the_runtime().send_message(execution_id, payload)
    except ExecutionNotFoundError as err:
        return _answer(404, error=str(err))
    except ExecutionNotRunningError as err:
        return _answer(409, error=str(err))
    return _answer(202, message_id=message_id)


@require_GET
def listener_status(request: HttpRequest, execution_id: str) -> JsonResponse:
    with agents.listeners_lock:
        local = agents.listeners.get(execution_id)
    try:
        handle = local[0] if local else agents.the_runtime().attach(execution_id)
        status = handle.status()
    except ExecutionNotFoundError as err:
        return _answer(404, error=str(err))
    if local and status.is_terminal:  # e.g. stopped through another worker: forget it here
        with agents.listeners_lock:
            agents.listeners.pop(execution_id, None)
    return _answer(execution_id=execution_id, status=status.status.value, waiting=status.is_waiting,
                   served_here=local is not None, reports=list(local[1].reports) if local else None)


@require_POST
def stop_listener(request: HttpRequest, execution_id: str) -> JsonResponse:
    with agents.listeners_lock:
        local = agents.listeners.get(execution_id)
    try:
        handle = local[0] if local else agents.the_runtime().attach(execution_id)
        handle.stop()
        result = handle.wait(timeout=STOP_TIMEOUT)
    except ExecutionNotFoundError as err:
        return _answer(404, error=str(err))
    except WaitTimeoutError:
        return _answer(202, execution_id=execution_id, status="STOPPING")
    with agents.listeners_lock:
        agents.listeners.pop(execution_id, None)
    return _answer(execution_id=execution_id, status=result.status.value, output=result.output,
                   tool_calls=[{"name": c.name, "arguments": dict(c.arguments), "output": dict(c.output)}
                               for c in result.tool_calls if c.name == "generate_report"])
