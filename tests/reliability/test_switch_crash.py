"""Crashes inside a continuation: the serving process is SIGKILLed at each step of a switch, a new one
resumes the listener by its first id, and there is one live run, no orphaned second one, and every
message acted on exactly once (issue 18)."""

from __future__ import annotations

import collections
import logging
import os
import re
import time

import attrs

import pytest
import requests

from conductor_agents import AgentRuntime, Continuation, RunStatus
from conductor_agents._listener.chain import is_abandoned, is_continued
from conductor_agents._listener.directory import ChainDirectory
from conductor_agents.testing import ToolCall, listener_policy

from ..helpers import eventually, listener as make_listener
from .crash_child import FileActionTools, read_actions
from .support import Child, kill_all

pytestmark = pytest.mark.reliability


def act_on(payload: dict) -> ToolCall:
    return ToolCall("act", {"action": payload["action"], "tag": payload.get("tag", "")})


def chain_state(base: str, runtime: AgentRuntime, execution_id: str) -> "list[tuple[str, str, str]]":
    """(execution id, status, reason) of every link of the listener the server still holds (retention
    removes older ended ones), first to newest, from the server."""
    directory = ChainDirectory(runtime._api)
    chain = directory.chain(execution_id)
    newest = directory.refresh(chain)
    links = []
    for number in range(chain.first, newest.number + 1):
        link = chain.link(number).execution_id
        response = requests.get(f"{base}/agent/{link}/status", timeout=10)
        if response.status_code == 404:
            continue  # retired
        status = response.json()
        links.append((link, status.get("status"), status.get("reasonForIncompletion")))
    return links


def send_until_the_child_crashes(child: Child, sender: AgentRuntime, execution_id: str, log: str,
                                 sent: "list[str]", where: str = "") -> None:
    """Send the listener one message at a time (``before-<n>``, appended to ``sent``), each acted on
    before the next, until the child's first switch kills it (60 s at most)."""
    deadline = time.monotonic() + 60
    while child.proc.poll() is None:
        assert time.monotonic() < deadline, f"the child did not crash{where}: {child.stderr_tail()}"
        sent.append(f"before-{len(sent)}")
        sender.send_message(execution_id, {"action": sent[-1], "tag": "before"})
        eventually(lambda: len(read_actions(log)) >= len(sent) or child.proc.poll() is not None,
                   timeout=30, interval=0.05, message="the message acted on, or the crash")


def turn_limit(base: str, execution_id: str) -> "int | None":
    """The most turns run ``execution_id`` may take, from its compiled loop on the server; None once it is retired."""
    flow = requests.get(f"{base}/workflow/{execution_id}", params={"includeTasks": "false"}, timeout=10)
    if flow.status_code == 404:
        return None  # retired (retention)
    flow.raise_for_status()
    (limit,) = set(re.findall(r"_loop\['iteration'\] < (\d+)", flow.text))
    return int(limit)


@pytest.mark.parametrize("step", ["started", "terminated", "committed"])
def test_a_crash_at_each_step_of_a_switch_leaves_one_live_run(agent_settings, scripted_llm, unique_name, tmp_path,
                                                              step):
    base = agent_settings.server_url
    model = scripted_llm.script(policy=listener_policy(act_on))
    name = unique_name("switchcrash")
    log = str(tmp_path / "actions.jsonl")
    child = Child(["--server-url", base, "--name", name, "--model", model, "--log", log, "--start",
                   "--continue-every", "2", "--crash-at", step], stderr_path=str(tmp_path / "child.err"))
    sent: "list[str]" = []
    try:
        execution_id = child.read_info(timeout=60)["execution_id"]
        with AgentRuntime(agent_settings) as sender:
            send_until_the_child_crashes(child, sender, execution_id, log, sent, f" at {step}")
            assert f"killed after the switch step {step}" in child.stderr_tail()
            for i in range(3):  # while nobody serves the listener
                sent.append(f"orphaned-{i}")
                sender.send_message(execution_id, {"action": sent[-1], "tag": "orphaned"})
    finally:
        kill_all([child])

    tools = FileActionTools(log)
    with AgentRuntime(agent_settings) as resumer:
        handle = resumer.resume(execution_id, make_listener(name, model, tools, batch_size=5,
                                                            continuation=Continuation(max_turns=2)), force=True)
        assert handle.execution_id == execution_id
        eventually(lambda: len(read_actions(log)) >= len(sent), timeout=90, interval=0.2,
                   message=f"all {len(sent)} messages acted on")
        counts = collections.Counter(a["action"] for a in read_actions(log))
        assert sorted(counts) == sorted(sent) and set(counts.values()) == {1}, counts

        handle.stop()
        assert handle.wait(timeout=60).status is RunStatus.COMPLETED
        # No orphaned run: every link before the completed one was continued, one completed, none runs.
        # A stop that lands while a switch is under way completes the old link, and the switch is then
        # abandoned: its new link, the newest, is terminated as such.
        links = chain_state(base, resumer, execution_id)
        statuses = [status for _, status, _ in links]
        assert statuses.count("COMPLETED") == 1, links
        done = statuses.index("COMPLETED")
        assert all(s == "TERMINATED" and is_continued(r) for _, s, r in links[:done]), links
        assert all(s == "TERMINATED" and is_abandoned(r) for _, s, r in links[done + 1:]), links
        assert handle.current_execution_id == links[done][0]  # where it ended, not an abandoned switch's run
        assert len(links) - done <= 2, links
        assert requests.get(f"{base}/workflow/running/{name}", timeout=10).json() == []


def test_a_crash_mid_switch_under_serve_leaves_one_live_run_adopted_with_its_identity(
        agent_settings, scripted_llm, unique_name, tmp_path, caplog):
    """A serving child starts a listener and is SIGKILLed right after its first switch started the new
    run (both runs live, the switch half done). This process serves the same agent: it adopts the
    listener once, by its first id, finishes the switch (one live run), acts on every message once,
    and the later links' turn budget counts the turns before the crash."""
    base = agent_settings.server_url
    serving = attrs.evolve(agent_settings, liveness_stall_seconds=6.0, liveness_check_interval_seconds=1.0)
    model = scripted_llm.script(policy=listener_policy(act_on))
    name = unique_name("adoptswitch")
    log = str(tmp_path / "actions.jsonl")
    agent = make_listener(name, model, FileActionTools(log), batch_size=5, continuation=Continuation(max_turns=2))
    adopted: list = []
    caplog.set_level(logging.INFO, logger="conductor_agents")  # the take-up's own lines, should it fail
    with AgentRuntime(serving) as adopter:
        adopter.serve(agent, on_adopt=adopted.append)
        child = Child(["--server-url", base, "--name", name, "--model", model, "--log", log, "--serve",
                       "--starts", "1", "--continue-every", "2", "--crash-at", "started", "--stall-seconds", "6"],
                      stderr_path=str(tmp_path / "child.err"))
        sent: "list[str]" = []
        try:
            execution_id = child.read_info(timeout=60)["execution_ids"][0]
            send_until_the_child_crashes(child, adopter, execution_id, log, sent)
            died = time.monotonic()
            assert "killed after the switch step started" in child.stderr_tail()
        finally:
            kill_all([child])
        eventually(lambda: adopted, timeout=6.0 + 10, interval=0.1, message="the listener adopted")
        took = time.monotonic() - died
        assert [h.execution_id for h in adopted] == [execution_id], adopted  # once, by its first id
        handle = adopted[0]
        for i in range(6):  # a few more switches, served here
            sent.append(f"after-{i}")
            adopter.send_message(execution_id, {"action": sent[-1], "tag": "after"})

        def state() -> str:
            waiting = {link: [(t.get("referenceTaskName"), t.get("status"), t.get("workerId"))
                              for t in adopter._api.workflow_tasks(link, statuses=("IN_PROGRESS", "SCHEDULED"),
                                                                  start=0, count=20).tasks]
                       for link, status, _ in chain_state(base, adopter, execution_id) if status == "RUNNING"}
            said = [f"{r.name}: {r.getMessage()}" for r in caplog.records
                    if any(word in r.getMessage() for word in ("adopt", "resumed", "switch", "commit", "continu"))][-20:]
            return f"acted on {read_actions(log)}; links {chain_state(base, adopter, execution_id)}; " \
                   f"waiting tasks {waiting}; this process said {said}"

        # Bound: the switch the dead child began is finished here once its old run comes to rest, at worst
        # after the drain bound (continuation_drain_seconds, 60 s), then every message is a turn or two.
        eventually(lambda: len(read_actions(log)) >= len(sent), timeout=150, interval=0.2,
                   message=f"all {len(sent)} messages acted on", explain=state)
        counts = collections.Counter(a["action"] for a in read_actions(log))
        assert sorted(counts) == sorted(sent) and set(counts.values()) == {1}, counts
        assert {a["pid"] for a in read_actions(log) if a["tag"] == "after"} == {os.getpid()}
        # One live run once any switch under way is done (a switch runs both links for a moment), read with each
        # link's turn limit and the first link held, all in one view: retention retires ended links in the
        # background after each commit, so a link listed can be gone when its limit is read (seen in a full run).
        def settled():
            listed = chain_state(base, adopter, execution_id)
            if [s for _, s, _ in listed].count("RUNNING") != 1:
                return None
            limits = [turn_limit(base, link) for link, _, _ in listed]
            chain = ChainDirectory(adopter._api).chain(execution_id)
            first = chain.link(chain.first).execution_id
            if None in limits or chain_state(base, adopter, execution_id) != listed:
                return None  # retention moved meanwhile: read again
            return listed, limits, first

        links, limits, first = eventually(settled, timeout=30, interval=0.2, message="one live run")
        print(f"\nadopted {took:.1f}s after the crash; links' turn limits {limits}")
        # The budget is the listener's: each link may take what the ones before it left (10,000 in all). Retention
        # may have removed the first links by now (it keeps the newest ended ones): only link 0 has it all.
        first_held = links[0][0] == first
        assert (limits[0] == 10_000) == first_held and limits[0] <= 10_000, (limits, first_held)
        assert all(a > b for a, b in zip(limits, limits[1:])), limits
        status = handle.status()  # (retention may have removed the oldest ended links: runs counts them all)
        assert adopted == [handle] and status.current_execution_id == links[-1][0] and status.runs >= len(links)
        handle.stop()
        assert handle.wait(timeout=60).status is RunStatus.COMPLETED
    assert requests.get(f"{base}/workflow/running/{name}", timeout=10).json() == []
