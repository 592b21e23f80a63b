"""``conductor-agents list AGENT`` and ``conductor-agents events ID`` through the real CLI: the running runs of an
agent with what each waits for, and a run's events followed until it ends.

The one-shot verbs run the CLI's ``main`` in this process (``cli``: the same arguments and environment, output
captured; a process each costs an interpreter start and the package's import, seconds on a loaded machine, and
some are polled); ``events`` following a run runs as a process of its own, as a user runs it."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import time
from contextlib import redirect_stderr, redirect_stdout
from unittest import mock

import attrs
import pytest

from conductor_agents import AgentRuntime, RunStatus, WaitTimeoutError
from conductor_agents.cli._main import main
from conductor_agents.testing import listener_policy

from ..helpers import eventually, listener
from .test_stateful_listener import ActionTools, act_on

pytestmark = pytest.mark.integration


#: A CLI whose liveness bound is 3 s (the default, 30 s, would make a test wait that long) and whose progress
#: checks every half second whether a process serves the run.
SHORT_STALL = {"CONDUCTOR_AGENT_LIVENESS_STALL_SECONDS": "3", "CONDUCTOR_AGENT_LIVENESS_CHECK_INTERVAL_SECONDS": "0.5"}


def cli(server_url: str, *args: str, env: "dict | None" = None) -> subprocess.CompletedProcess:
    """``conductor-agents ARGS --server-url URL`` by the CLI's ``main`` in this process, with ``env`` added to the
    environment; the exit code is what ``main`` returns (``python -m conductor_agents`` exits with it)."""
    out, err = io.StringIO(), io.StringIO()
    with mock.patch.dict(os.environ, env or {}), redirect_stdout(out), redirect_stderr(err):
        code = main([*args, "--server-url", server_url])
    return subprocess.CompletedProcess(["conductor-agents", *args], code, out.getvalue(), err.getvalue())


def test_list_shows_what_each_run_waits_for_and_events_follows_a_run_to_its_end(
        agent_settings, scripted_llm, unique_name) -> None:
    url = agent_settings.server_url
    model = scripted_llm.script(policy=listener_policy(act_on))
    tools = ActionTools("watch")
    name = unique_name("watched")
    with AgentRuntime(agent_settings) as runtime:
        handles = [runtime.start(listener(name, model, tools), "Start listening.") for _ in range(2)]
        handles[0].send_message({"action": "first"})
        eventually(lambda: [a for a, _ in tools.actions] == ["first"], timeout=60, message="the action")

        def listed():
            result = cli(url, "list", name, "--json")
            assert result.returncode == 0, result.stderr
            rows = json.loads(result.stdout)
            return rows if len(rows) == 2 and all(r["waitingFor"] == "message" for r in rows) else None

        rows = eventually(listed, timeout=60, interval=0.5, message="both listeners waiting for a message")
        assert {(r["executionId"], r["currentExecutionId"]) for r in rows} == {
            (h.execution_id, h.current_execution_id) for h in handles}  # named by the id callers hold
        assert all(r["served"] is True and r["unservedFor"] is None for r in rows)  # this runtime serves both
        assert all(r["status"] == "RUNNING" and abs(r["startTime"] - time.time()) < 600 for r in rows)
        assert {(r.execution_id, r.waiting_for) for r in runtime.running(name)} == {
            (h.execution_id, "message") for h in handles}
        plain = cli(url, "list", name)
        assert plain.returncode == 0 and len(plain.stdout.splitlines()) == 2
        assert all("waits for message" in line for line in plain.stdout.splitlines()), plain.stdout
        none = cli(url, "list", unique_name("nobody"))
        assert (none.returncode, none.stdout) == (0, "")

        follower = subprocess.Popen(
            [sys.executable, "-m", "conductor_agents", "events", handles[0].execution_id, "--json",
             "--server-url", url], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            handles[0].send_message({"action": "second"})
            eventually(lambda: "second" in [a for a, _ in tools.actions], timeout=60, message="the second action")
            handles[0].stop()
            out, err = follower.communicate(timeout=120)
        finally:
            if follower.poll() is None:
                follower.kill()
        assert follower.returncode == 0, err
        kinds = [json.loads(line)["kind"] for line in out.splitlines()]
        assert kinds[-1] == "done" and kinds.count("tool_call") >= 2, kinds  # the history, then what followed
        handles[1].cancel()

    text = cli(url, "events", handles[0].execution_id)  # an ended run: its history at once, in lines
    assert text.returncode == 0 and text.stdout.splitlines()[-1].endswith("done"), text.stdout
    unknown = cli(url, "events", "no-such-run", "--timeout", "5")
    assert unknown.returncode == 3, unknown.stderr


def test_a_listeners_errors_name_the_id_its_caller_holds(agent_settings, scripted_llm, unique_name, capsys) -> None:
    """Issue 41, point 4: ``approve ID`` said ``run LINK waits for no person now`` and ``events ID --timeout 5``
    ``run LINK did not end within 4.99999s``, LINK a run of the listener, whose id the caller never held (it
    holds the listener's mailbox's); ``status`` printed the server's tool-call placeholder as the output. The
    verbs run in this process (``main``): a process each would cost more than the rest of the test."""
    url = agent_settings.server_url
    model = scripted_llm.script(policy=listener_policy(act_on))
    agent = listener(unique_name("ids"), model, ActionTools("ids"))

    def verb(*args: str) -> "tuple[int, str, str]":
        code = main([*args, "--server-url", url])
        out, err = capsys.readouterr()
        return code, out, err

    with AgentRuntime(agent_settings) as runtime:
        handle = runtime.start(agent, "Start listening.")
        held, run = handle.execution_id, handle.current_execution_id
        assert run != held  # the listener's first run; the caller holds its mailbox's id

        code, _, err = verb("approve", held)
        assert (code, err.strip()) == (
            3, f"conductor-agents: error: listener {held} (its run {run}) waits for no person now (nothing to approve)")
        code, _, err = verb("events", held, "--timeout", "2")
        assert (code, err.splitlines()[-1]) == (
            5, f"conductor-agents: error: run {held} did not end within 2s; it goes on on the server and is not "
               "cancelled (see `conductor-agents status|wait|resume|stop|cancel`)")
        handle.stop()
        result = handle.wait(timeout=60)
        code, out, _ = verb("status", held)
        shown = [line.split(None, 1)[1] for line in out.splitlines() if line.startswith("output ")]
        assert (result.status, code, shown) == (  # the answer wait() gave, or none: never the tool-call placeholder
            RunStatus.COMPLETED, 0, [] if result.output is None else [result.output]), out


def test_a_run_nobody_serves_says_so_in_status_list_and_wait_until_a_process_serves_it(
        agent_settings, scripted_llm, unique_name) -> None:
    """A listener started with no worker (as ``conductor-agents start`` does): ``status`` and ``list`` say that no
    process serves it, for how long and what would serve it, ``wait`` says it once, and Python's ``wait()`` says it
    when it times out; served, it says so."""
    url = agent_settings.server_url
    model = scripted_llm.script(policy=listener_policy(act_on))
    name = unique_name("unserved")
    tools = ActionTools("late")
    with AgentRuntime(attrs.evolve(agent_settings, auto_start_workers=False)) as starter:
        execution_id = starter.start(listener(name, model, tools), "Start listening.").execution_id

    def unserved() -> "dict | None":
        result = cli(url, "status", execution_id, "--json", env=SHORT_STALL)
        assert result.returncode == 0, result.stderr
        status = json.loads(result.stdout)
        return status if status["served"] is False else None

    status = eventually(unserved, timeout=30, interval=1, message="status --json says no process serves the run")
    assert status["status"] == "RUNNING" and status["unservedFor"] > 3, status
    plain = cli(url, "status", execution_id, env=SHORT_STALL)
    (line,) = [row for row in plain.stdout.splitlines() if row.startswith("status")]
    assert "RUNNING" in line and "not served: no process has polled its tasks for " in line, plain.stdout
    assert line.endswith("(serve it with: conductor-agents serve MODULE:AGENT)"), line
    listed = cli(url, "list", name, env=SHORT_STALL)
    assert "not served for " in listed.stdout and "waits for nothing" not in listed.stdout, listed.stdout
    assert "conductor-agents serve MODULE:AGENT" in listed.stderr, listed.stderr
    waited = cli(url, "wait", execution_id, "--timeout", "3", env=SHORT_STALL)
    assert waited.returncode == 5, waited.stderr
    assert waited.stderr.count("not served: no process has polled its tasks") == 1, waited.stderr  # said once
    print(f"\n{line}\n{listed.stdout}{listed.stderr}{waited.stderr}")
    with AgentRuntime(attrs.evolve(agent_settings, liveness_stall_seconds=3.0)) as looker, \
            pytest.raises(WaitTimeoutError) as timed_out:  # Python's wait() of it, from a process that holds its id
        looker.attach(execution_id).wait(timeout=1)
    assert ", and no process has polled its tasks for " in str(timed_out.value), timed_out.value
    assert f"(serve it with runtime.resume({execution_id!r}, agent), or conductor-agents serve MODULE:AGENT)" in str(
        timed_out.value), timed_out.value

    with AgentRuntime(agent_settings) as serving:
        handle = serving.resume(execution_id, listener(name, model, tools))
        eventually(lambda: handle.status().served is True, timeout=30, interval=0.5, message="served once resumed")
        assert [(r.execution_id, r.served) for r in serving.running(name)] == [(execution_id, True)]
        handle.send_message({"action": "at last"})
        eventually(lambda: [a for a, _ in tools.actions] == ["at last"], timeout=60, message="the action")
        handle.stop()
        assert handle.wait(timeout=60).ok
