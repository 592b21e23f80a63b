"""Stateful listeners behind a small Flask API.

One :class:`AgentRuntime` per process, kept at module level and shared by every request
(it is thread-safe), which calls ``runtime.serve(agent)``: each process serves the listeners it
starts *and* adopts the listeners of a process that went away (a gunicorn worker recycled by
``--max-requests``, a deploy, a crash), so a listener lives as long as any process of the app
does, and exactly one process serves it at any time. Every request works from any process: the
handles are looked up by execution id (``runtime.attach``) and act through the server.

The tools keep their state per listener, keyed by its run id (``ctx.run_id``, the same for the
whole life of a listener), in the process that serves it; ``GET /listeners/<id>`` shows it when
that process answers. An adopting process starts that state afresh in ``on_adopt`` (the place to
reload it from your own store): what the server keeps (the conversation, the budget, the
listener's identity, pending approvals) moves with the listener; this process's memory does not.

    POST /listeners                     start a listener          -> 201 {"execution_id", ...}
    POST /listeners/<id>/messages       send it a JSON message    -> 202 {"message_id"}
    GET  /listeners/<id>                its status, reports, stall -> 200
    POST /listeners/<id>/stop           stop it and wait (<= 30 s) -> 200 {"status", "output", ...}
    GET  /approvals                     the approval queue: an HTML page (JSON with Accept: application/json)
    POST /approvals/<id>/approve        approve what listener <id> waits on (form or JSON: by, reason, request)
    POST /approvals/<id>/reject         reject it (reason required): the model is told, the listener goes on

Publishing a report needs a person's approval: ``{"action": "publish-report", "topic": ...}``
makes the listener wait until someone approves or rejects the call on ``/approvals``.

Any process may answer any of these. ``reports`` and ``published`` (in the status and the stop
answer) are what the tools did in the process that answered: empty when another process serves
the listener.

Run it offline (a real Conductor server on this machine, with a scripted model):

    pip install 'conductor-agents[samples]'
    python samples/flask_app.py                     # http://127.0.0.1:5000
    curl -X POST localhost:5000/listeners
    curl -X POST localhost:5000/listeners/ID/messages -H 'content-type: application/json' \\
         -d '{"action": "generate-report", "topic": "sales"}'
    curl localhost:5000/listeners/ID
    curl -X POST localhost:5000/listeners/ID/messages -H 'content-type: application/json' \\
         -d '{"action": "publish-report", "topic": "sales"}'
    open http://127.0.0.1:5000/approvals            # approve or reject the publication
    curl -X POST localhost:5000/listeners/ID/stop

Or against your own server and a real model:

    CONDUCTOR_SERVER_URL=http://localhost:8080/api CONDUCTOR_AGENT_MODEL=anthropic/claude-sonnet-4-6 \\
        flask --app samples/flask_app.py run

Or under gunicorn, any number of workers (recycled or not: a recycled worker's listeners are
adopted by the others within seconds; docs/operations.md):

    CONDUCTOR_SERVER_URL=... CONDUCTOR_AGENT_MODEL=... \\
        gunicorn --workers 4 --threads 8 --max-requests 1000 --max-requests-jitter 100 --preload \\
                 --chdir samples flask_app:app
"""

from __future__ import annotations

import argparse
import atexit
import html
import logging
import os
import threading
import time
from typing import Any, Dict, List, Optional, Tuple

from flask import Flask, jsonify, redirect, request

from conductor_agents import (
    Agent,
    AgentHandle,
    AgentRuntime,
    AnswerConflictError,
    ExecutionNotFoundError,
    ExecutionNotRunningError,
    NothingPendingError,
    PendingRequest,
    ToolContext,
    ToolRegistry,
    WaitForMessageTool,
    WaitTimeoutError,
    tool,
)

STOP_TIMEOUT = 30.0


class ActionTools:
    """The listeners' tools, shared by every listener this process serves; state kept per listener."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.reports: Dict[str, List[str]] = {}
        self.published: Dict[str, List[str]] = {}

    @tool
    def generate_report(self, ctx: ToolContext, topic: str = "weekly") -> dict:
        """Generate a report on a topic and return where it was saved."""
        with self._lock:
            self.reports.setdefault(ctx.run_id or ctx.execution_id, []).append(topic)
        return {"saved_to": f"/reports/{topic}.pdf"}

    @tool(approval_required=True)
    def publish_report(self, ctx: ToolContext, topic: str) -> dict:
        """Publish a report to customers (a person approves each publication first)."""
        with self._lock:
            self.published.setdefault(ctx.run_id or ctx.execution_id, []).append(topic)
        return {"published": f"https://example.com/reports/{topic}"}

    def begin(self, run_id: str) -> None:
        """Fresh state for a listener served here from now on (started here, or adopted)."""
        with self._lock:
            self.reports.setdefault(run_id, [])
            self.published.setdefault(run_id, [])

    def state_of(self, run_id: Optional[str]) -> Tuple[List[str], List[str]]:
        with self._lock:
            return list(self.reports.get(run_id or "", ())), list(self.published.get(run_id or "", ()))

    def forget(self, run_id: Optional[str]) -> None:
        with self._lock:
            self.reports.pop(run_id or "", None)
            self.published.pop(run_id or "", None)


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
                     "with that topic; for {action: publish-report, topic}, call publish_report; repeat until "
                     "told to stop.",
    )


# --- one runtime per process, serving the agent ------------------------------------------------

TOOLS = ActionTools()
_runtime: Optional[AgentRuntime] = None
_agent: Optional[Agent] = None
_runtime_lock = threading.Lock()
#: run id -> handle of the listeners this process started or adopted (their stall flag is watched here).
served: Dict[str, AgentHandle] = {}


def runtime() -> AgentRuntime:
    """The process's runtime, created on first use from the environment (CONDUCTOR_SERVER_URL...),
    serving the listener agent: from then on this process also adopts listeners nobody serves."""
    global _runtime, _agent
    with _runtime_lock:
        if _runtime is None:
            _runtime = AgentRuntime(on_stall=_stalled, on_pending=_pending)
            _agent = build_agent(model(), TOOLS)
            _runtime.serve(_agent, on_adopt=_adopted)
            atexit.register(_runtime.close)  # hands this process's listeners over to the others
        return _runtime


def agent() -> Agent:
    runtime()
    assert _agent is not None
    return _agent


def _adopted(handle: AgentHandle) -> None:
    """``serve(..., on_adopt=)``: a listener whose process went away is served here now (on the adopt thread).

    The server kept its conversation, budget and identity; the tools' memory stayed with the old
    process. Rebuild it here (from your own store, keyed by the run id); this sample starts afresh."""
    run_id = handle.run_id or handle.execution_id
    TOOLS.begin(run_id)
    served[run_id] = handle
    logging.getLogger("flask_app").warning("pid %d adopted listener %s", os.getpid(), handle.execution_id)


def _stalled(handle: AgentHandle, err: Exception) -> None:
    """Nobody waits on a listener here: the runtime's watchdog calls this (on its thread) when one stalls."""
    logging.getLogger("flask_app").error("listener %s is not being served: %s", handle.execution_id, err)


def _pending(handle: AgentHandle, pending: PendingRequest) -> None:
    """A listener waits for a person (the runtime calls this once per request, on its thread)."""
    logging.getLogger("flask_app").warning("listener %s waits for approval of %s: see /approvals",
                                           handle.execution_id, pending.tool_name)


def model() -> str:
    return os.environ.get("CONDUCTOR_AGENT_MODEL", "anthropic/claude-sonnet-4-6")


app = Flask(__name__)


def _listener(execution_id: str) -> AgentHandle:
    """A handle on listener ``execution_id``, from any process (404 when the server has no such run)."""
    try:
        return runtime().attach(execution_id)
    except ExecutionNotFoundError:
        raise KeyError(execution_id) from None


@app.errorhandler(KeyError)
def _unknown(err: KeyError) -> Any:
    return jsonify(error=f"no listener {err.args[0]!r}"), 404


@app.post("/listeners")
def start_listener() -> Any:
    body = request.get_json(silent=True) or {}
    handle = runtime().start(agent(), str(body.get("prompt") or "Start listening."))
    run_id = handle.run_id or handle.execution_id
    TOOLS.begin(run_id)
    served[run_id] = handle
    return jsonify(execution_id=handle.execution_id, run_id=handle.run_id, status="RUNNING"), 201


@app.post("/listeners/<execution_id>/messages")
def send_message(execution_id: str) -> Any:
    payload = request.get_json(silent=True)
    if payload is None:
        return jsonify(error="send a JSON body"), 400
    try:
        message_id = runtime().send_message(execution_id, payload)
    except ExecutionNotFoundError:
        raise KeyError(execution_id) from None
    except ExecutionNotRunningError as err:
        return jsonify(error=str(err)), 409
    return jsonify(message_id=message_id), 202


@app.get("/listeners/<execution_id>")
def listener_status(execution_id: str) -> Any:
    handle = _listener(execution_id)
    try:
        status = handle.status()
    except ExecutionNotFoundError:
        raise KeyError(execution_id) from None
    here = served.get(handle.run_id or "")
    stall = here.stall if here is not None else None  # set by this process's watchdog when nobody polls its tasks
    reports, published = TOOLS.state_of(handle.run_id)  # what the tools did for it in *this* process
    return jsonify(execution_id=execution_id, status=status.status.value, waiting=status.is_waiting,
                   reports=reports, published=published, stalled=str(stall) if stall else None)


@app.post("/listeners/<execution_id>/stop")
def stop_listener(execution_id: str) -> Any:
    handle = _listener(execution_id)
    try:
        handle.stop()
        result = handle.wait(timeout=STOP_TIMEOUT)
    except ExecutionNotFoundError:
        raise KeyError(execution_id) from None
    except WaitTimeoutError:
        return jsonify(execution_id=execution_id, status="STOPPING"), 202
    reports, _ = TOOLS.state_of(handle.run_id)
    TOOLS.forget(handle.run_id)
    served.pop(handle.run_id or "", None)
    # A long listener is continued as new runs: ``tool_calls`` are those of its last run (of ``runs``).
    return jsonify(execution_id=execution_id, status=result.status.value, output=result.output, runs=result.runs,
                   reports=reports, tool_calls=[c.name for c in result.tool_calls])


# --- the approval queue ------------------------------------------------------------------------

_PAGE = """<!doctype html><html><head><meta charset="utf-8"><title>Approvals</title></head><body>
<h1>Waiting for approval</h1>{rows}
<p><a href="/approvals">refresh</a></p></body></html>"""
_ROW = """<form method="post" action="/approvals/{eid}/{verb}" style="display:inline">
<input type="hidden" name="request" value="{ref}"><input name="reason" placeholder="{hint}">
<button>{verb}</button></form>"""


def _queue() -> "list[PendingRequest]":
    """Every approval a listener of this app waits for (in any process: asked of the server)."""
    return [r for r in runtime().pending_requests("flask_listener") if r.kind == PendingRequest.APPROVAL]


@app.get("/approvals")
def approvals() -> Any:
    queue = _queue()
    if request.accept_mimetypes.best == "application/json" or request.args.get("format") == "json":
        return jsonify(approvals=[r.to_dict() for r in queue])
    rows = "".join(
        f"<div><p><code>{html.escape(r.execution_id)}</code> waiting {time.time() - (r.since or time.time()):.0f}s: "
        + ", ".join(f"<b>{html.escape(c.name)}</b>({html.escape(str(dict(c.arguments)))})" for c in r.tool_calls)
        + "</p>" + _ROW.format(eid=html.escape(r.execution_id), verb="approve", ref=html.escape(r.task_reference_name),
                               hint="note (optional)")
        + _ROW.format(eid=html.escape(r.execution_id), verb="reject", ref=html.escape(r.task_reference_name),
                      hint="reason (required)") + "</div>"
        for r in queue) or "<p>Nothing waits for approval.</p>"
    return _PAGE.format(rows=rows)


@app.post("/approvals/<execution_id>/<verb>")
def answer_approval(execution_id: str, verb: str) -> Any:
    form = request.get_json(silent=True) if request.is_json else request.form
    form = form or {}
    reason = (form.get("reason") or "").strip() or None
    options = dict(by=form.get("by") or "flask approval page", request=form.get("request") or None)
    try:
        if verb == "approve":
            answer = runtime().approve(execution_id, reason=reason, **options)
        elif verb == "reject" and reason:
            answer = runtime().reject(execution_id, reason, **options)
        else:
            return jsonify(error="POST .../approve, or .../reject with a reason"), 400
    except (NothingPendingError, ExecutionNotRunningError) as err:
        return jsonify(error=str(err)), 404
    except AnswerConflictError as err:
        return jsonify(error=str(err), winner=err.winner.to_dict()), 409
    if not request.is_json:
        return redirect("/approvals", code=303)
    return jsonify(answer.to_dict())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--remote", action="store_true",
                        help="use CONDUCTOR_SERVER_URL and CONDUCTOR_AGENT_MODEL instead of a local server")
    parser.add_argument("--port", type=int, default=5000)
    args = parser.parse_args()
    if args.remote:
        app.run(host="127.0.0.1", port=args.port, threaded=True)
        return 0

    from conductor_agents.testing import LocalStack, listener_policy

    print("starting a local Conductor server with a scripted model...")  # a first run also says it downloads the jar
    with LocalStack() as stack:
        os.environ["CONDUCTOR_SERVER_URL"] = stack.url
        os.environ["CONDUCTOR_AGENT_MODEL"] = stack.llm.script(policy=listener_policy(scripted_action))
        try:
            app.run(host="127.0.0.1", port=args.port, threaded=True)
        finally:
            if _runtime is not None:
                _runtime.close()
    return 0


def scripted_action(payload: Any) -> Any:
    """The offline model: a report for generate-report, a publication (needs approval) for publish-report."""
    from conductor_agents.testing import ToolCall

    if isinstance(payload, dict) and payload.get("action") == "generate-report":
        return ToolCall("generate_report", {"topic": payload.get("topic", "weekly")})
    if isinstance(payload, dict) and payload.get("action") == "publish-report":
        return ToolCall("publish_report", {"topic": payload.get("topic", "weekly")})
    return None


if __name__ == "__main__":
    raise SystemExit(main())
else:
    # Imported by gunicorn, ``flask run`` or a test: serve the agent from now on, so that this process
    # adopts orphaned listeners before its first request (with ``gunicorn --preload`` the master builds
    # the runtime and every forked worker serves the agent too).
    runtime()
