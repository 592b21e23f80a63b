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
``conductor_cluster`` (session)
    A :class:`~conductor_agents.testing.LocalCluster` (two nodes on one Redis behind
    HAProxy) wired to ``scripted_llm``; started on first use, once per session.
``topology``
    ``"single"`` or ``"cluster"``. Tests marked ``both_topologies`` run once on each
    (ids ``[single]`` and ``[cluster]``); ``--topology single|cluster|both`` (default
    ``both``, or ``CONDUCTOR_AGENTS_TEST_TOPOLOGY``) chooses which. Other tests: ``"single"``.
``topology_server``
    The server of this test's topology: ``conductor_server`` or ``conductor_cluster``.
``agent_settings``
    :class:`~conductor_agents.AgentSettings` for ``topology_server``, with the defaults: a listener's mailbox
    looks for messages every 30 s while idle, so a test that pushes to it with the server's own REST call
    signals it after the push (``POST /tasks/{id}/COMPLETED/signal``, as ``docs/concepts.md`` tells raw
    senders), and the message is taken at once.
``agent_runtime``
    An :class:`~conductor_agents.AgentRuntime` on that server, closed after the test.
``server_secrets`` (session)
    ``{name: value}`` of the secrets the session's servers hold (one random value per session,
    under ``CONDUCTOR_AGENTS_TEST_SECRET``): a tool declaring ``credentials=[name]`` gets it.
    With ``CONDUCTOR_AGENTS_TEST_SERVER_URL``, start that server with
    ``CONDUCTOR_SECRET_CONDUCTOR_AGENTS_TEST_SECRET=<value>`` and set
    ``CONDUCTOR_AGENTS_TEST_SECRET=<value>`` for the tests.
``unique_name``
    ``unique_name("listener")`` gives a name no other test uses, so tests never see
    each other's runs or task queues. After the test, runs of those names still running on
    the session's servers are terminated: a listener left waiting costs a server task
    evaluations every second, and a suite that leaves dozens slows every later test.

When the collected tests use these fixtures, the server's boot archive (see
:class:`~conductor_agents.LocalServer`) is got ready in a background thread as soon as
collection ends, so on a fresh machine its one training start overlaps the tests that
need no server instead of delaying the first one that does.
"""

from __future__ import annotations

import itertools
import logging
import os
import re
import threading
import uuid
from collections.abc import Callable, Iterator
from typing import Protocol

import pytest

from ..runtime import AgentRuntime
from ..settings import AgentSettings
from ._scripted_llm import ScriptedLLM

#: URLs of the session's servers while they run (ended leftovers are looked for there).
_SESSION_SERVER_URLS: list[str] = []

#: The name of the secret the session's servers hold (see ``server_secrets``).
TEST_SECRET_NAME = "CONDUCTOR_AGENTS_TEST_SECRET"  # noqa: S105 - the secret's name; its value is made below
_TEST_SECRET_VALUE = os.environ.get(TEST_SECRET_NAME) or f"test-secret-{uuid.uuid4().hex}"


def _session_secrets() -> dict[str, str]:
    return {TEST_SECRET_NAME: _TEST_SECRET_VALUE}


@pytest.fixture(scope="session")
def server_secrets() -> dict[str, str]:
    """The secrets the session's servers hold: ``{name: value}``."""
    return _session_secrets()


class _ExternalServer:
    """Stands in for a LocalServer when the tests run against a server started elsewhere."""

    def __init__(self, url: str) -> None:
        self.url = url.rstrip("/")

    def start(self) -> None:
        """Nothing to start: it runs already."""

    def stop(self) -> None:
        """Nothing to stop: it is not ours."""


class _SessionServer(Protocol):
    @property
    def url(self) -> str: ...

    def start(self) -> object: ...

    def stop(self) -> None: ...


def _for_the_session(server: _SessionServer) -> Iterator[object]:
    """Start ``server`` (a LocalServer, a LocalCluster or an external server), count its URL among the session's
    (the runs left on it are ended after the session), and stop it once the session is done."""
    server.start()
    _SESSION_SERVER_URLS.append(server.url)
    try:
        yield server
    finally:
        _SESSION_SERVER_URLS.remove(server.url)
        server.stop()


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
        yield from _for_the_session(_ExternalServer(external))
        return
    from ..local_server import LocalServer

    # A generous startup bound: on a small machine shared with other servers the JVM alone can take minutes.
    yield from _for_the_session(LocalServer(tmp_path_factory.mktemp("conductor-server"),
                                            env=_test_server_env(scripted_llm), startup_timeout=600.0,
                                            secrets=_session_secrets()))


#: The fixtures through which a test gets a local server (all of them need ``scripted_llm``).
_SERVER_FIXTURES = frozenset({"scripted_llm", "conductor_server", "conductor_cluster"})
_BOOT_ARCHIVE_JOIN_SECONDS = 5.0


def pytest_collection_finish(session: pytest.Session) -> None:
    """Start getting the boot archive ready in the background when a collected test needs a server."""
    if session.config.option.collectonly or not any(
            _SERVER_FIXTURES.intersection(getattr(item, "fixturenames", ())) for item in session.items):
        return
    # A daemon: if it dies (or is still making the archive at exit) only the head start is lost; the
    # first server start makes the archive itself, waiting on the same lock if this thread holds it.
    thread = threading.Thread(target=_prepare_boot_archive, name="conductor-agents-boot-archive", daemon=True)
    thread.start()
    session.config.stash[_BOOT_ARCHIVE_THREAD] = thread


def pytest_sessionfinish(session: pytest.Session) -> None:
    thread = session.config.stash.get(_BOOT_ARCHIVE_THREAD, None)
    if thread is not None:
        thread.join(_BOOT_ARCHIVE_JOIN_SECONDS)


_BOOT_ARCHIVE_THREAD = pytest.StashKey["threading.Thread"]()


def _prepare_boot_archive() -> None:
    from ..local_server import LocalServer

    try:
        LocalServer(progress=False).prepare()
    except Exception as err:  # noqa: BLE001 - the first start will try (and report) again
        logging.getLogger("conductor_agents.testing").warning("could not prepare the boot archive: %s", err)


TOPOLOGIES = ("single", "cluster")


class _Served(Protocol):
    """What the tests read of a session server or cluster (LocalServer, LocalCluster, an external URL)."""

    @property
    def url(self) -> str: ...
TOPOLOGY_MARKER = "both_topologies"
_TOPOLOGY_ENV = "CONDUCTOR_AGENTS_TEST_TOPOLOGY"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("conductor-agents")
    group.addoption(
        "--topology",
        choices=("both", *TOPOLOGIES),
        default=None,
        help=f"where tests marked {TOPOLOGY_MARKER} run: one SQLite node, the Redis cluster, or both "
        f"(default: ${_TOPOLOGY_ENV} or both)",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", f"{TOPOLOGY_MARKER}: runs on one SQLite node and on a Redis cluster behind a balancer"
    )


def _selected_topologies(config: pytest.Config) -> list[str]:
    choice = config.getoption("--topology") or os.environ.get(_TOPOLOGY_ENV) or "both"
    return list(TOPOLOGIES) if choice == "both" else [choice]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "topology" in metafunc.fixturenames and metafunc.definition.get_closest_marker(TOPOLOGY_MARKER):
        metafunc.parametrize("topology", _selected_topologies(metafunc.config), indirect=True)


def _test_server_env(llm: ScriptedLLM) -> dict[str, str]:
    """A test server's environment: the scripted model, and a script time limit (the server's INLINE tasks,
    regex guardrails) of 30 s instead of the server's 4 s, which runs out on a loaded test machine."""
    return {**llm.server_env(), "CONDUCTOR_SCRIPT_MAX_EXECUTION_SECONDS": "30"}


@pytest.fixture(scope="session")
def conductor_cluster(scripted_llm: ScriptedLLM, tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """Two Conductor nodes on one Redis behind HAProxy for the session, wired to ``scripted_llm``."""
    from ..local_server import LocalCluster

    # Two JVMs start at once: on a small shared machine that can take minutes.
    yield from _for_the_session(LocalCluster(tmp_path_factory.mktemp("conductor-cluster"), nodes=2,
                                             env=_test_server_env(scripted_llm), startup_timeout=600.0,
                                             secrets=_session_secrets()))


@pytest.fixture
def topology(request: pytest.FixtureRequest) -> str:
    """``"single"`` or ``"cluster"``: where this test runs (see the module docstring)."""
    return str(getattr(request, "param", "single"))


@pytest.fixture
def topology_server(topology: str, request: pytest.FixtureRequest) -> _Served:
    """The session's server for this test's topology (started on first use)."""
    served: _Served = request.getfixturevalue("conductor_cluster" if topology == "cluster" else "conductor_server")
    return served


@pytest.fixture
def agent_settings(topology_server: _Served) -> AgentSettings:
    """Settings pointing at the server of this test's topology (the defaults otherwise)."""
    return AgentSettings.from_env(environ={}, server_url=topology_server.url)


@pytest.fixture
def agent_runtime(agent_settings: AgentSettings) -> Iterator[AgentRuntime]:
    """An AgentRuntime on the session's server; closed (threads joined) after the test."""
    runtime = AgentRuntime(agent_settings)
    try:
        yield runtime
    finally:
        runtime.close()


@pytest.fixture
def unique_name(request: pytest.FixtureRequest) -> Iterator[Callable[[str], str]]:
    """``unique_name(base)`` → ``base_<test>_<random>``: an agent or tool name of this test only.

    After the test, runs of the names it gave out that are still running on the session's
    servers are terminated (see the module docstring).
    """
    test = re.sub(r"[^A-Za-z0-9]", "_", request.node.name)[-40:].strip("_") or "test"
    salt = uuid.uuid4().hex[:6]
    counter = itertools.count()
    issued: list[str] = []

    def make(base: str = "agent") -> str:
        name = f"{base}_{test}_{salt}{next(counter)}"[:64]
        issued.append(name)
        return name

    yield make
    ended = _end_leftover_runs(issued, list(_SESSION_SERVER_URLS))
    if ended:
        request.config.stash[_LEFTOVERS] = request.config.stash.get(_LEFTOVERS, 0) + ended


_LEFTOVERS = pytest.StashKey[int]()


def _end_leftover_runs(names: list[str], urls: list[str]) -> int:
    """Terminate the runs of ``names`` still running on ``urls``; how many were ended."""
    import requests

    ended = 0
    for url in urls:
        for name in names:
            try:
                response = requests.get(f"{url}/workflow/running/{name}", timeout=10)
                ids = response.json() if response.ok else []
            except (requests.RequestException, ValueError):
                continue  # a server that is down or restarting holds nothing to clean now
            for execution_id in ids if isinstance(ids, list) else []:
                try:
                    requests.delete(f"{url}/workflow/{execution_id}",
                                    params={"reason": "left running by a test"}, timeout=10)
                    ended += 1
                except requests.RequestException:
                    pass
    return ended


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, exitstatus: int,
                            config: pytest.Config) -> None:
    ended = config.stash.get(_LEFTOVERS, 0)
    if ended:
        terminalreporter.write_line(f"conductor-agents: terminated {ended} run(s) that tests left running")


