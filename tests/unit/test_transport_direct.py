"""``Transport.get_json``'s direct path (urllib3 without requests), against a loopback HTTP server.

``responses`` cannot see this path (it patches requests), so these tests answer from a small
real server on 127.0.0.1: statuses, bodies, timeouts and tokens as the requests path has them.
"""

from __future__ import annotations

import http.server
import json
import socket
import threading
import time
from typing import Iterator, List

import pytest
import requests
import responses

from conductor_agents._wire.transport import HttpError, Transport
from conductor_agents.errors import AuthenticationError, ServerError, ServerUnavailableError


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    seen: List[dict] = []
    tokens: List[str] = []

    def _send(self, status: int, body: bytes, content_type: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        self.seen.append({"path": self.path, "auth": self.headers.get("X-Authorization"),
                          "agent": self.headers.get("User-Agent")})
        route = self.path.split("?")[0]
        if route == "/api/ok":
            self._send(200, b'[{"taskId": "t1"}]')
        elif route == "/api/empty":
            self._send(204, b"")
        elif route == "/api/text":
            self._send(200, b"plain words", "text/plain")
        elif route == "/api/malformed":
            self._send(200, b"{not json")
        elif route == "/api/boom":
            self._send(500, b'{"message": "boom"}')
        elif route == "/api/missing":
            self._send(404, b"no such thing", "text/plain")
        elif route == "/api/slow":
            time.sleep(1.5)
            self._send(200, b"[]")
        elif route == "/api/guarded":
            ok = self.tokens and self.headers.get("X-Authorization") == self.tokens[-1] and len(self.tokens) > 1
            self._send(200, b'"in"') if ok else self._send(401, b'{"message": "expired"}')
        else:
            self._send(404, b"")

    def do_POST(self) -> None:  # noqa: N802
        length = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(length)
        token = f"tok{len(self.tokens) + 1}"
        self.tokens.append(token)
        self._send(200, json.dumps({"token": token}).encode())

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[str]:
    _Handler.seen, _Handler.tokens = [], []
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}/api"
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(5)


@pytest.fixture
def transport(server: str) -> Iterator[Transport]:
    made = Transport(server)
    yield made
    made.close()


def test_get_json_goes_around_requests_and_sends_what_requests_would(server, transport, monkeypatch):
    def no_requests(*args, **kwargs):
        raise AssertionError("the direct path was expected")

    monkeypatch.setattr(requests.Session, "request", no_requests)
    assert transport.get_json("/ok", params={"taskType": ["d1:act", "b"], "count": 1}) == [{"taskId": "t1"}]
    [seen] = _Handler.seen
    assert seen["path"] == "/api/ok?taskType=d1%3Aact&taskType=b&count=1"
    assert (seen["auth"], seen["agent"]) == (None, "conductor-agents-python")


def test_bodies_decode_as_on_the_requests_path(transport):
    assert transport.get_json("/empty") is None
    assert transport.get_json("/text") == "plain words"
    with pytest.raises(ServerError, match="malformed JSON"):
        transport.get_json("/malformed")


def test_error_statuses_are_http_errors_with_the_servers_message(transport):
    with pytest.raises(HttpError) as boom:
        transport.get_json("/boom")
    assert (boom.value.status, boom.value.server_message, boom.value.transient) == (500, "boom", True)
    with pytest.raises(HttpError) as missing:
        transport.get_json("/missing")
    assert (missing.value.status, missing.value.server_message, missing.value.transient) == (404, "no such thing", False)


def test_a_slow_answer_and_a_closed_port_are_server_unavailable(transport):
    with pytest.raises(ServerUnavailableError, match="did not answer in time"):
        transport.get_json("/slow", timeout=(1.0, 0.3))
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    closed = Transport(f"http://127.0.0.1:{port}/api")
    try:
        with pytest.raises(ServerUnavailableError, match="cannot reach"):
            closed.get_json("/ok", timeout=(0.5, 0.5))
    finally:
        closed.close()


def test_an_expired_token_is_refreshed_once(server):
    authed = Transport(server, auth_key="key", auth_secret="the-secret")
    try:
        assert authed.get_json("/guarded") == "in"  # tok1 refused, tok2 taken
        assert [s["auth"] for s in _Handler.seen] == ["tok1", "tok2"]
        _Handler.tokens.clear()  # every token refused from now on
        with pytest.raises(AuthenticationError) as refused:
            authed.get_json("/guarded")
        assert "the-secret" not in str(refused.value)
    finally:
        authed.close()


def test_a_replaced_requests_send_sees_the_call(transport):
    """``responses`` (or instrumentation) patches requests: get_json then goes through requests."""
    with responses.RequestsMock() as mock:
        mock.get(f"{transport.base_url}/ok", json=["mocked"])
        assert transport.get_json("/ok") == ["mocked"]
    assert _Handler.seen == []


def test_no_direct_path_through_a_proxy_or_a_borrowed_session(server, monkeypatch):
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    proxied = Transport(server)
    borrowed = Transport(server, session=requests.Session())
    try:
        assert proxied._direct is None and borrowed._direct is None
    finally:
        proxied.close()
        borrowed.close()


def test_a_new_process_gets_a_new_pool_and_a_closed_transport_sends_nothing(transport):
    first = transport._direct
    transport.get_json("/ok")
    transport._pid = -1  # as in a child forked without the hook having run
    transport.get_json("/ok")
    assert transport._direct is not first and transport._direct is not None
    transport.close()
    with pytest.raises(ServerUnavailableError):
        transport.get_json("/ok")


def test_https_verifies_with_the_bundle_requests_would_use(monkeypatch, tmp_path):
    """TLS as on the requests path: certifi's bundle, or REQUESTS_CA_BUNDLE (a file or a directory)."""
    monkeypatch.delenv("REQUESTS_CA_BUNDLE", raising=False)
    monkeypatch.delenv("CURL_CA_BUNDLE", raising=False)
    default = Transport("https://conductor.example:8443/api")
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(tmp_path))
    from_dir = Transport("https://conductor.example:8443/api")
    try:
        pool = default._direct._pool
        assert (pool.host, pool.port, pool.cert_reqs, pool.ca_certs) == (
            "conductor.example", 8443, "CERT_REQUIRED", requests.certs.where())
        assert from_dir._direct._pool.ca_cert_dir == str(tmp_path)
    finally:
        default.close()
        from_dir.close()
