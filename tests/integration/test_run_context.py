"""A run's context and media on the real server: start(context=..., media=...), ctx.state,
ctx.update_state(), result.context."""

from __future__ import annotations

import base64
import http.server
import socket
import threading
from typing import Iterator

import pytest

from conductor_agents import Agent, PayloadError, RunContextError, ToolContext, tool
from conductor_agents.testing import ToolCall

pytestmark = pytest.mark.integration

#: A 1x1 PNG.
PNG = base64.b64decode("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg==")


@pytest.mark.both_topologies
def test_context_reaches_the_model_and_the_tools_and_tools_update_it(agent_runtime, scripted_llm, unique_name):
    """The model sees the context, each tool reads it as ctx.state and updates it for the next turn;
    the run's result carries the final context."""
    name = unique_name("count")
    seen = []

    @tool(name=name)
    def count(ctx: ToolContext) -> dict:
        """Count a visit."""
        seen.append(dict(ctx.state))
        ctx.update_state(visits=ctx.state["visits"] + 1, last="count")
        return {"ok": True}

    model = scripted_llm.script([ToolCall(name), ToolCall(name), "counted"])
    result = agent_runtime.run(Agent(name=unique_name("counter"), model=model, tools=[count]), "Count twice.",
                               context={"visits": 0, "user": "ann"}, timeout=90)
    assert result.output == "counted"
    assert seen == [{"visits": 0, "user": "ann"}, {"visits": 1, "user": "ann", "last": "count"}]
    assert result.context == {"visits": 2, "user": "ann", "last": "count"}
    shown = [r.context for r in scripted_llm.requests_for(model)]
    assert shown == [{"visits": "0", "user": "ann"}, {"visits": "1", "user": "ann", "last": "count"},
                     {"visits": "2", "user": "ann", "last": "count"}]  # the server shows values as text
    assert [r.prompt for r in scripted_llm.requests_for(model)] == ["Count twice."] * 3


def test_a_context_the_server_would_cut_is_refused_before_any_request(agent_runtime, scripted_llm, unique_name):
    """More than 4 KB in one value, or something that is not JSON, fails start() at once."""
    model = scripted_llm.script(["never"])
    agent = Agent(name=unique_name("ctx"), model=model)
    with pytest.raises(RunContextError) as too_big:
        agent_runtime.start(agent, "Go.", context={"notes": "x" * 5000})
    assert (too_big.value.key, too_big.value.limit) == ("notes", 4096)
    with pytest.raises(PayloadError):
        agent_runtime.start(agent, "Go.", context={"when": object()})
    assert scripted_llm.requests_for(model) == ()


def _outward_address() -> str:
    """This machine's address as other hosts see it (the server refuses to download from loopback)."""
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        probe.connect(("192.0.2.1", 9))  # no packet is sent: this only picks the outgoing interface
        address = probe.getsockname()[0]
    finally:
        probe.close()
    assert not address.startswith("127."), "media needs a non-loopback address on this machine"
    return address


@pytest.fixture
def image_url() -> Iterator[str]:
    """A PNG served over HTTP on this machine's outward address."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
            self.send_response(200)
            self.send_header("Content-Type", "image/png")
            self.send_header("Content-Length", str(len(PNG)))
            self.end_headers()
            self.wfile.write(PNG)

        def log_message(self, *args: object) -> None:
            pass

    address = _outward_address()
    server = http.server.ThreadingHTTPServer((address, 0), Handler)
    thread = threading.Thread(target=server.serve_forever, name="test-media-server", daemon=True)
    thread.start()
    try:
        yield f"http://{address}:{server.server_port}/picture.png"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


@pytest.mark.both_topologies
def test_media_urls_are_attached_to_the_first_user_message(agent_runtime, scripted_llm, unique_name, image_url):
    """The server downloads each media URL and gives the model the image with the prompt."""
    model = scripted_llm.script(["a white pixel"])
    result = agent_runtime.run(Agent(name=unique_name("looker"), model=model), "What is in the picture?",
                               media=[image_url], timeout=90)
    assert result.output == "a white pixel"
    [request] = scripted_llm.requests_for(model)
    assert request.prompt == "What is in the picture?"
    assert request.media == ["data:image/png;base64," + base64.b64encode(PNG).decode()]
