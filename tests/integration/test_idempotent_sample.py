"""samples/idempotent_tool.py: a worker SIGKILLed after its tool's side effect, before the result was
posted; after resume() the call comes again with attempt 2 and the same key, and one row exists."""

from __future__ import annotations

import os
import re
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from conductor_agents.testing import ToolCall

pytestmark = pytest.mark.integration

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_the_killed_and_resumed_tool_writes_one_row(agent_settings, scripted_llm, tmp_path):
    model = scripted_llm.script(policy=lambda request: "Payment recorded." if request.tool_outputs else
                                ToolCall("record_payment", {"order_id": "A-1", "amount": 42.5}))
    db = tmp_path / "payments.db"
    env = {**os.environ, "CONDUCTOR_SERVER_URL": agent_settings.server_url, "CONDUCTOR_AGENT_MODEL": model,
           "PYTHONUNBUFFERED": "1"}
    result = subprocess.run([sys.executable, "samples/idempotent_tool.py", "--remote", "--db", str(db)],
                            cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300)
    out = result.stdout
    assert result.returncode == 0, out + result.stderr

    child_pid = re.search(r"killed child (\d+) \(SIGKILL\)", out).group(1)
    deliveries = re.findall(r"\[pid (\d+)\] record_payment attempt (\d+) key (\S+)", out)
    assert [(pid == child_pid, attempt) for pid, attempt, _ in deliveries] == [(True, "1"), (False, "2")]
    assert deliveries[0][2] == deliveries[1][2]  # the same call: the same idempotency key
    assert "SIDE EFFECT DONE" in out and "run ended COMPLETED" in out and "payment rows: 1" in out

    with sqlite3.connect(db) as conn:  # the test's own look at the table
        rows = conn.execute("SELECT idempotency_key, order_id, amount, attempt, pid FROM payments").fetchall()
    assert rows == [(deliveries[0][2], "A-1", 42.5, 1, int(child_pid))]

    # What the model saw: one result, from the second delivery, saying the payment was already recorded.
    [request] = scripted_llm.requests_for(model)[1:]
    [output] = request.tool_outputs
    assert output.output == {"order_id": "A-1", "amount": 42.5, "receipt": deliveries[0][2], "already_recorded": True}
    scripted_llm.assert_no_anomalies(model)
