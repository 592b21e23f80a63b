"""A loopback TCP proxy the tests steer: freeze traffic, cut connections, refuse some requests.

``LoopbackProxy(upstream_url)`` listens on a free 127.0.0.1 port and forwards every byte to the
upstream server; :attr:`~LoopbackProxy.url` is the proxied API base URL (same path).

- :meth:`~LoopbackProxy.freeze`: nothing is forwarded in either direction and nothing is
  closed; connections (old and new) are held and their bytes wait in the kernel's socket
  buffers, like a network that went silent. :meth:`~LoopbackProxy.unfreeze` lets the held
  bytes through, except the requests of clients that gave up meanwhile (they closed their
  socket): those are dropped rather than replayed, so a poll the SDK abandoned never reaches
  the server later and takes a task nobody reads.
- :meth:`~LoopbackProxy.cut`: shuts every open connection (both sides) at once.
- :meth:`~LoopbackProxy.refuse`: answers requests whose path contains a fragment with an error
  status itself (the request never reaches the server), then closes that connection; with
  ``status=0`` it closes the connection without any answer (the client sees a connection error).
- :meth:`~LoopbackProxy.lose_answers`: forwards the next requests whose path contains a fragment to the
  server, then drops the server's answer and closes the connection (the server acted; the client sees a
  connection error, as when an answer is lost on the way back).
- :meth:`~LoopbackProxy.requests_to`: the requests seen (method, path, lower-cased headers).

Requests are recognised by their first bytes each time a client sends: fine for ``requests``,
which sends a request line and its headers in one write and never pipelines. Thread-safe.
Threads are named ``test-proxy-*`` (not ``conductor-agents-``, so the SDK's thread-leak checks
do not see them); :meth:`~LoopbackProxy.stop` closes every socket and joins every thread with a
deadline.
"""

from __future__ import annotations

import json
import re
import select
import socket
import threading
from typing import Dict, Iterable, List, Optional, Tuple
from urllib.parse import urlparse

_TICK = 0.05  # how often a pump re-checks the freeze / stop flags
_JOIN_SECONDS = 5.0
_REQUEST_LINE = re.compile(rb"^([A-Z]+) (\S+) HTTP/1\.[01]\r\n")
_REASONS = {404: "Not Found", 500: "Internal Server Error", 503: "Service Unavailable"}

Request = Tuple[str, str, Dict[str, str]]


class LoopbackProxy:
    """Forwards 127.0.0.1:<port> to the upstream of ``upstream_url``; freeze, cut, refuse, record."""

    def __init__(self, upstream_url: str) -> None:
        parsed = urlparse(upstream_url)
        self._upstream = (parsed.hostname or "127.0.0.1", parsed.port or 80)
        self._base_path = parsed.path.rstrip("/")
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._listener.getsockname()[1])
        self._flowing = threading.Event()
        self._flowing.set()
        self._closed = threading.Event()
        self._lock = threading.Lock()
        self._sockets: List[socket.socket] = []
        self._threads: List[threading.Thread] = []
        self._refusals: Tuple[Tuple[bytes, int], ...] = ()
        self._requests: List[Request] = []
        self._lose: List[List[object]] = []  # [fragment bytes, answers left to lose]
        self.lost = 0  # answers dropped by lose_answers()
        self.refused = 0  # requests answered by refuse()
        self.dropped = 0  # requests abandoned by their client while frozen, never forwarded
        self.connections = 0
        self.cuts = 0

    # -- control ----------------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}{self._base_path}"

    def start(self) -> "LoopbackProxy":
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

    def cut(self) -> None:
        """Break every open connection now."""
        with self._lock:
            sockets, self._sockets = self._sockets, []
            self.cuts += 1
        for sock in sockets:
            _close(sock)

    def refuse(self, fragments: Iterable[str], *, status: int = 503) -> None:
        """Answer requests whose path contains one of ``fragments`` with ``status`` (``[]`` undoes it).

        ``status=0``: close the connection without an answer instead.
        """
        with self._lock:
            self._refusals = tuple((f.encode(), status) for f in fragments)

    def lose_answers(self, fragment: str, count: int = 1) -> None:
        """Forward the next ``count`` requests whose path contains ``fragment``, and drop their answers."""
        with self._lock:
            self._lose.append([fragment.encode(), count])

    def requests_to(self, fragment: str) -> List[Request]:
        """The requests seen whose path contains ``fragment``, oldest first."""
        with self._lock:
            return [r for r in self._requests if fragment in r[1]]

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

    def __enter__(self) -> "LoopbackProxy":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- internals --------------------------------------------------------------------

    def _spawn(self, target, role: str, *args) -> None:
        # Daemon: a test helper; if the test process exits, only this proxy is lost.
        thread = threading.Thread(target=target, args=args, name=f"test-proxy-{role}", daemon=True)
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
            lose = threading.Event()  # set: this connection's next answer is dropped
            self._spawn(self._pump, "c2s", client, upstream, True, lose)
            self._spawn(self._pump, "s2c", upstream, client, False, lose)

    def _pump(self, src: socket.socket, dst: socket.socket, from_client: bool, lose: threading.Event) -> None:
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
                    refusal = self._note_request(data)
                    if refusal is not None:
                        self.refused += 1
                        if refusal:
                            src.sendall(refusal)
                        break
                    data, gone = _rest_unless_closed(src, data)
                    if gone:
                        self.dropped += 1
                        break
                    if self._to_lose(data):
                        lose.set()
                elif lose.is_set():
                    self.lost += 1
                    break  # the server answered; the answer is lost on the way back
                dst.sendall(data)
        except (OSError, ValueError):  # ValueError: the other side closed the socket under select()
            pass
        finally:
            _close(src)
            _close(dst)

    def _to_lose(self, data: bytes) -> bool:
        """Whether the request ``data`` starts is one whose answer :meth:`lose_answers` drops (counted)."""
        match = _REQUEST_LINE.match(data)
        if match is None:
            return False
        with self._lock:
            for rule in self._lose:
                if rule[0] in match.group(2) and int(rule[1]) > 0:  # type: ignore[operator,arg-type]
                    rule[1] = int(rule[1]) - 1  # type: ignore[arg-type]
                    return True
        return False

    def _note_request(self, data: bytes) -> Optional[bytes]:
        """Record the request that ``data`` starts (if it starts one); the refusal to send, if any."""
        match = _REQUEST_LINE.match(data)
        if match is None:
            return None  # the rest of a body
        method, path = match.group(1).decode(), match.group(2)
        head = data.split(b"\r\n\r\n", 1)[0].decode("latin-1").split("\r\n")[1:]
        headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in head) if k}
        with self._lock:
            self._requests.append((method, path.decode("latin-1"), headers))
            refusals = self._refusals
        status = next((s for fragment, s in refusals if fragment in path), None)
        return None if status is None else _refusal(status)


def _refusal(status: int) -> bytes:
    if status == 0:
        return b""  # close without an answer
    body = json.dumps({"status": status, "message": "refused by the test proxy"}).encode()
    return (f"HTTP/1.1 {status} {_REASONS.get(status, 'Error')}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode() + body


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
