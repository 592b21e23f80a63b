"""Whether a task update racing the server's own evaluation of a wait for messages can lose the message (issue 42).

    PYTHONPATH=. .venv/bin/python benchmarks/update_race.py --runs 40

Evidence for a constraint of the design in ``docs/idle-listeners.md``: the only REST levers over a system task's
next evaluation (a task result ``IN_PROGRESS`` with ``callbackAfterSeconds``: park or nudge; ``extendLease``) write
the whole task back. ``updateTask`` loads the task, then writes status, output and callback; an evaluation that
completed the task in between (it popped the message and wrote ``COMPLETED`` with it) is overwritten: the task is
``IN_PROGRESS`` again with an empty output, and the message, already taken off the queue, is gone.

Per run: a two-task workflow ``[PULL_WORKFLOW_MESSAGES, SIMPLE]`` waiting, two threads posting ``IN_PROGRESS``
results on its wait as fast as they can for 2 s while one message is pushed, then up to 20 s for the server's own
evaluations (every second) to take a message still queued; a run whose wait has not taken it by then lost it (it is
``IN_PROGRESS`` with an empty output; where the run's next task was scheduled, the wait had completed and was put
back). Four runs at a time on one
``LocalServer``. An exaggeration on purpose (a parker or a sender updates a wait once, not hundreds of times): it
shows that the window exists, not how often a single update falls into it.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import sys
import threading
import time

import requests

from conductor_agents.local_server import LocalServer


def one(url: str, i: int) -> dict:
    http = requests.Session()
    eid = http.post(f"{url}/workflow", json={"name": "race_pull", "version": 1, "input": {}},
                    timeout=30).text.strip().strip('"')
    wait: dict = {}
    for _ in range(300):
        tasks = http.get(f"{url}/workflow/{eid}", params={"includeTasks": "true"}, timeout=30).json()["tasks"]
        if tasks and tasks[0]["status"] == "IN_PROGRESS":
            wait = tasks[0]
            break
        time.sleep(0.1)
    stop = threading.Event()

    def hammer() -> None:
        s = requests.Session()
        while not stop.is_set():
            s.post(f"{url}/tasks", json={"workflowInstanceId": eid, "taskId": wait["taskId"], "status": "IN_PROGRESS",
                                         "callbackAfterSeconds": 0, "workerId": "race", "outputData": {}}, timeout=30)

    threads = [threading.Thread(target=hammer) for _ in range(2)]
    for t in threads:
        t.start()
    http.post(f"{url}/workflow/{eid}/messages", json={"i": i}, timeout=30).raise_for_status()
    time.sleep(2.0)
    stop.set()
    for t in threads:
        t.join()
    deadline = time.monotonic() + 20.0  # the server's own evaluations (every second) take a message still queued
    while True:
        tasks = http.get(f"{url}/workflow/{eid}", params={"includeTasks": "true"}, timeout=30).json()["tasks"]
        got = bool((tasks[0].get("outputData") or {}).get("messages"))
        if got or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    http.delete(f"{url}/workflow/{eid}", params={"reason": "update_race done"}, timeout=30)
    return {"run": eid, "wait_status": tasks[0]["status"], "message_taken": got,
            "next_task_scheduled": any(t["referenceTaskName"] == "after" for t in tasks)}


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=40)
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    server = LocalServer(progress=False)
    server.start()
    try:
        url = server.url.rstrip("/")
        requests.post(f"{url}/metadata/taskdefs", json=[{
            "name": "race_after", "ownerEmail": "bench@example.com", "retryCount": 0, "timeoutSeconds": 0,
            "responseTimeoutSeconds": 3600}], timeout=30).raise_for_status()
        requests.post(f"{url}/metadata/workflow", json={
            "name": "race_pull", "version": 1, "schemaVersion": 2, "ownerEmail": "bench@example.com",
            "timeoutSeconds": 0, "tasks": [
                {"name": "pull", "taskReferenceName": "wait", "type": "PULL_WORKFLOW_MESSAGES",
                 "inputParameters": {"batchSize": 1}},
                {"name": "race_after", "taskReferenceName": "after", "type": "SIMPLE"}]}, timeout=30)
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            rows = list(pool.map(lambda i: one(url, i), range(args.runs)))
    finally:
        server.stop()
    lost = [r for r in rows if not r["message_taken"]]
    print(f"runs {len(rows)}, message taken {len(rows) - len(lost)}, lost {len(lost)}")
    for r in lost[:5]:
        print("  lost:", r)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
