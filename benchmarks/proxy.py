"""A loopback HTTP proxy that counts the requests a client sends to the server.

Put between an SDK and the Conductor server (give the SDK ``proxy.url`` as its server URL)
to count what an idle run costs, per kind of request. It forwards each request on a
keep-alive connection of its own to the upstream and returns the whole response (no
streaming: the scenarios it is used for open no event streams).
"""

from __future__ import annotations

import http.client
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Dict, Optional, Tuple
from urllib.parse import urlsplit

_HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "proxy-connection", "te", "trailer", "upgrade",
               "content-length"}


def classify(method: str, path: str) -> str:
    """A coarse kind for a request path (``/api`` prefix already there or not)."""
    p = path.split("?", 1)[0]
    if "/tasks/poll" in p:
        return "task poll"
    if method == "POST" and p.rstrip("/").endswith("/tasks"):
        return "task update"
    if p.endswith("/status"):
        return "run status"
    if "/workflow/" in p and "/messages" in p:
        return "message"
    if "/workflow/" in p:
        return "workflow"
    return "other"


class CountingProxy:
    """Forwards ``http://127.0.0.1:<port>/...`` to ``upstream`` and counts requests. Thread-safe."""

    def __init__(self, upstream: str) -> None:
        parts = urlsplit(upstream)
        self._host = parts.hostname or "127.0.0.1"
        self._port = parts.port or 80
        self._prefix = parts.path.rstrip("/")
        self._lock = threading.Lock()
        self._counts: Dict[str, int] = {}
        self._bytes = 0  # request and response bodies, both ways
        self._server: Optional[ThreadingHTTPServer] = None
        self._thread: Optional[threading.Thread] = None

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}{self._prefix}"

    def count(self, kind: str) -> None:
        with self._lock:
            self._counts[kind] = self._counts.get(kind, 0) + 1

    def reset(self) -> None:
        with self._lock:
            self._counts = {}
            self._bytes = 0

    def add_bytes(self, n: int) -> None:
        with self._lock:
            self._bytes += n

    @property
    def bytes(self) -> int:
        """Body bytes that went through so far (requests and responses)."""
        with self._lock:
            return self._bytes

    def snapshot(self) -> Dict[str, int]:
        with self._lock:
            return dict(self._counts)

    def start(self) -> "CountingProxy":
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            upstream: Optional[http.client.HTTPConnection] = None

            def log_message(self, *args: object) -> None:
                pass

            def _forward(self) -> None:
                proxy.count(classify(self.command, self.path))
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_BY_HOP and k.lower() != "host"}
                status, reason, out_headers, data = self._upstream_call(body, headers)
                proxy.add_bytes(len(body or b"") + len(data))
                self.send_response(status, reason)
                for key, value in out_headers:
                    if key.lower() not in _HOP_BY_HOP:
                        self.send_header(key, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)

            def _upstream_call(self, body: Optional[bytes], headers: dict) -> Tuple[int, str, list, bytes]:
                for attempt in (1, 2):  # a kept-alive upstream connection may have been closed
                    if self.upstream is None:
                        self.upstream = http.client.HTTPConnection(proxy._host, proxy._port, timeout=60)
                    try:
                        self.upstream.request(self.command, self.path, body=body, headers=headers)
                        resp = self.upstream.getresponse()
                        data = resp.read()
                        return resp.status, resp.reason, resp.getheaders(), data
                    except (OSError, http.client.HTTPException):
                        self.upstream.close()
                        self.upstream = None
                        if attempt == 2:
                            return 502, "Bad Gateway", [], b""
                return 502, "Bad Gateway", [], b""

            do_GET = do_POST = do_PUT = do_DELETE = do_HEAD = do_PATCH = _forward

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.2},
                                        name="bench-proxy", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(5)
