"""pytest fixtures for agents on a real Conductor server with a scripted model.

Enable it in a ``conftest.py``::

    pytest_plugins = ["conductor_agents.testing.pytest_plugin"]

Fixtures:

``scripted_llm`` (session)
    A running :class:`~conductor_agents.testing.ScriptedLLM`.
``conductor_server`` (session)
    A :class:`~conductor_agents.LocalServer` (the real Conductor jar, SQLite, message
    queue on) whose OpenAI provider points at ``scripted_llm``. Set
    ``CONDUCTOR_AGENTS_TEST_SERVER_URL`` to use a server you started yourself instead
    (start it with ``OPENAI_BASE_URL=http://127.0.0.1:PORT/v1`` and run the tests with
    ``CONDUCTOR_AGENTS_TEST_LLM_PORT=PORT`` so the session's ScriptedLLM listens there).
``agent_settings``
    :class:`~conductor_agents.AgentSettings` for that server.
``agent_runtime``
    An :class:`~conductor_agents.AgentRuntime` on that server, closed after the test.
``unique_name``
    ``unique_name("listener")`` gives a name no other test uses, so tests never see
    each other's runs or task queues.
"""

from __future__ import annotations

import itertools
import os
import re
import uuid
from typing import Callable, Iterator

import pytest

from ..runtime import AgentRuntime
from ..settings import AgentSettings
from ._scripted_llm import ScriptedLLM


class _ExternalServer:
    """Stands in for a LocalServer when the tests run against a server started elsewhere."""

    def __init__(self, url: str) -> None:
        self.url = url.rstrip("/")


@pytest.fixture(scope="session")
def scripted_llm() -> Iterator[ScriptedLLM]:
    """A scripted OpenAI Responses API on loopback, shared by the session."""
    port = int(os.environ.get("CONDUCTOR_AGENTS_TEST_LLM_PORT") or 0)
    llm = ScriptedLLM(port=port)
    llm.start()
    try:
        yield llm
    finally:
        llm.stop()


@pytest.fixture(scope="session")
def conductor_server(scripted_llm: ScriptedLLM, tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """A real Conductor server for the session, wired to ``scripted_llm``."""
    external = os.environ.get("CONDUCTOR_AGENTS_TEST_SERVER_URL")
    if external:
        yield _ExternalServer(external)
        return
    from ..local_server import LocalServer

    data_dir = tmp_path_factory.mktemp("conductor-server")
    server = LocalServer(data_dir, env=scripted_llm.server_env())
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def agent_settings(conductor_server: object) -> AgentSettings:
    """Settings pointing at the session's server, with short liveness checks."""
    return AgentSettings.from_env(environ={}, server_url=getattr(conductor_server, "url"))


@pytest.fixture
def agent_runtime(agent_settings: AgentSettings) -> Iterator[AgentRuntime]:
    """An AgentRuntime on the session's server; closed (threads joined) after the test."""
    runtime = AgentRuntime(agent_settings)
    try:
        yield runtime
    finally:
        runtime.close()


@pytest.fixture
def unique_name(request: pytest.FixtureRequest) -> Callable[[str], str]:
    """``unique_name(base)`` → ``base_<test>_<random>``: an agent or tool name of this test only."""
    test = re.sub(r"[^A-Za-z0-9]", "_", request.node.name)[-40:].strip("_") or "test"
    salt = uuid.uuid4().hex[:6]
    counter = itertools.count()

    def make(base: str = "agent") -> str:
        return f"{base}_{test}_{salt}{next(counter)}"[:64]

    return make


