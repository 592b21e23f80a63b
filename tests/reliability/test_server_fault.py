"""A run the server failed because it could not write the tasks it decided is retried, and goes on.

Seen in the hour-long soak on the Redis cluster: at Redis restarts, four listeners ended FAILED ("Error scheduling
tasks: [...]": the server decided a turn's next tasks and Redis, loading its data, refused the write), and the
messages accepted for them were never acted on. Here the same failure is made on demand on the SQLite node: a trigger
in the server's own database refuses the row that schedules the listener's next tool call (only its first attempt,
and only in this run), so the server fails the run exactly as it did on Redis. The SDK retries the run (the server's
``POST /workflow/{id}/retry``); the tool runs, the message is acted on once, and the listener goes on.
"""

from __future__ import annotations

import contextlib
import logging
import sqlite3
import uuid
from collections.abc import Iterator

import attrs
import pytest

from conductor_agents import AgentRuntime, RunStatus
from conductor_agents._listener import parking
from conductor_agents._liveness import nudges
from conductor_agents.testing import listener_policy

from ..helpers import eventually, listener
from ..integration.test_stateful_listener import ActionTools, act_on
from .support import quiescent, workflow

pytestmark = pytest.mark.reliability


@contextlib.contextmanager
def scheduling_refused(server: object, execution_id: str) -> Iterator[None]:
    """The server cannot write the first attempt of a tool call's task in ``execution_id`` (its database refuses
    the row that schedules it, ``task_scheduled``; a retried task's key ends in ``_1`` and is let through)."""
    path = server.data_dir / "conductor.db"  # type: ignore[attr-defined]
    name = "refuse_" + execution_id.replace("-", "_")
    with contextlib.closing(sqlite3.connect(str(path), timeout=30)) as db:
        db.execute(f"CREATE TRIGGER {name} BEFORE INSERT ON task_scheduled "
                   f"WHEN NEW.workflow_id = '{execution_id}' AND NEW.task_key GLOB 'call_*_0' "
                   "BEGIN SELECT RAISE(ABORT, 'refused by the test'); END")
        db.commit()
        try:
            yield
        finally:
            db.execute(f"DROP TRIGGER IF EXISTS {name}")
            db.commit()


def acted_once_and_at_rest(handle: object, tools: ActionTools, base_url: str) -> str:
    """Send ``a0`` to the listener, wait until it acted on it and rests; the id of its current run."""
    handle.send_message({"action": "a0"})  # type: ignore[attr-defined]
    eventually(lambda: len(tools.actions) == 1, timeout=60, message="a0 acted on")
    eventually(lambda: quiescent(base_url, handle.execution_id), timeout=60,  # type: ignore[attr-defined]
               message="at rest")
    return str(handle.status().current_execution_id)  # type: ignore[attr-defined]


def explain_run(base_url: str, execution_id: str) -> str:
    run = workflow(base_url, execution_id)
    tasks = [f"{t.get('referenceTaskName')} {t.get('taskType')} {t.get('status')} {t.get('retryCount')}"
             for t in (run.get("tasks") or ())[-12:]]
    return f"{execution_id} {run.get('status')} {run.get('reasonForIncompletion')}: " + "; ".join(tasks)


def test_a_listener_the_server_failed_for_want_of_writing_its_tasks_is_retried_and_goes_on(
        agent_settings, scripted_llm, unique_name, conductor_server, caplog):
    caplog.set_level(logging.WARNING, logger="conductor_agents")
    model = scripted_llm.script(policy=listener_policy(act_on))
    tools = ActionTools("fault")
    settings = attrs.evolve(agent_settings, liveness_check_interval_seconds=1.0, continuation_enabled=False)
    with AgentRuntime(settings) as serving:
        handle = serving.start(listener(unique_name("fault"), model, tools), "Start listening.")
        run = acted_once_and_at_rest(handle, tools, settings.server_url)
        with scheduling_refused(conductor_server, run):
            handle.send_message({"action": "a1"})
            eventually(lambda: len(tools.actions) == 2, timeout=60,
                       message="a1 acted on (without the retry the listener ended FAILED and a1 was lost)",
                       explain=lambda: explain_run(settings.server_url, run) + "\n" + caplog.text[-3000:])
        assert "could not write the tasks it decided" in caplog.text  # the server did fail it: the retry was needed
        handle.send_message({"action": "a2"})
        eventually(lambda: len(tools.actions) == 3, timeout=60, message="a2 acted on")
        assert handle.status().status is RunStatus.RUNNING
        assert handle.status().current_execution_id == run  # the same run, retried (not a new one)
        assert [action for action, _ in tools.actions] == ["a0", "a1", "a2"]  # each once, in order
        handle.stop()
        assert handle.wait(timeout=60).status is RunStatus.COMPLETED


@contextlib.contextmanager
def model_call_leased_away(server: object, execution_id: str) -> Iterator[None]:
    """The next model call of ``execution_id`` is queued leased for an hour, as a node leaves it when a Redis restart
    drops the answer of its lease's write and it skips the call ("will retry on redelivery"): its queue message is
    made invisible as it is pushed (one message, this run only), the task stays SCHEDULED, never started."""
    path = server.data_dir / "conductor.db"  # type: ignore[attr-defined]
    name = "lease_" + execution_id.replace("-", "_")
    with contextlib.closing(sqlite3.connect(str(path), timeout=30)) as db:
        db.execute("CREATE TABLE IF NOT EXISTS test_fault_once (run TEXT PRIMARY KEY)")
        db.execute("INSERT OR IGNORE INTO test_fault_once (run) VALUES (?)", (execution_id,))
        uuid.UUID(execution_id)  # a trigger takes no parameters: the id is checked to be a run's id, nothing else
        db.execute(f"CREATE TRIGGER {name} AFTER INSERT ON queue_message "  # noqa: S608 (the id is checked above)
                   f"WHEN NEW.queue_name = 'LLM_CHAT_COMPLETE' "
                   f"AND EXISTS (SELECT 1 FROM test_fault_once WHERE run = '{execution_id}') "
                   f"AND NEW.message_id IN (SELECT task_id FROM task WHERE json_data LIKE '%{execution_id}%') "
                   "BEGIN UPDATE queue_message SET deliver_on = strftime('%Y-%m-%d %H:%M:%f', 'now', '+3600 seconds'), "
                   "popped = 1 WHERE queue_name = NEW.queue_name AND message_id = NEW.message_id; "
                   f"DELETE FROM test_fault_once WHERE run = '{execution_id}'; END")
        db.commit()
        try:
            yield
        finally:
            db.execute(f"DROP TRIGGER IF EXISTS {name}")
            db.execute("DELETE FROM test_fault_once WHERE run = ?", (execution_id,))
            db.commit()


def test_a_model_call_left_leased_and_never_started_is_made_due_again(agent_settings, scripted_llm, unique_name,
                                                                       conductor_server, caplog, monkeypatch):
    """Seen in the hour-long soak on the Redis cluster: at a Redis restart a node leased a listener's model call and
    dropped it (the lease's write took effect, its answer was lost); the call stayed SCHEDULED, never started, for the
    lease's hour, and the listener acted on nothing. A model call due long and never started (no start time, no poll:
    a node persists both before it calls the model) is made due again by the serving process. The bound is 45 s; here
    3 s, to keep the test short."""
    monkeypatch.setattr(nudges, "MODEL_UNSTARTED_SECONDS", 3.0)
    monkeypatch.setattr(parking, "MODEL_UNSTARTED_SECONDS", 3.0)
    monkeypatch.setattr(parking, "_LOOK_EVERY_MODEL", 2.0)
    caplog.set_level(logging.WARNING, logger="conductor_agents")
    model = scripted_llm.script(policy=listener_policy(act_on))
    tools = ActionTools("leased")
    with AgentRuntime(agent_settings) as serving:
        handle = serving.start(listener(unique_name("leased"), model, tools), "Start listening.")
        run = acted_once_and_at_rest(handle, tools, agent_settings.server_url)
        with model_call_leased_away(conductor_server, run):
            handle.send_message({"action": "a1"})
            eventually(lambda: len(tools.actions) == 2, timeout=60,
                       message="a1 acted on (without the nudge its model call waits out the hour's lease)",
                       explain=lambda: explain_run(agent_settings.server_url, run) + "\n" + caplog.text[-2000:])
        assert "was never started" in caplog.text  # the call was left leased: the nudge was needed
        handle.send_message({"action": "a2"})
        eventually(lambda: len(tools.actions) == 3, timeout=60, message="a2 acted on")
        assert [action for action, _ in tools.actions] == ["a0", "a1", "a2"]
        handle.stop()
        assert handle.wait(timeout=60).status is RunStatus.COMPLETED
