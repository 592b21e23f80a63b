"""samples/django_app under a real WSGI server with two worker processes (issue 11.9).

gunicorn runs the sample with ``--workers 2``, with ``--preload`` (the runtime is built in the
master and forked into the workers) and without (each worker builds its own), against the
session's server with a scripted model. Listeners are started through HTTP until two workers
have each started one; messages are sent until each listener has received one through the
worker that did *not* start it. Every tool output names the pid that ran it: all of a
listener's tools must have run in its starter's process, and each listener must have acted on
exactly the messages sent to it (no crossovers).
"""

from __future__ import annotations

import concurrent.futures
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, Iterator, List

import pytest
import requests

from conductor_agents.testing import ToolCall, listener_policy

from ..helpers import eventually, listener_runs, run_tasks_summary

pytestmark = pytest.mark.integration

SAMPLE = Path(__file__).resolve().parents[2] / "samples" / "django_app"
ROUNDS = 12  # bounded attempts to land requests on a given worker (the kernel picks the worker)


def report_on(payload: dict) -> "ToolCall | None":
    if isinstance(payload, dict) and payload.get("action") == "generate-report":
        return ToolCall("generate_report", {"topic": payload.get("topic", "weekly")})
    return None


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Site:
    """The sample under gunicorn; ``call`` sends one request and returns (status, body)."""

    def __init__(self, port: int, process: subprocess.Popen, log: Path) -> None:
        self.base = f"http://127.0.0.1:{port}"
        self.process = process
        self.log = log

    def call(self, method: str, path: str, body: Any = None) -> "tuple[int, Dict[str, Any]]":
        response = requests.request(method, self.base + path, json=body, timeout=90)
        return response.status_code, response.json()


@pytest.fixture(params=["preload", "no-preload"])
def site(request: pytest.FixtureRequest, agent_settings, scripted_llm, tmp_path: Path,
         xdg_runtime_dir: str) -> Iterator[Site]:
    pytest.importorskip("django", reason="pip install -e '.[test]' brings Django")
    pytest.importorskip("gunicorn", reason="pip install -e '.[test]' brings gunicorn")
    model = scripted_llm.script(policy=listener_policy(report_on))
    env = {**os.environ, "CONDUCTOR_SERVER_URL": agent_settings.server_url, "CONDUCTOR_AGENT_MODEL": model,
           "PYTHONUNBUFFERED": "1", "XDG_RUNTIME_DIR": xdg_runtime_dir}  # its own gunicorn.ctl
    port = free_port()
    command = [sys.executable, "-m", "gunicorn", "--workers", "2", "--bind", f"127.0.0.1:{port}",
               "--chdir", str(SAMPLE), "--timeout", "120", "--graceful-timeout", "40",
               "listeners_site.wsgi:application"]
    if request.param == "preload":
        command.append("--preload")
    log = tmp_path / "gunicorn.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT)
    site = Site(port, process, log)
    try:
        eventually(lambda: _answers(site), timeout=120, interval=0.5, message="gunicorn serving the sample")
        yield site
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)  # graceful: workers finish, exit, close their runtimes
        try:
            code = process.wait(timeout=90)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)
            raise AssertionError(f"gunicorn did not stop within 90 s:\n{log.read_text()}") from None
    text = log.read_text()
    assert code == 0, text
    assert "Traceback" not in text and "SIGKILL" not in text and "WORKER TIMEOUT" not in text, text


def _answers(site: Site) -> bool:
    if site.process.poll() is not None:
        raise AssertionError(f"gunicorn exited:\n{site.log.read_text()}")
    try:
        return site.call("GET", "/listeners")[0] == 200
    except requests.RequestException:
        return False


def concurrently(site: Site, calls: "List[tuple]") -> "List[tuple[int, Dict[str, Any]]]":
    """Send the requests at once, so a worker busy with one leaves the next to the other worker."""
    with concurrent.futures.ThreadPoolExecutor(len(calls)) as pool:
        return list(pool.map(lambda call: site.call(*call), calls))


def server_tool_calls(server_url: str, execution_id: str) -> int:
    """Completed report tasks over every run of the listener (a long one is continued as new runs)."""
    count = 0
    for run in listener_runs(server_url, execution_id):
        workflow = requests.get(f"{server_url}/workflow/{run}", params={"includeTasks": "true"}, timeout=10).json()
        count += sum(1 for t in workflow.get("tasks") or () if t.get("taskType") == "generate_report"
                     and t.get("status") == "COMPLETED")
    return count


def explain_listener(site: Site, server_url: str, execution_id: str) -> str:
    """What a timed-out wait for a listener's reports needs (two CI failures, 9 reports not reached): each run's
    report count and last tasks, the id the callers hold as the server has it, and the workers' warnings."""
    lines = [f"reports completed on the server: {server_tool_calls(server_url, execution_id)}"]
    lines += [run_tasks_summary(server_url, run, last=12) for run in listener_runs(server_url, execution_id)]
    if execution_id not in listener_runs(server_url, execution_id):
        lines.append(run_tasks_summary(server_url, execution_id, last=6))
    noted = [row for row in site.log.read_text(errors="replace").splitlines()
             if any(level in row for level in ("WARNING", "ERROR", "Traceback"))]
    return "\n".join([*lines, f"gunicorn's warnings ({len(noted)}, the last 40):", *noted[-40:]])


def test_listeners_in_two_gunicorn_workers_each_run_their_tools_in_their_own_process(
        site: Site, agent_settings) -> None:
    # Start listeners until two different worker processes have each started one.
    started: Dict[int, Dict[str, Any]] = {}
    extra: List[str] = []
    for _ in range(ROUNDS):
        for status, body in concurrently(site, [("POST", "/listeners", {}), ("POST", "/listeners", {})]):
            assert status == 201, body
            if body["pid"] in started:
                extra.append(body["execution_id"])
            else:
                started[body["pid"]] = body
        if len(started) == 2:
            break
    assert len(started) == 2, f"every start landed on one worker in {ROUNDS} rounds: {started}"
    (pid_a, a), (pid_b, b) = sorted(started.items())
    assert a["worker_id"] != b["worker_id"]
    for pid, body in started.items():
        assert f"-{pid}-" in body["worker_id"]  # the worker id is the worker's own, not the master's

    whoami = {body["pid"]: body for _, body in concurrently(site, [("GET", "/listeners")] * 4)}
    for pid, body in whoami.items():
        if "--preload" in site.process.args:
            assert body["runtime_built_in_pid"] == site.process.pid  # built in the master, then forked
        else:
            assert body["runtime_built_in_pid"] == pid

    # Message both listeners at once, round after round, until each got one through the other worker.
    sent: Dict[str, List[str]] = {a["execution_id"]: [], b["execution_id"]: []}
    starter = {a["execution_id"]: pid_a, b["execution_id"]: pid_b}
    crossed = set()
    for round_no in range(ROUNDS):
        calls = [("POST", f"/listeners/{eid}/messages",
                  {"action": "generate-report", "topic": f"{eid[:8]}-{round_no}"}) for eid in sent]
        for (_, path, body), (status, answer) in zip(calls, concurrently(site, calls)):
            execution_id = path.split("/")[2]
            assert status == 202, answer
            sent[execution_id].append(body["topic"])
            if answer["pid"] != starter[execution_id]:
                crossed.add(execution_id)
        if crossed == set(sent):
            break
    assert crossed == set(sent), f"no message reached {set(sent) - crossed} through the other worker"

    for execution_id, topics in sent.items():
        eventually(lambda: server_tool_calls(agent_settings.server_url, execution_id) == len(topics),
                   timeout=120, interval=0.5, message=f"{len(topics)} reports of {execution_id}",
                   explain=lambda: explain_listener(site, agent_settings.server_url, execution_id))

    # Read each from whichever worker gets the request: the tools' state is only in the starter.
    for execution_id, topics in sent.items():
        for status, body in concurrently(site, [("GET", f"/listeners/{execution_id}")] * 2):
            assert status == 200 and body["status"] == "RUNNING", body
            assert body["served_here"] == (body["pid"] == starter[execution_id])
            assert body["reports"] == (topics if body["served_here"] else None)

    # Stop each from whichever worker gets the request; the result shows where its tools ran.
    for execution_id, topics in sent.items():
        status, body = site.call("POST", f"/listeners/{execution_id}/stop")
        assert status == 200 and body["status"] == "COMPLETED", body
        # Its own messages, in order: all of them, or those of its last run when it was continued (a
        # listener's run grows with every message; the SDK continues it as a new one every few).
        called = [c["arguments"]["topic"] for c in body["tool_calls"]]
        assert called == (topics if body["runs"] == 1 else topics[len(topics) - len(called):]), body
        assert {c["output"]["pid"] for c in body["tool_calls"]} <= {starter[execution_id]}

    for execution_id in extra:
        status, body = site.call("POST", f"/listeners/{execution_id}/stop")
        assert status == 200 and body["status"] == "COMPLETED", body
        assert body["tool_calls"] == []
