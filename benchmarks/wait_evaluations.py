"""How often the server evaluates the listeners' waits for a message (``PULL_WORKFLOW_MESSAGES``).

    .venv/bin/python benchmarks/wait_evaluations.py http://127.0.0.1:8080/api AGENT_NAME [SECONDS]

The server re-evaluates a waiting run's message check every second (``getEvaluationOffset``) when it
keeps up; each evaluation adds one to the task's ``pollCount``. This reads the waiting task of up to
10 running runs of ``AGENT_NAME`` twice, ``SECONDS`` (15) apart, and prints each one's evaluations per
second: 1.0 is the server's cadence, less is a server that has fallen behind (a message then waits
for the next evaluation).
"""

from __future__ import annotations

import sys
import time
from typing import Dict, List

import requests


def waiting_poll_counts(url: str, ids: List[str]) -> Dict[str, int]:
    out = {}
    for eid in ids:
        tasks = requests.get(f"{url}/workflow/{eid}", params={"includeTasks": "true"}, timeout=30).json().get("tasks", [])
        for t in tasks:
            if t.get("taskType") == "PULL_WORKFLOW_MESSAGES" and t.get("status") == "IN_PROGRESS":
                out[eid] = int(t.get("pollCount") or 0)
    return out


def main(argv: "list[str]") -> int:
    url, agent = argv[0].rstrip("/"), argv[1]
    seconds = float(argv[2]) if len(argv) > 2 else 15.0
    ids = requests.get(f"{url}/workflow/running/{agent}", timeout=30).json()[:10]
    before, began = waiting_poll_counts(url, ids), time.monotonic()
    time.sleep(seconds)
    after, took = waiting_poll_counts(url, ids), time.monotonic() - began
    rates = sorted(round((after[k] - before[k]) / took, 2) for k in before if k in after)
    print(f"{len(rates)} waiting runs of {agent}; evaluations per second of each: {rates}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
