"""The loopback HTTP side of ScriptedLLM: a threading server, its handler and the responder.

Only this module parses and writes HTTP. :class:`Responder` turns a request body into a
status and a JSON value (through the :class:`ScriptBook`); :class:`LoopbackServer` is a
``ThreadingHTTPServer`` whose per-request threads are named and tracked so their owner can
join them with a deadline (the standard library either joins them without a bound or
forgets them).
"""

from __future__ import annotations

import itertools
import json
import logging
import socket
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from conductor_agents._common.clock import Clock
from conductor_agents.testing._anthropic import render_message, responses_body
from conductor_agents.testing._llm_request import LLMRequest
from conductor_agents.testing._scripts import Anomaly, ScriptBook
from conductor_agents.testing._wire import error_body, render

__all__ = ["THREAD_NAME", "LoopbackServer", "Responder"]

_log = logging.getLogger("conductor_agents.testing")

THREAD_NAME = "conductor-agents-scripted-llm"

#: Longest a client may take to send one request before its connection is dropped.
_SOCKET_TIMEOUT_SECONDS = 30.0


class Responder:
    """Answers one HTTP request: parse, record, decide, render. Thread-safe; never raises."""

    def __init__(self, book: ScriptBook, clock: Clock) -> None:
        self._book = book
        self._clock = clock
        self._ids = itertools.count(1)
        self._ids_lock = threading.Lock()

    def _next_id(self) -> int:
        with self._ids_lock:
            return next(self._ids)

    def respond(self, method: str, path: str, raw: bytes) -> tuple[int, Any]:
        """The status and JSON body for ``method path`` with body ``raw``."""
        route = path.split("?", 1)[0].rstrip("/")
        messages = route.endswith("/messages")  # Anthropic's Messages API, for anthropic/... models
        if method != "POST" or not (route.endswith("/responses") or messages):
            return 404, error_body(f"scripted-llm serves POST /v1/responses and /v1/messages only, not {method} {path}")
        try:
            body = json.loads(raw.decode("utf-8"))
            if not isinstance(body, dict):
                raise ValueError("the body is not a JSON object")
        except ValueError as err:
            message = f"scripted-llm: unreadable request body on {path}: {err}"
            self._book.add_anomaly(Anomaly(kind="bad_request", model="", message=message))
            return 400, error_body(message)
        try:
            request = LLMRequest.from_body(responses_body(body) if messages else body, received_at=self._clock.time(),
                                           path=route)
            self._book.record(request)
            outcome = self._book.decide(request)
            if messages:
                return render_message(outcome, model=request.model, next_id=self._next_id)
            return render(outcome, model=request.model, next_id=self._next_id, created_at=int(self._clock.time()))
        except Exception as err:  # noqa: BLE001 - a bug here must reach the test, not kill the thread
            message = f"scripted-llm: internal error answering {path}: {type(err).__name__}: {err}"
            _log.exception("%s", message)
            self._book.add_anomaly(Anomaly(kind="internal_error", model=str(body.get("model", "")), message=message))
            return 500, error_body(message, kind="server_error")


class _Handler(BaseHTTPRequestHandler):
    """Reads one request, asks the server's responder, writes JSON. One request per connection."""

    server: LoopbackServer
    server_version = "ScriptedLLM/1"
    timeout = _SOCKET_TIMEOUT_SECONDS

    def do_POST(self) -> None:  # http.server naming
        self._answer("POST")

    def do_GET(self) -> None:
        self._answer("GET")

    def _answer(self, method: str) -> None:
        try:
            raw = self._read_body()
        except (ValueError, OSError) as err:
            self._send(400, error_body(f"scripted-llm: cannot read the request body: {err}"))
            return
        status, body = self.server.responder.respond(method, self.path, raw)
        self._send(status, body)

    def _read_body(self) -> bytes:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            chunks: list[bytes] = []
            while True:
                size = int(self.rfile.readline().split(b";", 1)[0].strip() or b"0", 16)
                if size == 0:
                    self.rfile.readline()
                    return b"".join(chunks)
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def _send(self, status: int, body: Any) -> None:
        data = body.encode("utf-8") if isinstance(body, str) else json.dumps(body).encode("utf-8")
        content_type = "text/plain; charset=utf-8" if isinstance(body, str) else "application/json"
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:  # http.server signature
        _log.debug("scripted-llm %s - %s", self.address_string(), format % args)


class LoopbackServer(ThreadingHTTPServer):
    """A ThreadingHTTPServer whose request threads are named, tracked and joined with a bound.

    Thread-safe for its owner's calls. The owner drives it with ``handle_request()`` from its
    own loop (``timeout`` bounds each call), then calls ``server_close()`` and
    ``join_requests(timeout)``.
    """

    daemon_threads = True
    block_on_close = False

    def __init__(self, address: tuple[str, int], responder: Responder, poll_seconds: float = 0.1) -> None:
        self.responder = responder
        self.timeout = poll_seconds
        self._live: set[threading.Thread] = set()
        self._live_lock = threading.Lock()
        super().__init__(address, _Handler)

    def process_request(self, request: socket.socket | tuple[bytes, socket.socket], client_address: Any) -> None:
        # Daemon: if the process exits mid-request only that reply is lost, and the
        # Conductor server retries failed LLM calls.
        thread = threading.Thread(
            target=self._serve_one, args=(request, client_address), name=f"{THREAD_NAME}-request", daemon=True
        )
        with self._live_lock:
            self._live.add(thread)
        thread.start()

    def _serve_one(self, request: socket.socket | tuple[bytes, socket.socket], client_address: Any) -> None:
        try:
            self.process_request_thread(request, client_address)
        finally:
            with self._live_lock:
                self._live.discard(threading.current_thread())

    def handle_error(self, request: Any, client_address: Any) -> None:
        _log.debug("scripted-llm: connection from %s failed", client_address, exc_info=True)

    def join_requests(self, timeout: float, monotonic: Callable[[], float]) -> int:
        """Join in-flight request threads until ``timeout`` seconds pass; returns how many are left."""
        deadline = monotonic() + timeout
        with self._live_lock:
            threads = list(self._live)
        for thread in threads:
            thread.join(max(0.0, deadline - monotonic()))
        with self._live_lock:
            return sum(1 for t in self._live if t.is_alive())
