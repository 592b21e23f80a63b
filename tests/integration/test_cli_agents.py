"""``python -m conductor_agents run|start|resume|send|status|wait|stop|cancel`` as a user runs them.

The verbs that serve a run (``run``, ``resume``, a ``wait`` beside them) run as subprocesses against the
session's server, as do a few one-shot calls that prove the exit codes end to end (the code ``main``
returns is the process's: 2, 3 and 4 below); the other one-shot verbs run the CLI's ``main`` in this
process (``Cli.here``: same arguments, working directory and environment, output captured), which spares
each an interpreter start and the package's import (seconds each on a loaded machine). The agent is a
module written to a temporary directory (``MODULE:AGENT`` = ``agent_mod.py:make_agent``) whose model is a
script of the session's ScriptedLLM: a listener that turns each message into an ``act`` call.
"""

from __future__ import annotations

import io
import json
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from typing import Dict, List, Optional
from unittest import mock

import pytest

from conductor_agents import Agent, ToolRegistry, WaitForMessageTool, tool
from conductor_agents.cli import main
from conductor_agents.cli._progress import ProgressDisplay, RunWatcher
from conductor_agents.testing import ToolCall, listener_policy

from ..helpers import eventually
from .test_steering import turn_after

pytestmark = pytest.mark.integration

REPO_ROOT = Path(__file__).resolve().parents[2]
TIMEOUT = 90


def act_on(payload: dict) -> Optional[ToolCall]:
    if "action" in payload:
        return ToolCall("act", {"action": str(payload["action"])})
    if "message" in payload:
        return ToolCall("act", {"action": str(payload["message"])})
    return None


AGENT_MODULE = '''
import time
from conductor_agents import Agent, ToolRegistry, WaitForMessageTool, tool


class Tools:
    @tool
    def act(self, action: str) -> dict:
        """Carry out an action."""
        if action == "slow":
            time.sleep(3)
        return {{"done": action}}


def make_agent():
    return Agent(name={name!r}, model={model!r}, stateful=True, max_turns=1000,
                 tools=[WaitForMessageTool.create(name="wait_for_message"), *ToolRegistry.from_instance(Tools())])


not_an_agent = 42
'''


class Cli:
    """Runs the CLI with the session server's URL in CONDUCTOR_SERVER_URL."""

    def __init__(self, cwd: Path, server_url: str) -> None:
        self.cwd = cwd
        self.env = {**os.environ, "CONDUCTOR_SERVER_URL": server_url, "PYTHONUNBUFFERED": "1"}

    def __call__(self, *args: str, timeout: float = TIMEOUT, env: Optional[Dict[str, str]] = None
                 ) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "conductor_agents", *args], cwd=self.cwd,
                              env={**self.env, **(env or {})}, capture_output=True, text=True, timeout=timeout)

    def here(self, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        """The CLI's ``main(args)`` in this process, as ``__call__`` runs it in a subprocess: this Cli's working
        directory and environment, stdout and stderr captured; the exit code is what ``main`` returns
        (``python -m conductor_agents`` exits with it). A target module it imports (from the working
        directory) and the ``sys.path`` entries it adds are taken back afterwards."""
        out, err = io.StringIO(), io.StringIO()
        cwd, path, modules = os.getcwd(), list(sys.path), set(sys.modules)
        try:
            with mock.patch.dict(os.environ, {**self.env, **(env or {})}, clear=True), \
                    redirect_stdout(out), redirect_stderr(err):
                os.chdir(self.cwd)
                code = main(list(args))
        finally:
            os.chdir(cwd)
            sys.path[:] = path
            for name in set(sys.modules) - modules:
                if str(getattr(sys.modules[name], "__file__", None) or "").startswith(str(self.cwd)):
                    del sys.modules[name]
        return subprocess.CompletedProcess(["conductor-agents", *args], code, out.getvalue(), err.getvalue())

    def spawn(self, *args: str) -> "Running":
        return Running(subprocess.Popen([sys.executable, "-m", "conductor_agents", *args], cwd=self.cwd,
                                        env=self.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))


class Running:
    """A CLI process in the background; its stderr is read line by line on a thread."""

    def __init__(self, process: subprocess.Popen) -> None:
        self.process = process
        self.lines: "queue.Queue[Optional[str]]" = queue.Queue()
        self.stderr: List[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def expect(self, text: str, timeout: float = 60) -> str:
        """The next stderr line containing ``text``."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self.lines.get(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"no stderr line with {text!r} within {timeout}s; got {self.stderr}") from None
            if line is None:
                raise AssertionError(f"the CLI exited before printing {text!r}; stderr: {self.stderr}")
            self.stderr.append(line)
            if text in line:
                return line

    def finish(self, timeout: float = TIMEOUT) -> "tuple[int, str, str]":
        """Wait for the exit; return (code, stdout, all of stderr)."""
        self.process.wait(timeout=timeout)
        assert self.process.stdout is not None
        stdout = self.process.stdout.read()  # not communicate(): the reader thread owns stderr
        self.process.stdout.close()
        self._reader.join(10)
        while True:
            line = self.lines.get_nowait() if not self.lines.empty() else None
            if line is None:
                break
            self.stderr.append(line)
        return self.process.returncode, stdout, "\n".join(self.stderr)

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)


@pytest.fixture
def cli(tmp_path: Path, agent_settings) -> Cli:
    return Cli(tmp_path, agent_settings.server_url)


@pytest.fixture
def target(tmp_path: Path, scripted_llm, unique_name) -> str:
    model = scripted_llm.script(policy=listener_policy(act_on))
    (tmp_path / "agent_mod.py").write_text(AGENT_MODULE.format(name=unique_name("cli"), model=model))
    return "agent_mod.py:make_agent"


def execution_id_from(line: str) -> str:
    return line.rsplit("execution ", 1)[1].split()[0]


def test_run_serves_tools_prints_progress_and_ctrl_c_stops_gracefully(cli: Cli, target: str) -> None:
    run = cli.spawn("run", target, "Listen.")
    try:
        execution_id = execution_id_from(run.expect("started"))
        run.expect("waiting for a message")

        sent = cli.here("send", execution_id, '{"action": "build"}')
        assert sent.returncode == 0, sent.stderr
        assert sent.stdout.strip()  # the message id
        run.expect("tool act(action=build)")
        run.expect("-> {\"done\":\"build\"}")

        status = cli.here("status", execution_id)
        assert status.returncode == 0, status.stderr
        assert "RUNNING" in status.stdout and execution_id in status.stdout
        as_json = json.loads(cli.here("status", execution_id, "--json").stdout)
        assert as_json["executionId"] == execution_id and as_json["status"] == "RUNNING"
        assert as_json["runId"] and not as_json["terminal"]
        assert (as_json["served"], as_json["unservedFor"]) == (True, None)  # `run` polls its tasks (issue 41)

        run.process.send_signal(signal.SIGINT)  # Ctrl-C: a graceful stop
        code, stdout, stderr = run.finish()
    finally:
        run.kill()
    assert code == 0, stderr
    assert "stopping" in stderr and "COMPLETED" in stderr
    assert "Traceback" not in stderr
    assert json.loads(cli.here("status", execution_id, "--json").stdout)["status"] == "COMPLETED"


def test_second_ctrl_c_cancels_the_run(cli: Cli, target: str) -> None:
    run = cli.spawn("run", target, "Listen.")
    try:
        execution_id = execution_id_from(run.expect("started"))
        run.expect("waiting for a message")
        assert cli.here("send", execution_id, "slow").returncode == 0  # text: the tool sleeps 3 s
        run.expect("model turn 2")
        run.process.send_signal(signal.SIGINT)
        run.expect("stopping")
        run.process.send_signal(signal.SIGINT)
        code, _, stderr = run.finish()
    finally:
        run.kill()
    assert code == 1, stderr
    assert "cancelling" in stderr and "TERMINATED" in stderr


def test_run_serves_until_the_end_and_timeout_is_only_there_when_given(cli: Cli, target: str) -> None:
    """Issue 11.8: ``--timeout 3`` stops serving with exit 5 (the run goes on); without it ``run``
    is still serving after that (it would have served for days), and Ctrl-C still ends it cleanly."""
    endless = cli.spawn("run", target, "Listen.")
    bounded = cli.spawn("run", target, "Listen.", "--timeout", "3")
    bounded_id = None
    try:
        endless_id = execution_id_from(endless.expect("started"))
        endless.expect("waiting for a message")
        bounded_id = execution_id_from(bounded.expect("started"))
        code, _, stderr = bounded.finish()
        assert code == 5, stderr
        assert "did not end within 3s" in stderr and "not cancelled" in stderr
        assert json.loads(cli.here("status", bounded_id, "--json").stdout)["status"] == "RUNNING"

        # started before the bounded one: past its 3 s, still there and still serving its tools
        assert endless.process.poll() is None, endless.stderr
        assert cli.here("send", endless_id, '{"action": "after-the-deadline"}').returncode == 0
        endless.expect("tool act(action=after-the-deadline)")

        endless.process.send_signal(signal.SIGINT)
        code, _, stderr = endless.finish()
    finally:
        endless.kill()
        bounded.kill()
        if bounded_id is not None:
            cli.here("cancel", bounded_id, "--reason", "test over")
    assert code == 0, stderr
    assert "stopping" in stderr and "COMPLETED" in stderr and "Traceback" not in stderr


def test_start_then_resume_serves_the_run_while_wait_and_stop_drive_it(cli: Cli, target: str) -> None:
    started = cli.here("start", target, "Listen.")
    assert started.returncode == 0, started.stderr
    execution_id = started.stdout.strip()
    assert "resume" in started.stderr  # says that its tools are not served by `start`

    resume = cli.spawn("resume", target, execution_id, "--json")
    waiter = cli.spawn("wait", execution_id, "--timeout", "60")
    try:
        resume.expect("resumed")
        assert cli.here("send", execution_id, "hello").returncode == 0  # text becomes {"message": "hello"}
        resume.expect("tool act(action=hello)")
        stopped = cli.here("stop", execution_id)
        assert stopped.returncode == 0, stopped.stderr
        code, stdout, stderr = resume.finish()
        wait_code, _, wait_stderr = waiter.finish()
    finally:
        resume.kill()
        waiter.kill()
    assert code == 0, stderr
    result = json.loads(stdout)
    assert result["status"] == "COMPLETED" and result["executionId"] == execution_id
    assert {"name": "act", "status": "COMPLETED", "arguments": {"action": "hello"},
            "output": {"done": "hello"}, "error": None} in result["toolCalls"]
    assert wait_code == 0, wait_stderr
    assert "COMPLETED" in wait_stderr and "Traceback" not in wait_stderr

    again = cli.here("stop", execution_id)  # stopping a run that ended is not an error
    assert again.returncode == 0 and "already ended" in again.stderr


def test_cancel_wait_and_send_after_the_end(cli: Cli, target: str) -> None:
    execution_id = cli.here("start", target, "Listen.").stdout.strip()
    timed_out = cli.here("wait", execution_id, "--timeout", "1", "--quiet")
    assert timed_out.returncode == 5, timed_out.stderr
    assert timed_out.stderr.count("\n") == 1 and "not cancelled" in timed_out.stderr

    # Nothing waits for a person: `pending` answers "nobody" (exit 0); there is nothing to approve (exit 3).
    nobody = cli.here("pending", execution_id)
    assert nobody.returncode == 0 and nobody.stdout == "" and "waits for no person" in nobody.stderr
    as_json = cli.here("pending", execution_id, "--json")
    assert as_json.returncode == 0 and json.loads(as_json.stdout) == []
    nothing = cli.here("approve", execution_id)
    assert nothing.returncode == 3 and nothing.stderr.count("\n") == 1, nothing.stderr

    # JSON-looking text that is not JSON is sent as text, with one warning saying why (point 7).
    looks = cli.here("send", execution_id, '{"action": generate-report}')
    assert looks.returncode == 0, looks.stderr
    assert looks.stderr.count("\n") == 1 and "warning: the message looks like JSON but is not" in looks.stderr
    assert "column 12" in looks.stderr
    meant = cli.here("send", execution_id, "{not json}", "--text")
    assert meant.returncode == 0 and meant.stderr == ""
    plain = cli.here("send", execution_id, "plain words")
    assert plain.returncode == 0 and plain.stderr == ""

    cancelled = cli.here("cancel", execution_id, "--reason", "test over")
    assert cancelled.returncode == 0, cancelled.stderr
    waited = cli.here("wait", execution_id, "--json")
    assert waited.returncode == 1
    assert json.loads(waited.stdout)["status"] == "TERMINATED"
    # The summary gives the run's own duration (it lived for more than the 1 s wait above), not the
    # moment `wait` took to find it ended (point 9).
    took = float(waited.stderr.rsplit("TERMINATED after ", 1)[1].split("s:", 1)[0])
    assert took >= 1.0, waited.stderr
    late = cli("send", execution_id, "anyone there?")  # a subprocess: exit 3 is the process's exit code
    assert late.returncode == 3 and late.stderr.startswith("conductor-agents: error: ")
    assert late.stderr.count("\n") == 1


@pytest.mark.parametrize("verb", [["status"], ["wait"], ["send", "hi"], ["stop"], ["signal", "hi"], ["cancel"]])
def test_unknown_execution_exits_3_with_one_line(cli: Cli, verb: List[str]) -> None:
    result = cli.here(verb[0], "no-such-execution-0000", *verb[1:])
    assert result.returncode == 3, result.stderr
    assert result.stderr.startswith("conductor-agents: error: ") and result.stderr.count("\n") == 1
    assert "no-such-execution-0000" in result.stderr


def test_unreachable_server_exits_4(cli: Cli, target: str) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{sock.getsockname()[1]}/api"  # bound, never listening: refused
        by_flag = cli.here("status", "some-id", "--server-url", url)
        by_env = cli("run", target, "hi", env={"CONDUCTOR_SERVER_URL": url})  # a subprocess: its exit code
    for result in (by_flag, by_env):
        assert result.returncode == 4, result.stderr
        # `run` starts polling before it starts the run: the poller's first failures are not warned
        # about, so the one line is the error (issue 34, point 8).
        assert result.stderr.count("\n") == 1, result.stderr
        assert result.stderr.startswith("conductor-agents: error: ") and "cannot reach the server" in result.stderr


def test_server_url_without_api_exits_2_naming_the_fix(cli: Cli, target: str) -> None:
    root = cli.env["CONDUCTOR_SERVER_URL"].rstrip("/")
    assert root.endswith("/api")
    root = root[: -len("/api")]
    by_flag = cli.here("status", "some-id", "--server-url", root)
    by_env = cli("run", target, "hi", env={"CONDUCTOR_SERVER_URL": root})  # a subprocess: its exit code
    for result in (by_flag, by_env):
        assert result.returncode == 2, result.stderr
        assert result.stderr.count("\n") == 1, result.stderr
        assert result.stderr.startswith(f"conductor-agents: error: the server URL {root} is not the Conductor API")
        assert f"{root}/api" in result.stderr
    versioned = cli.here("status", "some-id", "--server-url", f"{root}/api/v1")  # issue 41: not .../api/v1/api
    assert versioned.returncode == 2, versioned.stderr
    assert versioned.stderr.rstrip().endswith(f"set CONDUCTOR_SERVER_URL (or --server-url) to {root}/api")


@pytest.mark.parametrize("args, message", [
    (["run", "no_such_module:agent", "hi"], "no module named"),
    (["run", "agent_mod.py:missing", "hi"], "has no attribute"),
    (["run", "agent_mod.py:not_an_agent", "hi"], "is an int, not an Agent"),
    (["run", "agent_mod.py", "hi"], "expected MODULE:AGENT"),
    (["wait", "some-id", "--timeout", "-1"], "seconds > 0"),
    (["status", "some-id", "--server-url", "localhost"], "http(s) URL"),
    (["run"], "required"),
])
def test_usage_errors_exit_2(cli: Cli, target: str, args: List[str], message: str) -> None:
    result = cli.here(*args)
    assert result.returncode == 2, result.stderr
    assert message in result.stderr and "Traceback" not in result.stderr


def test_help_documents_exit_codes(cli: Cli) -> None:
    result = cli.here("--help")
    assert result.returncode == 0
    for code in ("0    success", "3    unknown execution", "4    the Conductor server cannot be reached",
                 "5    the wait timed out", "6    send --wait-delivered", "7    approve, reject, respond"):
        assert code in result.stdout
    verb = cli.here("wait", "--help")
    assert verb.returncode == 0 and "exit codes: see conductor-agents --help" in verb.stdout
    assert "5    the wait timed out" not in verb.stdout


class InProcessTools:
    @tool
    def act(self, action: str) -> dict:
        """Carry out an action."""
        return {"done": action}


@pytest.mark.parametrize("tty", [False, True])
def test_progress_from_the_task_list_when_there_is_no_event_stream(agent_runtime, scripted_llm, unique_name,
                                                                   tty: bool) -> None:
    """The watcher's polling mode (an SDK without handle.events()) tells the same story."""
    model = scripted_llm.script(policy=listener_policy(act_on))
    agent = Agent(name=unique_name("progress"), model=model, stateful=True, max_turns=100,
                  tools=[WaitForMessageTool.create(name="wait_for_message"),
                         *ToolRegistry.from_instance(InProcessTools())])
    handle = agent_runtime.start(agent, "Listen.")
    out = io.StringIO()
    display = ProgressDisplay(out, tty=tty)
    watcher = RunWatcher(display, handle.execution_id, interval=0.2,
                         fetch=lambda: agent_runtime._api.get_workflow(handle.current_execution_id, include_tasks=True))
    watcher.start()
    try:
        eventually(lambda: "waiting for a message" in out.getvalue(), timeout=30, message="waiting")
        handle.send_message({"action": "build"})
        eventually(lambda: "tool act(action=build)" in out.getvalue(), timeout=30, message="the tool line")
        handle.stop()
        assert handle.wait(timeout=60).ok
    finally:
        watcher.stop()
    text = out.getvalue()
    lines = [line.rsplit("\x1b[2K", 1)[-1] for line in text.splitlines()]
    for expected in ("model turn 1", "wait_for_message: waiting for a message",
                     'wait_for_message: received {"action":"build"}', 'tool act(action=build) -> {"done":"build"}',
                     "run COMPLETED"):
        assert expected in lines, text
    assert ("\r\x1b[2K" in text) is tty


def test_signal_sets_and_clears_the_standing_signal_of_a_run(cli: Cli, tmp_path: Path, scripted_llm,
                                                             unique_name) -> None:
    model = scripted_llm.script(policy=listener_policy(act_on))
    (tmp_path / "agent_mod.py").write_text(AGENT_MODULE.format(name=unique_name("sig"), model=model))
    run = cli.spawn("run", "agent_mod.py:make_agent", "Listen.")
    try:
        execution_id = execution_id_from(run.expect("started"))
        run.expect("waiting for a message")  # signalled once it waits (see test_steering)
        done = cli.here("signal", execution_id, "Answer in French.")
        assert done.returncode == 0 and f"set the signal of execution {execution_id}" in done.stderr, done.stderr
        assert cli.here("send", execution_id, '{"action": "a"}').returncode == 0
        run.expect("tool act(action=a)")
        assert turn_after(scripted_llm, model, "a").signal == "Answer in French."

        run.expect("waiting for a message")
        cleared = cli.here("signal", execution_id, "")
        assert cleared.returncode == 0 and "cleared the signal" in cleared.stderr, cleared.stderr
        assert cli.here("send", execution_id, '{"action": "b"}').returncode == 0
        run.expect("tool act(action=b)")
        assert turn_after(scripted_llm, model, "b").signal is None

        run.process.send_signal(signal.SIGINT)
        code, _, stderr = run.finish()
    finally:
        run.kill()
    assert code == 0, stderr
    ended = cli.here("signal", execution_id, "too late")
    assert ended.returncode == 3 and ended.stderr.startswith("conductor-agents: error: "), ended.stderr
    assert ended.stderr.count("\n") == 1
