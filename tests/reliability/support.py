"""Helpers of the reliability tests: read the server's view of a run, drive child processes."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from typing import Any, List, Optional

from conductor_agents._common.task_names import is_message_wait
from conductor_agents._listener.chain import is_human_wait_key, parse_mailbox_key

from ..helpers import listener_runs, read_through_balancer

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))

#: The server-side task type of a WaitForMessageTool task when its listener waits with ``pull`` (a ``HUMAN`` task
#: with ``human``: :func:`waiting_for_message` tells both).
WAIT_TASK_TYPE = "PULL_WORKFLOW_MESSAGES"

_TERMINAL_TASK = {"COMPLETED", "COMPLETED_WITH_ERRORS", "FAILED", "FAILED_WITH_TERMINAL_ERROR", "CANCELED",
                  "SKIPPED", "TIMED_OUT"}


def server_get(base_url: str, path: str, **params: Any) -> Any:
    """GET ``base_url + path`` straight from the server (the test's own view, not the SDK's)."""
    response = read_through_balancer(base_url + path, params)
    response.raise_for_status()
    return response.json() if response.content else None


def workflow(base_url: str, execution_id: str) -> dict:
    """The run with its tasks; for a listener's mailbox (the id its handle holds), its current run."""
    flow = server_get(base_url, f"/workflow/{execution_id}", includeTasks="true")
    if parse_mailbox_key(flow.get("correlationId")) is not None:
        return server_get(base_url, f"/workflow/{current_run(base_url, execution_id)}", includeTasks="true")
    return flow


def waits_on_human_task(base_url: str, execution_id: str) -> bool:
    """Whether the listener whose mailbox is ``execution_id`` waits on a ``HUMAN`` task (``listener_wait="human"``:
    every message goes through its mailbox), as its mailbox's key says; False for one that waits with ``pull``."""
    flow = server_get(base_url, f"/workflow/{execution_id}", includeTasks="false")
    return is_human_wait_key(flow.get("correlationId"))


def current_run(base_url: str, execution_id: str) -> str:
    """The newest run of the listener whose first run is ``execution_id`` (itself if never continued)."""
    return listener_runs(base_url, execution_id)[-1]


def tasks_of(base_url: str, execution_id: str, task_type: str) -> "list[dict]":
    return [t for t in workflow(base_url, execution_id).get("tasks") or () if t.get("taskType") == task_type]


def quiescent(base_url: str, execution_id: str, tool: str = "act") -> bool:
    """True when the run waits for a message and no ``tool`` task is pending or running.

    Only then may a worker process be killed without losing a tool mid-flight (a tool that
    ran but whose result was not posted would run again after resume: at-least-once).
    """
    tasks = workflow(base_url, current_run(base_url, execution_id)).get("tasks") or ()
    if any(t.get("taskType") == tool and t.get("status") not in _TERMINAL_TASK for t in tasks):
        return False
    return waiting_for_message(tasks)


def waiting_for_message(tasks: Any) -> bool:
    """Whether the newest wait for messages among a run's ``tasks`` is in progress, whatever its kind (the
    server's ``PULL_WORKFLOW_MESSAGES`` or, with ``listener_wait="human"``, a ``HUMAN`` task the mailbox
    completes)."""
    waits = [t for t in tasks if is_message_wait(t)]
    return bool(waits) and waits[-1].get("status") == "IN_PROGRESS"


def last_poll_ms(base_url: str, task_type: str, domain: str) -> Optional[int]:
    """The server's ``lastPollTime`` of ``task_type`` on ``domain`` (epoch ms), if polled at all."""
    for row in server_get(base_url, "/tasks/queue/polldata", taskType=task_type) or ():
        if row.get("domain") == domain:
            return int(row.get("lastPollTime") or 0)
    return None


class Child:
    """A ``crash_child.py`` process. Its stdin is a pipe: it exits if this process dies."""

    def __init__(self, args: "list[str]", *, stderr_path: str) -> None:
        env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
        self.stderr_path = stderr_path
        with open(stderr_path, "ab") as stderr:  # a file, so a chatty child never blocks on a pipe
            self.proc = subprocess.Popen(
                [sys.executable, os.path.join(HERE, "crash_child.py"), *args],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr, env=env,
            )
        self.info: dict = {}

    def read_info(self, timeout: float) -> dict:
        """The JSON line the child prints once it serves the run (bounded)."""
        deadline = time.monotonic() + timeout
        buffer = b""
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        while b"\n" not in buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or self.proc.poll() is not None:
                raise AssertionError(f"the child printed nothing usable within {timeout}s "
                                     f"(exit {self.proc.poll()}): {self.stderr_tail()}")
            readable, _, _ = select.select([fd], [], [], min(remaining, 0.5))
            if readable:
                chunk = os.read(fd, 4096)
                if not chunk:
                    continue
                buffer += chunk
        self.info = json.loads(buffer.split(b"\n", 1)[0])
        return self.info

    def stderr_tail(self) -> str:
        with open(self.stderr_path, "rb") as fh:
            return fh.read().decode(errors="replace")[-3000:]

    def kill(self) -> None:
        """SIGKILL: no atexit, no finally, no close(); the worst way to die."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None:
                stream.close()


def kill_all(children: List[Child]) -> None:
    for child in children:
        try:
            child.kill()
        except Exception:  # keep killing the others
            pass


def run_summary(base_url: str, execution_id: str) -> str:
    """One line per task of the run (for failure messages)."""
    flow = workflow(base_url, execution_id)
    lines = [f"workflow {execution_id} {flow.get('status')}"]
    for t in flow.get("tasks") or ():
        lines.append(f"  {t.get('referenceTaskName')} {t.get('taskType')} {t.get('status')} "
                     f"polls={t.get('pollCount')} domain={t.get('domain')} worker={t.get('workerId')} "
                     f"reason={t.get('reasonForIncompletion')}")
    return "\n".join(lines)
