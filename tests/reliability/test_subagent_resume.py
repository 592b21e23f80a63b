"""A stateful team whose process dies inside a sub-agent's tool: resume() in a new process reclaims the
task from the sub-run and the run completes there."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading

import pytest

from conductor_agents import Agent, AgentRuntime, RunStatus, Strategy, tool
from conductor_agents.testing import ToolCall

from ..helpers import eventually

pytestmark = pytest.mark.reliability


class FileLookup:
    """A sub-agent's tool that writes each call to a shared file (fsync'ed), and may hang inside."""

    def __init__(self, log_path: str, *, hang: bool = False) -> None:
        self.log_path = log_path
        self.hang = hang
        self.lock = threading.Lock()

    @tool
    def lookup(self, key: str) -> dict:
        """Look a key up."""
        with self.lock, open(self.log_path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps({"key": key, "pid": os.getpid()}) + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        if self.hang:
            threading.Event().wait(300)  # bounded; the test SIGKILLs this process long before
        return {"key": key, "pid": os.getpid()}


def team(names: dict, models: dict, tools: FileLookup) -> Agent:
    specialist = Agent(name=names["specialist"], model=models["specialist"], tools=[tools.lookup],
                       description="looks things up")
    other = Agent(name=names["other"], model=models["other"], description="never asked")
    return Agent(name=names["parent"], model=models["parent"], stateful=True, agents=[specialist, other],
                 strategy=Strategy.HANDOFF)


def read_log(path: str) -> "list[dict]":
    try:
        with open(path, encoding="utf-8") as fh:
            return [json.loads(line) for line in fh if line.strip()]
    except FileNotFoundError:
        return []


CHILD = textwrap.dedent(
    """
    import json, sys, threading
    sys.path.insert(0, {root!r})
    from conductor_agents import AgentRuntime, AgentSettings
    from tests.reliability.test_subagent_resume import FileLookup, team
    with AgentRuntime(AgentSettings(server_url={url!r})) as runtime:
        handle = runtime.start(team({names!r}, {models!r}, FileLookup({log!r}, hang=True)), "Look up the key k-1.")
        print(json.dumps({{"execution_id": handle.execution_id, "worker_id": runtime.worker_id}}), flush=True)
        threading.Event().wait(240)
    """
)


def test_a_killed_sub_agent_tool_is_reclaimed_and_the_tree_completes(agent_settings, scripted_llm, unique_name,
                                                                    tmp_path):
    """SIGKILL inside a sub-agent's tool: resume(force=True) hands the sub-run's task back and runs it here."""
    names = {role: unique_name(role) for role in ("parent", "specialist", "other")}

    def coordinator(request):
        if "Based on the work done" in (request.instructions or ""):
            return "final answer"
        return "DONE" if f"[{names['specialist']}]:" in request.user_text else names["specialist"]

    def specialist(request):
        if request.is_first_turn:
            return ToolCall("lookup", {"key": "k-1"})
        [out] = request.tool_outputs
        return f"found by {out.output['pid']}"

    models = {"parent": scripted_llm.script(policy=coordinator), "specialist": scripted_llm.script(policy=specialist),
              "other": scripted_llm.script(["never asked"])}
    log = str(tmp_path / "lookups.jsonl")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    code = CHILD.format(root=root, url=agent_settings.server_url, names=names, models=models, log=log)
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stdin=subprocess.DEVNULL,
                             text=True)
    try:
        info = json.loads(child.stdout.readline())
        execution_id = info["execution_id"]
        eventually(lambda: read_log(log), timeout=90, interval=0.05, message="the child entered the tool")
        child.kill()
        child.wait(timeout=10)
        with AgentRuntime(agent_settings) as runtime:
            handle = runtime.resume(execution_id, team(names, models, FileLookup(log)), force=True)
            result = handle.wait(timeout=120)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(timeout=10)
    assert result.status is RunStatus.COMPLETED, result.error
    assert [(entry["key"], entry["pid"]) for entry in read_log(log)] == [("k-1", child.pid), ("k-1", os.getpid())]
    assert result.agents_run == (names["specialist"],)
    # The model saw only the second delivery's result: the task was handed back, not failed.
    seen = [o.output for r in scripted_llm.requests_for(models["specialist"]) for o in r.tool_outputs]
    assert seen == [{"key": "k-1", "pid": os.getpid()}]


def test_an_unpolled_sub_agent_tool_is_a_stall_and_resume_completes_the_tree(agent_settings, scripted_llm,
                                                                           unique_name, tmp_path):
    """Nobody serves the team: the sub-run's tool task waits unpolled on the run's domain, wait() raises
    WorkerStallError naming it; resume() from a runtime with workers completes the run."""
    import attrs

    from conductor_agents import WorkerStallError

    names = {role: unique_name(role) for role in ("parent", "specialist", "other")}

    def coordinator(request):
        if "Based on the work done" in (request.instructions or ""):
            return "final answer"
        return "DONE" if f"[{names['specialist']}]:" in request.user_text else names["specialist"]

    def specialist(request):
        if request.is_first_turn:
            return ToolCall("lookup", {"key": "k-2"})
        return "found"

    models = {"parent": scripted_llm.script(policy=coordinator), "specialist": scripted_llm.script(policy=specialist),
              "other": scripted_llm.script(["never asked"])}
    log = str(tmp_path / "lookups.jsonl")
    settings = attrs.evolve(agent_settings, auto_start_workers=False, liveness_stall_seconds=3.0,
                            liveness_check_interval_seconds=0.5)
    with AgentRuntime(settings) as no_workers:
        handle = no_workers.start(team(names, models, FileLookup(log)), "Look up k-2.")
        with pytest.raises(WorkerStallError) as info:
            handle.wait(timeout=90)
    assert info.value.domain == handle.run_id
    assert info.value.task_reference_name.startswith("call_")  # the sub-agent's lookup call
    with AgentRuntime(agent_settings) as live:
        result = live.resume(handle.execution_id, team(names, models, FileLookup(log))).wait(timeout=120)
    assert result.status is RunStatus.COMPLETED, result.error
    assert [entry["key"] for entry in read_log(log)] == ["k-2"]
