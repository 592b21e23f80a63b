"""Records created once per key (``_listener/records.py``), and the mailbox a keyed start keeps by one."""

from __future__ import annotations

from typing import Any

from conductor_agents._listener import mailbox, records
from conductor_agents._listener.head import read_mailbox
from conductor_agents.errors import ExecutionNotFoundError


class RecordServer:
    """The server's create-once start as far as records need it: the first start of a key makes the run, every
    later one gets that run back; plus the calls a mailbox's opening makes."""

    def __init__(self) -> None:
        self.records: "dict[str, dict[str, Any]]" = {}
        self.ended: "list[str]" = []
        self.started: "list[str]" = []
        self.terminated: "list[str]" = []
        self.poll_rows: "dict[str, str]" = {}

    def start_agent(self, body: "dict[str, Any]") -> "dict[str, Any]":
        execution_id = records.record_id(body["agentConfig"]["name"], body["idempotencyKey"])
        self.records.setdefault(execution_id, dict(body["context"]))
        return {"executionId": execution_id}

    def get_workflow(self, execution_id: str, include_tasks: bool = False) -> "dict[str, Any]":
        if execution_id not in self.records:
            raise ExecutionNotFoundError(execution_id, execution_id=execution_id)
        return {"input": {"context": self.records[execution_id]}}

    def cancel_agent(self, execution_id: str, reason: str) -> None:
        self.ended.append(execution_id)

    # -- a mailbox's opening
    def register_definitions(self, task_defs: Any, workflow_defs: Any) -> None:
        pass

    def start_workflow(self, body: "dict[str, Any]") -> str:
        self.started.append(f"00000000-0000-4000-8000-{len(self.started):012d}")
        return self.started[-1]

    def terminate_workflow(self, execution_id: str, reason: str) -> None:
        self.terminated.append(execution_id)

    def mark_presence(self, task_type: str, *, worker_id: str, domain: str) -> None:
        self.poll_rows[task_type] = worker_id

    def poll_data(self, task_type: str) -> "list[dict[str, Any]]":
        row = self.poll_rows.get(task_type)
        return [{"workerId": row}] if row else []


def no_pause(seconds: float) -> bool:
    return False


def test_the_first_start_of_a_key_makes_the_record_and_every_later_one_reads_it():
    server = RecordServer()
    first = records.create_once(server, "agent_x", "k:1", {"says": "a"}, prompt="p", pause=no_pause)
    second = records.create_once(server, "agent_x", "k:1", {"says": "b"}, prompt="p", pause=no_pause)
    assert first.created_here and not second.created_here
    assert first.execution_id == second.execution_id == records.record_id("agent_x", "k:1")
    assert first.context["says"] == second.context["says"] == "a"
    assert server.ended == [first.execution_id]  # ended once read back, by its creator only
    other = records.create_once(server, "agent_x", "k:2", {"says": "c"}, prompt="p", pause=no_pause)
    assert other.created_here and other.execution_id != first.execution_id


def test_a_record_that_cannot_be_read_back_says_nothing(monkeypatch):
    server = RecordServer()
    monkeypatch.setattr(records.time, "sleep", lambda seconds: None)
    monkeypatch.setattr(server, "get_workflow", lambda *a, **k: (_ for _ in ()).throw(
        ExecutionNotFoundError("unknown", execution_id="x")))
    record = records.create_once(server, "agent_x", "k:1", {"says": "a"}, prompt="p", pause=no_pause)
    assert record.context is None and not record.created_here and server.ended == []


def test_two_keyed_opens_of_one_listener_keep_the_mailbox_the_record_names():
    server = RecordServer()
    boxes = mailbox.Mailboxes(server, pause=no_pause)
    first = boxes.open("run1", "listener", human_wait=True, keyed=True)
    server.poll_rows.clear()  # the second start found nothing written down (it looked before the first wrote)
    second = mailbox.Mailboxes(server, pause=no_pause).open("run1", "listener", human_wait=True, keyed=True)
    kept, other = server.started
    assert first == second == kept
    assert server.terminated == [other]
    assert read_mailbox(server, "run1") == kept


def test_an_open_without_a_key_makes_no_record():
    server = RecordServer()
    opened = mailbox.Mailboxes(server, pause=no_pause).open("run2", "listener", human_wait=True)
    assert server.started == [opened] and server.records == {} and read_mailbox(server, "run2") == opened
