"""``conductor-agents serve MODULE:AGENT`` end to end (issue 19): it adopts a closed process's listener,
acts on its messages, and on SIGTERM hands the run over and exits 0."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import attrs
import pytest

from conductor_agents import AgentRuntime, RunStatus
from conductor_agents.testing import listener_policy

from ..helpers import eventually
from ..integration.test_stateful_listener import act_on
from .crash_child import FileActionTools, listener, read_actions
from .support import ROOT

pytestmark = pytest.mark.reliability

AGENT_MODULE = """\
import os
from tests.reliability.crash_child import FileActionTools, listener
agent = listener(os.environ["T_NAME"], os.environ["T_MODEL"], FileActionTools(os.environ["T_LOG"]))
"""


def test_cli_serve_adopts_acts_and_hands_over_on_sigterm(agent_settings, scripted_llm, unique_name, tmp_path):
    settings = attrs.evolve(agent_settings, liveness_stall_seconds=6.0, liveness_check_interval_seconds=1.0)
    model = scripted_llm.script(policy=listener_policy(act_on))
    name = unique_name("cliserve")
    log = str(tmp_path / "actions.jsonl")
    (tmp_path / "served_agent.py").write_text(AGENT_MODULE)
    env = {**os.environ, "PYTHONPATH": ROOT, "T_NAME": name, "T_MODEL": model, "T_LOG": log,
           "CONDUCTOR_AGENT_LIVENESS_STALL_SECONDS": "6"}
    first = AgentRuntime(settings)
    first.serve(listener(name, model, FileActionTools(log)))
    handle = first.start(listener(name, model, FileActionTools(log)), "Start listening.")
    stderr = open(tmp_path / "cli.err", "wb")
    cli = subprocess.Popen([sys.executable, "-m", "conductor_agents", "serve", str(tmp_path / "served_agent.py:agent"),
                            "--server-url", settings.server_url], env=env, stdin=subprocess.DEVNULL,
                           stdout=subprocess.DEVNULL, stderr=stderr, cwd=ROOT)
    try:
        eventually(lambda: b"serving" in (tmp_path / "cli.err").read_bytes(), timeout=60, message="the CLI serves")
        first.close()  # hands the listener over: the CLI adopts it
        with AgentRuntime(settings) as other:
            other.send_message(handle.execution_id, {"action": "m1"})
            eventually(lambda: read_actions(log), timeout=60, interval=0.1, message="the CLI acted on m1")
            assert read_actions(log)[0]["pid"] == cli.pid

            last = AgentRuntime(settings)
            adopted = []
            last.serve(listener(name, model, FileActionTools(log)), on_adopt=adopted.append)
            time.sleep(2)
            assert adopted == []  # the CLI is present: nothing to adopt
            cli.send_signal(signal.SIGTERM)
            assert cli.wait(timeout=60) == 0
            assert b"handed over" in (tmp_path / "cli.err").read_bytes()
            eventually(lambda: adopted, timeout=15, interval=0.05, message="handed over to the last runtime")
            other.send_message(handle.execution_id, {"action": "m2"})
            eventually(lambda: len(read_actions(log)) == 2, timeout=60, interval=0.1, message="m2 acted on")
            assert [(a["action"], a["pid"]) for a in read_actions(log)] == [("m1", cli.pid), ("m2", os.getpid())]
            other.attach(handle.execution_id).stop()
            assert other.attach(handle.execution_id).wait(timeout=60).status is RunStatus.COMPLETED
            last.close()
    finally:
        if cli.poll() is None:
            cli.kill()
            cli.wait(10)
        stderr.close()
        first.close()
