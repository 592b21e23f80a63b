"""The API: start listeners, message them, read them, stop them (from any worker process).

    GET  /listeners                     this process: pid, worker id, its listeners    -> 200
    POST /listeners                     start a listener (served here, adopted elsewhere
                                        if this process goes away)                        -> 201
    POST /listeners/<id>/messages       send it a JSON message (from any process)       -> 202
    GET  /listeners/<id>                its status; its reports when it runs here       -> 200
    POST /listeners/<id>/stop           stop it and wait (<= 30 s), from any process    -> 200
    GET  /approvals                     the approval queue of every listener, whichever process
                                        serves it: an HTML page (JSON with Accept: application/json)
    POST /approvals/<id>/approve        approve what listener <id> waits on (form or JSON)  -> 303/200
    POST /approvals/<id>/reject         reject it (reason required); the listener goes on  -> 303/200

``{"action": "publish-report", "topic": ...}`` makes a listener call ``publish_report``, which
needs a person's approval: the run waits on the server (no process has to) until someone answers
on ``/approvals`` through any worker; the tool then runs in the process that serves the listener.

A message or a stop may arrive at any worker: it goes to the run through the server, by
execution id, and the run's tools execute in the one process that serves it (its task domain
is served only there): the one that started it, until that process goes away and another
adopts it. Every answer names the ``pid`` that handled the request, and each tool output the
``pid`` that ran the tool.
"""

from __future__ import annotations

import html
import json
import os
import time
from typing import Any

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from conductor_agents import (
    AnswerConflictError,
    ExecutionNotFoundError,
    ExecutionNotRunningError,
    NothingPendingError,
    PendingRequest,
    WaitTimeoutError,
)

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
        here = sorted(run.execution_id for run in runtime.stats().active_runs)
        return _answer(worker_id=runtime.worker_id, runtime_built_in_pid=agents.runtime_built_in_pid,
                       listeners=here)
    body = _json_body(request) or {}
    handle = runtime.start(agents.the_agent(), str(body.get("prompt") or "Start listening."))
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
    try:
        handle = agents.the_runtime().attach(execution_id)
        status = handle.status()
    except ExecutionNotFoundError as err:
        return _answer(404, error=str(err))
    here = agents.served_here(handle.run_id)
    state = agents.TOOLS.state_of(handle.run_id or "") if here else None
    return _answer(execution_id=execution_id, status=status.status.value, waiting=status.is_waiting,
                   served_here=here, reports=(state[0] if state else []) if here else None,
                   published=(state[1] if state else []) if here else None)


@require_POST
def stop_listener(request: HttpRequest, execution_id: str) -> JsonResponse:
    try:
        handle = agents.the_runtime().attach(execution_id)
        handle.stop()
        result = handle.wait(timeout=STOP_TIMEOUT)
    except ExecutionNotFoundError as err:
        return _answer(404, error=str(err))
    except WaitTimeoutError:
        return _answer(202, execution_id=execution_id, status="STOPPING")
    # A long listener is continued as new runs: ``tool_calls`` are those of its last run (of ``runs``).
    return _answer(execution_id=execution_id, status=result.status.value, output=result.output, runs=result.runs,
                   tool_calls=[{"name": c.name, "arguments": dict(c.arguments), "output": dict(c.output)}
                               for c in result.tool_calls if c.name in ("generate_report", "publish_report")])


# --- the approval queue ------------------------------------------------------------------------

_PAGE = """<!doctype html><html><head><meta charset="utf-8"><title>Approvals</title></head><body>
<h1>Waiting for approval</h1>{rows}<p><a href="/approvals">refresh</a> (page by pid {pid})</p></body></html>"""
_FORM = """<form method="post" action="/approvals/{eid}/{verb}" style="display:inline">
<input type="hidden" name="request" value="{ref}"><input name="reason" placeholder="{hint}">
<button>{verb}</button></form>"""


@require_GET
def approvals(request: HttpRequest) -> HttpResponse:
    """Every pending approval of the agent, asked of the server: it lists listeners of all workers."""
    queue = [r for r in agents.the_runtime().pending_requests(agents.AGENT_NAME) if r.kind == PendingRequest.APPROVAL]
    if "application/json" in request.headers.get("Accept", "") or request.GET.get("format") == "json":
        return _answer(approvals=[r.to_dict() for r in queue])
    rows = "".join(
        f"<div><p><code>{html.escape(r.execution_id)}</code> waiting {time.time() - (r.since or time.time()):.0f}s: "
        + ", ".join(f"<b>{html.escape(c.name)}</b>({html.escape(str(dict(c.arguments)))})" for c in r.tool_calls)
        + "</p>"
        + _FORM.format(eid=html.escape(r.execution_id), verb="approve", ref=html.escape(r.task_reference_name),
                       hint="note (optional)")
        + _FORM.format(eid=html.escape(r.execution_id), verb="reject", ref=html.escape(r.task_reference_name),
                       hint="reason (required)") + "</div>"
        for r in queue) or "<p>Nothing waits for approval.</p>"
    return HttpResponse(_PAGE.format(rows=rows, pid=os.getpid()))


@require_POST
def answer_approval(request: HttpRequest, execution_id: str, verb: str) -> HttpResponse:
    """Approve or reject from whichever worker gets the request: the answer goes through the server."""
    as_json = request.content_type == "application/json"
    form = (_json_body(request) or {}) if as_json else request.POST
    reason = (form.get("reason") or "").strip() or None
    options = dict(by=form.get("by") or f"django approval page (pid {os.getpid()})",
                   request=form.get("request") or None)
    runtime = agents.the_runtime()
    try:
        if verb == "approve":
            answer = runtime.approve(execution_id, reason=reason, **options)
        elif verb == "reject" and reason:
            answer = runtime.reject(execution_id, reason, **options)
        else:
            return _answer(400, error="POST .../approve, or .../reject with a reason")
    except (NothingPendingError, ExecutionNotFoundError, ExecutionNotRunningError) as err:
        return _answer(404, error=str(err))
    except AnswerConflictError as err:
        return _answer(409, error=str(err), winner=err.winner.to_dict())
    if not as_json:
        return _see_other("/approvals")
    return _answer(**answer.to_dict())


def _see_other(location: str) -> HttpResponse:
    response = HttpResponse(status=303)
    response["Location"] = location
    return response
