"""Test configuration: the project's own pytest plugin gives every test the real server."""

pytest_plugins = ["conductor_agents.testing.pytest_plugin"]

from typing import Dict, Iterator

import pytest

from conductor_agents import LocalServer
from conductor_agents.testing import ScriptedLLM

#: The restartable servers' settings. ``systemTaskPostponeThreshold=0`` makes the join after a
#: waiting message task back off from its first check (test_long_wait); the script limit is
#: generous because several servers share two cores (the server's own 4 s was seen to run out).
RESTARTABLE_PROPERTIES = {"conductor.app.systemTaskPostponeThreshold": "0"}
RESTARTABLE_ENV = {"CONDUCTOR_SCRIPT_MAX_EXECUTION_SECONDS": "60"}


class RestartableServers:
    """One real server per backend that tests may restart and stop (never the session's, which every
    other test uses): started on first use, and again for the next test after one stopped it. Each
    costs a JVM start (20-50 s here), so the restart tests share them instead of starting their own."""

    def __init__(self, llm: ScriptedLLM, tmp_path_factory: pytest.TempPathFactory) -> None:
        self._llm = llm
        self._tmp = tmp_path_factory
        self._servers: Dict[str, LocalServer] = {}

    def get(self, backend: str = "sqlite") -> LocalServer:
        server = self._servers.get(backend)
        if server is None:
            server = LocalServer(self._tmp.mktemp(f"restartable-{backend}"), backend=backend,
                                 env={**self._llm.server_env(), **RESTARTABLE_ENV},
                                 properties=RESTARTABLE_PROPERTIES, startup_timeout=600)
            self._servers[backend] = server
        if not server.is_running:
            server.start()
        return server

    def stop(self) -> None:
        for server in self._servers.values():
            server.stop()


_RESTARTABLE = "restartable_servers"
_open: "list[RestartableServers]" = []


@pytest.fixture(scope="session")
def restartable_servers(scripted_llm: ScriptedLLM,
                        tmp_path_factory: pytest.TempPathFactory) -> Iterator[RestartableServers]:
    servers = RestartableServers(scripted_llm, tmp_path_factory)
    _open.append(servers)
    try:
        yield servers
    finally:
        servers.stop()
        _open.remove(servers)


def _uses_restartable(item: "pytest.Item | None") -> bool:
    return item is not None and _RESTARTABLE in getattr(item, "fixturenames", ())


#: Markers this conftest puts on tests (``make test-fast`` deselects both).
RESTARTS_MARKER = "restarts"
CLUSTER_MARKER = "cluster"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", f"{RESTARTS_MARKER}: uses the restartable servers (set on collection)")
    config.addinivalue_line("markers", f"{CLUSTER_MARKER}: runs on the local cluster (set on collection)")


def _on_cluster(item: pytest.Item) -> bool:
    params = getattr(getattr(item, "callspec", None), "params", {})
    return "conductor_cluster" in getattr(item, "fixturenames", ()) or params.get("topology") == "cluster"


def _is_unit(item: pytest.Item) -> bool:
    return "tests/unit/" in item.nodeid.replace("\\", "/")


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: "list[pytest.Item]") -> None:
    """Order: the unit tests (they need no server: the boot archive is got ready beside them, see the
    plugin); the tests on the restartable servers, one after the other, in their own order, whose
    servers are then stopped (below) instead of idling beside the session's for the rest of the run
    (an idle Conductor JVM takes a fifth of a core here); the tests on one SQLite node; and last the
    tests on the cluster (the fault tests, which kill and restart its parts, at the very end), so
    its two JVMs start only then instead of idling through the single-node tests."""
    for item in items:
        if _uses_restartable(item):
            item.add_marker(RESTARTS_MARKER)
        if _on_cluster(item):
            item.add_marker(CLUSTER_MARKER)
    unit = [item for item in items if _is_unit(item)]
    first = [item for item in items if _uses_restartable(item)]
    first.sort(key=lambda item: item.name == "test_stop_leaves_no_process")  # it stops one: last (stable)
    rest = [item for item in items if not _is_unit(item) and not _uses_restartable(item)]
    cluster = [item for item in rest if _on_cluster(item)]
    cluster.sort(key=lambda item: item.nodeid.startswith("tests/cluster/"))  # the fault tests last (stable)
    items[:] = unit + first + [item for item in rest if not _on_cluster(item)] + cluster


def pytest_runtest_teardown(item: pytest.Item, nextitem: "pytest.Item | None") -> None:
    if _uses_restartable(item) and not _uses_restartable(nextitem):
        for servers in _open:
            servers.stop()  # a later test asking for one starts it again
