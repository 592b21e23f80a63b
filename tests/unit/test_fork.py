"""After ``fork()`` a runtime, its transport and its observer are the child's own (issue 11.9).

Real forks of the test process; the child reports through a pipe and leaves with ``os._exit``
(never back into pytest). No request is sent: what a child does against a real server is in
tests/reliability/test_fork.py.
"""

from __future__ import annotations

import json
import os
from typing import Any, Callable, Dict

import pytest
import requests

from conductor_agents import AgentRuntime, AgentSettings
from conductor_agents._common import fork as _fork
from conductor_agents._wire.transport import Transport

URL = "http://127.0.0.1:9/api"  # never contacted


def in_child(check: Callable[[], Dict[str, Any]]) -> Dict[str, Any]:
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
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end) as pipe:
        data = pipe.read()
    os.waitpid(pid, 0)
    report = json.loads(data)
    assert "unexpected" not in report, report["unexpected"]
    return report


@pytest.fixture
def runtime():
    with AgentRuntime(AgentSettings(server_url=URL)) as rt:
        yield rt


def test_runtime_in_a_child_has_its_own_worker_id_workers_and_lock(runtime) -> None:
    parent = {"worker_id": runtime.worker_id, "workers": id(runtime._process.workers), "lock": id(runtime._process.lock),
              "observer": id(runtime._observer)}

    def check() -> Dict[str, Any]:
        return {"pid": os.getpid(), "worker_id": runtime.worker_id, "workers": id(runtime._process.workers),
                "lock": id(runtime._process.lock), "observer": id(runtime._observer),
                "observer_is_the_workers": runtime._process.workers.observer is runtime._observer,
                "session": id(runtime._transport._session)}

    child = in_child(check)
    assert child["worker_id"] != parent["worker_id"] and f"-{child['pid']}-" in child["worker_id"]
    assert child["workers"] != parent["workers"] and child["lock"] != parent["lock"]
    assert child["observer"] == parent["observer"] and child["observer_is_the_workers"]  # reset, not replaced
    assert child["session"] != id(runtime._transport._session)
    assert runtime.worker_id == parent["worker_id"] and id(runtime._process.workers) == parent["workers"]


def test_child_stats_start_from_zero(runtime) -> None:
    runtime._observer.poll_failed()
    assert runtime.stats().polls == 1

    def check() -> Dict[str, Any]:
        stats = runtime.stats()
        return {"polls": stats.polls, "errors": stats.poll_errors}

    assert in_child(check) == {"polls": 0, "errors": 0}
    assert runtime.stats().polls == 1


def test_transport_owns_a_new_session_and_no_token_in_a_child() -> None:
    own = Transport(URL, auth_key="k", auth_secret="s")
    own._token = "parent-token"
    given_session = requests.Session()
    given = Transport(URL, session=given_session)

    def check() -> Dict[str, Any]:
        return {"own_session": id(own._session), "token": own._token, "given_session": id(given._session)}

    child = in_child(check)
    assert child["own_session"] != id(own._session) and child["token"] is None
    assert child["given_session"] == id(given_session)  # the caller's session is the caller's
    assert own._token == "parent-token"
    own.close()
    given.close()
    given_session.close()


def test_a_fork_the_hook_missed_is_caught_at_the_next_call(runtime) -> None:
    """uWSGI forks below Python: the pid check at each entry rebuilds on first use."""
    before = runtime.worker_id, runtime._process.workers
    runtime._process.pid = -1  # as seen from a process whose fork hook did not run
    runtime._transport._pid = -1
    runtime.stats()
    assert runtime._process.pid == os.getpid() and runtime.worker_id != before[0] and runtime._process.workers is not before[1]
    session = runtime._transport._session
    runtime._transport._check_process()
    assert runtime._transport._session is not session


def test_one_failing_rebuild_does_not_stop_the_others(runtime) -> None:
    class Broken:
        def _after_fork_in_child(self) -> None:
            raise RuntimeError("boom")

    broken = Broken()
    _fork.rebuild_after_fork(broken)

    def check() -> Dict[str, Any]:
        return {"worker_id": runtime.worker_id}

    assert in_child(check)["worker_id"] != runtime.worker_id
    del broken


def test_a_child_cannot_stop_a_local_server_and_its_exit_stops_nothing(tmp_path) -> None:
    """The guard alone, on a stand-in process (the real server's case is in tests/reliability/test_fork.py)."""
    import subprocess
    import sys

    from conductor_agents.errors import LocalServerError
    from conductor_agents.local_server import LocalServer, _server

    owned = tmp_path / "owned-data"
    owned.mkdir()
    server = LocalServer(port=9)
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        server._proc, server._owned_dir = proc, owned  # as _start() leaves them
        _server._register(server)

        def check() -> Dict[str, Any]:
            try:
                server.stop()
            except LocalServerError as err:
                message = str(err)
            else:
                message = "no error"
            _server._stop_all_at_exit()  # what an ordinary exit of the child runs
            return {"message": message, "pid": server.pid, "registered": len(_server._attached)}

        child = in_child(check)
        assert "is a fork of it and cannot stop" in child["message"]
        assert child["pid"] == proc.pid and child["registered"] == 0
        assert proc.poll() is None and owned.is_dir() and server.is_running
    finally:
        _server._unregister(server)
        server._proc, server._owned_dir = None, None
        proc.kill()
        proc.wait(10)


def test_a_scripted_llm_refuses_scripting_in_a_child_and_keeps_serving_the_parent() -> None:
    from conductor_agents.testing import ScriptedLLM, ScriptedLLMStateError

    with ScriptedLLM() as llm:
        model = llm.script(["before the fork"])

        def check() -> Dict[str, Any]:
            try:
                llm.requests_for(model)
            except ScriptedLLMStateError as err:
                message = str(err)
            else:
                message = "no error"
            llm.stop()  # releases only the child's copy of the socket
            return {"message": message}

        assert f"serves from process {os.getpid()}" in in_child(check)["message"]
        answer = requests.post(f"{llm.base_url}/responses", json={"model": model.split("/", 1)[1], "input": "hi"},
                               timeout=10)
        assert answer.status_code == 200 and llm.requests_for(model)


def test_a_missed_fork_rebuilds_even_while_a_parent_thread_held_the_served_agents_lock(runtime) -> None:
    """The runtime's rebuild gives its served agents a lock of their own first: one a parent thread held at
    a C-level fork (no hook ran) never blocks the child."""
    import threading

    from conductor_agents import Agent

    served = runtime._served
    held = served._lock
    held.acquire()  # as by a parent thread at the fork: it does not exist in the child, nor ever releases
    try:
        runtime._process.pid = -1  # as seen from a process whose fork hook did not run
        call = threading.Thread(target=runtime.stats, daemon=True)
        call.start()
        call.join(5.0)
        assert not call.is_alive(), "the child's rebuild waited on the parent's lock"
        assert served._lock is not held
        assert served.put(Agent(name="a", model="openai/gpt-4o-mini", stateful=True), None)
    finally:
        held.release()


def test_served_agents_are_first_served_once_however_often_the_only_agent_is_served_again() -> None:
    from conductor_agents import Agent
    from conductor_agents._serving.process import ServedAgents

    served = ServedAgents()
    one = Agent(name="a", model="openai/gpt-4o-mini", stateful=True)
    hooks = [lambda h: None, lambda h: None]
    assert [True, False, False] == [served.put(one, None), served.put(one, hooks[0]), served.put(one, hooks[1])]
    assert [(one, hooks[1])] == served.agents()
