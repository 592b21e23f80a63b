"""A loopback TCP proxy the reliability tests control: freeze traffic, refuse some HTTP paths.

``FreezableProxy(upstream_port)`` listens on a free 127.0.0.1 port and forwards every byte to
``127.0.0.1:upstream_port``. While :meth:`~FreezableProxy.freeze` is in effect nothing is
forwarded in either direction and nothing is closed: connections (old and new) are held,
their bytes wait in the kernel's socket buffers, exactly like a network that went silent.
:meth:`~FreezableProxy.unfreeze` lets the held bytes through, except the requests of clients
that gave up while frozen (they closed their socket): those are dropped rather than replayed,
so a poll the SDK abandoned never reaches the server later and takes a task nobody reads.

:meth:`~FreezableProxy.refuse` makes the proxy answer HTTP requests whose path starts with a
prefix with ``503`` itself (the request never reaches the server). It looks at the first
bytes each time a client sends: fine for ``requests``, which sends a request line and its
headers in one write and never pipelines.

Thread-safe. Threads are named ``reliability-proxy-*`` (not ``conductor-agents-``, so the
SDK's thread-leak checks do not see them); :meth:`~FreezableProxy.stop` closes every socket
and joins every thread with a deadline.
"""

from __future__ import annotations

import select
import socket
import threading
from typing import Iterable, List, Optional, Tuple

_TICK = 0.05  # how often a pump re-checks the freeze / stop flags
_JOIN_SECONDS = 5.0


class FreezableProxy:
    """Forwards 127.0.0.1:<port> to 127.0.0.1:<upstream_port>; freeze, unfreeze, refuse."""

    def __init__(self, upstream_port: int, *, upstream_host: str = "127.0.0.1") -> None:
        self._upstream = (upstream_host, upstream_port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._listener.getsockname()[1])
        self._flowing = threading.Event()
        self._flowing.set()
        self._closed = threading.Event()
        self._lock = threading.Lock()
        self._sockets: List[socket.socket] = []
        self._threads: List[threading.Thread] = []
        self._refused_prefixes: Tuple[bytes, ...] = ()
        self.refused = 0  # requests answered 503 by refuse()
        self.dropped = 0  # requests abandoned by their client while frozen, never forwarded
        self.connections = 0

    # -- control ----------------------------------------------------------------------

    def url(self, path: str = "/api") -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def start(self) -> "FreezableProxy":
        self._spawn(self._accept_loop, "accept")
        return self

    def freeze(self) -> None:
        """Stop forwarding in both directions; hold every connection open."""
        self._flowing.clear()

    def unfreeze(self) -> None:
        """Forward again (held bytes first, minus requests whose client gave up)."""
        self._flowing.set()

    @property
    def frozen(self) -> bool:
        return not self._flowing.is_set()

    def refuse(self, prefixes: Iterable[str]) -> None:
        """Answer requests whose path starts with one of ``prefixes`` with 503 (``[]`` undoes it)."""
        with self._lock:
            self._refused_prefixes = tuple(p.encode() for p in prefixes)

    def stop(self) -> None:
        """Close everything and join the threads (bounded). Idempotent."""
        self._closed.set()
        self._flowing.set()
        try:
            self._listener.close()
        except OSError:
            pass
        with self._lock:
            sockets, threads = list(self._sockets), list(self._threads)
        for sock in sockets:
            _close(sock)
        for thread in threads:
            if thread is not threading.current_thread():
                thread.join(_JOIN_SECONDS)

    def __enter__(self) -> "FreezableProxy":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- internals --------------------------------------------------------------------

    def _spawn(self, target, role: str, *args) -> None:
        # Daemon: a test helper; if the test process exits, only this proxy is lost.
        thread = threading.Thread(target=target, args=args, name=f"reliability-proxy-{role}", daemon=True)
        with self._lock:
            self._threads = [t for t in self._threads if t.is_alive()]
            self._threads.append(thread)
        thread.start()

    def _track(self, sock: socket.socket) -> None:
        with self._lock:
            self._sockets.append(sock)

    def _accept_loop(self) -> None:
        self._listener.settimeout(_TICK * 4)
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            self.connections += 1
            self._track(client)
            try:
                upstream = socket.create_connection(self._upstream, timeout=5.0)
            except OSError:
                _close(client)  # the server is down: the client sees a reset, as it would directly
                continue
            self._track(upstream)
            self._spawn(self._pump, "c2s", client, upstream, True)
            self._spawn(self._pump, "s2c", upstream, client, False)

    def _pump(self, src: socket.socket, dst: socket.socket, from_client: bool) -> None:
        try:
            while not self._closed.is_set():
                if not self._flowing.wait(_TICK):
                    continue  # frozen: leave the bytes in the kernel buffer
                readable, _, _ = select.select([src], [], [], _TICK)
                if not readable:
                    continue
                if not self._flowing.is_set():
                    continue  # froze between the checks: do not read (hold)
                data = src.recv(65536)
                if not data:
                    break
                if from_client:
                    if self._is_refused(data):
                        self.refused += 1
                        src.sendall(_REFUSAL)
                        break
                    data, gone = _rest_unless_closed(src, data)
                    if gone:
                        self.dropped += 1
                        break
                dst.sendall(data)
        except (OSError, ValueError):  # ValueError: the other pump closed the socket under select()
            pass
        finally:
            _close(src)
            _close(dst)

    def _is_refused(self, data: bytes) -> bool:
        with self._lock:
            prefixes = self._refused_prefixes
        if not prefixes:
            return False
        parts = data.split(b"\r\n", 1)[0].split(b" ")
        return len(parts) >= 2 and any(parts[1].startswith(p) for p in prefixes)


_BODY = b'{"status":503,"message":"refused by the test proxy"}'
_REFUSAL = (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
            b"Content-Length: " + str(len(_BODY)).encode() + b"\r\nConnection: close\r\n\r\n" + _BODY)


def _rest_unless_closed(sock: socket.socket, data: bytes) -> "tuple[bytes, bool]":
    """``data`` plus whatever else is buffered; ``gone`` when the client closed after sending it.

    An HTTP client that sent a request and is still waiting for the answer never closes its
    socket; one that closed it has given up (it timed out while the proxy held the request).
    """
    chunks = [data]
    sock.setblocking(False)
    try:
        while True:
            try:
                more = sock.recv(65536)
            except (BlockingIOError, InterruptedError):
                return b"".join(chunks), False
            except OSError:
                return b"", True
            if not more:
                return b"", True
            chunks.append(more)
    finally:
        try:
            sock.setblocking(True)
        except OSError:
            pass


def _close(sock: Optional[socket.socket]) -> None:
    if sock is None:
        return
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    try:
        sock.close()
    except OSError:
        pass
