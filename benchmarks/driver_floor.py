"""Drives the benchmark's listener with nothing but the server's own REST calls: the floor.

Run by ``benchmarks/server_share.py`` with the project's interpreter, importing only ``requests``
(not conductor_agents). The agent is the one the SDK drivers start (a wait-for-message tool and
one worker tool), started with ``POST /agent/start`` without a run domain; one thread long-polls
the tool's task type in batches (``timeout=1000`` ms) and completes each task with
``POST /tasks``; a message is ``POST /workflow/{id}/messages``, as the SDKs push it. That is
the least a client can ask of the server for this agent: no status reads, no liveness samples, no
domain per run (a stateful run's domain needs a poll per domain, which is the SDKs' business).
"""

from __future__ import annotations

import os
import sys
import threading

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import requests  # noqa: E402

import _scenarios  # noqa: E402

TOOL = "bench_act_floor"

CONFIG = {
    "name": "bench_listen_floor",
    "instructions": "Loop: wait_for_message, act on it, repeat until told to stop.",
    "tools": [
        {"name": "wait_for_message", "description": "Wait for the next external messages, then return them.",
         "inputSchema": {"type": "object", "properties": {}}, "toolType": "pull_workflow_messages",
         "stateful": False, "config": {"batchSize": 1}},
        {"name": TOOL, "description": "Benchmark tool: acts on a message.",
         "inputSchema": {"type": "object", "properties": {"key": {"type": "string", "default": ""}},
                         "required": [], "additionalProperties": False},
         "toolType": "worker", "stateful": False, "config": {}},
    ],
    "maxTurns": 10_000,
}


class FloorAdapter:
    def __init__(self, cfg: dict) -> None:
        self.url = cfg["server_url"].rstrip("/")
        self.http = requests.Session()
        self._stop = threading.Event()
        self._worker = threading.Thread(target=self._work, name="floor-worker", daemon=True)
        self._worker.start()

    def _work(self) -> None:
        with requests.Session() as http:
            while not self._stop.is_set():
                try:
                    r = http.get(f"{self.url}/tasks/poll/batch/{TOOL}", timeout=30,
                                 params={"workerid": "floor", "count": 10, "timeout": 1000})
                    tasks = r.json() if r.status_code == 200 and r.content else []
                except (requests.RequestException, ValueError):
                    self._stop.wait(0.5)
                    continue
                for task in tasks:
                    key = str((task.get("inputData") or {}).get("key", ""))
                    _scenarios.record_entry(key)
                    http.post(f"{self.url}/tasks", timeout=30, json={
                        "taskId": task["taskId"], "workflowInstanceId": task["workflowInstanceId"],
                        "workerId": "floor", "status": "COMPLETED", "outputData": {"ok": key}})

    def start_listener(self, model: str) -> str:
        r = self.http.post(f"{self.url}/agent/start", timeout=60,
                           json={"agentConfig": {**CONFIG, "model": model}, "prompt": "Start listening."})
        r.raise_for_status()
        return str(r.json()["executionId"])

    def send(self, execution_id: str, payload: dict) -> None:
        self.http.post(f"{self.url}/workflow/{execution_id}/messages", json=payload, timeout=60).raise_for_status()

    def close(self) -> None:
        self._stop.set()
        self._worker.join(5)
        self.http.close()


if __name__ == "__main__":
    raise SystemExit(_scenarios.main(FloorAdapter))
