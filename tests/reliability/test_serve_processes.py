"""runtime.serve(agent) across real processes (issue 19): a SIGKILLed server is replaced, orphans are
spread, each run is served by exactly one process, and a SIGTERMed one hands its runs over."""

from __future__ import annotations

import signal
import time
from collections import Counter

import pytest

from conductor_agents.testing import listener_policy

from ..helpers import eventually, lease_owner, push_raw
from ..integration.test_stateful_listener import act_on
from .crash_child import read_actions
from .support import Child, kill_all, server_get

# On the cluster only, the production topology: its single-node twin cost a minute of the suite, and one node's
# adoption is proved by test_serve_adoption.py and test_fence.py.
pytestmark = [pytest.mark.reliability, pytest.mark.parametrize("topology", ["cluster"], indirect=True)]

STALL = 6.0
RUNS = 30


def _domain(base: str, execution_id: str) -> str:
    flow = server_get(base, f"/workflow/{execution_id}", includeTasks="false")
    (domain,) = set(flow["taskToDomain"].values())
    return domain


def _pollers(base: str) -> "dict[str, str]":
    return {row["domain"]: row["workerId"] for row in server_get(base, "/tasks/queue/polldata", taskType="act") or ()}


def _send(base: str, execution_id: str, action: str) -> None:
    push_raw(base, execution_id, {"action": action}, timeout=10).raise_for_status()


def _server(args, tmp_path, label):
    return Child([*args, "--serve", "--stall-seconds", str(STALL)], stderr_path=str(tmp_path / f"{label}.err"))


def test_three_processes_replace_a_killed_one_and_share_its_30_runs(agent_settings, scripted_llm, unique_name,
                                                                     tmp_path):
    base = agent_settings.server_url
    model = scripted_llm.script(policy=listener_policy(act_on))
    name = unique_name("adopt30")
    log = str(tmp_path / "actions.jsonl")
    common = ["--server-url", base, "--name", name, "--model", model, "--log", log]
    children = []
    try:
        starter = _server([*common, "--starts", str(RUNS)], tmp_path, "starter")
        children.append(starter)
        runs = starter.read_info(timeout=240)["execution_ids"]
        domains = {run: _domain(base, run) for run in runs}
        assert all(lease_owner(base, d, 0) == starter.info["worker_id"] for d in domains.values())

        servers = [_server(common, tmp_path, f"server{i}") for i in range(3)]  # started together
        children += servers
        workers = {s.read_info(timeout=60)["worker_id"]: s for s in servers}
        time.sleep(3 * STALL / 8)  # a few rounds: the starter is present, nothing is adopted
        assert all(lease_owner(base, d, 1) is None for d in domains.values())

        starter.kill()
        killed_at = time.monotonic()
        owners = {}

        def adopted_all():
            for run, domain in domains.items():
                if run not in owners:
                    owner = lease_owner(base, domain, 1)
                    if owner:
                        owners[run] = owner
            return len(owners) == RUNS

        eventually(adopted_all, timeout=STALL + 60, interval=0.2, message="every run adopted")
        took = time.monotonic() - killed_at
        print(f"\nSIGKILL -> all {RUNS} runs adopted: {took:.1f}s; shares {sorted(Counter(owners.values()).values())}")
        assert took < STALL + 10, took
        assert set(owners.values()) <= set(workers)
        share = Counter(owners.values())
        assert len(share) == 3 and min(share.values()) >= 3, share  # spread, not taken by the first to look
        assert all(lease_owner(base, d, 2) is None for d in domains.values())  # nobody took one a second time

        # Each run is polled by its owner, and acted on there, once.
        eventually(lambda: all(_pollers(base).get(domains[r]) == owners[r] for r in runs), timeout=60,
                   interval=0.5, message="each domain polled by its lease's owner")
        for run in runs:
            _send(base, run, f"first-{run}")
        eventually(lambda: len(read_actions(log)) >= RUNS, timeout=120, interval=0.2, message="all acted on")
        by_action = {a["action"]: a["pid"] for a in read_actions(log)}
        assert len(read_actions(log)) == RUNS and len(by_action) == RUNS
        for run in runs:
            assert by_action[f"first-{run}"] == workers[owners[run]].proc.pid

        # A graceful stop (SIGTERM) hands that process's runs to the two others within seconds.
        leaving_id, leaving = next(iter(workers.items()))
        its_runs = [r for r in runs if owners[r] == leaving_id]
        leaving.proc.send_signal(signal.SIGTERM)
        stopped_at = time.monotonic()
        leaving.proc.wait(timeout=60)
        assert leaving.proc.returncode == 0, leaving.stderr_tail()
        moved = {}

        def handed_over():
            for run in its_runs:
                owner = lease_owner(base, domains[run], 2)
                if owner:
                    moved[run] = owner
            return len(moved) == len(its_runs)

        eventually(handed_over, timeout=60, interval=0.1, message="its runs adopted by the others")
        print(f"SIGTERM -> its {len(its_runs)} runs adopted: {time.monotonic() - stopped_at:.1f}s")
        assert time.monotonic() - stopped_at < 5.0 + 30.0  # the close itself (tools finish), then adoption
        assert set(moved.values()) <= set(workers) - {leaving_id}
        for run in its_runs:
            _send(base, run, f"second-{run}")
        eventually(lambda: len(read_actions(log)) >= RUNS + len(its_runs), timeout=120, interval=0.2,
                   message="the moved runs acted on")
        actions = read_actions(log)
        assert len(actions) == RUNS + len(its_runs)
        pids = {a["action"]: a["pid"] for a in actions}
        for run in its_runs:
            assert pids[f"second-{run}"] == workers[moved[run]].proc.pid
    finally:
        kill_all(children)
