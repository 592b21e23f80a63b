"""A loopback HTTP proxy that counts the requests a client sends to the server.

Put between an SDK and the Conductor server (give the SDK ``proxy.url`` as its server URL)
to count what an idle run costs, per kind of request. It forwards each request on a
keep-alive connection of its own to the upstream and returns the whole response (no
streaming: the scenarios it is used for open no event streams).
"""

from __future__ import annotations

import contextlib
import http.client
import socket
import threading
import time
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


class FaultyProxy:
    """A loopback TCP relay to ``upstream`` whose connections can be cut or slowed (the soak's network faults).

    :meth:`cut` closes every relayed connection and refuses new ones (accepted, then closed at once) for a
    while; :meth:`slow` delays every chunk relayed, either way, for a while. Clients use :attr:`url`.
    Thread-safe; two threads per relayed connection.
    """

    def __init__(self, upstream: str) -> None:
        parts = urlsplit(upstream)
        self._host = parts.hostname or "127.0.0.1"
        self._port = parts.port or 80
        self._prefix = parts.path.rstrip("/")
        self._lock = threading.Lock()
        self._pairs: set[tuple[socket.socket, socket.socket]] = set()
        self._refuse_until = 0.0
        self._slow_until = 0.0
        self._slow_by = 0.0
        self._stop = threading.Event()
        self._listener: socket.socket | None = None

    @property
    def url(self) -> str:
        assert self._listener is not None
        return f"http://127.0.0.1:{self._listener.getsockname()[1]}{self._prefix}"

    def start(self) -> FaultyProxy:
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.5)
        threading.Thread(target=self._accept, name="soak-proxy-accept", daemon=True).start()
        return self

    def cut(self, seconds: float) -> int:
        """Close every relayed connection and refuse new ones for ``seconds``; how many were cut."""
        with self._lock:
            self._refuse_until = time.monotonic() + seconds
            pairs, self._pairs = list(self._pairs), set()
        for pair in pairs:
            _close(*pair)
        return len(pairs)

    def slow(self, seconds: float, delay: float) -> None:
        """Delay every chunk relayed by ``delay`` s for the next ``seconds``."""
        with self._lock:
            self._slow_until, self._slow_by = time.monotonic() + seconds, delay

    def stop(self) -> None:
        self._stop.set()
        self.cut(0.0)
        if self._listener is not None:
            self._listener.close()

    def _accept(self) -> None:
        assert self._listener is not None
        while not self._stop.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            if time.monotonic() < self._refuse_until:
                client.close()
                continue
            try:
                upstream = socket.create_connection((self._host, self._port), timeout=10)
            except OSError:
                client.close()
                continue
            for sock in (client, upstream):
                sock.settimeout(None)
            pair = (client, upstream)
            with self._lock:
                self._pairs.add(pair)
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(src, dst, pair), name="soak-proxy-pump", daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, pair: tuple[socket.socket, socket.socket]) -> None:
        with contextlib.suppress(OSError):  # a cut, or either side closed
            while True:
                data = src.recv(65536)
                if not data:
                    break
                with self._lock:
                    delay = self._slow_by if time.monotonic() < self._slow_until else 0.0
                if delay:
                    time.sleep(delay)
                dst.sendall(data)
        with self._lock:
            self._pairs.discard(pair)
        _close(*pair)


def _close(*socks: socket.socket) -> None:
    for sock in socks:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
        sock.close()
