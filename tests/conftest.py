"""Test configuration: the project's own pytest plugin gives every test the real server."""

pytest_plugins = ["conductor_agents.testing.pytest_plugin"]

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Dict, Iterator, Optional

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


#: The session's clusters (one per worker process), recorded to stop them once this worker is done with them.
_clusters: "list[object]" = []
#: Those this conftest stopped after the last cluster test (started again if a cluster test still comes).
_clusters_stopped: "list[object]" = []


@pytest.fixture(scope="session")
def conductor_cluster(conductor_cluster: object) -> Iterator[object]:
    """The plugin's cluster, recorded so that it is stopped once this process has run its cluster tests
    (see ``pytest_runtest_teardown``) instead of idling beside the single-node tests."""
    _clusters.append(conductor_cluster)
    try:
        yield conductor_cluster
    finally:
        _clusters.remove(conductor_cluster)


@pytest.fixture
def xdg_runtime_dir() -> Iterator[str]:
    """A private, short ``XDG_RUNTIME_DIR`` for one test's subprocesses: gunicorn (25.1+) makes its
    control socket ``$XDG_RUNTIME_DIR/gunicorn.ctl`` (else ``~/.gunicorn/gunicorn.ctl``), which two
    gunicorns at once (two test workers) would share. Short because a Unix socket path has 107 bytes."""
    path = tempfile.mkdtemp(prefix="xdg-run-")
    os.chmod(path, 0o700)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


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


# --- parallel runs (pytest-xdist) ------------------------------------------------------------
#
# ``make test`` runs the suite on two pytest-xdist workers (``-n 2 --dist loadgroup``). Each worker is
# a pytest session of its own, with its own session server, ScriptedLLM, restartable servers and
# cluster (free ports, its own basetemp), so tests that share one of the expensive ones must run on
# one worker, one after the other, in the order ``pytest_collection_modifyitems`` gives them:
#
# - ``cluster``: every test on the local cluster (two JVMs, Redis, HAProxy), the fault tests last;
# - ``restarts``: every test on the restartable servers, ``test_stop_leaves_no_process`` last;
# - ``module:<path>``: the tests of a module that uses a module- or class-scoped fixture (a server
#   that module starts, or state it builds once);
# - ``package:<path>``: likewise for a package-scoped fixture;
# - every other test is a group of its own, sent to whichever worker is free.
#
# The worker knows the groups (they come from fixtures and markers); the controller, which schedules,
# sees only node ids. So each worker writes ``{nodeid: group}`` to a file in a directory the controller
# gives it (``workerinput``) before it reports its collection, and the controller's scheduler
# (``_GroupScheduling``, a LoadScopeScheduling whose scope is the group) reads it. The node ids stay as
# they are. xdist's own ``--dist loadgroup`` reads ``xdist_group`` marks before this conftest can set
# them, hence the scheduler of our own, used for ``--dist load`` (``-n`` alone) and ``loadgroup``.

CLUSTER_GROUP = "cluster"
RESTARTS_GROUP = "restarts"
#: The large groups, sent first (one to each worker) so that none is left for the end of the run.
_FIRST_GROUPS = (CLUSTER_GROUP, RESTARTS_GROUP)
_GROUPS_DIR_KEY = "conductor_agents_groups_dir"
_GROUPS_DIR = pytest.StashKey[str]()
_WIDE_SCOPES = ("class", "module", "package")


def _group_of(item: pytest.Item) -> Optional[str]:
    """The group ``item`` runs in, or None when it can run on any worker (see above)."""
    if _on_cluster(item):
        return CLUSTER_GROUP
    if _uses_restartable(item):
        return RESTARTS_GROUP
    info = getattr(item, "_fixtureinfo", None)
    for name in getattr(info, "names_closure", ()):
        defs = getattr(info, "name2fixturedefs", {}).get(name) or ()
        scope = getattr(defs[-1], "scope", None) if defs else None
        if scope == "package":
            return f"package:{defs[-1].baseid}"
        if scope in _WIDE_SCOPES:
            return f"module:{item.nodeid.split('::', 1)[0]}"
    return None


def _write_groups(config: pytest.Config, items: "list[pytest.Item]") -> None:
    """On an xdist worker: write ``{nodeid: group}`` for the controller's scheduler."""
    workerinput = getattr(config, "workerinput", None)
    if not workerinput or _GROUPS_DIR_KEY not in workerinput:
        return
    groups = {item.nodeid: group for item in items if (group := _group_of(item)) is not None}
    target = Path(workerinput[_GROUPS_DIR_KEY]) / f"{workerinput['workerid']}.json"
    partial = target.with_suffix(".partial")
    partial.write_text(json.dumps(groups))
    os.replace(partial, target)


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node) -> None:  # the controller, before each worker starts
    config = node.config
    directory = config.stash.get(_GROUPS_DIR, None)
    if directory is None:
        directory = config.stash[_GROUPS_DIR] = tempfile.mkdtemp(prefix="conductor-agents-xdist-")
    node.workerinput[_GROUPS_DIR_KEY] = directory


@pytest.hookimpl(tryfirst=True, optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    # tryfirst: answer before xdist's own implementation (the hook takes the first answer).
    if config.getvalue("dist") not in ("load", "loadgroup"):
        return None  # an explicit --dist loadscope/loadfile/worksteal/each is left to xdist
    return _make_group_scheduling(config, log)


def _make_group_scheduling(config: pytest.Config, log):
    from xdist.scheduler import LoadScopeScheduling

    class _GroupScheduling(LoadScopeScheduling):
        """LoadScopeScheduling whose scope is the test's group (its node id when it has none); the large
        groups go out first, the others in collection order; a group's tests run in collection order."""

        def __init__(self, config: pytest.Config, log=None) -> None:
            super().__init__(config, log)
            self._groups: "Optional[Dict[str, str]]" = None

        def _load_groups(self) -> "Dict[str, str]":
            if self._groups is None:
                self._groups = {}
                directory = self.config.stash.get(_GROUPS_DIR, None)
                files = sorted(Path(directory).glob("*.json")) if directory else []
                if files:
                    self._groups = json.loads(files[0].read_text())
                else:
                    self.log("no test groups written by the workers: every test is scheduled on its own")
            return self._groups

        def _split_scope(self, nodeid: str) -> str:
            return self._load_groups().get(nodeid, nodeid)

        def schedule(self) -> None:
            if self.collection is None and self.collection_is_completed and self._check_nodes_have_same_collection():
                collection = list(next(iter(self.registered_collections.values())))
                units: "Dict[str, Dict[str, bool]]" = {}
                for nodeid in collection:
                    units.setdefault(self._split_scope(nodeid), {})[nodeid] = False
                order = sorted(enumerate(units), key=lambda pair: (
                    _FIRST_GROUPS.index(pair[1]) if pair[1] in _FIRST_GROUPS else len(_FIRST_GROUPS), pair[0]))
                for _, scope in order:
                    self.workqueue[scope] = units[scope]
                self.collection = collection
                if not collection:
                    return
                extra = len(self.nodes) - len(self.workqueue)
                for _ in range(max(extra, 0)):
                    unused, _assigned = self.assigned_work.popitem()
                    unused.shutdown()
                for node in self.nodes:
                    self._assign_work_unit(node)
                for node in self.nodes:
                    self._reschedule(node)
                if not self.workqueue:
                    for node in self.nodes:
                        node.shutdown()
                return
            super().schedule()

    return _GroupScheduling(config, log)


def pytest_unconfigure(config: pytest.Config) -> None:
    directory = config.stash.get(_GROUPS_DIR, None)
    if directory is not None:
        shutil.rmtree(directory, ignore_errors=True)


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: "list[pytest.Item]") -> None:
    """Order: the unit tests (they need no server: the boot archive is got ready beside them, see the
    plugin); the tests on the restartable servers, one after the other, in their own order, whose
    servers are then stopped (below) instead of idling beside the session's for the rest of the run
    (an idle Conductor JVM takes a fifth of a core here); the tests on one SQLite node; and last the
    tests on the cluster (the fault tests, which kill and restart its parts, at the very end), so
    its two JVMs start only then instead of idling through the single-node tests. On xdist workers each
    group of tests that share a server keeps this order, the groups being scheduled as described above
    ("parallel runs")."""
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
    _write_groups(config, items)


def pytest_runtest_setup(item: pytest.Item) -> None:
    if _clusters_stopped and _on_cluster(item):
        # A cluster test after the group ended (an xdist worker took over a crashed one's): start again.
        for cluster in list(_clusters_stopped):
            cluster.start()  # same ports and data directory
            _clusters_stopped.remove(cluster)


def pytest_runtest_teardown(item: pytest.Item, nextitem: "pytest.Item | None") -> None:
    if _uses_restartable(item) and not _uses_restartable(nextitem):
        for servers in _open:
            servers.stop()  # a later test asking for one starts it again
    if _on_cluster(item) and nextitem is not None and not _on_cluster(nextitem):
        # Run serially the cluster tests come last (nextitem None); on an xdist worker they come first
        # (one group): its two JVMs, Redis and HAProxy need not idle through the rest of the run.
        for cluster in _clusters:
            if cluster not in _clusters_stopped:
                cluster.stop()
                _clusters_stopped.append(cluster)
