"""Bad input, one row per mistake: the typed error it raises and the HTTP requests it cost.

Every row counts the requests ``requests`` sends during the failing call: zero when the SDK
can tell without asking the server (definitions, settings, payloads, argument types), and the
minimum the answer needs otherwise (an unknown execution is one GET; a 404 on a message is
that POST plus one GET telling "unknown run" from "queue disabled"). What a row needs on the
server (a finished run, a run that never consumes its queue...) is prepared before counting.
"""

from __future__ import annotations

import math
import socket
import time
from typing import Any, Callable, Optional

import attrs
import pytest
import requests
import responses

from conductor_agents import (
    Agent,
    AgentDefinitionError,
    AgentRuntime,
    AgentSettings,
    AgentTypeError,
    AuthenticationError,
    ConfigurationError,
    ExecutionNotFoundError,
    ExecutionNotRunningError,
    MessageQueueDisabledError,
    MessageQueueFullError,
    PayloadError,
    ResumeError,
    RunStatus,
    RuntimeClosedError,
    ServerUnavailableError,
    ToolDefinitionError,
    ToolRegistry,
    WaitForMessageTool,
    tool,
)
from conductor_agents.testing import ToolCall, listener_policy

pytestmark = pytest.mark.integration

UNKNOWN_ID = "00000000-0000-0000-0000-00000000dead"
MAX_QUEUE = 1000  # the server's default conductor.workflow-message-queue.maxQueueSize


class Tools:
    @tool
    def act(self, action: str) -> dict:
        """Carry out an action."""
        return {"done": action}


@tool
def lookup(key: str) -> str:
    """Look something up."""
    return key


def good_agent(name: str = "ok_agent", model: str = "openai/gpt-4o", **fields: Any) -> Agent:
    return Agent(name, model, **fields)


def stateful_agent(name: str, model: str) -> Agent:
    return Agent(name, model, stateful=True, tools=list(ToolRegistry.from_instance(Tools())), max_turns=5)


class Server:
    """What the rows need on the server, created on first use and cleaned up at the end."""

    def __init__(self, settings: AgentSettings, llm: Any, server: Any, tmp_factory: Any) -> None:
        self.settings = settings
        self.llm = llm
        self.server = server
        self.tmp_factory = tmp_factory
        self.runtime = AgentRuntime(settings)
        self._cache: dict = {}
        self._cleanups: "list[Callable[[], None]]" = []
        self._names = iter(range(10_000))

    def name(self, base: str) -> str:
        return f"bad_input_{base}_{next(self._names)}_{time.monotonic_ns() % 10**8}"

    def once(self, key: str, make: Callable[[], Any]) -> Any:
        if key not in self._cache:
            self._cache[key] = make()
        return self._cache[key]

    def finished_run(self) -> str:
        """A non-stateful run that COMPLETED."""
        def make() -> str:
            agent = good_agent(self.name("finished"), self.llm.script(["done"]))
            result = self.runtime.run(agent, "Say done.", timeout=60)
            assert result.status is RunStatus.COMPLETED
            return result.execution_id
        return self.once("finished", make)

    def waiting_plain_run(self) -> str:
        """A RUNNING non-stateful run (no task domain) blocked in wait_for_message."""
        def make() -> str:
            agent = good_agent(self.name("plain"), self.llm.script(policy=listener_policy()),
                               tools=[WaitForMessageTool.create()])
            handle = self.runtime.start(agent, "Listen.")
            self._cleanups.append(lambda: handle.cancel("test cleanup"))
            return handle.execution_id
        return self.once("plain", make)

    def full_queue_run(self) -> str:
        """A RUNNING stateful run stuck on a tool nobody polls, its queue filled to the limit."""
        def make() -> str:
            lazy = AgentRuntime(attrs.evolve(self.settings, auto_start_workers=False))
            agent = stateful_agent(self.name("full"), self.llm.script([ToolCall("act", {"action": "x"})]))
            handle = lazy.start(agent, "Act.")
            lazy.close()
            self._cleanups.append(lambda: self.runtime.attach(handle.execution_id).cancel("test cleanup"))
            session = requests.Session()  # filling the queue is setup, not the SDK under test
            url = f"{self.settings.server_url}/workflow/{handle.execution_id}/messages"
            for i in range(MAX_QUEUE):
                response = session.post(url, json={"n": i}, timeout=10)
                assert response.status_code == 200, (i, response.status_code, response.text)
            session.close()
            return handle.execution_id
        return self.once("full", make)

    def vanished_handle(self) -> Any:
        """A handle on a run the server has since deleted."""
        def make() -> Any:
            execution_id = self.runtime.run(good_agent(self.name("vanished"), self.llm.script(["done"])),
                                            "Say done.", timeout=60).execution_id
            handle = self.runtime.attach(execution_id)
            response = requests.delete(f"{self.settings.server_url}/workflow/{execution_id}/remove", timeout=10)
            assert response.ok, response.text
            return handle
        return self.once("vanished", make)

    def queue_disabled_run(self) -> "tuple[AgentRuntime, str]":
        """A RUNNING run on a second server started with the message queue switched off."""
        def make() -> "tuple[AgentRuntime, str]":
            from conductor_agents import LocalServer

            server = LocalServer(self.tmp_factory.mktemp("queue-off"), env=self.llm.server_env(),
                                 properties={"conductor.workflow-message-queue.enabled": "false"})
            server.start()
            self._cleanups.append(server.stop)
            # No workers and no liveness: nothing of this runtime talks to the server in the background
            # (the rows count every request the process sends).
            # A long read timeout: the first agent start on a server just started compiles the agent, which
            # took over 30 s on a loaded 2-core machine.
            settings = attrs.evolve(self.settings, server_url=server.url, auto_start_workers=False,
                                    liveness_enabled=False, http_timeout_seconds=180.0)
            runtime = AgentRuntime(settings)
            self._cleanups.append(runtime.close)
            agent = stateful_agent(self.name("queue_off"), self.llm.script([ToolCall("act", {"action": "x"})]))
            handle = runtime.start(agent, "Act.")
            return runtime, handle.execution_id
        return self.once("queue_off", make)

    def close(self) -> None:
        for cleanup in reversed(self._cleanups):
            try:
                cleanup()
            except Exception:  # keep cleaning up
                pass
        self.runtime.close()


@pytest.fixture(scope="module")
def srv(conductor_server, scripted_llm, tmp_path_factory):
    settings = AgentSettings.from_env(environ={}, server_url=conductor_server.url)
    state = Server(settings, scripted_llm, conductor_server, tmp_path_factory)
    yield state
    state.close()


@pytest.fixture
def sent(monkeypatch):
    """Every request ``requests`` sends during the test, as (method, url)."""
    log: "list[tuple[str, str]]" = []
    original = requests.Session.send

    def counting_send(self, request, **kwargs):
        log.append((request.method, request.url))
        return original(self, request, **kwargs)

    monkeypatch.setattr(requests.Session, "send", counting_send)
    return log


def dead_url() -> str:
    """The URL of a loopback port nobody listens on (connection refused at once)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}/api"


def nothing_answers(srv: Server, prep: Any) -> None:
    """A server that accepts connections and never answers: the read timeout is the bound."""
    with socket.create_server(("127.0.0.1", 0)) as silent:  # never accept()ed; the kernel queues us
        settings = AgentSettings(server_url=f"http://127.0.0.1:{silent.getsockname()[1]}/api",
                                 http_timeout_seconds=1.0)
        with AgentRuntime(settings) as runtime:
            runtime.send_message(UNKNOWN_ID, {"a": 1})


def refused(srv: Server, prep: Any) -> None:
    with AgentRuntime(AgentSettings(server_url=dead_url())) as runtime:
        runtime.start(good_agent(), "Hello.")


def wrong_secret(srv: Server, prep: Any) -> None:
    url = "http://127.0.0.1:9/api"  # never reached: responses answers
    with responses.RequestsMock() as mocked:
        mocked.add(responses.POST, url + "/token", status=401, json={"message": "invalid credentials"})
        with AgentRuntime(AgentSettings(server_url=url, auth_key="key", auth_secret="wrong")) as runtime:
            runtime.send_message(UNKNOWN_ID, {"a": 1})


def closed_runtime(srv: Server, prep: Any) -> None:
    runtime = AgentRuntime(srv.settings)
    runtime.close()
    runtime.start(good_agent(), "Hello.")


def duplicate_tools(srv: Server, prep: Any) -> None:
    def other_lookup(key: str) -> str:
        """Another tool that happens to have the same name."""
        return key

    Agent("dup", "openai/gpt-4o", tools=[lookup, *ToolRegistry.from_instance(Tools()), tool(name="lookup")(other_lookup)])


def untyped_tool(srv: Server, prep: Any) -> None:
    def no_hints(x):  # type: ignore[no-untyped-def]
        return x

    tool(no_hints)


@attrs.frozen
class Row:
    id: str
    act: Callable[[Server, Any], Any]
    error: type
    requests: int = 0
    prepare: Optional[Callable[[Server], Any]] = None
    check: Optional[Callable[[Any, Any], None]] = None
    max_seconds: Optional[float] = None


def field_is(name: str) -> Callable[[Any, Any], None]:
    def check(err: Any, prep: Any) -> None:
        assert err.field == name and name in str(err)
    return check


def names_execution(err: Any, prep: Any) -> None:
    expected = prep if isinstance(prep, str) else getattr(prep, "execution_id", None) or prep[1]
    assert err.execution_id == expected, (err.execution_id, expected)


def holds(predicate: Callable[[Any], bool]) -> Callable[[Any, Any], None]:
    def check(err: Any, prep: Any) -> None:
        assert predicate(err), err
    return check


def unknown_execution(err: Any, prep: Any) -> None:
    assert err.execution_id == UNKNOWN_ID and UNKNOWN_ID in str(err)


ROWS = [
    # --- agent definitions: caught at construction, nothing sent ----------------------------
    Row("agent-name-with-space", lambda s, p: good_agent("my agent"), AgentDefinitionError, check=field_is("name")),
    Row("agent-name-not-str", lambda s, p: good_agent(42), AgentTypeError, check=field_is("name")),
    Row("model-without-provider", lambda s, p: good_agent(model="gpt-4o"), AgentDefinitionError,
        check=field_is("model")),
    Row("model-not-str", lambda s, p: good_agent(model=None), AgentTypeError, check=field_is("model")),
    Row("max-turns-zero", lambda s, p: good_agent(max_turns=0), AgentDefinitionError, check=field_is("max_turns")),
    Row("max-turns-str", lambda s, p: good_agent(max_turns="10"), AgentTypeError, check=field_is("max_turns")),
    Row("tools-a-string", lambda s, p: good_agent(tools="lookup"), AgentTypeError, check=field_is("tools")),
    Row("tools-holding-a-number", lambda s, p: good_agent(tools=[42]), AgentTypeError, check=field_is("tools")),
    Row("duplicate-tool-names", duplicate_tools, AgentDefinitionError, check=field_is("tools")),
    Row("tool-without-type-hints", untyped_tool, ToolDefinitionError),
    Row("wait-tool-batch-zero", lambda s, p: WaitForMessageTool.create(batch_size=0), ConfigurationError),
    # --- settings ------------------------------------------------------------------------------
    Row("server-url-without-scheme", lambda s, p: AgentSettings(server_url="localhost:8080"), ConfigurationError,
        check=holds(lambda e: e.variable == "server_url")),
    Row("env-stall-seconds-not-a-number",
        lambda s, p: AgentSettings.from_env({"CONDUCTOR_AGENT_LIVENESS_STALL_SECONDS": "soon"}),
        ConfigurationError, check=holds(lambda e: e.variable == "CONDUCTOR_AGENT_LIVENESS_STALL_SECONDS")),
    # --- runtime calls refused before any request ----------------------------------------------
    Row("start-not-an-agent", lambda s, p: s.runtime.start("listener", "Hello."), AgentTypeError),
    Row("start-blank-prompt", lambda s, p: s.runtime.start(good_agent(), " \n\t "), ValueError),
    Row("start-prompt-not-str", lambda s, p: s.runtime.start(good_agent(), None), AgentTypeError),
    Row("message-unserialisable", lambda s, p: s.runtime.send_message(UNKNOWN_ID, {"at": object()}), PayloadError),
    Row("message-nan", lambda s, p: s.runtime.send_message(UNKNOWN_ID, {"x": math.nan}), PayloadError),
    Row("message-non-string-key", lambda s, p: s.runtime.send_message(UNKNOWN_ID, {("a",): 1}), PayloadError),
    Row("resume-not-an-agent", lambda s, p: s.runtime.resume(UNKNOWN_ID, "listener"), AgentTypeError),
    Row("wait-timeout-zero", lambda s, p: p.wait(timeout=0), ValueError,
        prepare=lambda s: s.runtime.attach(s.finished_run())),
    Row("runtime-closed", closed_runtime, RuntimeClosedError),
    # --- unknown executions: one request tells ----------------------------------------------------
    Row("message-to-unknown-execution", lambda s, p: s.runtime.send_message(UNKNOWN_ID, "hi"),
        ExecutionNotFoundError, requests=1, check=unknown_execution),
    Row("attach-unknown-execution", lambda s, p: s.runtime.attach(UNKNOWN_ID), ExecutionNotFoundError,
        requests=1, check=unknown_execution),
    Row("resume-unknown-execution", lambda s, p: s.runtime.resume(UNKNOWN_ID, good_agent()),
        ExecutionNotFoundError, requests=1, check=unknown_execution),
    Row("status-of-deleted-execution", lambda s, p: p.status(), ExecutionNotFoundError, requests=1,
        prepare=lambda s: s.vanished_handle(), check=names_execution),
    Row("wait-on-deleted-execution", lambda s, p: p.wait(timeout=30), ExecutionNotFoundError, requests=1,
        prepare=lambda s: s.vanished_handle(), check=names_execution),
    # --- runs in the wrong state ----------------------------------------------------------------
    Row("message-to-finished-run", lambda s, p: s.runtime.send_message(p, {"late": True}),
        ExecutionNotRunningError, requests=1, prepare=lambda s: s.finished_run(), check=names_execution),
    Row("resume-plain-run-with-stateful-agent",
        lambda s, p: s.runtime.resume(p, stateful_agent("listener", "openai/gpt-4o")), ResumeError, requests=1,
        prepare=lambda s: s.waiting_plain_run(), check=names_execution),
    # The run was started by another runtime: this one reads its status once to know whether it is a
    # continued listener (docs/concepts.md), then sends.
    Row("message-queue-full", lambda s, p: s.runtime.send_message(p, {"one": "too many"}), MessageQueueFullError,
        requests=2, prepare=lambda s: s.full_queue_run(), check=names_execution),
    Row("message-queue-disabled", lambda s, p: p[0].send_message(p[1], {"a": 1}), MessageQueueDisabledError,
        requests=2, prepare=lambda s: s.queue_disabled_run(), check=names_execution),
    # --- the server itself ----------------------------------------------------------------------
    Row("wrong-auth-secret", wrong_secret, AuthenticationError, requests=1,
        check=holds(lambda e: e.status == 401 and "wrong" not in str(e))),
    Row("server-refuses-connections", refused, ServerUnavailableError, requests=1, max_seconds=3.0),
    Row("server-never-answers", nothing_answers, ServerUnavailableError, requests=1, max_seconds=4.0),
]


def test_the_table_is_big_enough():
    assert len(ROWS) >= 20 and len({r.id for r in ROWS}) == len(ROWS)


@pytest.mark.parametrize("row", ROWS, ids=[r.id for r in ROWS])
def test_bad_input(row: Row, srv: Server, sent: list) -> None:
    prep = row.prepare(srv) if row.prepare is not None else None
    del sent[:]
    began = time.monotonic()
    with pytest.raises(row.error) as info:
        row.act(srv, prep)
    elapsed = time.monotonic() - began
    assert len(sent) == row.requests, f"{row.id}: expected {row.requests} request(s), sent {sent}"
    assert str(info.value), "the error says what is wrong"
    if row.check is not None:
        row.check(info.value, prep)
    if row.max_seconds is not None:
        assert elapsed < row.max_seconds, f"{row.id}: took {elapsed:.1f}s"


def test_a_tool_returning_garbage_fails_its_task_clearly_and_the_run_goes_on(agent_runtime, scripted_llm,
                                                                             unique_name):
    """Values the server cannot store (a set, a non-string key, NaN, an arbitrary object) fail the
    tool's task with a reason naming the tool; the model sees it; the run completes."""
    garbage = {"a_set": {1, 2}, "int_key": {1: "one"}, "not_a_number": math.nan, "an_object": object()}
    def returning(value: Any) -> Callable[[], Any]:
        def produce():  # type: ignore[no-untyped-def]
            return value
        return produce

    tools = [tool(name=unique_name(kind))(returning(value)) for kind, value in garbage.items()]
    model = scripted_llm.script([[ToolCall(t.name) for t in tools], "done"])
    agent = Agent(unique_name("garbage"), model, tools=tools, max_turns=5)
    result = agent_runtime.run(agent, "Call them all.", timeout=60)
    assert result.status is RunStatus.COMPLETED and result.output == "done"
    calls = {c.name: c for c in result.tool_calls}
    assert set(calls) == {t.name for t in tools}
    for name, call in calls.items():
        # The SDK reports FAILED_WITH_TERMINAL_ERROR (no retry: the same body would return the
        # same garbage); the server shows an optional tool task that failed as COMPLETED_WITH_ERRORS.
        assert call.status == "COMPLETED_WITH_ERRORS", call
        assert name in call.error and "unusable value" in call.error, call.error
    seen = {o.name: o.output for o in scripted_llm.requests_for(model)[1].tool_outputs}
    assert set(seen) == set(calls)
