"""Stateful listeners behind a small async API (Starlette; the same shape works in FastAPI): the async
twin of ``flask_app.py``.

One :class:`AsyncAgentRuntime` per process, made in the app's lifespan and shared by every request; it
serves the listener agent (``await runtime.serve(agent)``), so this process also adopts listeners whose
process went away. Every verb is awaited and never blocks the event loop: the SDK's blocking work runs
on the runtime's own thread pool.

    POST /listeners                     start a listener          -> 201 {"execution_id", ...}
    POST /listeners/{id}/messages       send it a JSON message    -> 202 {"message_id"}
    GET  /listeners/{id}                its status and reports    -> 200
    POST /listeners/{id}/stop           stop it and wait (<= 30 s) -> 200 {"status", "output", ...}
    GET  /approvals                     what listeners wait on a person for -> 200 {"approvals": [...]}
    POST /approvals/{id}/approve        approve it (JSON: by, reason)
    POST /approvals/{id}/reject         reject it (JSON: reason required)

Run it offline (a real Conductor server on this machine, with a scripted model):

    pip install 'conductor-agents[samples]'
    python samples/starlette_app.py                 # http://127.0.0.1:8000
    curl -X POST localhost:8000/listeners
    curl -X POST localhost:8000/listeners/ID/messages -H 'content-type: application/json' \\
         -d '{"action": "generate-report", "topic": "sales"}'
    curl localhost:8000/listeners/ID
    curl -X POST localhost:8000/listeners/ID/stop

Or against your own server and a real model, under any ASGI server:

    CONDUCTOR_SERVER_URL=http://localhost:8080/api CONDUCTOR_AGENT_MODEL=anthropic/claude-sonnet-4-6 \\
        uvicorn --app-dir samples starlette_app:app
"""

from __future__ import annotations

import argparse
import contextlib
import os
import threading
from typing import Any, AsyncIterator, Dict, List

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from conductor_agents import (
    Agent,
    AnswerConflictError,
    AsyncAgentRuntime,
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
AGENT_NAME = "async_listener"


class ReportTools:
    """The listeners' tools (run on the SDK's tool threads, not on the loop); reports kept per listener."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.reports: Dict[str, List[str]] = {}

    @tool
    def generate_report(self, ctx: ToolContext, topic: str = "weekly") -> dict:
        """Generate a report on a topic and return where it was saved."""
        with self._lock:
            self.reports.setdefault(ctx.run_id or ctx.execution_id, []).append(topic)
        return {"saved_to": f"/reports/{topic}.pdf"}

    @tool(approval_required=True)
    def publish_report(self, topic: str) -> dict:
        """Publish a report to customers (a person approves each publication first)."""
        return {"published": f"https://example.com/reports/{topic}"}

    def of(self, run_id: "str | None") -> List[str]:
        with self._lock:
            return list(self.reports.get(run_id or "", ()))


TOOLS = ReportTools()


def build_agent(model: str) -> Agent:
    return Agent(
        name=AGENT_NAME, model=model, stateful=True, max_turns=10_000,
        tools=[WaitForMessageTool.create(name="wait_for_message"), *ToolRegistry.from_instance(TOOLS)],
        instructions="Loop: wait_for_message; for {action: generate-report, topic}, call generate_report "
                     "with that topic; for {action: publish-report, topic}, call publish_report; repeat until "
                     "told to stop.",
    )


@contextlib.asynccontextmanager
async def lifespan(app: Starlette) -> AsyncIterator[None]:
    """One runtime for the process's life, serving the agent; closing it hands its listeners over."""
    async with AsyncAgentRuntime() as runtime:  # CONDUCTOR_SERVER_URL ... from the environment
        agent = build_agent(os.environ.get("CONDUCTOR_AGENT_MODEL", "anthropic/claude-sonnet-4-6"))
        await runtime.serve(agent)
        app.state.runtime, app.state.agent = runtime, agent
        yield


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


async def start_listener(request: Request) -> JSONResponse:
    runtime: AsyncAgentRuntime = request.app.state.runtime
    handle = await runtime.start(request.app.state.agent, "Start listening.")
    return JSONResponse({"execution_id": handle.execution_id, "run_id": handle.run_id, "status": "RUNNING"}, 201)


async def send_message(request: Request) -> JSONResponse:
    try:
        payload = await request.json()
    except ValueError:
        return _error(400, "send a JSON body")
    execution_id = request.path_params["execution_id"]
    try:
        message_id = await request.app.state.runtime.send_message(execution_id, payload)
    except ExecutionNotFoundError:
        return _error(404, f"no listener {execution_id!r}")
    except ExecutionNotRunningError as err:
        return _error(409, str(err))
    return JSONResponse({"message_id": message_id}, 202)


async def listener_status(request: Request) -> JSONResponse:
    execution_id = request.path_params["execution_id"]
    try:
        handle = await request.app.state.runtime.attach(execution_id)
        status = await handle.status()
    except ExecutionNotFoundError:
        return _error(404, f"no listener {execution_id!r}")
    return JSONResponse({"execution_id": execution_id, "status": status.status.value,
                         "reports": TOOLS.of(handle.run_id)})


async def stop_listener(request: Request) -> JSONResponse:
    execution_id = request.path_params["execution_id"]
    try:
        handle = await request.app.state.runtime.attach(execution_id)
        await handle.stop()
        result = await handle.wait(timeout=STOP_TIMEOUT)
    except ExecutionNotFoundError:
        return _error(404, f"no listener {execution_id!r}")
    except WaitTimeoutError:
        return JSONResponse({"execution_id": execution_id, "status": "STOPPING"}, 202)
    return JSONResponse({"execution_id": execution_id, "status": result.status.value, "runs": result.runs,
                         "reports": TOOLS.of(handle.run_id), "tool_calls": [c.name for c in result.tool_calls]})


async def approvals(request: Request) -> JSONResponse:
    queue = await request.app.state.runtime.pending_requests(AGENT_NAME)
    return JSONResponse({"approvals": [r.to_dict() for r in queue if r.kind == PendingRequest.APPROVAL]})


async def answer_approval(request: Request) -> JSONResponse:
    runtime: AsyncAgentRuntime = request.app.state.runtime
    execution_id, verb = request.path_params["execution_id"], request.path_params["verb"]
    try:
        form: Dict[str, Any] = await request.json()
    except ValueError:
        form = {}
    reason = (form.get("reason") or "").strip() or None
    try:
        if verb == "approve":
            answer = await runtime.approve(execution_id, reason=reason, by=form.get("by") or "async api")
        elif verb == "reject" and reason:
            answer = await runtime.reject(execution_id, reason, by=form.get("by") or "async api")
        else:
            return _error(400, "POST .../approve, or .../reject with a reason")
    except (NothingPendingError, ExecutionNotRunningError) as err:
        return _error(404, str(err))
    except AnswerConflictError as err:
        return JSONResponse({"error": str(err), "winner": err.winner.to_dict()}, 409)
    return JSONResponse(answer.to_dict())


app = Starlette(lifespan=lifespan, routes=[
    Route("/listeners", start_listener, methods=["POST"]),
    Route("/listeners/{execution_id}/messages", send_message, methods=["POST"]),
    Route("/listeners/{execution_id}", listener_status, methods=["GET"]),
    Route("/listeners/{execution_id}/stop", stop_listener, methods=["POST"]),
    Route("/approvals", approvals, methods=["GET"]),
    Route("/approvals/{execution_id}/{verb}", answer_approval, methods=["POST"]),
])


def scripted_action(payload: Any) -> Any:
    """The offline model: a report for generate-report, a publication (needs approval) for publish-report."""
    from conductor_agents.testing import ToolCall

    if isinstance(payload, dict) and payload.get("action") in ("generate-report", "publish-report"):
        name = payload["action"].replace("-", "_")
        return ToolCall(name, {"topic": payload.get("topic", "weekly")})
    return None


def main() -> int:
    import uvicorn  # only to run the sample by hand: pip install uvicorn

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=8000)
    args = parser.parse_args()
    from conductor_agents.testing import LocalStack, listener_policy

    print("starting a local Conductor server with a scripted model...")
    with LocalStack() as stack:
        os.environ["CONDUCTOR_SERVER_URL"] = stack.url
        os.environ["CONDUCTOR_AGENT_MODEL"] = stack.llm.script(policy=listener_policy(scripted_action))
        uvicorn.run(app, host="127.0.0.1", port=args.port)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
