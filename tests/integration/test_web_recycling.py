"""Issue 19's done-when, in the shape of the problem: samples/django_app under a real gunicorn with 3
workers, ``--preload`` and ``--max-requests 10``. Six listeners are started through a view and eight
messages each are sent through another view while the workers are recycled under them. Every message
is acted on within 90 s of being sent, none twice, and each listener is served by one process at a
time: the pids that ran its tools follow the owners of its leases, in order."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List

import pytest
import requests

from conductor_agents.testing import listener_policy

from ..helpers import eventually, lease_owner, listener_runs
from .test_django_sample import SAMPLE, Site, concurrently, free_port, report_on

pytestmark = pytest.mark.integration

LISTENERS = 6
MESSAGES = 8


def _reports(server_url: str, execution_id: str) -> "List[dict]":
    """Every completed report task of the listener, over all its runs: topic, pid, end time."""
    found = []
    for run in listener_runs(server_url, execution_id):
        flow = requests.get(f"{server_url}/workflow/{run}", params={"includeTasks": "true"}, timeout=10).json()
        for task in flow.get("tasks") or ():
            if task.get("taskType") == "generate_report" and task.get("status") == "COMPLETED":
                found.append({"topic": (task.get("inputData") or {}).get("topic"),
                              "pid": (task.get("outputData") or {}).get("pid"), "end": task.get("endTime")})
    return sorted(found, key=lambda r: r["end"])


def _lease_pids(server_url: str, domain: str) -> "List[int]":
    pids, epoch = [], 0
    while (owner := lease_owner(server_url, domain, epoch)) is not None:
        pids.append(int(owner.rsplit("-", 2)[1]) if owner else None)
        epoch += 1
    return pids


def _diagnose(base: str, started: "List[dict]", sent: "Dict[str, Dict[str, float]]", log: Path) -> str:
    lines, ids = [], set()
    for body in started:
        eid = body["execution_id"]
        done = {r["topic"] for r in _reports(base, eid)}
        missing = sorted(set(sent[eid]) - done)
        runs = listener_runs(base, eid)
        last = requests.get(f"{base}/workflow/{runs[-1]}", params={"includeTasks": "true"}, timeout=10).json()
        open_tasks = [(t.get("taskType"), t.get("status"), t.get("workerId"), t.get("domain"))
                      for t in last.get("tasks") or () if t.get("status") in ("SCHEDULED", "IN_PROGRESS")]
        lines.append(f"{eid}: missing {missing}; runs {len(runs)}, last {last.get('status')}; "
                     f"leases {_lease_pids(base, body['run_id'])}; open {open_tasks}")
        if missing:
            ids.update([eid, body["run_id"], *runs])
            mailbox = requests.get(f"{base}/workflow/{eid}", params={"includeTasks": "true"}, timeout=10).json()
            lines.append(f"  its mailbox {mailbox.get('status')}, tasks (last 6): " + "; ".join(
                f"{t.get('referenceTaskName')} {t.get('taskType')} {t.get('status')} domain={t.get('domain')} "
                f"worker={t.get('workerId')} in={json.dumps(t.get('inputData'))[:200]} "
                f"out={json.dumps(t.get('outputData'))[:300]}" for t in (mailbox.get("tasks") or ())[-6:]))
            for run in runs:
                flow = requests.get(f"{base}/workflow/{run}", params={"includeTasks": "true"}, timeout=10).json()
                pulls = [((t.get("outputData") or {}).get("messages") or []) for t in flow.get("tasks") or ()
                         if t.get("taskType") == "PULL_WORKFLOW_MESSAGES"]
                lines.append(f"  run {run} {flow.get('status')}: pulled "
                             f"{[[(m.get('payload') or {}).get('topic') for m in p] for p in pulls if p]}")
    told = [line for line in log.read_text(errors="replace").splitlines()
            if any(i and i in line for i in ids) or "WARNING" in line or "ERROR" in line]
    return "not every message was acted on:\n" + "\n".join(lines) + "\nthe site's log about them:\n" + "\n".join(
        told[-60:])


def _is_subsequence(short: list, long: list) -> bool:
    it = iter(long)
    return all(any(x == y for y in it) for x in short)


def test_listeners_survive_gunicorn_recycling_workers_under_them(agent_settings, scripted_llm, tmp_path: Path,
                                                                 xdg_runtime_dir: str) -> None:
    pytest.importorskip("django", reason="pip install -e '.[test]' brings Django")
    pytest.importorskip("gunicorn", reason="pip install -e '.[test]' brings gunicorn")
    base = agent_settings.server_url
    model = scripted_llm.script(policy=listener_policy(report_on))
    env = {**os.environ, "CONDUCTOR_SERVER_URL": base, "CONDUCTOR_AGENT_MODEL": model, "PYTHONUNBUFFERED": "1",
           "XDG_RUNTIME_DIR": xdg_runtime_dir, "CONDUCTOR_AGENT_LIVENESS_STALL_SECONDS": "6",
           "CONDUCTOR_AGENT_LIVENESS_CHECK_INTERVAL_SECONDS": "1", "LISTENERS_SITE_SDK_LOG_LEVEL": "INFO",
           # Every run kept: the reports are counted in the listener's runs (retention would remove the first).
           "CONDUCTOR_AGENT_KEEP_RUNS": "all"}
    port = free_port()
    command = [sys.executable, "-m", "gunicorn", "--workers", "3", "--preload", "--max-requests", "10",
               "--bind", f"127.0.0.1:{port}", "--chdir", str(SAMPLE), "--timeout", "120",
               "--graceful-timeout", "40", "listeners_site.wsgi:application"]
    log = tmp_path / "gunicorn.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT)
    site = Site(port, process, log)
    try:
        def up() -> bool:
            if process.poll() is not None:
                raise AssertionError(f"gunicorn exited:\n{log.read_text()}")
            try:
                return site.call("GET", "/listeners")[0] == 200
            except requests.RequestException:
                return False

        eventually(up, timeout=120, interval=0.5, message="gunicorn serving the sample")
        started = []
        for _ in range(LISTENERS):
            status, body = site.call("POST", "/listeners", {})
            assert status == 201, body
            started.append(body)
        sent: Dict[str, Dict[str, float]] = {b["execution_id"]: {} for b in started}
        handled_by = set()
        for round_no in range(MESSAGES):
            calls = [("POST", f"/listeners/{eid}/messages", {"action": "generate-report", "topic": f"{eid[:8]}-{round_no}"})
                     for eid in sent]
            for (_, path, body), (status, answer) in zip(calls, concurrently(site, calls)):
                assert status == 202, answer
                sent[path.split("/")[2]][body["topic"]] = time.time()
                handled_by.add(answer["pid"])
            time.sleep(1.0)
        assert len(handled_by) > 3, handled_by  # workers were recycled while messages went out

        def all_acted() -> bool:
            return all(len(_reports(base, eid)) >= MESSAGES for eid in sent)

        try:
            eventually(all_acted, timeout=150, interval=1.0, message="every message acted on")
        except AssertionError:
            raise AssertionError(_diagnose(base, started, sent, log)) from None
        adoptions = 0
        for body in started:
            eid = body["execution_id"]
            reports = _reports(base, eid)
            topics = [r["topic"] for r in reports]
            assert sorted(topics) == sorted(sent[eid]), (eid, topics)  # all of them, none twice
            for report in reports:
                assert report["end"] / 1000.0 - sent[eid][report["topic"]] < 90, report
            owners = _lease_pids(base, body["run_id"])
            adoptions += len(owners) - 1
            pids = [r["pid"] for r in reports]
            collapsed = [p for i, p in enumerate(pids) if i == 0 or pids[i - 1] != p]
            assert _is_subsequence(collapsed, owners), (eid, collapsed, owners)
        assert adoptions > 0  # some listener did change hands
        for eid in sent:
            status, body = site.call("POST", f"/listeners/{eid}/stop")
            assert status in (200, 202), body
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=90)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)
            raise AssertionError(f"gunicorn did not stop within 90 s:\n{log.read_text()}") from None
    text = log.read_text()
    assert "Traceback" not in text and "WORKER TIMEOUT" not in text, text
