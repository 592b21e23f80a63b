"""A loopback TCP proxy the tests control: cut every connection, or answer 404 to some paths.

Client-to-server bytes are parsed as HTTP/1.1 requests (request line, headers,
``Content-Length`` body) so each request's path and headers are recorded and a request can
be refused; server-to-client bytes are copied as they come (streams stay streams).
"""

from __future__ import annotations

import json
import socket
import threading
from typing import Dict, List, Optional, Tuple
from urllib.parse import urlparse


class TcpProxy:
    """``TcpProxy(upstream_url).start()``; ``url`` is the proxied API base URL. Thread-safe.

    ``cut()`` shuts down every open connection (both sides) at once; ``refuse_paths``
    answers ``404`` (a JSON body, then closes) to any request whose path contains one of them.
    """

    def __init__(self, upstream_url: str, *, refuse_paths: Tuple[str, ...] = ()) -> None:
        parsed = urlparse(upstream_url)
        self._upstream = (parsed.hostname or "127.0.0.1", parsed.port or 80)
        self._base_path = parsed.path.rstrip("/")
        self.refuse_paths = refuse_paths
        self._lock = threading.Lock()
        self._sockets: List[socket.socket] = []
        self._threads: List[threading.Thread] = []
        self._listener: Optional[socket.socket] = None
        self._stopped = threading.Event()
        self.requests: List[Tuple[str, str, Dict[str, str]]] = []
        self.cuts = 0

    @property
    def url(self) -> str:
        assert self._listener is not None
        return f"http://127.0.0.1:{self._listener.getsockname()[1]}{self._base_path}"

    def start(self) -> "TcpProxy":
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.bind(("127.0.0.1", 0))
        listener.listen(64)
        listener.settimeout(0.2)
        self._listener = listener
        self._spawn(self._accept_loop, "proxy-accept")
        return self

    def stop(self) -> None:
        self._stopped.set()
        self.cut(count=False)
        for thread in list(self._threads):
            thread.join(timeout=5)
        if self._listener is not None:
            self._listener.close()

    def __enter__(self) -> "TcpProxy":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def cut(self, *, count: bool = True) -> None:
        """Break every open connection now."""
        with self._lock:
            sockets, self._sockets = self._sockets, []
            if count:
                self.cuts += 1
        for sock in sockets:
            _shut(sock)

    def requests_to(self, fragment: str) -> List[Tuple[str, str, Dict[str, str]]]:
        with self._lock:
            return [r for r in self.requests if fragment in r[1]]

    # -- internals --------------------------------------------------------------------

    def _spawn(self, target, name: str, *args: object) -> None:
        thread = threading.Thread(target=target, args=args, name=name, daemon=True)
        with self._lock:
            self._threads = [t for t in self._threads if t.is_alive()]
            self._threads.append(thread)
        thread.start()

    def _track(self, sock: socket.socket) -> None:
        with self._lock:
            self._sockets.append(sock)

    def _accept_loop(self) -> None:
        assert self._listener is not None
        while not self._stopped.is_set():
            try:
                client, _ = self._listener.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            client.settimeout(None)
            self._track(client)
            self._spawn(self._client_loop, "proxy-client", client)

    def _client_loop(self, client: socket.socket) -> None:
        upstream: Optional[socket.socket] = None
        buffer = b""
        try:
            while True:
                head, buffer = _read_until(client, buffer, b"\r\n\r\n")
                if head is None:
                    return
                method, path, headers = _parse_head(head)
                length = int(headers.get("content-length", "0") or 0)
                body, buffer = _read_exactly(client, buffer, length)
                if body is None:
                    return
                with self._lock:
                    self.requests.append((method, path, headers))
                if any(fragment in path for fragment in self.refuse_paths):
                    payload = json.dumps({"status": 404, "message": "refused by the test proxy"}).encode()
                    client.sendall(b"HTTP/1.1 404 Not Found\r\nContent-Type: application/json\r\nContent-Length: "
                                   + str(len(payload)).encode() + b"\r\nConnection: close\r\n\r\n" + payload)
                    return
                if upstream is None:
                    upstream = socket.create_connection(self._upstream, timeout=5)
                    upstream.settimeout(None)
                    self._track(upstream)
                    self._spawn(self._pump, "proxy-pump", upstream, client)
                upstream.sendall(head + body)
        except OSError:
            return
        finally:
            _shut(client)
            if upstream is not None:
                _shut(upstream)

    @staticmethod
    def _pump(source: socket.socket, target: socket.socket) -> None:
        try:
            while True:
                data = source.recv(65536)
                if not data:
                    return
                target.sendall(data)
        except OSError:
            return
        finally:
            _shut(source)
            _shut(target)


def _shut(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    try:
        sock.close()
    except OSError:
        pass


def _read_until(sock: socket.socket, buffer: bytes, marker: bytes) -> Tuple[Optional[bytes], bytes]:
    while marker not in buffer:
        data = sock.recv(65536)
        if not data:
            return None, b""
        buffer += data
    end = buffer.index(marker) + len(marker)
    return buffer[:end], buffer[end:]


def _read_exactly(sock: socket.socket, buffer: bytes, length: int) -> Tuple[Optional[bytes], bytes]:
    while len(buffer) < length:
        data = sock.recv(65536)
        if not data:
            return None, b""
        buffer += data
    return buffer[:length], buffer[length:]


def _parse_head(head: bytes) -> Tuple[str, str, Dict[str, str]]:
    lines = head.decode("latin-1").split("\r\n")
    method, path, _ = (lines[0].split(" ", 2) + ["", ""])[:3]
    headers = {}
    for line in lines[1:]:
        if ":" in line:
            name, value = line.split(":", 1)
            headers[name.strip().lower()] = value.strip()
    return method, path, headers
