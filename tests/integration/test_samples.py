"""Every sample runs headless, and prints or returns what its docstring promises.

``samples/listener.py`` runs exactly as ``make demo`` runs it (its own LocalStack: ~15 s).
The others run in their ``--remote`` mode (or, for the notebook, with CONDUCTOR_SERVER_URL
set) against the session's server, with a model scripted by the session's ScriptedLLM, so
they start no server of their own.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, Iterator

import pytest

from conductor_agents.testing import ToolCall, listener_policy

from ..helpers import eventually

pytestmark = pytest.mark.integration

REPO_ROOT = Path(__file__).resolve().parents[2]
SAMPLES = REPO_ROOT / "samples"


def report_on(payload: dict) -> "ToolCall | None":
    """The samples' scripted model: {action: generate-report, topic} -> generate_report(topic), and
    {action: publish-report, topic} -> publish_report(topic) (a tool that needs approval)."""
    if isinstance(payload, dict) and payload.get("action") == "generate-report":
        return ToolCall("generate_report", {"topic": payload.get("topic", "weekly")})
    if isinstance(payload, dict) and payload.get("action") == "publish-report":
        return ToolCall("publish_report", {"topic": payload.get("topic", "weekly")})
    return None


@pytest.fixture
def remote_env(agent_settings, scripted_llm) -> Dict[str, str]:
    """The environment of a sample's --remote mode: the session's server, a scripted model."""
    model = scripted_llm.script(policy=listener_policy(report_on))
    return {**os.environ, "CONDUCTOR_SERVER_URL": agent_settings.server_url, "CONDUCTOR_AGENT_MODEL": model,
            "PYTHONUNBUFFERED": "1"}


def run_sample(args: "list[str]", env: Dict[str, str], timeout: float = 120,
               **kwargs: object) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout, **kwargs)


def test_make_demo_runs_the_listener_sample_offline() -> None:
    """What `make demo` runs, as it runs it: its own local server and scripted model."""
    env = {k: v for k, v in os.environ.items() if k != "CONDUCTOR_SERVER_URL"}
    result = run_sample(["samples/listener.py"], env, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "[tool] generate_report(topic='weekly') -> /reports/weekly-1.pdf" in result.stdout
    assert "run ended COMPLETED" in result.stdout
    assert "reports generated in this process: ['/reports/weekly-1.pdf']" in result.stdout
    # Nothing a newcomer need worry about: no download promised for a cached jar, no warning (issue 34, point 12)
    assert "download" not in result.stdout.lower() and "warning" not in (result.stdout + result.stderr).lower()
    assert "delivered: run " in result.stdout and "pulled by" not in result.stdout
    # One id for the listener, the one to hold (issue 41, point 4: it printed its mailbox's, its run id and a run's).
    held = re.search(r"started listener: execution (\S+)", result.stdout).group(1)
    assert set(re.findall(r"[0-9a-f]{8}-[0-9a-f-]{27}|[0-9a-f]{32}", result.stdout)) == {held}


def test_stateful_resume_sample_continues_the_run_after_the_child_is_killed(remote_env: Dict[str, str]) -> None:
    result = run_sample(["samples/stateful_resume.py", "--remote"], remote_env)
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    child_pid = out.split("child ", 1)[1].split()[0]
    assert f"[tool in pid {child_pid}] generate_report(topic='before-crash')" in out
    assert "(SIGKILL)" in out
    assert "generate_report(topic='after-resume')" in out and f"pid {child_pid}] generate_report(topic='after" not in out
    assert "run ended COMPLETED; reports made in this process: ['after-resume']" in out


def test_webhook_sender_sample_reaches_the_listener_by_plain_http_across_continuations(
        remote_env: Dict[str, str]) -> None:
    result = run_sample(["samples/webhook_sender.py", "--remote"], remote_env, timeout=240)
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert out.count(": HTTP 200;") == 8 and "a push now: HTTP 409" in out, out
    runs = int(out.split(" after ", 1)[1].split(" runs", 1)[0])
    assert runs >= 3, out  # continued, and every push still reached it


def test_steering_sample_sets_and_clears_a_signal_and_starts_with_model_settings(
        remote_env: Dict[str, str]) -> None:
    result = run_sample(["samples/steering.py", "--remote"], remote_env, timeout=240)
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert "signal set:" in out and "signal cleared" in out and "a signal now is refused: True" in out, out
    assert "reports: ['sales', 'costs', 'hiring', 'outlook']" in out, out


def test_chat_repl_sample_works_with_piped_input(scripted_llm, agent_settings) -> None:
    model = scripted_llm.script(policy=listener_policy(
        lambda payload: ToolCall("reply", {"text": f"you said: {payload['message']}"})))
    env = {**os.environ, "CONDUCTOR_SERVER_URL": agent_settings.server_url, "CONDUCTOR_AGENT_MODEL": model}
    result = run_sample(["samples/chat_repl.py", "--remote"], env, input="hello\n\nhow are you?\n/quit\nignored\n")
    assert result.returncode == 0, result.stdout + result.stderr
    lines = [line for line in result.stdout.splitlines() if line.startswith(("you>", "agent>"))]
    assert lines == ["you> hello", "agent> you said: hello", "you> how are you?", "agent> you said: how are you?"]
    assert "chat ended: COMPLETED" in result.stdout


@pytest.fixture
def flask_sample(remote_env: Dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Iterator[object]:
    """samples/flask_app.py imported with the session's server and a scripted model in its environment."""
    pytest.importorskip("flask", reason="pip install -e '.[test]' brings Flask")
    for key in ("CONDUCTOR_SERVER_URL", "CONDUCTOR_AGENT_MODEL"):
        monkeypatch.setenv(key, remote_env[key])
    spec = importlib.util.spec_from_file_location("flask_app_sample", SAMPLES / "flask_app.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    try:
        yield module
    finally:
        if module._runtime is not None:
            module._runtime.close()


def test_flask_sample_starts_messages_reads_and_stops_a_listener(flask_sample) -> None:
    client = flask_sample.app.test_client()
    started = client.post("/listeners", json={})
    assert started.status_code == 201, started.get_json()
    execution_id = started.get_json()["execution_id"]

    sent = client.post(f"/listeners/{execution_id}/messages", json={"action": "generate-report", "topic": "sales"})
    assert sent.status_code == 202 and sent.get_json()["message_id"]
    state = eventually(lambda: (lambda body: body if body["reports"] else None)(
        client.get(f"/listeners/{execution_id}").get_json()), timeout=30, message="the report")
    assert state == {"execution_id": execution_id, "status": "RUNNING", "waiting": state["waiting"],
                     "reports": ["sales"], "published": [], "stalled": None}

    assert client.post(f"/listeners/{execution_id}/messages", data="not json").status_code == 400
    assert client.get("/listeners/nope").status_code == 404

    stopped = client.post(f"/listeners/{execution_id}/stop")
    assert stopped.status_code == 200
    body = stopped.get_json()
    assert body["status"] == "COMPLETED" and body["reports"] == ["sales"]
    assert "generate_report" in body["tool_calls"]
    after = client.get(f"/listeners/{execution_id}").get_json()  # the server's status; the tools' state forgotten
    assert after["status"] == "COMPLETED" and after["reports"] == []


def _load_flask_sample(module_name: str) -> object:
    spec = importlib.util.spec_from_file_location(module_name, SAMPLES / "flask_app.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_flask_sample_listener_is_adopted_by_another_process_when_the_first_closes(
        remote_env: Dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    """Two copies of the app (two runtimes: two processes, as two gunicorn workers would be) serve the
    agent. A listener started through A is served by A; A closes (a recycled worker); B adopts it within
    seconds (``on_adopt``), and a message sent through B is acted on by B's tools."""
    pytest.importorskip("flask", reason="pip install -e '.[test]' brings Flask")
    for key in ("CONDUCTOR_SERVER_URL", "CONDUCTOR_AGENT_MODEL"):
        monkeypatch.setenv(key, remote_env[key])
    monkeypatch.setenv("CONDUCTOR_AGENT_LIVENESS_STALL_SECONDS", "6")  # serving rounds every 0.75 s
    a, b = _load_flask_sample("flask_app_a"), _load_flask_sample("flask_app_b")
    try:
        client_a, client_b = a.app.test_client(), b.app.test_client()
        b.runtime()  # B serves the agent before A starts anything
        execution_id = client_a.post("/listeners", json={}).get_json()["execution_id"]
        client_b.post(f"/listeners/{execution_id}/messages", json={"action": "generate-report", "topic": "one"})
        eventually(lambda: client_a.get(f"/listeners/{execution_id}").get_json()["reports"] == ["one"], timeout=30,
                   message="A's tools acted")
        assert client_b.get(f"/listeners/{execution_id}").get_json()["reports"] == []  # B does not serve it

        closed_at = time.monotonic()
        a._runtime.close()
        run_id = eventually(lambda: next((rid for rid, h in list(b.served.items())
                                          if h.execution_id == execution_id), None),
                            timeout=30, interval=0.1, message="B adopted the listener")
        assert time.monotonic() - closed_at < 10.0
        client_b.post(f"/listeners/{execution_id}/messages", json={"action": "generate-report", "topic": "two"})
        eventually(lambda: client_b.get(f"/listeners/{execution_id}").get_json()["reports"] == ["two"], timeout=30,
                   message="B's tools acted on the next message")
        assert b.TOOLS.state_of(run_id) == (["two"], [])
        stopped = client_b.post(f"/listeners/{execution_id}/stop").get_json()
        assert stopped["status"] == "COMPLETED" and stopped["reports"] == ["two"]
    finally:
        for module in (a, b):
            if module._runtime is not None:
                module._runtime.close()


def test_notebook_sample_runs_cell_by_cell(remote_env: Dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    nbformat = pytest.importorskip("nbformat", reason="pip install -e '.[test]' brings nbformat")
    nbclient = pytest.importorskip("nbclient", reason="pip install -e '.[test]' brings nbclient")
    for key in ("CONDUCTOR_SERVER_URL", "CONDUCTOR_AGENT_MODEL"):
        monkeypatch.setenv(key, remote_env[key])  # the kernel inherits this process's environment
    notebook = nbformat.read(SAMPLES / "listener.ipynb", as_version=4)
    first = next(cell for cell in notebook.cells if cell.cell_type == "code")
    assert "USE_MY_SERVER = False" in first.source  # a CONDUCTOR_SERVER_URL left in the environment is not followed
    first.source = first.source.replace("USE_MY_SERVER = False", "USE_MY_SERVER = True")  # the session's server
    client = nbclient.NotebookClient(notebook, timeout=120, kernel_name="python3",
                                     resources={"metadata": {"path": str(SAMPLES)}})
    client.execute()

    code = [cell for cell in notebook.cells if cell.cell_type == "code"]
    said = "".join(o.get("text", "") for o in code[0].outputs if o["output_type"] == "stream")
    assert said == f"server {remote_env['CONDUCTOR_SERVER_URL']} (yours), model {remote_env['CONDUCTOR_AGENT_MODEL']}\n"
    started = code[0].outputs[-1]["data"]
    assert "AgentHandle(execution_id=" in started["text/plain"] and "workers=local" in started["text/plain"]
    assert "<b>notebook_listener</b>" in started["text/html"]
    assert code[1].outputs[-1]["data"]["text/plain"] == "['sales']"
    approval = "".join(o.get("text", "") for o in code[2].outputs if o["output_type"] == "stream")
    assert approval == "approval publish_report {'topic': 'sales'}\n"  # the cell saw the pending call...
    assert code[2].outputs[-1]["data"]["text/plain"] == "['sales']"  # ...approved it, and the tool ran here
    printed = "".join(o.get("text", "") for o in code[3].outputs if o["output_type"] == "stream")
    assert printed.startswith("COMPLETED") and "generate_report" in printed and "publish_report" in printed
    assert "status=COMPLETED" in code[3].outputs[-1]["data"]["text/plain"]


@pytest.mark.both_topologies
def test_cluster_sample_runs_unchanged_on_either_topology(remote_env: Dict[str, str]) -> None:
    """samples/cluster.py --remote against the session's server: one SQLite node or the cluster's balancer."""
    result = run_sample(["samples/cluster.py", "--remote"], remote_env, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "run ended COMPLETED; reports made in this process: ['/reports/before.pdf', '/reports/after.pdf']" \
        in result.stdout


def test_starlette_sample_is_the_async_twin_of_the_flask_one(agent_settings, scripted_llm,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """samples/starlette_app.py through Starlette's TestClient (its lifespan makes and closes the async
    runtime): start, a message acted on, a publication approved from the approval queue, stop."""
    from starlette.testclient import TestClient

    sample = _import_sample("starlette_app_sample", "starlette_app.py")
    monkeypatch.setenv("CONDUCTOR_SERVER_URL", agent_settings.server_url)
    monkeypatch.setenv("CONDUCTOR_AGENT_MODEL", scripted_llm.script(policy=listener_policy(sample.scripted_action)))
    with TestClient(sample.app) as client:
        started = client.post("/listeners")
        assert started.status_code == 201, started.text
        execution_id = started.json()["execution_id"]
        sent = client.post(f"/listeners/{execution_id}/messages", json={"action": "generate-report", "topic": "q3"})
        assert sent.status_code == 202 and sent.json()["message_id"]
        eventually(lambda: client.get(f"/listeners/{execution_id}").json()["reports"] == ["q3"], timeout=60,
                   message="the report")
        assert client.post(f"/listeners/{execution_id}/messages", content=b"not json").status_code == 400
        assert client.get("/listeners/nope").status_code == 404

        client.post(f"/listeners/{execution_id}/messages", json={"action": "publish-report", "topic": "q3"})
        queue = eventually(lambda: client.get("/approvals").json()["approvals"], timeout=60, message="the approval")
        assert [r["executionId"] for r in queue] == [execution_id]
        assert client.post(f"/approvals/{execution_id}/reject", json={}).status_code == 400  # a reason is needed
        approved = client.post(f"/approvals/{execution_id}/approve", json={"by": "tester"})
        assert approved.status_code == 200, approved.text

        stopped = client.post(f"/listeners/{execution_id}/stop")
        assert stopped.status_code == 200, stopped.text
        body = stopped.json()
        assert body["status"] == "COMPLETED" and body["reports"] == ["q3"]
        assert {"generate_report", "publish_report"} <= set(body["tool_calls"])


def _import_sample(module_name: str, file_name: str) -> object:
    spec = importlib.util.spec_from_file_location(module_name, SAMPLES / file_name)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_notebooks_first_cell_uses_its_own_server_and_keeps_it_when_run_again(
        agent_settings, scripted_llm, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    """With a CONDUCTOR_SERVER_URL left in the environment, the first cell still starts a local server (and says
    which it uses); run again, it keeps that server and closes its first runtime (issue 34, point 12: it followed
    the variable silently, and a second run started a second server). Run here, not in a kernel, with a
    LocalStack that stands in for a new server by lending the session's (so no JVM starts)."""
    import json

    import conductor_agents.testing as testing

    starts = []

    class SessionStack:
        def __init__(self) -> None:
            self.llm, self.settings, self.server = scripted_llm, agent_settings, self

        is_running = True

        def start(self) -> "SessionStack":
            starts.append(self)
            return self

        def stop(self) -> None:
            pass

    monkeypatch.setattr(testing, "LocalStack", SessionStack)
    monkeypatch.setenv("CONDUCTOR_SERVER_URL", "http://127.0.0.1:9/api")  # left over: never to be used
    cell = "".join(json.loads((SAMPLES / "listener.ipynb").read_text())["cells"][1]["source"])
    scope: Dict[str, object] = {}
    try:
        exec(compile(cell, "listener.ipynb", "exec"), scope)  # noqa: S102 - the notebook's own cell
        first, first_run = scope["runtime"], scope["handle"]
        exec(compile(cell, "listener.ipynb", "exec"), scope)  # noqa: S102
        scope["runtime"].attach(first_run.execution_id).cancel("the test is done with it")
        assert len(starts) == 1 and scope["stack"] is starts[0]
        assert first is not scope["runtime"] and "closed" in repr(first)
        said = capsys.readouterr().out.splitlines()
        assert said[-1].startswith(f"server {agent_settings.server_url} (local, started by this notebook), model ")
        assert scope["handle"].status().status.value == "RUNNING"
    finally:
        if "handle" in scope:
            scope["handle"].cancel("the test is done with it")
        if "runtime" in scope:
            scope["runtime"].close()


def test_traces_console_sample_prints_one_trace_across_a_continued_listener(remote_env: Dict[str, str]) -> None:
    """The console exporter prints the caller's span, both runs' spans, tool and chat spans, all in one trace,
    and the two GenAI metrics."""
    result = run_sample(["samples/traces_console.py", "--remote"], remote_env)
    assert result.returncode == 0, result.stdout + result.stderr
    spans = [line.split() for line in result.stdout.splitlines() if line.startswith("trace ")]
    names = [" ".join(fields[6:8]) for fields in spans]
    assert {fields[1] for fields in spans} == {spans[0][1]}, result.stdout  # one trace id
    assert names.count("invoke_agent traced_listener") >= 2 and "execute_tool generate_report" in names
    assert any(name.startswith("chat ") for name in names) and "handle webhook" in " ".join(names)
    assert "metric gen_ai.client.token.usage" in result.stdout
    assert "metric gen_ai.client.operation.duration" in result.stdout
