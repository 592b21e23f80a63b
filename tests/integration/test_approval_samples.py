"""The samples' approval queues: samples/flask_app.py (its test client) and samples/django_app (under
gunicorn with two workers), on the session's server with a scripted model.

A listener asked to publish a report waits for a person; the queue page lists the call, an
approval through the page runs the tool in the process that serves the listener, and a
rejection through the page leaves the listener listening.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Dict, Iterator

import pytest
import requests

from conductor_agents.testing import listener_policy

from ..helpers import eventually
from .test_django_sample import SAMPLE as DJANGO_SAMPLE
from .test_django_sample import Site, free_port
from .test_samples import SAMPLES, report_on

pytestmark = pytest.mark.integration


@pytest.fixture
def flask_app(agent_settings, scripted_llm, monkeypatch: pytest.MonkeyPatch) -> Iterator[object]:
    """samples/flask_app.py imported with the session's server and a model that publishes on request."""
    monkeypatch.setenv("CONDUCTOR_SERVER_URL", agent_settings.server_url)
    monkeypatch.setenv("CONDUCTOR_AGENT_MODEL", scripted_llm.script(policy=listener_policy(report_on)))
    spec = importlib.util.spec_from_file_location("flask_app_approvals", SAMPLES / "flask_app.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    try:
        yield module
    finally:
        if module._runtime is not None:
            module._runtime.close()


def queue_of(client, execution_id: str) -> list:
    body = client.get("/approvals", headers={"Accept": "application/json"}).get_json()
    return [a for a in body["approvals"] if a["executionId"] == execution_id]


def test_flask_approval_page_approves_and_rejects_a_listeners_publication(flask_app) -> None:
    # One topology: the sample's verbs are proved on the cluster by tests/integration/test_approvals.py.
    client = flask_app.app.test_client()
    execution_id = client.post("/listeners", json={}).get_json()["execution_id"]
    client.post(f"/listeners/{execution_id}/messages", json={"action": "publish-report", "topic": "sales"})
    [waiting] = eventually(lambda: queue_of(client, execution_id), timeout=60, interval=0.25,
                           message="the publication in the approval queue")
    assert waiting["toolCalls"] == [{"name": "publish_report", "arguments": {"topic": "sales"}}]
    page = client.get("/approvals").get_data(as_text=True)
    assert "publish_report" in page and f'action="/approvals/{execution_id}/approve"' in page

    approved = client.post(f"/approvals/{execution_id}/approve",
                           data={"request": waiting["taskReferenceName"], "by": "editor"})
    assert approved.status_code == 303
    eventually(lambda: client.get(f"/listeners/{execution_id}").get_json()["published"] == ["sales"], timeout=60,
               message="the approved publication ran in this process")
    assert queue_of(client, execution_id) == []
    again = client.post(f"/approvals/{execution_id}/approve", json={"request": waiting["taskReferenceName"]})
    assert again.status_code == 409 and again.get_json()["winner"]["answeredBy"] == "editor"

    client.post(f"/listeners/{execution_id}/messages", json={"action": "publish-report", "topic": "leaks"})
    [second] = eventually(lambda: queue_of(client, execution_id), timeout=60, interval=0.25,
                          message="the second publication in the queue")
    assert client.post(f"/approvals/{execution_id}/reject", json={}).status_code == 400  # a reason is required
    rejected = client.post(f"/approvals/{execution_id}/reject", json={"reason": "confidential"})
    assert rejected.status_code == 200 and rejected.get_json()["approved"] is False
    client.post(f"/listeners/{execution_id}/messages", json={"action": "generate-report", "topic": "after"})
    eventually(lambda: client.get(f"/listeners/{execution_id}").get_json()["reports"] == ["after"], timeout=60,
               message="the listener went on after the rejection")
    assert client.get(f"/listeners/{execution_id}").get_json()["published"] == ["sales"]
    for _ in range(3):  # 202 STOPPING: the sample's stop waits 30 s at most, then says to ask again
        answer = client.post(f"/listeners/{execution_id}/stop")
        if answer.status_code != 202:
            break
    assert answer.status_code == 200 and answer.get_json()["status"] == "COMPLETED", answer.get_json()


@pytest.fixture
def django_site(agent_settings, scripted_llm, tmp_path: Path, xdg_runtime_dir: str) -> Iterator[Site]:
    """samples/django_app under gunicorn --workers 2 --preload."""
    env: Dict[str, str] = {**os.environ, "CONDUCTOR_SERVER_URL": agent_settings.server_url,
                           "CONDUCTOR_AGENT_MODEL": scripted_llm.script(policy=listener_policy(report_on)),
                           "PYTHONUNBUFFERED": "1", "XDG_RUNTIME_DIR": xdg_runtime_dir}  # its own gunicorn.ctl
    port = free_port()
    command = [sys.executable, "-m", "gunicorn", "--workers", "2", "--bind", f"127.0.0.1:{port}", "--chdir",
               str(DJANGO_SAMPLE), "--timeout", "120", "--graceful-timeout", "40", "--preload",
               "listeners_site.wsgi:application"]
    log = tmp_path / "gunicorn.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT)
    site = Site(port, process, log)

    def serving() -> bool:
        assert process.poll() is None, log.read_text()
        try:
            return site.call("GET", "/listeners")[0] == 200
        except requests.RequestException:
            return False

    try:
        eventually(serving, timeout=120, interval=0.5, message="gunicorn serving the sample")
        yield site
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
        try:
            code = process.wait(timeout=90)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)
            raise AssertionError(f"gunicorn did not stop within 90 s:\n{log.read_text()}") from None
    text = log.read_text()
    assert code == 0 and "Traceback" not in text, text


def test_django_approval_queue_lists_every_workers_listeners_and_answers_from_any_worker(django_site: Site) -> None:
    status, started = django_site.call("POST", "/listeners", {})
    assert status == 201
    execution_id, starter = started["execution_id"], started["pid"]
    django_site.call("POST", f"/listeners/{execution_id}/messages", {"action": "publish-report", "topic": "q3"})

    seen_by = set()

    def listed() -> list:
        response = requests.get(django_site.base + "/approvals", headers={"Accept": "application/json"}, timeout=90)
        body = response.json()
        found = [a for a in body["approvals"] if a["executionId"] == execution_id]
        if found:
            seen_by.add(body["pid"])
        return found if len(seen_by) == 2 else []  # both workers list it: it is asked of the server

    [waiting] = eventually(listed, timeout=90, interval=0.2, message="the publication listed by both workers")
    page = requests.get(django_site.base + "/approvals", timeout=90).text
    assert "publish_report" in page and execution_id in page
    status, answer = django_site.call("POST", f"/approvals/{execution_id}/approve",
                                      {"request": waiting["taskReferenceName"], "by": "editor"})
    assert status == 200 and answer["approved"] is True, answer
    status, stopped = 0, {}
    eventually(lambda: _published(django_site, execution_id, starter), timeout=90, interval=0.5,
               message="the publication ran in the starter's process")
    status, stopped = django_site.call("POST", f"/listeners/{execution_id}/stop")
    assert status == 200 and stopped["status"] == "COMPLETED", stopped
    [published] = [c for c in stopped["tool_calls"] if c["name"] == "publish_report"]
    assert published["output"]["pid"] == starter  # approved through any worker, ran where the listener lives


def _published(site: Site, execution_id: str, starter: int) -> bool:
    for _ in range(4):  # a read lands on either worker; only the starter holds the tools' state
        status, body = site.call("GET", f"/listeners/{execution_id}")
        if status == 200 and body["pid"] == starter:
            return body["published"] == ["q3"]
    return False
