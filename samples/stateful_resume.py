"""Surviving a crash: a stateful listener started by one process and resumed by another.

1. A child process (this file with ``--child``) starts a listener run and serves its tools;
   it handles one message.
2. The child is killed with SIGKILL: no cleanup, no goodbye. The run lives on, on the server.
3. This process calls ``runtime.resume(execution_id, agent, force=True)`` (force: it killed the child itself). That re-registers the agent's
   tools on the run's domain, so the *same run* continues and its tools now run here.
4. A second message is handled here; the run is stopped and ends COMPLETED.

Run it offline (a real Conductor server on this machine, with a scripted model):

    python samples/stateful_resume.py

Or against your own server and a real model:

    CONDUCTOR_SERVER_URL=http://localhost:8080/api \\
    CONDUCTOR_AGENT_MODEL=anthropic/claude-sonnet-4-6 python samples/stateful_resume.py --remote

The same from the shell: ``start`` only starts the run (a process that exits cannot serve
tools); ``resume`` serves them in the foreground until the run ends (Ctrl-C stops it):

    ID=$(conductor-agents start samples/stateful_resume.py:make_agent "Start listening.")
    conductor-agents resume samples/stateful_resume.py:make_agent "$ID"
    conductor-agents send "$ID" '{"action": "generate-report", "topic": "sales"}'   # another shell
"""

from __future__ import annotations

import argparse
import os
import queue
import subprocess
import sys
import threading
import time
from typing import Optional

from conductor_agents import Agent, AgentHandle, AgentRuntime, AgentSettings, ToolRegistry, WaitForMessageTool, tool

DEFAULT_MODEL = "anthropic/claude-sonnet-4-6"


class ActionTools:
    """The agent's tools. Their state (``reports``) lives in the process that serves the run."""

    def __init__(self) -> None:
        self.reports: list[str] = []
        self.done = threading.Event()

    @tool
    def generate_report(self, topic: str = "weekly") -> dict:
        """Generate a report on a topic and return where it was saved."""
        path = f"/reports/{topic}.pdf"
        self.reports.append(topic)
        print(f"  [tool in pid {os.getpid()}] generate_report(topic={topic!r}) -> {path}", flush=True)
        self.done.set()
        return {"saved_to": path}


def build_agent(model: str, tools: ActionTools) -> Agent:
    return Agent(
        name="resumable_listener",
        model=model,
        stateful=True,
        max_turns=10_000,
        tools=[
            WaitForMessageTool.create(name="wait_for_message",
                                      description="Wait for the next external message, then return its content."),
            *ToolRegistry.from_instance(tools),
        ],
        instructions="Loop: wait_for_message; for {action: generate-report, topic}, call generate_report "
                     "with that topic; repeat until told to stop.",
    )


def make_agent() -> Agent:
    """The agent for the command line (``samples/stateful_resume.py:make_agent``)."""
    return build_agent(os.environ.get("CONDUCTOR_AGENT_MODEL", DEFAULT_MODEL), ActionTools())


# --- the child: starts the run, serves it until it is killed ---------------------------------


def child(settings: AgentSettings, model: str) -> int:
    tools = ActionTools()
    with AgentRuntime(settings) as runtime:
        handle = runtime.start(build_agent(model, tools), "Start listening.")
        print(f"EXECUTION {handle.execution_id}", flush=True)
        handle.wait(timeout=300)  # serves the tools until the parent kills this process
    return 0


# --- the parent: lets the child start, kills it, resumes ------------------------------------


class ChildProcess:
    """This file with ``--child``, its stdout read line by line on a thread."""

    def __init__(self, settings: AgentSettings, model: str) -> None:
        env = {**os.environ, "CONDUCTOR_SERVER_URL": settings.server_url, "CONDUCTOR_AGENT_MODEL": model}
        self.process = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--child"], env=env,
                                        stdout=subprocess.PIPE, text=True)
        self.lines: "queue.Queue[Optional[str]]" = queue.Queue()
        self._reader = threading.Thread(target=self._read, name="child-stdout", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def expect(self, prefix: str, timeout: float) -> str:
        """The child's next line starting with ``prefix`` (echoing the others)."""
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            try:
                line = self.lines.get(timeout=max(0.01, remaining))
            except queue.Empty:
                raise TimeoutError(f"the child printed no {prefix!r} line within {timeout:g}s") from None
            if line is None:
                raise RuntimeError(f"the child exited ({self.process.wait()}) before printing {prefix!r}")
            print(line, flush=True)
            if line.lstrip().startswith(prefix):
                return line

    def kill(self) -> None:
        self.process.kill()  # SIGKILL: nothing in the child gets to clean up
        self.process.wait(timeout=30)
        self._reader.join(timeout=5)


def wait_for_message_task(handle: AgentHandle, *, after: Optional[str], timeout: float = 60.0) -> str:
    """Poll until the run waits for a message in a wait task other than ``after``; return its name."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = handle.status()
        ref = (status.pending_tool or {}).get("taskRefName")
        if status.is_waiting and ref and ref != after:
            return str(ref)
        time.sleep(0.2)
    raise TimeoutError(f"run {handle.execution_id} did not wait for a new message within {timeout:g}s")


def run_scenario(settings: AgentSettings, model: str) -> int:
    first = ChildProcess(settings, model)
    try:
        execution_id = first.expect("EXECUTION", timeout=60).split()[1]
        print(f"child {first.process.pid} started run {execution_id}")
        with AgentRuntime(settings) as runtime:
            observer = runtime.attach(execution_id)  # registers no workers: it only looks
            waiting_on = wait_for_message_task(observer, after=None)
            runtime.send_message(execution_id, {"action": "generate-report", "topic": "before-crash"})
            first.expect("[tool", timeout=60)
            # Kill it once the tool's result is in and the run waits for the next message. (Killed
            # mid-tool, the task would be handed back on resume and run again, here: at least once.)
            wait_for_message_task(observer, after=waiting_on)
            first.kill()
            print(f"killed child {first.process.pid} (SIGKILL); the run goes on without a worker")

            tools = ActionTools()
            # force=True: we killed the child ourselves; its last poll is seconds old, so without
            # it resume() would refuse, taking the child for alive (see docs/concepts.md#resume).
            handle = runtime.resume(execution_id, build_agent(model, tools), force=True)
            print(f"resumed in pid {os.getpid()}: {handle!r}")
            runtime.send_message(execution_id, {"action": "generate-report", "topic": "after-resume"})
            tools.done.wait(timeout=60)

            handle.stop()
            result = handle.wait(timeout=120)
            print(f"run ended {result.status.value}; reports made in this process: {tools.reports}")
            return 0 if result.ok and tools.reports == ["after-resume"] else 1
    finally:
        if first.process.poll() is None:
            first.kill()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--remote", action="store_true",
                        help="use CONDUCTOR_SERVER_URL and CONDUCTOR_AGENT_MODEL instead of a local server")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(AgentSettings.from_env(), os.environ.get("CONDUCTOR_AGENT_MODEL", DEFAULT_MODEL))
    if args.remote:
        return run_scenario(AgentSettings.from_env(), os.environ.get("CONDUCTOR_AGENT_MODEL", DEFAULT_MODEL))

    from conductor_agents.testing import LocalStack, ToolCall, listener_policy

    print("starting a local Conductor server with a scripted model...")  # a first run also says it downloads the jar
    with LocalStack() as stack:
        model = stack.llm.script(policy=listener_policy(
            lambda payload: ToolCall("generate_report", {"topic": payload.get("topic", "weekly")})
            if isinstance(payload, dict) and payload.get("action") == "generate-report" else None
        ))
        print(f"server up at {stack.url}")
        return run_scenario(stack.settings, model)


if __name__ == "__main__":
    raise SystemExit(main())
