"""The HTTP boundary: with :mod:`.retries`, the only module that imports ``requests``.

It owns the :class:`requests.Session` (and closes only one it created), the retry
policy, the auth token, and turns every ``requests`` exception and HTTP error status
into a :mod:`conductor_agents.errors` type with ``raise ... from err`` (a failure to reach the server
from :func:`.causes.short_cause`: its root in one line, not the four exceptions ``requests`` chains). The
small GETs that every live run makes in the background (polls, queue sizes) go on a urllib3 pool of its own
when it may (:class:`_DirectGets`, :meth:`Transport.get_json`), with the same errors.

Retry policy (:mod:`.retries`; urllib3 ``Retry`` on the mounted adapter): only failures to *establish* a
connection are retried, twice with a short backoff, for every method. Nothing has reached
the server then, so a retry can never run a side effect twice. A GET whose connection broke
before the answer came (reset, closed: a node of a cluster killed, a balancer shutting the
sessions of a node it marked down) is sent once more: it changes nothing on the server (a poll that takes tasks
does: it is not, see :mod:`.retries`).
Everything else (read timeouts, 5xx, 429, a broken POST) is reported to the caller, which knows
whether its call is safe to repeat (``wait()`` counts transient errors; result updates retry
with backoff).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import threading
from collections.abc import Iterator, Mapping
from typing import Any
from urllib.parse import urlencode

import requests
import requests.utils
import urllib3
from requests.adapters import HTTPAdapter

from .._common.clock import SYSTEM_CLOCK, Clock
from .._common.fork import rebuild_after_fork
from ..errors import AuthenticationError, ServerError, ServerUnavailableError
from .base_url import missing_api_prefix
from .causes import short_cause, unavailable
from .retries import again_if_broken, connect_retries, hands_out_tasks

__all__ = ["HttpError", "Transport", "TRANSIENT_STATUSES"]

log = logging.getLogger("conductor_agents.transport")

#: Statuses that say "try again later" rather than "this request is wrong".
TRANSIENT_STATUSES = frozenset({429, 500, 502, 503, 504})

#: Tokens are refreshed this long before the server's usual one-hour expiry.
_TOKEN_MAX_AGE_SECONDS = 45 * 60

Timeout = float | tuple[float, float]

#: Serializes the rebuild of a transport found in a new process without the fork hook having run.
_process_check_lock = threading.Lock()

#: What requests sends through; if either is replaced (a test double such as ``responses``, or
#: instrumentation), :meth:`Transport.get_json` takes the requests path so that it sees the call.
_REQUESTS_SENDS = (requests.Session.send, HTTPAdapter.send)


class _DirectGets:
    """GETs with small JSON answers sent on a urllib3 pool of their own, without requests.

    A thousand idle listeners send about 17 polls a second between them, plus the queue watcher's
    reads; through requests each cost about 1.7 ms of client CPU (measured in a process serving
    1,000 runs), on urllib3 directly about half. Only for a transport with its own session and no
    proxy; the same connect retries, timeouts and TLS verification as the requests path.
    """

    def __init__(self, base_url: str, pool_size: int, verify: bool | str) -> None:
        parsed = urllib3.util.parse_url(base_url)
        self._prefix = (parsed.path or "").rstrip("/")
        tls: dict[str, Any] = {}
        if parsed.scheme == "https":
            if verify is False:
                tls = {"cert_reqs": "CERT_NONE"}
            else:
                bundle = verify if isinstance(verify, str) else requests.utils.DEFAULT_CA_BUNDLE_PATH
                tls = {"cert_reqs": "CERT_REQUIRED",
                       "ca_cert_dir" if os.path.isdir(bundle) else "ca_certs": bundle}
        self._pool = urllib3.connection_from_url(base_url, maxsize=pool_size, block=False, **tls)

    def get(self, path: str, params: Mapping[str, Any] | None, headers: Mapping[str, str],
            timeout: tuple[float, float]) -> tuple[int, bytes, str]:
        """(status, body, content type); urllib3's errors propagate."""
        url = self._prefix + path
        if params:
            url += "?" + urlencode(params, doseq=True)
        response = self._pool.urlopen(
            "GET", url, headers=dict(headers), retries=connect_retries(), redirect=False,
            timeout=urllib3.Timeout(connect=timeout[0], read=timeout[1]), preload_content=True,
        )
        return response.status, response.data, response.headers.get("Content-Type", "")

    def close(self) -> None:
        self._pool.close()


class HttpError(ServerError):
    """An HTTP error status from the server; ``status`` and ``message`` (the server's text).

    The API layer maps these to the specific errors (``ExecutionNotFoundError`` ...).
    """

    status: int  # an answer came: its status is never None here

    def __init__(self, message: str, *, status: int, server_message: str, method: str, path: str) -> None:
        super().__init__(message, status=status)
        self.server_message = server_message
        self.method = method
        self.path = path

    @property
    def transient(self) -> bool:
        """Whether the same request may succeed later (5xx, 429)."""
        return self.status in TRANSIENT_STATUSES


def _server_message(response: requests.Response) -> str:
    return _message_of(response.content or b"")


def _message_of(body: bytes) -> str:
    """The server's message in an error body (as :func:`_server_message`, from raw bytes)."""
    text = body.decode("utf-8", "replace")
    try:
        parsed = json.loads(text)
    except ValueError:
        return text.strip()[:500]
    if isinstance(parsed, dict) and parsed.get("message"):
        return str(parsed["message"])[:500]
    return text.strip()[:500]


class ByteStream:
    """An open streaming response (see :meth:`Transport.open_stream`): iterate for raw chunks.

    One thread iterates; :meth:`abort` may be called from any other thread and unblocks a
    read in progress (it shuts the socket down). Iterating maps every failure to
    :class:`ServerUnavailableError`; the iteration simply ends when the server closes the
    stream cleanly. Use it as a context manager, or call :meth:`close`.
    """

    def __init__(self, response: requests.Response, method: str, path: str) -> None:
        self._response = response
        self._method = method
        self._path = path
        self._aborted = False
        self.status = response.status_code
        self.headers: Mapping[str, str] = response.headers

    def __iter__(self) -> Iterator[bytes]:
        raw = self._response.raw
        try:
            if getattr(raw, "chunked", False):
                # Chunked: urllib3 yields each chunk as soon as it arrives.
                for chunk in self._response.iter_content(chunk_size=None):
                    if chunk:
                        yield chunk
                return
            while True:  # not chunked: read1 returns what is there, without waiting to fill a buffer
                chunk = raw.read1(8192)
                if not chunk:
                    return
                yield chunk
        except Exception as err:  # requests' and urllib3's errors, or OSError/ValueError after abort()
            if self._aborted:
                return
            raise ServerUnavailableError(
                f"{self._method} {self._path}: the stream broke ({err.__class__.__name__})"
            ) from err

    def abort(self) -> None:
        """Cut the connection now, from any thread (a blocked read returns). Idempotent."""
        self._aborted = True
        raw = self._response.raw
        connection = getattr(raw, "connection", None) or getattr(raw, "_connection", None)
        sock = getattr(connection, "sock", None)
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        self.close()

    def close(self) -> None:
        """Close the response (the connection is not reused). Idempotent."""
        try:
            self._response.close()
        except Exception:  # closing a half-read, aborted response may complain; it is closed anyway
            log.debug("closing a stream of %s raised", self._path, exc_info=True)

    def __enter__(self) -> ByteStream:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class Transport:
    """Sends requests to one Conductor server and returns decoded bodies.

    Thread-safe: one instance is shared by every thread of a runtime (requests'
    connection pool is thread-safe; the token is guarded by a lock).

    Fork-safe: in a process forked from the one that made it, it uses a new session
    (connection pool) of its own, a new token lock and no cached token: the parent's pooled
    sockets are never written to by the child. A ``session`` passed in is the caller's and is
    kept as it is (give each process its own).
    """

    def __init__(
        self,
        base_url: str,
        *,
        auth_key: str | None = None,
        auth_secret: str | None = None,
        timeout: float = 30.0,
        session: requests.Session | None = None,
        pool_size: int = 64,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self._auth_key = auth_key
        self._auth_secret = auth_secret
        self._timeout = timeout
        self._clock = clock
        self._owns_session = session is None
        self._pool_size = pool_size
        self._session = session if session is not None else self._new_session(self.base_url, pool_size)
        self._direct = self._new_direct()
        self._token: str | None = None
        self._token_at = 0.0
        self._token_lock = threading.Lock()
        self._closed = False
        self._pid = os.getpid()
        rebuild_after_fork(self)

    def _after_fork_in_child(self) -> None:
        """In a forked child: a fresh pool, lock and token (see the class docstring)."""
        self._pid = os.getpid()
        self._token_lock = threading.Lock()  # a parent thread may have held it at the fork
        self._token = None
        self._token_at = 0.0
        if self._owns_session and not self._closed:
            # Dropped, not closed: closing takes the pool's locks, which a parent thread may hold.
            # The child's copies of the parent's sockets are closed when they are collected.
            self._session = self._new_session(self.base_url, self._pool_size)
            self._direct = self._new_direct()

    def __repr__(self) -> str:
        auth = "token" if self._auth_key else "none"
        return f"Transport({self.base_url!r}, auth={auth})"

    def _new_direct(self) -> _DirectGets | None:
        """The urllib3 pool for :meth:`get_json`, when this transport may bypass requests."""
        if not self._owns_session or self._session.proxies:
            return None
        verify = self._session.verify
        return _DirectGets(self.base_url, self._pool_size, True if verify is None else verify)

    @staticmethod
    def _new_session(base_url: str, pool_size: int) -> requests.Session:
        session = requests.Session()
        # The environment's proxy and CA-bundle settings are read once, here, not on every request
        # (requests re-reads them, and ~/.netrc, per call: a sixth of a small request's client CPU,
        # which a thousand idle listeners' background requests add up). ~/.netrc is not used:
        # Conductor's auth is the X-Authorization token.
        session.trust_env = False
        session.proxies.update(requests.utils.get_environ_proxies(base_url))
        bundle = os.environ.get("REQUESTS_CA_BUNDLE") or os.environ.get("CURL_CA_BUNDLE")
        if bundle:
            session.verify = bundle
        adapter = HTTPAdapter(max_retries=connect_retries(), pool_connections=4, pool_maxsize=pool_size)
        session.mount("http://", adapter)
        session.mount("https://", adapter)
        session.headers["User-Agent"] = "conductor-agents-python"
        return session

    # -- public -----------------------------------------------------------------------

    def request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, Any] | None = None,
        json_body: Any = None,
        timeout: Timeout | None = None,
    ) -> Any:
        """Send one request; return the decoded JSON body, the text body, or None (204/empty).

        Raises:
            ServerUnavailableError: no connection, or it broke or timed out.
            AuthenticationError: 401/403 even after refreshing the token.
            ConfigurationError: the answer says the base URL lacks ``/api`` (:mod:`.base_url`).
            HttpError: any other status >= 400.
        """
        response = self._exchange(method, path, params=params, json_body=json_body, timeout=timeout)
        return self._decode(response, method, path)

    def get_with_headers(self, path: str, *, params: Mapping[str, Any] | None = None) -> tuple[Any, Mapping[str, str]]:
        """``GET path``: the decoded body and the response headers (for the server's ``Date``).

        Raises: as :meth:`request`.
        """
        response = self._exchange("GET", path, params=params)
        return self._decode(response, "GET", path), response.headers

    def get_json(
        self,
        path: str,
        *,
        params: Mapping[str, Any] | None = None,
        timeout: tuple[float, float] | None = None,
    ) -> Any:
        """``GET path`` for a small JSON answer: as :meth:`request`, on the direct pool when it may.

        For the requests a process sends all the time whatever it does (polls, queue sizes).
        Raises: as :meth:`request`.
        """
        direct = self._direct
        if direct is None or (requests.Session.send, HTTPAdapter.send) != _REQUESTS_SENDS:
            return self.request("GET", path, params=params, timeout=timeout)
        self._check_process()
        direct = self._direct
        assert direct is not None
        limits = timeout if timeout is not None else self._limits()
        status, body, content_type = self._direct_get(direct, path, params, limits)
        if status in (401, 403) and self._auth_key:
            self._invalidate_token()
            status, body, content_type = self._direct_get(direct, path, params, limits)
        if status in (401, 403):
            raise AuthenticationError(
                f"GET {path}: the server rejected the credentials (HTTP {status})", status=status)
        self._check_prefix("GET", path, status, body, content_type)
        if status >= 400:
            server_message = _message_of(body)
            raise HttpError(f"GET {path} failed with HTTP {status}: {server_message}", status=status,
                            server_message=server_message, method="GET", path=path)
        if status == 204 or not body:
            return None
        if "json" in content_type:
            try:
                return json.loads(body)
            except ValueError as err:
                raise ServerError(f"GET {path}: the server sent a malformed JSON body", status=status) from err
        return body.decode("utf-8", "replace")

    def _direct_get(self, direct: _DirectGets, path: str, params: Mapping[str, Any] | None,
                    timeout: tuple[float, float]) -> tuple[int, bytes, str]:
        headers = {"User-Agent": "conductor-agents-python"}
        token = self._current_token()
        if token is not None:
            headers["X-Authorization"] = token
        try:
            return again_if_broken(lambda: direct.get(path, params, headers, timeout), f"GET {path}",
                                   resend=not hands_out_tasks(path, params))
        except urllib3.exceptions.HTTPError as err:  # connection refused/reset, broken read, pool closed
            cause = err.reason if isinstance(err, urllib3.exceptions.MaxRetryError) else err
            # urllib3 makes a refused connection a kind of connect timeout: it is not one here.
            if isinstance(cause, urllib3.exceptions.TimeoutError) and \
                    not isinstance(cause, urllib3.exceptions.NewConnectionError):
                raise ServerUnavailableError(
                    f"GET {path}: the server did not answer in time ({cause.__class__.__name__})") from short_cause(err)
            raise ServerUnavailableError(
                f"GET {path}: cannot reach the server at {self.base_url}") from short_cause(err)

    def close(self) -> None:
        """Close the session if this transport created it. Idempotent."""
        if not self._closed and self._owns_session:
            self._session.close()
            if self._direct is not None:
                self._direct.close()
        self._closed = True

    def open_stream(
        self,
        path: str,
        *,
        headers: Mapping[str, str] | None = None,
        timeout: Timeout | None = None,
    ) -> ByteStream:
        """``GET path`` as a stream (server-sent events); the caller iterates and closes it.

        ``timeout`` is (connect, read): the read timeout bounds the silence between two
        chunks, not the whole stream. Not retried beyond the connect retries of every call.

        Raises:
            ServerUnavailableError: no connection.
            AuthenticationError: 401/403 even after refreshing the token.
            HttpError: any other status >= 400 (the error body is read and the connection closed).
        """
        response = self._exchange("GET", path, headers=headers, timeout=timeout, stream=True)
        return ByteStream(response, "GET", path)

    # -- internals --------------------------------------------------------------------

    def _exchange(
        self,
        method: str,
        path: str,
        *,
        params: Any = None,
        json_body: Any = None,
        headers: Mapping[str, str] | None = None,
        timeout: Timeout | None = None,
        stream: bool = False,
    ) -> requests.Response:
        """Send with the auth token, refresh it once on 401/403, and raise for error statuses."""
        response = self._send(method, path, params, json_body, headers, timeout, stream)
        if response.status_code in (401, 403) and self._auth_key:
            response.close()
            self._invalidate_token()
            response = self._send(method, path, params, json_body, headers, timeout, stream)
        if response.status_code in (401, 403):
            response.close()
            raise AuthenticationError(
                f"{method} {path}: the server rejected the credentials (HTTP {response.status_code})",
                status=response.status_code,
            )
        if response.status_code >= 400:
            try:
                server_message = _server_message(response)
            except requests.exceptions.RequestException:  # a streamed error body that broke
                server_message = ""
            response.close()
            self._check_prefix(method, path, response.status_code, server_message, "")
            raise HttpError(
                f"{method} {path} failed with HTTP {response.status_code}: {server_message}",
                status=response.status_code,
                server_message=server_message,
                method=method,
                path=path,
            )
        self._check_prefix(method, path, response.status_code, "", response.headers.get("Content-Type", ""))
        return response

    def _check_prefix(self, method: str, path: str, status: int, message: Any, content_type: str) -> None:
        """Raise ``ConfigurationError`` when the answer says the base URL lacks ``/api`` (see ``base_url``)."""
        text = _message_of(message) if isinstance(message, bytes) else message
        wrong = missing_api_prefix(self.base_url, method, path, status=status, server_message=text,
                                   content_type=content_type)
        if wrong is not None:
            raise wrong

    def _check_process(self) -> None:
        """A fork the hook did not see (a C-level ``fork()``): rebuild on first use in the child."""
        if self._pid != os.getpid():
            with _process_check_lock:
                if self._pid != os.getpid():
                    self._after_fork_in_child()

    def _limits(self) -> tuple[float, float]:
        """The default (connect, read) timeouts: connecting takes at most 5 s of the read timeout."""
        return (min(5.0, self._timeout), self._timeout)

    def _send(self, method: str, path: str, params: Any, json_body: Any, headers: Mapping[str, str] | None,
              timeout: Timeout | None, stream: bool) -> requests.Response:
        self._check_process()
        send_headers = dict(headers or {})
        token = self._current_token()
        if token is not None:
            send_headers["X-Authorization"] = token
        limits = timeout if timeout is not None else self._limits()
        try:
            def send() -> requests.Response:
                return self._session.request(method, self.base_url + path, params=params, json=json_body,
                                             headers=send_headers, stream=stream, timeout=limits)
            if method == "GET" and not stream:
                return again_if_broken(send, f"GET {path}", resend=not hands_out_tasks(path, params))
            return send()
        except requests.exceptions.Timeout as err:
            raise unavailable(f"{method} {path}: the server did not answer in time ({err.__class__.__name__})",
                               err) from short_cause(err)
        except requests.exceptions.ConnectionError as err:
            raise unavailable(f"{method} {path}: cannot reach the server at {self.base_url}",
                               err) from short_cause(err)
        except requests.exceptions.RequestException as err:
            raise ServerUnavailableError(
                f"{method} {path}: request failed ({err.__class__.__name__})") from short_cause(err)

    @staticmethod
    def _decode(response: requests.Response, method: str, path: str) -> Any:
        if response.status_code == 204 or not response.content:
            return None
        content_type = response.headers.get("Content-Type", "")
        if "json" in content_type:
            try:
                return response.json()
            except ValueError as err:
                raise ServerError(
                    f"{method} {path}: the server sent a malformed JSON body", status=response.status_code
                ) from err
        return response.text

    def _current_token(self) -> str | None:
        if not self._auth_key:
            return None
        with self._token_lock:
            if self._token is None or self._clock.monotonic() - self._token_at > _TOKEN_MAX_AGE_SECONDS:
                self._token = self._fetch_token()
                self._token_at = self._clock.monotonic()
            return self._token

    def _invalidate_token(self) -> None:
        with self._token_lock:
            self._token = None

    def _fetch_token(self) -> str:
        path = "/token"
        try:
            response = self._session.post(
                self.base_url + path,
                json={"keyId": self._auth_key, "keySecret": self._auth_secret},
                timeout=self._limits(),
            )
        except requests.exceptions.RequestException as err:
            raise ServerUnavailableError(
                f"POST {path}: cannot reach the server at {self.base_url}") from short_cause(err)
        if response.status_code in (401, 403):
            raise AuthenticationError(
                "the server rejected CONDUCTOR_AUTH_KEY/CONDUCTOR_AUTH_SECRET "
                f"(HTTP {response.status_code} from {path})",
                status=response.status_code,
            )
        if response.status_code >= 400:
            raise ServerError(
                f"POST {path} failed with HTTP {response.status_code}: {_server_message(response)}",
                status=response.status_code,
            )
        try:
            token = response.json()["token"]
        except (ValueError, KeyError, TypeError) as err:
            raise ServerError(f"POST {path}: the answer holds no token", status=response.status_code) from err
        log.debug("obtained an auth token from %s", self.base_url)
        return str(token)
