"""LocalServer: the real Conductor jar, plus process-lifecycle checks with a fake ``java``.

The real server starts once for the module (about 15 s) and is restarted once; the
startup-failure check dies within seconds. Lifecycle corner cases (atexit, parent
SIGKILL, SIGTERM ignored, startup timeout) use a tiny Python stand-in for ``java``
that answers ``/health``, so they cost well under a second each.
"""

from __future__ import annotations

import os
import signal
import socket
import stat
import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from typing import Iterator, List

import pytest
import requests

from conductor_agents.errors import ConfigurationError, LocalServerError
from conductor_agents.local_server import LocalServer, _proc
from tests.helpers import eventually

pytestmark = pytest.mark.integration

#: Generous: the first start of the probe workflow (its graaljs INLINE task warms the JS engine up) took
#: more than 10 s on a loaded two-core machine while the other test worker started the cluster beside it.
HTTP_TIMEOUT = 60


def process_exists(pid: int) -> bool:
    """True when ``pid`` is a live (non-zombie) process."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return False
    return fields[0] not in ("Z", "X")


def processes_mentioning(text: str) -> List[int]:
    """Pids of live processes whose command line contains ``text``."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if text in cmdline and process_exists(int(entry.name)):
                found.append(int(entry.name))
    return found


def listening_addresses(port: int) -> List[str]:
    """Local addresses (hex, as in /proc/net/tcp*) that listen on ``port``."""
    result = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            address, hex_port = fields[1].rsplit(":", 1)
            if fields[3] == "0A" and int(hex_port, 16) == port:
                result.append(address)
    return result


# --- the real server ----------------------------------------------------------------------


@pytest.fixture
def server(restartable_servers) -> LocalServer:
    """A real server on a caller-given data dir that these tests may restart and stop (shared with
    the other restart tests: each JVM start costs 20-50 s here)."""
    return restartable_servers.get("sqlite")


WORKFLOW = {
    "name": "local_server_probe",
    "version": 1,
    "schemaVersion": 2,
    "ownerEmail": "tests@example.com",
    "tasks": [
        {
            "name": "answer",
            "taskReferenceName": "answer",
            "type": "INLINE",
            "inputParameters": {"evaluatorType": "graaljs", "expression": "(function () { return 42; })()"},
        }
    ],
    "outputParameters": {"answer": "${answer.output.result}"},
}


class TestRealServer:
    def test_healthy_on_loopback(self, server: LocalServer) -> None:
        """The server is healthy, its API answers at url, and it listens on 127.0.0.1 only."""
        assert server.is_running and server.pid is not None
        assert server.url == f"http://127.0.0.1:{server.port}/api"
        health = requests.get(f"{server.base_url}/health", timeout=HTTP_TIMEOUT).json()
        assert health["healthy"] is True
        assert requests.get(f"{server.url}/metadata/workflow", timeout=HTTP_TIMEOUT).status_code == 200
        addresses = listening_addresses(server.port)
        assert addresses and all(a in ("0100007F", "0000000000000000FFFF00000100007F") for a in addresses)
        assert server.data_dir is not None and (server.data_dir / "conductor.db").exists()
        assert server.log_path == server.data_dir / "server.log"
        assert server.log_tail(5).count("\n") == 4
        assert server.version  # the pinned default unless CONDUCTOR_SERVER_VERSION says otherwise

    def test_system_tasks_are_evaluated_sixteen_at_a_time(self, server: LocalServer) -> None:
        """The server took LocalServer's system-task settings: 16 threads and 16 permits per queue, not 2 per core
        (many listeners' waits keep their 1 s cadence; docs/operations.md)."""
        log = server.log_path.read_text(errors="replace")
        assert "SystemTaskWorker initialized with 16 threads" in log
        pollers = [line for line in log.splitlines() if "Starting poller" in line and "PULL_WORKFLOW_MESSAGES" in line]
        assert pollers and all("permits: 16" in line for line in pollers), pollers[:2]

    def test_start_twice_raises(self, server: LocalServer) -> None:
        """A second start() is refused."""
        with pytest.raises(LocalServerError, match="already started"):
            server.start()

    def test_a_restart_keeps_the_runs_and_is_not_held_by_a_request_held_open(self, server: LocalServer,
                                                                           caplog) -> None:
        """restart() on the same data dir and port: a completed workflow is still COMPLETED, with its output, in
        the new process. And a client's request held open (a long poll, an event stream: `conductor-agents run`
        keeps one) is cut after 3 s of the server's graceful shutdown, so the stop needs no SIGKILL (issue 41,
        point 6: `server stop` with a `run` client connected waited 20 s, then killed it). One restart for both:
        each costs 15-25 s here."""
        import logging

        response = requests.post(f"{server.url}/metadata/workflow", json=WORKFLOW, timeout=HTTP_TIMEOUT)
        assert response.status_code in (200, 204), response.text
        response = requests.post(f"{server.url}/workflow/{WORKFLOW['name']}", json={}, timeout=HTTP_TIMEOUT)
        assert response.status_code == 200, response.text
        workflow_id = response.text

        def status() -> str:
            run = requests.get(f"{server.url}/workflow/{workflow_id}", timeout=HTTP_TIMEOUT).json()
            return run["status"] if run["status"] != "RUNNING" else ""

        assert eventually(status, timeout=30, interval=0.2, message="workflow done") == "COMPLETED"
        port, old_pid = server.port, server.pid
        with socket.create_connection(("127.0.0.1", server.port), timeout=HTTP_TIMEOUT) as held:
            # A request whose body is still coming: the server's handler waits reading it, as one streaming
            # events waits writing them.
            held.sendall(b"POST /api/workflow/local_server_probe HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                         b"Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{")
            assert requests.get(f"{server.base_url}/health", timeout=HTTP_TIMEOUT).json()["healthy"] is True
            with caplog.at_level(logging.WARNING, logger="conductor_agents"):
                server.restart()
            assert not [r for r in caplog.records if "ignored SIGTERM" in r.getMessage()], caplog.text
            held.settimeout(HTTP_TIMEOUT)
            while held.recv(4096):  # the stop closed it, so this ends (a socket still open would time out)
                pass
        assert requests.get(f"{server.base_url}/health", timeout=HTTP_TIMEOUT).json()["healthy"] is True
        assert server.port == port and server.pid not in (None, old_pid)
        assert not process_exists(old_pid)
        run = requests.get(f"{server.url}/workflow/{workflow_id}", timeout=HTTP_TIMEOUT).json()
        assert run["status"] == "COMPLETED"
        assert run["output"] == {"answer": 42}

    def test_stop_leaves_no_process(self, server: LocalServer) -> None:
        """stop() ends the process, is idempotent and keeps a caller-given data dir."""
        pid = server.pid
        assert pid is not None
        server.stop()
        assert server.pid is None and not server.is_running
        assert not process_exists(pid)
        server.stop()
        assert server.data_dir is not None and (server.data_dir / "conductor.db").exists()


def test_startup_failure_reports_log_tail(tmp_path: Path) -> None:
    """A server that fails to start raises LocalServerError with the log tail; nothing is left running."""
    srv = LocalServer(tmp_path, properties={"spring.config.import": "file:/nonexistent/conductor.properties"})
    with pytest.raises(LocalServerError) as info:
        srv.start()
    assert "exited with code" in str(info.value)
    assert "APPLICATION FAILED TO START" in info.value.log_tail
    assert "/nonexistent/conductor.properties" in str(info.value)
    assert srv.pid is None and not srv.is_running
    assert processes_mentioning(str(tmp_path)) == []


def test_port_already_taken(tmp_path: Path) -> None:
    """A port someone else listens on is refused before anything starts."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(LocalServerError, match=f"port {port}.*in use"):
            LocalServer(tmp_path, port=port, java="/nonexistent/java", jar=tmp_path / "x.jar").start()
    assert not (tmp_path / "server.log").exists()


def test_bad_arguments() -> None:
    """Arguments are checked up front."""
    with pytest.raises(ConfigurationError):
        LocalServer(port=70000)
    with pytest.raises(ConfigurationError, match="port="):
        LocalServer(properties={"server.port": "1"})
    with pytest.raises(ConfigurationError, match="detached"):
        LocalServer(detached=True)


# --- process lifecycle with a fake java ------------------------------------------------------

FAKE_JAVA = """\
    import http.server, json, os, signal, sys
    args = sys.argv[1:]
    if args == ["-version"]:
        sys.stderr.write('openjdk version "25.0.1" 2025-10-21\\n')
        sys.exit(0)
    mode = os.environ.get("FAKE_JAVA_MODE", "healthy")
    print("fake java starting", " ".join(args), flush=True)
    print("script limit", os.environ.get("CONDUCTOR_SCRIPT_MAX_EXECUTION_SECONDS"), flush=True)
    if mode == "crash":
        print("boom: cannot start", flush=True)
        sys.exit(3)
    if mode == "ignore-term":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    port = int(next(a for a in args if a.startswith("-Dserver.port=")).split("=", 1)[1])
    healthy = mode != "unhealthy"

    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = json.dumps({"healthy": healthy}).encode()
            self.send_response(200 if healthy else 503)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    http.server.HTTPServer(("127.0.0.1", port), Health).serve_forever()
"""


@pytest.fixture
def fake_java(tmp_path: Path) -> Path:
    """A stand-in ``java`` that serves ``/health`` on -Dserver.port (FAKE_JAVA_MODE varies it)."""
    path = tmp_path / "fake-jdk" / "bin" / "java"
    path.parent.mkdir(parents=True)
    path.write_text(f"#!{sys.executable}\n" + textwrap.dedent(FAKE_JAVA))
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


@pytest.fixture
def fake_jar(tmp_path: Path) -> Path:
    jar = tmp_path / "conductor-server-0.0.1-boot.jar"
    jar.write_bytes(b"not used by the fake java")
    return jar


class TestLifecycleWithFakeJava:
    def test_redis_backend_stop_leaves_neither_process(self, tmp_path: Path, fake_java: Path,
                                                       fake_jar: Path) -> None:
        """backend="redis": start() starts a real redis-server of the server's own before the node;
        stop() leaves neither process, and the append-only file stays in the data dir."""
        server = LocalServer(tmp_path / "data", backend="redis", java=fake_java, jar=fake_jar)
        server.start()
        try:
            assert server.redis is not None and server.redis.pid is not None
            pids = [server.pid, server.redis.pid]
            assert all(process_exists(pid) for pid in pids)
        finally:
            server.stop()
        assert [pid for pid in pids if process_exists(pid)] == []
        assert (tmp_path / "data" / "redis" / "appendonlydir").is_dir()

    def test_temp_dir_lifecycle(self, fake_java: Path, fake_jar: Path) -> None:
        """Without data_dir the server owns a temp dir and deletes it on stop; stop is idempotent."""
        srv = LocalServer(java=fake_java, jar=fake_jar)
        srv.stop()  # safe before start
        assert srv.port is None and srv.data_dir is None
        with srv:
            data_dir = srv.data_dir
            assert data_dir is not None and data_dir.is_dir()
            assert srv.is_running and srv.version == "0.0.1"
            assert "fake java starting" in srv.log_tail()
            assert f"-Dserver.port={srv.port}" in srv.log_tail()
            assert "-Dconductor.workflow-message-queue.enabled=true" in srv.log_tail()
            pid = srv.pid
        assert pid is not None and not process_exists(pid)
        assert not data_dir.exists() and srv.data_dir is None
        srv.stop()

    def test_the_script_limit_is_thirty_seconds_unless_the_caller_sets_it(self, fake_java: Path, fake_jar: Path,
                                                                           monkeypatch) -> None:
        """The server's 4 s default for a workflow's script terminated a listener on a loaded machine: a
        LocalServer gets 30 s, and the caller's own value (its environment, or ``env=``) wins."""
        monkeypatch.delenv("CONDUCTOR_SCRIPT_MAX_EXECUTION_SECONDS", raising=False)
        with LocalServer(java=fake_java, jar=fake_jar) as srv:
            assert "script limit 30" in srv.log_tail()
        with LocalServer(java=fake_java, jar=fake_jar, env={"CONDUCTOR_SCRIPT_MAX_EXECUTION_SECONDS": "7"}) as srv:
            assert "script limit 7" in srv.log_tail()
        monkeypatch.setenv("CONDUCTOR_SCRIPT_MAX_EXECUTION_SECONDS", "9")
        with LocalServer(java=fake_java, jar=fake_jar) as srv:
            assert "script limit 9" in srv.log_tail()

    def test_one_server_per_data_dir(self, tmp_path: Path, fake_java: Path, fake_jar: Path) -> None:
        """A second server on a data dir in use is refused; the dir is free again once the first stops."""
        first = LocalServer(tmp_path / "data", java=fake_java, jar=fake_jar).start()
        second = LocalServer(tmp_path / "data", java=fake_java, jar=fake_jar)
        try:
            with pytest.raises(LocalServerError, match="another server is using the data directory"):
                second.start()
            assert second.pid is None
        finally:
            first.stop()
        second.start()
        second.stop()

    def test_secrets_stay_out_of_the_log(self, tmp_path: Path, fake_java: Path, fake_jar: Path) -> None:
        """Secret-looking properties are passed to the server but not written in the log header."""
        props = {"conductor.ai.openai.api-key": "sk-very-secret"}
        with LocalServer(tmp_path / "data", java=fake_java, jar=fake_jar, properties=props) as srv:
            header = next(line for line in srv.log_tail(100).splitlines() if line.startswith("--- conductor-agents"))
            assert "-Dconductor.ai.openai.api-key=***" in header and "sk-very-secret" not in header
            assert "-Dconductor.ai.openai.api-key=sk-very-secret" in srv.log_tail(100)  # the fake echoes its argv

    def test_crash_during_startup(self, tmp_path: Path, fake_java: Path, fake_jar: Path) -> None:
        """A process that exits during startup gives its exit code and log lines."""
        srv = LocalServer(tmp_path / "data", java=fake_java, jar=fake_jar, env={"FAKE_JAVA_MODE": "crash"})
        with pytest.raises(LocalServerError, match="exited with code 3") as info:
            srv.start()
        assert "boom: cannot start" in info.value.log_tail
        assert "boom: cannot start" in str(info.value)

    def test_startup_timeout_kills_the_process(self, tmp_path: Path, fake_java: Path, fake_jar: Path) -> None:
        """A server never healthy within startup_timeout is killed and reported."""
        srv = LocalServer(
            tmp_path / "data", java=fake_java, jar=fake_jar, env={"FAKE_JAVA_MODE": "unhealthy"}, startup_timeout=1.5
        )
        with pytest.raises(LocalServerError, match="not healthy within") as info:
            srv.start()
        assert "fake java starting" in info.value.log_tail
        assert processes_mentioning(str(tmp_path / "data")) == []

    def test_sigterm_ignored_then_killed(self, tmp_path: Path, fake_java: Path, fake_jar: Path) -> None:
        """stop() escalates to SIGKILL after stop_timeout."""
        srv = LocalServer(
            tmp_path / "data", java=fake_java, jar=fake_jar, env={"FAKE_JAVA_MODE": "ignore-term"}, stop_timeout=0.5
        )
        srv.start()
        pid = srv.pid
        assert pid is not None
        srv.stop()
        assert not process_exists(pid)

    def test_start_from_a_short_lived_thread(self, tmp_path: Path, fake_java: Path, fake_jar: Path) -> None:
        """A server started by a thread that then ends keeps running; the spawner thread ends after stop."""
        srv = LocalServer(tmp_path / "data", java=fake_java, jar=fake_jar)
        starter = threading.Thread(target=srv.start, name="test-starter")
        starter.start()
        starter.join(60)
        try:
            assert srv.is_running
            pid = srv.pid
            assert requests.get(f"{srv.base_url}/health", timeout=HTTP_TIMEOUT).json()["healthy"] is True
            assert srv.pid == pid and process_exists(pid)
        finally:
            srv.stop()

        # The spawner thread is shared by every attached server this process started from a
        # thread (the session's LocalCluster starts its nodes from a pool): it lets go of this
        # server, and ends once none of its servers is left.
        def spawner_done() -> bool:
            children = list(_proc._Spawner._children)
            if any(child.pid == pid for child in children):
                return False
            if any(child.poll() is None for child in children):
                return True
            return not any(t.name == "conductor-agents-local-server-spawner" for t in threading.enumerate())

        assert eventually(spawner_done, timeout=10, message="spawner thread let go of the server")

    def _child(self, tmp_path: Path, fake_java: Path, fake_jar: Path, body: str) -> subprocess.Popen:
        script = tmp_path / "child.py"
        script.write_text(
            textwrap.dedent(
                f"""\
                import sys, threading, time
                from conductor_agents.local_server import LocalServer
                def make(**kw):
                    return LocalServer({str(tmp_path / "data")!r}, java={str(fake_java)!r}, jar={str(fake_jar)!r}, **kw)
                """
            )
            + textwrap.dedent(body)
        )
        return subprocess.Popen(
            [sys.executable, str(script)], stdout=subprocess.PIPE, text=True, cwd=Path(__file__).parents[2]
        )

    def test_atexit_stops_the_server(self, tmp_path: Path, fake_java: Path, fake_jar: Path) -> None:
        """A process that exits without stop() still takes its server down."""
        child = self._child(tmp_path, fake_java, fake_jar, "print(make().start().pid, flush=True)\n")
        out, _ = child.communicate(timeout=60)
        assert child.returncode == 0
        assert eventually(lambda: not process_exists(int(out)), timeout=10, message="server gone")

    def test_parent_sigkill_takes_the_server_down(self, tmp_path: Path, fake_java: Path, fake_jar: Path) -> None:
        """SIGKILL of the Python process ends its server too, even one started from a finished thread."""
        body = """\
            box = []
            worker = threading.Thread(target=lambda: box.append(make().start()))
            worker.start(); worker.join(60)
            print(box[0].pid, flush=True)
            time.sleep(60)
            """
        child = self._child(tmp_path, fake_java, fake_jar, body)
        try:
            assert child.stdout is not None
            pid = int(child.stdout.readline())
            assert process_exists(pid)  # the thread that started it has ended; the server lives on
        finally:
            child.send_signal(signal.SIGKILL)
            child.wait(timeout=10)
        assert eventually(lambda: not process_exists(pid), timeout=10, message="server gone")

    def test_detached_outlives_its_parent(self, tmp_path: Path, fake_java: Path, fake_jar: Path) -> None:
        """A detached server keeps running after its parent exits, in its own session."""
        child = self._child(tmp_path, fake_java, fake_jar, "print(make(detached=True).start().pid, flush=True)\n")
        out, _ = child.communicate(timeout=60)
        pid = int(out)
        try:
            assert process_exists(pid)
            assert os.getsid(pid) == pid
        finally:
            os.kill(pid, signal.SIGKILL)
        assert eventually(lambda: not process_exists(pid), timeout=10, message="server gone")


#: The first requests to a JVM that just started compile their code paths: on a loaded machine they took over 10 s.
COLD_SERVER_TIMEOUT = 60
