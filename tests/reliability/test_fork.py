"""A runtime built before ``fork()`` works in the child as the child's own (issue 11.9).

``fork_program.py`` runs as its own process (so its children exit by the ordinary interpreter
exit, as a gunicorn worker does, without a pytest in them): the parent starts a listener and
forks while its threads run and a tool is in flight; the child starts its own listener on the
inherited runtime. Proved by pid: each side's tools ran in its own process, the worker ids
differ, the parent's run went on unaffected, and the child exited (exit code 0, not "hung").
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import requests

from conductor_agents.errors import LocalServerError
from conductor_agents.local_server import LocalServer, _server
from conductor_agents.testing import ScriptedLLMStateError, ToolCall, listener_policy

from .support import HERE, ROOT

pytestmark = pytest.mark.reliability


def act_on(payload: dict) -> ToolCall:
    return ToolCall("act", {"action": payload["action"]})


@pytest.mark.parametrize("mode", ["os.fork", "multiprocessing"])
def test_a_forked_child_serves_its_own_listener_with_the_inherited_runtime(
        mode: str, agent_settings, scripted_llm, unique_name) -> None:
    model = scripted_llm.script(policy=listener_policy(act_on))
    env = {**os.environ, "CONDUCTOR_SERVER_URL": agent_settings.server_url,
           "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    done = subprocess.run([sys.executable, os.path.join(HERE, "fork_program.py"), mode, model, unique_name("fork")],
                          env=env, capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    parent, child = report["parent"], report["child"]
    assert "error" not in child, child.get("error")

    assert child["exit_code"] == 0  # exited through the interpreter's own exit, no hang
    assert child["pid"] != parent["pid"]
    # the parent's threads were running at the fork; none of them exists in the child
    assert any(name.startswith("conductor-agents-poll-") for name in parent["threads_at_fork"])
    assert child["threads_at_start"] == []
    assert "conductor-agents-watchdog" in parent["threads_at_fork"]
    # the child's threads are built anew, by the same path, on first use there
    assert "conductor-agents-watchdog" in child["threads_serving"] and child["stall"] == "None"
    assert any(name.startswith("conductor-agents-poll-") for name in child["threads_serving"])
    assert child["stats_at_start"] == 0  # stats are the child's own
    assert child["worker_id_differs"] and str(child["pid"]) in child["worker_id"]
    assert child["worker_id"] != parent["worker_id"]
    # the child's run: served there, its tool ran there (the pid in the tool's output)
    assert child["tool_ran_here"] and child["serves_own_run"] and child["status"] == "COMPLETED"
    assert child["tool_pids"] == [["child-work", child["pid"]]]
    # the parent's run is not the child's: not served there, none of its tools ran there
    assert not child["serves_parent_run"] and child["parent_actions_seen_here"] == []
    assert child["parent_run_status_seen"] == "RUNNING"
    if mode == "os.fork":
        assert child["threads_after_close"] == []

    # the parent's run went on: the in-flight tool finished, the next message ran, all in the parent
    assert parent["after_fork_ran"] and parent["serves_its_run"] and parent["status"] == "COMPLETED"
    assert parent["tool_pids"] == [["before-fork", parent["pid"]], ["slow", parent["pid"]],
                                   ["after-fork", parent["pid"]]]
    assert parent["threads_after_close"] == []


def _in_child(check) -> dict:
    """Run ``check()`` in a forked child of this test process; return what it reports (bounded)."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(read_end)
            try:
                report = check()
            except BaseException as err:  # noqa: BLE001 - reported to the parent
                report = {"unexpected": repr(err)}
            with os.fdopen(write_end, "w") as out:
                out.write(json.dumps(report))
        finally:
            os._exit(0)  # never back into pytest
    os.close(write_end)
    with os.fdopen(read_end) as pipe:
        data = pipe.read()  # EOF when the child exits (os._exit is immediate)
    os.waitpid(pid, 0)
    return json.loads(data)


def test_scripted_llm_refuses_scripting_in_a_forked_child(scripted_llm) -> None:
    """Its scripts live in the serving process: a child's script would silently never be served."""
    def check() -> dict:
        try:
            scripted_llm.script(["hi"])
        except ScriptedLLMStateError as err:
            message = str(err)
        else:
            message = "no error"
        return {"message": message, "url": scripted_llm.base_url}

    report = _in_child(check)
    assert f"serves from process {os.getpid()}" in report["message"]
    assert report["url"] == scripted_llm.base_url
    assert scripted_llm.is_running
    scripted_llm.script(["still fine here"])


def test_a_forked_child_cannot_stop_the_local_server_and_its_exit_leaves_it_running(conductor_server) -> None:
    """The session's server: a child's stop() raises, and what its atexit hook runs stops nothing."""
    if not isinstance(conductor_server, LocalServer):
        pytest.skip("CONDUCTOR_AGENTS_TEST_SERVER_URL: an external server, no LocalServer process here")
    data_dir = conductor_server.data_dir

    def check() -> dict:
        try:
            conductor_server.stop()
        except LocalServerError as err:
            message = str(err)
        else:
            message = "no error"
        _server._stop_all_at_exit()  # what an ordinary exit of the child runs
        return {"message": message, "running": conductor_server.is_running, "pid": conductor_server.pid}

    report = _in_child(check)
    assert "is a fork of it and cannot stop" in report["message"]
    assert report["running"] and report["pid"] == conductor_server.pid
    assert conductor_server.is_running and data_dir is not None and data_dir.is_dir()
    assert requests.get(conductor_server.base_url + "/health", timeout=10).ok
