"""A program that forks with a live runtime, as gunicorn ``--preload`` or multiprocessing do.

Run as ``python fork_program.py (os.fork|multiprocessing) MODEL NAME`` with
``CONDUCTOR_SERVER_URL`` set. The parent builds one :class:`AgentRuntime`, starts listener A
and gets its tools running (a poller, the watcher and the tool pool are live threads; a slow
tool is running at the moment of the fork). The forked child takes the *inherited* runtime,
starts its own listener B, messages it, stops it and reports; then it exits by the ordinary
interpreter exit (atexit hooks, thread joins): a hang there fails the test's timeout. The
parent then uses A again, stops it, and prints one JSON line with both sides' findings.

Every wait is bounded; the child is reaped.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import select
import sys
import threading
import time
import traceback
from typing import Any, Dict, List

from conductor_agents import AgentHandle, AgentRuntime, tool
from tests import helpers

WAIT = 60.0


class PidTools:
    """Each action records the pid that ran it; ``slow`` takes a while (the fork lands inside it)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.done: List[str] = []
        self.changed = threading.Condition(self.lock)
        self.slow_started = threading.Event()

    @tool
    def act(self, action: str) -> dict:
        """Carry out an action."""
        if action == "slow":
            self.slow_started.set()
            threading.Event().wait(2.0)
        with self.lock:
            self.done.append(action)
            self.changed.notify_all()
        return {"done": action, "pid": os.getpid()}

    def wait_for(self, action: str) -> bool:
        with self.lock:
            return self.changed.wait_for(lambda: action in self.done, timeout=WAIT)


def sdk_threads() -> List[str]:
    return helpers.sdk_threads()


def tool_pids(handle: AgentHandle) -> List[Any]:
    result = handle.wait(timeout=WAIT)
    return [(c.arguments.get("action"), c.output.get("pid")) for c in result.tool_calls if c.name == "act"]


def child_body(runtime: AgentRuntime, model: str, name: str, parent_run: AgentHandle,
               parent_worker_id: str) -> Dict[str, Any]:
    """In the child: a listener of its own on the inherited runtime."""
    report: Dict[str, Any] = {"pid": os.getpid(), "threads_at_start": sdk_threads(),
                              "stats_at_start": runtime.stats().tools_executed}
    tools = PidTools()
    handle = runtime.start(helpers.listener(name + "_child", model, tools), "Listen.")
    report["worker_id"] = runtime.worker_id
    report["worker_id_differs"] = runtime.worker_id != parent_worker_id
    handle.send_message({"action": "child-work"})
    report["tool_ran_here"] = tools.wait_for("child-work")
    report["threads_serving"] = sdk_threads()  # the child's own pollers, pool, watcher and watchdog
    report["stall"] = repr(handle.stall)
    served = [r.execution_id for r in runtime.stats().active_runs]
    report["serves_own_run"] = handle.execution_id in served
    report["serves_parent_run"] = parent_run.execution_id in served
    report["parent_run_status_seen"] = parent_run.status().status.value  # a request through the inherited handle
    handle.stop()
    result = handle.wait(timeout=WAIT)
    report["status"] = result.status.value
    report["tool_pids"] = [(c.arguments.get("action"), c.output.get("pid")) for c in result.tool_calls
                           if c.name == "act"]
    report["parent_actions_seen_here"] = [a for a in tools.done if a in ("slow", "before-fork", "after-fork")]
    return report


def run_child(runtime: AgentRuntime, model: str, name: str, parent_run: AgentHandle, parent_worker_id: str,
              send: Any, close: bool) -> None:
    try:
        report = child_body(runtime, model, name, parent_run, parent_worker_id)
    except BaseException:
        report = {"pid": os.getpid(), "error": traceback.format_exc()}
    if close:
        runtime.close()
        report["threads_after_close"] = sdk_threads()
    send(report)


def fork_with_os(runtime: AgentRuntime, model: str, name: str, handle: AgentHandle,
                 parent_worker_id: str) -> Dict[str, Any]:
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report through the pipe, then the ordinary interpreter exit
        os.close(read_end)

        def send(report: Dict[str, Any]) -> None:
            with os.fdopen(write_end, "w") as out:
                out.write(json.dumps(report))

        run_child(runtime, model, name, handle, parent_worker_id, send, close=True)
        sys.exit(0)  # atexit hooks and thread joins run here, as in a gunicorn worker
    os.close(write_end)
    data = b""
    deadline = time.monotonic() + 3 * WAIT
    with os.fdopen(read_end, "rb") as pipe:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([pipe], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                break
            chunk = os.read(pipe.fileno(), 65536)
            if not chunk:
                break
            data += chunk
    exit_code = reap(pid, timeout=WAIT)
    report = json.loads(data) if data else {"error": "the child sent no report"}
    report["exit_code"] = exit_code
    return report


def reap(pid: int, *, timeout: float) -> Any:
    """waitpid, bounded; a child still there after ``timeout`` is killed and reported as 'hung'."""
    reaped: Dict[str, int] = {}

    def exited() -> bool:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            reaped["code"] = os.waitstatus_to_exitcode(status)
        return bool(done)

    try:
        helpers.eventually(exited, timeout=timeout, message=f"child {pid} exiting")
    except AssertionError:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        return "hung"
    return reaped["code"]


def _mp_child(runtime: AgentRuntime, model: str, name: str, handle: AgentHandle, parent_worker_id: str,
              queue: Any) -> None:
    # No close(): a child that forgets it must still exit (the pool is joined idle, the rest are daemons).
    run_child(runtime, model, name, handle, parent_worker_id, queue.put, close=False)


def fork_with_multiprocessing(runtime: AgentRuntime, model: str, name: str, handle: AgentHandle,
                              parent_worker_id: str) -> Dict[str, Any]:
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    process = context.Process(target=_mp_child, args=(runtime, model, name, handle, parent_worker_id, queue))
    process.start()
    try:
        report = queue.get(timeout=3 * WAIT)
    except Exception:
        report = {"error": "the child sent no report"}
    process.join(WAIT)
    if process.is_alive():
        process.kill()
        process.join(10)
        report["exit_code"] = "hung"
    else:
        report["exit_code"] = process.exitcode
    return report


def main() -> int:
    mode, model, name = sys.argv[1:4]
    runtime = AgentRuntime()
    tools = PidTools()
    handle = runtime.start(helpers.listener(name, model, tools), "Listen.")
    handle.send_message({"action": "before-fork"})
    assert tools.wait_for("before-fork"), "the parent's tool did not run"
    handle.send_message({"action": "slow"})
    assert tools.slow_started.wait(WAIT), "the slow tool did not start"
    threads_at_fork = sdk_threads()

    fork = fork_with_os if mode == "os.fork" else fork_with_multiprocessing
    child = fork(runtime, model, name, handle, runtime.worker_id)

    assert tools.wait_for("slow"), "the parent's slow tool did not finish"
    handle.send_message({"action": "after-fork"})
    after_fork_ran = tools.wait_for("after-fork")
    served = [r.execution_id for r in runtime.stats().active_runs]
    handle.stop()
    parent = {"pid": os.getpid(), "worker_id": runtime.worker_id, "threads_at_fork": threads_at_fork,
              "after_fork_ran": after_fork_ran, "serves_its_run": handle.execution_id in served,
              "tool_pids": tool_pids(handle), "status": handle.wait(timeout=WAIT).status.value}
    runtime.close()
    parent["threads_after_close"] = sdk_threads()
    print(json.dumps({"parent": parent, "child": child}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
