"""Tools the server runs itself: HttpTool against a loopback HTTP server, McpTool against a real MCP server."""

from __future__ import annotations

import http.server
import json
import threading
import time
from typing import Iterator, List

import pytest

from conductor_agents import Agent, ApiTool, HttpTool, McpTool, RunStatus
from conductor_agents.testing import ToolCall

pytestmark = pytest.mark.integration


class Recorder(http.server.BaseHTTPRequestHandler):
    """Answers every request with JSON describing it, and records it on the server."""

    def _body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            data = b""
            while True:
                size = int(self.rfile.readline().strip() or b"0", 16)
                if size == 0:
                    self.rfile.readline()
                    return data
                data += self.rfile.read(size)
                self.rfile.readline()
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def _answer(self) -> None:
        if self.path == "/openapi.json":  # the spec of an OpenAPI service: one operation, GET /price?sku=
            return self._send({"openapi": "3.0.0", "info": {"title": "shop", "version": "1"},
                               "servers": [{"url": f"http://127.0.0.1:{self.server.server_address[1]}"}],
                               "paths": {"/price": {"get": {
                                   "operationId": "price_of", "summary": "Price of a SKU.",
                                   "parameters": [{"name": "sku", "in": "query", "required": True,
                                                   "schema": {"type": "string"}}]}}}})
        body = self._body()
        record = {"method": self.command, "path": self.path, "headers": dict(self.headers),
                  "body": json.loads(body) if body else None}
        self.server.seen.append(record)  # type: ignore[attr-defined]
        self._send({"price": 42, "path": self.path, "got": record["body"]})

    def _send(self, answer: dict) -> None:
        payload = json.dumps(answer).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    do_GET = do_POST = _answer

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def http_server() -> Iterator[http.server.ThreadingHTTPServer]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    server.seen = []  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, name="test-http-server", daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


@pytest.fixture
def mcp_server() -> Iterator[dict]:
    """A real MCP server (the official ``mcp`` package, Streamable HTTP) on loopback; records request headers."""
    import uvicorn
    from mcp.server.mcpserver import MCPServer

    server = MCPServer("calc")
    calls: List[tuple] = []

    @server.tool()
    def add(a: int, b: int) -> int:
        """Add two integers."""
        calls.append((a, b))
        return a + b

    app = server.streamable_http_app(stateless_http=True, json_response=True)
    headers: List[dict] = []

    async def recording(scope, receive, send):  # an ASGI wrapper: what the Conductor server sent
        if scope["type"] == "http":
            headers.append({k.decode(): v.decode() for k, v in scope["headers"]})
        await app(scope, receive, send)

    uv = uvicorn.Server(uvicorn.Config(recording, host="127.0.0.1", port=0, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=uv.run, name="test-mcp-server", daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not uv.started:
        assert time.monotonic() < deadline, "the MCP server did not start within 20s"
        time.sleep(0.05)
    port = uv.servers[0].sockets[0].getsockname()[1]
    try:
        yield {"url": f"http://127.0.0.1:{port}/mcp", "calls": calls, "headers": headers}
    finally:
        uv.should_exit = True
        thread.join(timeout=10)


def test_http_tools_call_the_url_with_the_servers_secret(agent_runtime, scripted_llm, unique_name, http_server,
                                                         server_secrets):
    """GET sends the arguments as the query, POST as the JSON body; ${NAME} becomes the secret on the wire only."""
    [(secret_name, secret_value)] = server_secrets.items()
    base = f"http://127.0.0.1:{http_server.server_address[1]}"
    price = HttpTool.create(name="get_price", url=f"{base}/price", description="Price of a SKU.",
                            headers={"Authorization": f"Bearer ${{{secret_name}}}"},
                            input_schema={"type": "object", "properties": {"sku": {"type": "string"}},
                                          "required": ["sku"]})
    order = HttpTool.create(name="place_order", url=f"{base}/orders", method="POST", path_template="/{sku}",
                            input_schema={"type": "object", "properties": {"sku": {"type": "string"},
                                                                           "qty": {"type": "integer"}}})
    model = scripted_llm.script([
        [ToolCall("get_price", {"sku": "a-1"}), ToolCall("place_order", {"sku": "b-2", "qty": 3})],
        "done",
    ])
    agent = Agent(name=unique_name("shop"), model=model, tools=[price, order])
    handle = agent_runtime.start(agent, "Buy things.")
    result = handle.wait(timeout=120)
    assert result.status is RunStatus.COMPLETED, result.error
    seen = {r["path"]: r for r in http_server.seen}
    assert seen["/price?sku=a-1"]["method"] == "GET"
    assert seen["/price?sku=a-1"]["headers"]["Authorization"] == f"Bearer {secret_value}"
    assert seen["/orders/b-2"]["method"] == "POST" and seen["/orders/b-2"]["body"] == {"qty": 3}
    outputs = {o.name: o.output for o in scripted_llm.requests_for(model)[1].tool_outputs}
    assert outputs["get_price"]["response"]["statusCode"] == 200
    assert outputs["get_price"]["response"]["body"]["price"] == 42
    assert outputs["place_order"]["response"]["body"]["got"] == {"qty": 3}
    # The run's stored history keeps the placeholder, never the value.
    stored = json.dumps(agent_runtime._api.get_workflow(handle.execution_id, include_tasks=True))
    assert secret_value not in stored and f"workflow.secrets.{secret_name}" in stored
    assert [c.name for c in result.tool_calls] == ["get_price", "place_order"]


def test_an_mcp_tool_round_trip(agent_runtime, scripted_llm, unique_name, mcp_server, server_secrets):
    """The server lists the MCP server's tools, offers them to the model and calls the one it picks."""
    [(secret_name, secret_value)] = server_secrets.items()
    calc = McpTool.create(server_url=mcp_server["url"], name="calc",
                          headers={"X-Api-Key": f"${{{secret_name}}}"})
    model = scripted_llm.script([ToolCall("add", {"a": 2, "b": 40}), "The sum is 42."])
    agent = Agent(name=unique_name("mcp"), model=model, tools=[calc])
    result = agent_runtime.run(agent, "Add 2 and 40.", timeout=120)
    assert result.status is RunStatus.COMPLETED, result.error
    assert result.output == "The sum is 42."
    assert mcp_server["calls"] == [(2, 40)]
    first, second = scripted_llm.requests_for(model)
    assert first.tools == ("add",)  # the MCP server's tool, under its own name
    [out] = second.tool_outputs
    assert out.name == "add" and out.output["isError"] is False
    assert out.output["content"][0]["text"] == "42"
    assert mcp_server["headers"] and all(h.get("x-api-key") == secret_value for h in mcp_server["headers"])


def test_an_api_tool_offers_the_openapi_operations_and_calls_them(agent_runtime, scripted_llm, unique_name,
                                                                  http_server, server_secrets):
    """The server reads the OpenAPI spec (with the header), offers its operation by operationId and calls it."""
    [(secret_name, secret_value)] = server_secrets.items()
    base = f"http://127.0.0.1:{http_server.server_address[1]}"
    shop = ApiTool.create(spec_url=f"{base}/openapi.json", name="shop", headers={"X-Api-Key": f"${{{secret_name}}}"})
    model = scripted_llm.script([ToolCall("price_of", {"sku": "z-9"}), "It costs 42."])
    result = agent_runtime.run(Agent(name=unique_name("api"), model=model, tools=[shop]), "Price of z-9?",
                               timeout=120)
    assert result.status is RunStatus.COMPLETED, result.error
    first, second = scripted_llm.requests_for(model)
    assert first.tools == ("price_of",)
    [out] = second.tool_outputs
    assert out.output["response"]["body"]["path"] == "/price?sku=z-9"
    [call] = [r for r in http_server.seen if r["path"].startswith("/price")]
    assert call["headers"]["X-Api-Key"] == secret_value
