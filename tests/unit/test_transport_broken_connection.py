"""A connection that breaks before the answer (a cluster node killed, a balancer shutting the sessions of a
node it marked down): a GET is sent once more, on both the requests path and the direct path; a POST is
not (it may have run on the server), and neither is a GET whose second connection breaks too.

The server is a loopback socket that reads each request and closes the connection without answering
for the first ``drops`` requests, then answers ``200 []``.
"""

from __future__ import annotations

import socket
import threading
from typing import Iterator, List

import pytest

from conductor_agents._wire.transport import Transport
from conductor_agents.errors import ServerUnavailableError


class DroppingServer:
    def __init__(self, drops: int) -> None:
        self.drops = drops
        self.requests: List[str] = []
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(16)
        self._sock.settimeout(0.2)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._sock.getsockname()[1]}/api"

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except OSError:
                continue
            with conn:
                conn.settimeout(5)
                data = b""
                while b"\r\n\r\n" not in data:
                    chunk = conn.recv(65536)
                    if not chunk:
                        break
                    data += chunk
                if not data:
                    continue
                self.requests.append(data.split(b"\r\n", 1)[0].decode())
                if len(self.requests) <= self.drops:
                    conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
                    continue  # closed (reset) without an answer
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n"
                             b"Connection: close\r\n\r\n[]")

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._sock.close()


@pytest.fixture
def make_server() -> Iterator:
    made: List[DroppingServer] = []

    def make(drops: int) -> DroppingServer:
        made.append(DroppingServer(drops))
        return made[-1]

    yield make
    for server in made:
        server.close()


@pytest.mark.parametrize("path", ["requests", "direct"])
def test_a_get_whose_connection_broke_is_sent_once_more(make_server, path):
    server = make_server(drops=1)
    transport = Transport(server.url)
    try:
        answer = transport.request("GET", "/x") if path == "requests" else transport.get_json("/x")
    finally:
        transport.close()
    assert answer == []
    assert server.requests == ["GET /api/x HTTP/1.1"] * 2


@pytest.mark.parametrize("path", ["requests", "direct"])
def test_a_get_broken_twice_is_server_unavailable(make_server, path):
    server = make_server(drops=2)
    transport = Transport(server.url)
    try:
        with pytest.raises(ServerUnavailableError, match="cannot reach"):
            transport.request("GET", "/x") if path == "requests" else transport.get_json("/x")
    finally:
        transport.close()
    assert len(server.requests) == 2


def test_a_post_whose_connection_broke_is_not_sent_again(make_server):
    server = make_server(drops=1)
    transport = Transport(server.url)
    try:
        with pytest.raises(ServerUnavailableError):
            transport.request("POST", "/x", json_body={"a": 1})
    finally:
        transport.close()
    assert server.requests == ["POST /api/x HTTP/1.1"]


@pytest.mark.parametrize("path", ["requests", "direct"])
def test_a_poll_that_takes_tasks_is_not_sent_again_but_one_for_none_is(make_server, path):
    """The server hands a polled task to the worker before it answers: a broken answer may have held tasks, which a
    poll sent again would leave waiting for their response timeout. The poller hears of the failure instead (and
    looks for them); a poll for none (count 0: the presence beat) only tells the server who polls."""
    server = make_server(drops=2)
    transport = Transport(server.url)
    taking = {"workerid": "w", "count": 1, "timeout": 100}
    try:
        with pytest.raises(ServerUnavailableError):
            if path == "requests":
                transport.request("GET", "/tasks/poll/batch/act", params=taking)
            else:
                transport.get_json("/tasks/poll/batch/act", params=taking)
        assert len(server.requests) == 1
        answer = (transport.request if path == "requests" else
                  lambda method, p, **kw: transport.get_json(p, **kw))("GET", "/tasks/poll/batch/act",
                                                                       params={**taking, "count": 0})
    finally:
        transport.close()
    assert answer == [] and len(server.requests) == 3  # the poll for none: broken once, sent once more
