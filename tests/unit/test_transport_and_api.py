"""Unit tests for conductor_agents._wire.transport (errors, auth, decoding) and _api (endpoint error mapping)."""

import json

import pytest
import requests

from conductor_agents._wire.api import ConductorApi
from conductor_agents._wire.transport import TRANSIENT_STATUSES, HttpError, Transport
from conductor_agents.errors import (
    AuthenticationError,
    ExecutionNotFoundError,
    ExecutionNotRunningError,
    MessageQueueDisabledError,
    MessageQueueFullError,
    ServerError,
    ServerUnavailableError,
)
from tests.unit.fakes import BASE_URL, FakeClock

SECRET = "s3cr3t-Do-Not-Print-7f2a"
EXEC = "wf-123"


@pytest.fixture
def transport():
    t = Transport(BASE_URL)
    yield t
    t.close()


def authed(clock=None):
    return Transport(BASE_URL, auth_key="key-id-1", auth_secret=SECRET, clock=clock or FakeClock())


def calls_to(http, suffix):
    return [c for c in http.calls if c.request.url.split("?")[0].endswith(suffix)]


# --- Transport: bodies and errors -----------------------------------------------------------


def test_json_body_is_decoded(http, transport):
    """A JSON answer comes back decoded."""
    http.add("GET", BASE_URL + "/thing", json={"a": [1, 2]})
    assert {"a": [1, 2]} == transport.request("GET", "/thing")


def test_text_body_is_returned_as_text(http, transport):
    """A non-JSON answer comes back as text."""
    http.add("POST", BASE_URL + "/thing", body="msg-1", content_type="text/plain")
    assert "msg-1" == transport.request("POST", "/thing")


@pytest.mark.parametrize("status,body", [(204, ""), (200, "")])
def test_empty_body_is_none(http, transport, status, body):
    """204 and empty answers decode to None."""
    http.add("DELETE", BASE_URL + "/thing", status=status, body=body)
    assert None is transport.request("DELETE", "/thing")


def test_params_and_json_body_are_sent(http, transport):
    """Query parameters and the JSON body reach the server unchanged."""
    http.add("POST", BASE_URL + "/thing", json={})
    transport.request("POST", "/thing", params={"reason": "a b"}, json_body={"x": 1})
    request = http.calls[0].request
    assert (BASE_URL + "/thing?reason=a+b", {"x": 1}) == (request.url, json.loads(request.body))


def test_trailing_slash_of_base_url_is_dropped(http):
    """A base URL ending in '/' does not produce '//' paths."""
    http.add("GET", BASE_URL + "/thing", json={})
    Transport(BASE_URL + "/").request("GET", "/thing")
    assert BASE_URL + "/thing" == http.calls[0].request.url


@pytest.mark.parametrize("status", [500, 502, 503, 504, 429])
def test_transient_statuses_are_transient_http_errors(http, transport, status):
    """5xx and 429 become an HttpError marked transient, with the server's message."""
    http.add("GET", BASE_URL + "/thing", status=status, json={"message": "busy now"})
    with pytest.raises(HttpError) as info:
        transport.request("GET", "/thing")
    err = info.value
    assert (status, True, "busy now", "GET", "/thing") == (
        err.status, err.transient, err.server_message, err.method, err.path)
    assert isinstance(err, ServerError)


def test_transient_status_set_is_pinned():
    """Exactly 429 and the usual 5xx count as transient."""
    assert frozenset({429, 500, 502, 503, 504}) == TRANSIENT_STATUSES


@pytest.mark.parametrize("status", [400, 404, 409, 422])
def test_client_errors_are_not_transient(http, transport, status):
    """4xx statuses (but 401/403/429) are HttpErrors that are not transient."""
    http.add("GET", BASE_URL + "/thing", status=status, body="nope", content_type="text/plain")
    with pytest.raises(HttpError) as info:
        transport.request("GET", "/thing")
    assert (status, False, "nope") == (info.value.status, info.value.transient, info.value.server_message)


def test_connection_refused_is_server_unavailable(http, transport):
    """A refused connection becomes ServerUnavailableError, also a ConnectionError, chained to the cause."""
    http.add("GET", BASE_URL + "/thing", body=requests.ConnectionError("connection refused"))
    with pytest.raises(ServerUnavailableError) as info:
        transport.request("GET", "/thing")
    assert isinstance(info.value, ConnectionError)
    assert isinstance(info.value.__cause__, requests.ConnectionError)
    assert None is info.value.status
    assert BASE_URL in str(info.value)


def test_read_timeout_is_server_unavailable(http, transport):
    """A read timeout becomes ServerUnavailableError saying the server did not answer in time."""
    http.add("GET", BASE_URL + "/thing", body=requests.exceptions.ReadTimeout("slow"))
    with pytest.raises(ServerUnavailableError) as info:
        transport.request("GET", "/thing")
    assert "did not answer in time" in str(info.value)


def test_malformed_json_is_server_error(http, transport):
    """A JSON content type with a broken body becomes ServerError (not a ValueError from requests)."""
    http.add("GET", BASE_URL + "/thing", body="{not json", content_type="application/json")
    with pytest.raises(ServerError) as info:
        transport.request("GET", "/thing")
    assert not isinstance(info.value, HttpError)
    assert 200 == info.value.status
    assert "malformed JSON" in str(info.value)


def test_retry_policy_only_retries_connection_setup(transport):
    """The mounted retry policy retries failed connects twice and never reads, statuses or redirects."""
    retry = transport._session.get_adapter(BASE_URL).max_retries
    assert (2, 0, 0, 0, 0) == (retry.connect, retry.read, retry.status, retry.other, retry.redirect)


def test_close_leaves_a_borrowed_session_open():
    """close() does not close a session the caller passed in, and is idempotent."""

    class CountingSession(requests.Session):
        closes = 0

        def close(self):
            CountingSession.closes += 1
            super().close()

    session = CountingSession()
    t = Transport(BASE_URL, session=session)
    t.close()
    t.close()
    assert 0 == CountingSession.closes
    session.close()


# --- Transport: auth ---------------------------------------------------------------------


def test_no_auth_sends_no_token(http, transport):
    """Without a key no token is fetched and no X-Authorization header is sent."""
    http.add("GET", BASE_URL + "/thing", json={})
    transport.request("GET", "/thing")
    assert ([], None) == (calls_to(http, "/token"), http.calls[0].request.headers.get("X-Authorization"))


def test_token_is_fetched_once_and_sent_as_x_authorization(http):
    """The token is fetched once from key and secret and sent on every request as X-Authorization."""
    http.add("POST", BASE_URL + "/token", json={"token": "tok-1"})
    http.add("GET", BASE_URL + "/thing", json={})
    t = authed()
    t.request("GET", "/thing")
    t.request("GET", "/thing")
    token_calls = calls_to(http, "/token")
    assert 1 == len(token_calls)
    assert {"keyId": "key-id-1", "keySecret": SECRET} == json.loads(token_calls[0].request.body)
    assert ["tok-1", "tok-1"] == [c.request.headers.get("X-Authorization") for c in calls_to(http, "/thing")]


def test_token_is_refreshed_after_a_401(http):
    """A 401 drops the token, fetches a new one and repeats the request with it."""
    http.add("POST", BASE_URL + "/token", json={"token": "tok-old"})
    http.add("POST", BASE_URL + "/token", json={"token": "tok-new"})
    http.add("GET", BASE_URL + "/thing", status=401, json={"message": "expired"})
    http.add("GET", BASE_URL + "/thing", json={"ok": True})
    assert {"ok": True} == authed().request("GET", "/thing")
    assert 2 == len(calls_to(http, "/token"))
    assert ["tok-old", "tok-new"] == [c.request.headers.get("X-Authorization") for c in calls_to(http, "/thing")]


def test_token_is_refreshed_when_old(http):
    """A token older than 45 minutes (on the clock) is replaced before the next request."""
    clock = FakeClock()
    http.add("POST", BASE_URL + "/token", json={"token": "tok-1"})
    http.add("POST", BASE_URL + "/token", json={"token": "tok-2"})
    http.add("GET", BASE_URL + "/thing", json={})
    t = authed(clock)
    t.request("GET", "/thing")
    clock.advance(44 * 60)
    t.request("GET", "/thing")
    clock.advance(2 * 60)
    t.request("GET", "/thing")
    assert ["tok-1", "tok-1", "tok-2"] == [c.request.headers.get("X-Authorization")
                                           for c in calls_to(http, "/thing")]


def test_401_after_refresh_is_authentication_error(http):
    """A 401 that survives a token refresh is an AuthenticationError (a PermissionError) without the secret."""
    http.add("POST", BASE_URL + "/token", json={"token": "tok"})
    http.add("GET", BASE_URL + "/thing", status=401)
    with pytest.raises(AuthenticationError) as info:
        authed().request("GET", "/thing")
    assert (401, 2) == (info.value.status, len(calls_to(http, "/thing")))
    assert isinstance(info.value, PermissionError)
    assert SECRET not in str(info.value)


def test_401_without_auth_is_authentication_error_at_once(http, transport):
    """Without credentials a 401 is not retried."""
    http.add("GET", BASE_URL + "/thing", status=403)
    with pytest.raises(AuthenticationError):
        transport.request("GET", "/thing")
    assert 1 == len(http.calls)


@pytest.mark.parametrize("status", [401, 403])
def test_wrong_secret_is_authentication_error_without_the_secret(http, status):
    """A rejected key/secret is an AuthenticationError naming the variables, never the secret."""
    http.add("POST", BASE_URL + "/token", status=status, json={"message": "bad credentials"})
    http.add("GET", BASE_URL + "/thing", json={})
    t = authed()
    with pytest.raises(AuthenticationError) as info:
        t.request("GET", "/thing")
    assert "CONDUCTOR_AUTH_SECRET" in str(info.value)
    assert SECRET not in str(info.value)
    assert SECRET not in repr(info.value)
    assert [] == calls_to(http, "/thing")


def test_token_answer_without_token_is_server_error(http):
    """A /token answer without a token is a ServerError."""
    http.add("POST", BASE_URL + "/token", json={"nothing": 1})
    with pytest.raises(ServerError) as info:
        authed().request("GET", "/thing")
    assert "no token" in str(info.value)


def test_unreachable_token_endpoint_is_server_unavailable(http):
    """A connection error while fetching the token is a ServerUnavailableError."""
    http.add("POST", BASE_URL + "/token", body=requests.ConnectionError("refused"))
    with pytest.raises(ServerUnavailableError) as info:
        authed().request("GET", "/thing")
    assert SECRET not in str(info.value)


def test_transport_repr_hides_the_secret():
    """repr(Transport) shows the URL and that auth is on, not the key or the secret."""
    assert f"Transport({BASE_URL!r}, auth=token)" == repr(authed())
    assert f"Transport({BASE_URL!r}, auth=none)" == repr(Transport(BASE_URL))


# --- ConductorApi: messages ------------------------------------------------------------------


@pytest.fixture
def api(transport):
    return ConductorApi(transport)


MESSAGES = f"{BASE_URL}/workflow/{EXEC}/messages"
WORKFLOW = f"{BASE_URL}/workflow/{EXEC}"


def test_push_message_returns_the_message_id(http, api):
    """A delivered message returns the server's message id and sends the payload as JSON."""
    http.add("POST", MESSAGES, body="msg-9\n", content_type="text/plain")
    assert "msg-9" == api.push_message(EXEC, {"text": "hi"})
    assert {"text": "hi"} == json.loads(http.calls[0].request.body)


def test_message_404_for_unknown_execution(http, api):
    """404 on messages and on the workflow: ExecutionNotFoundError carrying the execution id."""
    http.add("POST", MESSAGES, status=404, json={"message": "not found"})
    http.add("GET", WORKFLOW, status=404, json={"message": "not found"})
    with pytest.raises(ExecutionNotFoundError) as info:
        api.push_message(EXEC, {"a": 1})
    assert (EXEC, 404) == (info.value.execution_id, info.value.status)
    assert isinstance(info.value, LookupError)
    assert 1 == len(calls_to(http, f"/workflow/{EXEC}"))


def test_message_404_with_existing_workflow_is_queue_disabled(http, api):
    """404 on messages while the workflow exists: MessageQueueDisabledError saying how to enable it."""
    http.add("POST", MESSAGES, status=404, body="")
    http.add("GET", WORKFLOW, json={"workflowId": EXEC, "status": "RUNNING"})
    with pytest.raises(MessageQueueDisabledError) as info:
        api.push_message(EXEC, {"a": 1})
    assert EXEC == info.value.execution_id
    assert "conductor.workflow-message-queue.enabled=true" in str(info.value)
    assert not isinstance(info.value, ExecutionNotFoundError)


def test_message_409_is_not_running(http, api):
    """409 on messages: ExecutionNotRunningError with the execution id and the server's reason."""
    http.add("POST", MESSAGES, status=409, json={"message": "workflow is COMPLETED"})
    with pytest.raises(ExecutionNotRunningError) as info:
        api.push_message(EXEC, {"a": 1})
    assert (EXEC, 409) == (info.value.execution_id, info.value.status)
    assert "workflow is COMPLETED" in str(info.value)
    assert isinstance(info.value.__cause__, HttpError)


def test_message_429_is_queue_full(http, api):
    """429 on messages: MessageQueueFullError with the execution id."""
    http.add("POST", MESSAGES, status=429, json={"message": "full"})
    with pytest.raises(MessageQueueFullError) as info:
        api.push_message(EXEC, {"a": 1})
    assert (EXEC, 429) == (info.value.execution_id, info.value.status)


def test_message_5xx_stays_a_transient_http_error(http, api):
    """A 5xx on messages is reported as the transient HttpError it is."""
    http.add("POST", MESSAGES, status=503, body="down")
    with pytest.raises(HttpError) as info:
        api.push_message(EXEC, {"a": 1})
    assert (503, True) == (info.value.status, info.value.transient)


SIGNAL = f"{BASE_URL}/tasks/{EXEC}/COMPLETED/signal/sync"


def test_signal_wait_completes_a_wait_at_once_and_says_so(http, api):
    """200: a WAIT was completed; the synchronous variant with timeoutMillis=0 (no wait for the run to settle),
    an empty output."""
    http.add("POST", SIGNAL, json={"responseType": "TARGET_WORKFLOW", "signalTimeout": True})
    assert api.signal_wait(EXEC) is True
    request = http.calls[0].request
    assert (request.url.split("?")[1], json.loads(request.body)) == ("timeoutMillis=0", {})


def test_signal_wait_without_a_wait_is_false_and_an_unknown_run_is_not_found(http, api):
    """The server's two 404s: no WAIT waiting (False), no such run (ExecutionNotFoundError); others stay errors."""
    http.add("POST", SIGNAL, status=404, json={"message": f"Found no blocked task in workflow {EXEC} to signal"})
    assert api.signal_wait(EXEC) is False
    http.replace("POST", SIGNAL, status=404, json={"message": f"No such workflow found by id: {EXEC}"})
    with pytest.raises(ExecutionNotFoundError) as info:
        api.signal_wait(EXEC)
    assert info.value.execution_id == EXEC
    http.replace("POST", SIGNAL, status=500, json={"message": "boom"})
    with pytest.raises(HttpError):
        api.signal_wait(EXEC)


def test_execution_id_is_url_quoted(http, api):
    """An execution id with '/' cannot escape its path segment."""
    http.add("GET", BASE_URL + "/agent/a%2Fb/status", json={"status": "RUNNING"})
    assert "RUNNING" == api.agent_status("a/b")["status"]


# --- ConductorApi: other endpoints -----------------------------------------------------------


def test_status_404_is_unknown_execution(http, api):
    """404 on /agent/{id}/status is ExecutionNotFoundError."""
    http.add("GET", f"{BASE_URL}/agent/{EXEC}/status", status=404)
    with pytest.raises(ExecutionNotFoundError) as info:
        api.agent_status(EXEC)
    assert EXEC == info.value.execution_id


def test_status_without_status_field_is_server_error(http, api):
    """A status answer without 'status' is a ServerError."""
    http.add("GET", f"{BASE_URL}/agent/{EXEC}/status", json={"executionId": EXEC})
    with pytest.raises(ServerError):
        api.agent_status(EXEC)


@pytest.mark.parametrize("call", [
    lambda api: api.stop_agent(EXEC),
    lambda api: api.cancel_agent(EXEC, "why"),
    lambda api: api.get_workflow(EXEC),
    lambda api: api.agent_execution(EXEC),
    lambda api: api.liveness_sample(EXEC),
    lambda api: api.workflow_status(EXEC),
    lambda api: api.workflow_tasks(EXEC),
])
def test_404_on_execution_endpoints_is_unknown_execution(http, api, call):
    """Every per-execution endpoint turns 404 into ExecutionNotFoundError."""
    http.add("POST", f"{BASE_URL}/agent/{EXEC}/stop", status=404)
    http.add("DELETE", f"{BASE_URL}/agent/{EXEC}/cancel", status=404)
    http.add("GET", WORKFLOW, status=404)
    http.add("GET", f"{BASE_URL}/agent/execution/{EXEC}", status=404)
    http.add("GET", f"{WORKFLOW}/status", status=404)
    http.add("GET", f"{WORKFLOW}/tasks", status=404)
    with pytest.raises(ExecutionNotFoundError):
        call(api)


def test_cancel_sends_the_reason(http, api):
    """cancel_agent sends DELETE /agent/{id}/cancel with the reason as a query parameter."""
    http.add("DELETE", f"{BASE_URL}/agent/{EXEC}/cancel", status=200, body="")
    api.cancel_agent(EXEC, "enough")
    assert f"{BASE_URL}/agent/{EXEC}/cancel?reason=enough" == http.calls[0].request.url


def test_start_agent_without_execution_id_is_server_error(http, api):
    """A start answer without executionId is a ServerError."""
    http.add("POST", BASE_URL + "/agent/start", json={"agentName": "x"})
    with pytest.raises(ServerError):
        api.start_agent({"agentConfig": {}})


def test_liveness_sample_reads_the_status_and_the_scheduled_tasks_with_the_date_header(http, api):
    """liveness_sample asks for the status and only the SCHEDULED tasks, and returns the server's Date."""
    date = "Tue, 14 Nov 2023 22:13:20 GMT"
    scheduled = [{"taskId": "t", "status": "SCHEDULED"}]
    http.add("GET", f"{WORKFLOW}/status", json={"workflowId": EXEC, "status": "RUNNING"})
    http.add("GET", f"{WORKFLOW}/tasks", json={"totalHits": 1, "results": scheduled}, headers={"Date": date})
    assert ({"status": "RUNNING", "tasks": scheduled}, date) == api.liveness_sample(EXEC)
    assert http.calls[1].request.url.endswith("/tasks?start=0&count=100&status=SCHEDULED")


def test_workflow_tasks_pages_and_filters(http, api):
    """workflow_tasks sends start, count and each status; it returns the page and the total."""
    http.add("GET", f"{WORKFLOW}/tasks", json={"totalHits": 40, "results": [{"taskId": "a"}]})
    page = api.workflow_tasks(EXEC, start=5, count=1, statuses=("IN_PROGRESS", "SCHEDULED"))
    assert (40, [{"taskId": "a"}]) == (page.total, page.tasks)
    assert http.calls[0].request.url.endswith("/tasks?start=5&count=1&status=IN_PROGRESS&status=SCHEDULED")


def test_get_workflow_with_tasks_asks_for_them(http, api):
    """get_workflow(include_tasks=True) sends includeTasks=true."""
    http.add("GET", WORKFLOW, json={"status": "RUNNING"})
    api.get_workflow(EXEC, include_tasks=True)
    api.get_workflow(EXEC)
    assert ["includeTasks=true", "includeTasks=false"] == [c.request.url.split("?")[1] for c in http.calls]


def test_the_environment_proxy_is_read_once_at_construction(monkeypatch):
    """Proxy variables still apply (read when the transport is built, not on every request),
    NO_PROXY included; requests' per-call environment lookups are off."""
    monkeypatch.setenv("HTTP_PROXY", "http://proxy.example:3128")
    monkeypatch.setenv("NO_PROXY", "internal.example")
    proxied = Transport("http://conductor.example:8080")
    bypassed = Transport("http://internal.example:8080")
    assert proxied._session.proxies.get("http") == "http://proxy.example:3128"
    assert "http" not in bypassed._session.proxies
    assert proxied._session.trust_env is False


def _refused_as_requests_raises_it() -> requests.ConnectionError:
    """The four exceptions requests chains for a refused connection, as it chains them."""
    import urllib3

    refused = ConnectionRefusedError(111, "Connection refused")
    try:
        try:
            raise refused
        except ConnectionRefusedError as err:
            raise urllib3.exceptions.NewConnectionError(None, f"Failed to establish a new connection: {err}") from err
    except urllib3.exceptions.NewConnectionError as new:
        retried = urllib3.exceptions.MaxRetryError(None, "/thing", reason=new)
        try:
            raise retried
        except urllib3.exceptions.MaxRetryError as err:
            try:
                raise requests.ConnectionError(err)
            except requests.ConnectionError as wrapped:
                return wrapped


def test_a_refused_connection_is_one_short_cause_not_a_chain_of_four(http, transport):
    """The error is raised from a copy of the innermost exception (ConnectionRefusedError), with no traceback
    or chain of its own: the printed traceback is a few SDK frames, not ~100 lines of four exceptions
    (issue 41, point 6)."""
    import traceback

    http.add("GET", BASE_URL + "/thing", body=_refused_as_requests_raises_it())
    with pytest.raises(ServerUnavailableError) as info:
        transport.request("GET", "/thing")
    cause = info.value.__cause__
    assert type(cause) is ConnectionRefusedError and str(cause) == "[Errno 111] Connection refused"
    assert cause.__traceback__ is None and cause.__cause__ is None and cause.__suppress_context__
    printed = "".join(traceback.format_exception(info.value))
    assert printed.count("Traceback (most recent call last)") == 1 and "urllib3" not in printed
    assert BASE_URL in str(info.value)


def test_the_innermost_cause_is_found_through_causes_reasons_and_arguments():
    from conductor_agents._wire.causes import innermost, short_cause

    wrapped = _refused_as_requests_raises_it()
    assert type(innermost(wrapped)) is ConnectionRefusedError
    lone = ValueError("alone")
    assert innermost(lone) is lone and type(short_cause(lone)) is ValueError and short_cause(lone) is not lone

    class Odd(Exception):
        def __init__(self, a: int, b: int) -> None:
            super().__init__(a + b)

    odd = Odd(1, 2)
    assert short_cause(odd) is odd  # cannot be rebuilt from its args: the original
