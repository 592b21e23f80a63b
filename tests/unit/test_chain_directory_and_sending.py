"""Unit tests for finding a continued listener's current run (_chain_directory) and sending to it
(_sending), against a fake server that keeps a chain of runs."""

import pytest

from conductor_agents._listener.carryover import CommitRecord
from conductor_agents._common.task_names import CARRY_TASK
from conductor_agents._listener.chain import LinkKey, continued_reason, parse_link_key
from conductor_agents._listener.directory import Chain, ChainDirectory, Link
from conductor_agents._listener.sending import send_to_listener
from conductor_agents.errors import ExecutionNotFoundError, ExecutionNotRunningError, ServerError
from tests.unit.fakes import FakeClock

RUN = "0123456789abcdef0123456789abcdef"
NAME = "listener"


class FakeChainServer:
    """Links 0..n of one listener; records every call; links can be continued and commits written."""

    def __init__(self, links=1):
        self.calls = []
        self.runs = {}  # execution id -> dict(status, reason, number, queue, carry)
        for number in range(links):
            self.add_link(number)
        self.on_push = None  # called (execution id) before a push is answered
        self.pushed = 0
        self.poll_rows = {}  # (task type, domain) -> worker id: the server's poll data

    def key(self, number):
        return LinkKey(RUN, number, NAME)

    def add_link(self, number, *, committed=True, pulled=()):
        execution_id = self.key(number).execution_id
        self.runs[execution_id] = {"status": "RUNNING", "reason": None, "number": number, "queue": [],
                                   "carry": None}
        if number > 0:
            previous = self.key(number - 1).execution_id
            self.runs[execution_id]["carry"] = (
                CommitRecord(text="t", previous=previous, link=number, pulled=tuple(pulled)).to_output()
                if committed else None)
        return execution_id

    def continue_link(self, number, *, pulled=(), committed=True):
        old = self.key(number).execution_id
        new = self.add_link(number + 1, committed=committed, pulled=pulled)
        self.runs[old].update(status="TERMINATED", reason=continued_reason(new))
        return new

    def retire(self, number):
        """Retention removed link ``number`` (it answers 404 from now on)."""
        del self.runs[self.key(number).execution_id]

    # -- the api -------------------------------------------------------------------------

    def mark_presence(self, task_type, worker_id, domain):
        self.calls.append(("poll", task_type))
        self.poll_rows[(task_type, domain)] = worker_id

    def poll_data(self, task_type):
        self.calls.append(("polldata", task_type))
        return [{"queueName": t, "domain": d, "workerId": w, "lastPollTime": 1}
                for (t, d), w in self.poll_rows.items() if t == task_type]

    def workflow_status(self, execution_id, include_variables=False):
        self.calls.append(("status", execution_id))
        run = self.runs.get(execution_id)
        if run is None:
            raise ExecutionNotFoundError("no such run", execution_id=execution_id)
        return {"workflowId": execution_id, "status": run["status"],
                "correlationId": self.key(run["number"]).key, "variables": {}}

    def agent_status(self, execution_id, timeout=None):
        run = self.runs[execution_id]
        return {"executionId": execution_id, "status": run["status"], "reasonForIncompletion": run["reason"]}

    def push_message(self, execution_id, body):
        self.calls.append(("push", execution_id))
        if self.on_push is not None:
            self.on_push(execution_id)
        run = self.runs[execution_id]
        if run["status"] != "RUNNING":
            raise ExecutionNotRunningError("not running", execution_id=execution_id)
        self.pushed += 1
        message_id = f"m{self.pushed}"
        run["queue"].append(message_id)
        return message_id

    def workflow_tasks(self, execution_id, start=0, count=15, statuses=()):
        from conductor_agents._wire.api import TaskPage
        run = self.runs[execution_id]
        tasks = []
        if run["number"] > 0:
            carry = run["carry"]
            tasks.append({"taskType": CARRY_TASK, "taskId": "carry", "status": "COMPLETED" if carry else "SCHEDULED",
                          "outputData": carry or {}})
        return TaskPage(total=len(tasks), tasks=tasks)


def directory_for(server, execution_id):
    directory = ChainDirectory(server)
    return directory, directory.chain(execution_id)


def test_a_chain_is_known_from_one_status_read_of_any_of_its_runs():
    server = FakeChainServer(links=3)
    directory, chain = directory_for(server, server.key(0).execution_id)
    assert (chain.run_id, chain.agent_name, chain.first, chain.continuable) == (RUN, NAME, 0, True)
    assert chain.link(2).execution_id == server.key(2).execution_id and len(server.calls) == 1
    _, later = directory_for(server, server.key(2).execution_id)
    assert later.first == 2


def test_a_run_that_is_not_ours_is_its_own_only_link():
    server = FakeChainServer()
    server.key = lambda number: type("K", (), {"key": "order-42"})()  # a caller's own correlation id
    directory, chain = directory_for(server, LinkKey(RUN, 0, NAME).execution_id)
    assert not chain.continuable and directory.refresh(chain) == Link(0, chain.execution_id)


def test_refresh_finds_the_newest_link_in_few_probes():
    server = FakeChainServer(links=1)
    for number in range(100):
        server.continue_link(number)
    directory, chain = directory_for(server, server.key(0).execution_id)
    server.calls.clear()
    assert directory.refresh(chain).number == 100
    assert len(server.calls) <= 16  # gallop then halve: about 2 log2(100)
    server.calls.clear()
    # Nothing moved: one probe and one read of the head hint (the next link may be missing because
    # retention removed it, not because there is none).
    assert directory.refresh(chain).number == 100 and [kind for kind, _ in server.calls] == ["status", "polldata"]


def test_a_link_that_is_someone_elses_is_an_error():
    server = FakeChainServer(links=2)
    directory, chain = directory_for(server, server.key(0).execution_id)
    server.runs[server.key(1).execution_id]["number"] = 5  # the server knows that id as another link
    with pytest.raises(ServerError):
        directory.exists(chain, 1)


def send(server, directory, execution_id, **kwargs):
    clock = FakeClock()
    return send_to_listener(server, directory, execution_id, {"a": 1}, switch_wait=30, clock=clock,
                            pause=clock.advance, **kwargs)


def test_a_send_pushes_then_makes_one_small_probe():
    """The first send by a link's id also reads once whether the listener has a mailbox that takes every message
    (a listener that waits on a HUMAN task); later sends do not."""
    server = FakeChainServer()
    directory, chain = directory_for(server, server.key(0).execution_id)
    server.calls.clear()
    send(server, directory, chain.execution_id)
    assert [kind for kind, _ in server.calls] == ["polldata", "push", "status"]
    server.calls.clear()
    send(server, directory, chain.execution_id)
    assert [kind for kind, _ in server.calls] == ["push", "status"]


def test_a_send_to_a_continued_link_follows_to_the_newest():
    server = FakeChainServer()
    root = server.key(0).execution_id
    directory, chain = directory_for(server, root)
    server.continue_link(0)
    server.continue_link(1)
    accepted = []
    send(server, directory, root, on_accepted=lambda mid, link: accepted.append(link.number))
    assert accepted == [2] and server.runs[server.key(2).execution_id]["queue"]


def test_a_message_caught_in_a_switch_counts_once_the_record_says_it_was_pulled():
    server = FakeChainServer()
    root = server.key(0).execution_id
    directory, chain = directory_for(server, root)

    def switch_meanwhile(execution_id):  # the switch begins just as the message arrives
        server.on_push = None
        server.add_link(1, pulled=("m1",))
    server.on_push = switch_meanwhile
    accepted = []
    assert "m1" == send(server, directory, root, on_accepted=lambda mid, link: accepted.append(link.number))
    assert accepted == [0]


def test_a_message_dropped_by_a_switch_is_sent_again_to_the_new_run():
    server = FakeChainServer()
    root = server.key(0).execution_id
    directory, chain = directory_for(server, root)

    def switch_meanwhile(execution_id):
        server.on_push = None
        server.add_link(1, pulled=())  # the old run ended without pulling it
    server.on_push = switch_meanwhile
    accepted = []
    send(server, directory, root, on_accepted=lambda mid, link: accepted.append(link.number))
    assert accepted == [0, 1] and len(server.runs[server.key(1).execution_id]["queue"]) == 1


def test_a_listener_that_ended_refuses_the_message():
    server = FakeChainServer()
    root = server.key(0).execution_id
    directory, chain = directory_for(server, root)
    server.runs[root].update(status="COMPLETED")
    with pytest.raises(ExecutionNotRunningError):
        send(server, directory, root)


class WaitingLinkServer(FakeChainServer):
    """Link 0 waits on a pull whose evaluations this test counts; link 1 exists (a switch under way) with no commit
    yet. ``evaluate`` is how many evaluations each read of link 0's tasks finds since the last one."""

    def __init__(self, *, waiting=True, evaluate=0):
        super().__init__(1)
        self.add_link(1, committed=False)
        self.count = 1
        self.waiting = waiting
        self.evaluate = evaluate
        self.task_reads = 0
        self.on_task_read = None

    def workflow_tasks(self, execution_id, start=0, count=15, statuses=()):
        from conductor_agents._wire.api import TaskPage
        if execution_id != self.key(0).execution_id or not statuses:
            return super().workflow_tasks(execution_id, start, count, statuses)
        self.task_reads += 1
        if self.on_task_read is not None:
            self.on_task_read(self.task_reads)
        self.count += self.evaluate
        wait = {"taskType": "PULL_WORKFLOW_MESSAGES", "taskId": "pull-1", "status": "IN_PROGRESS",
                "pollCount": self.count}
        return TaskPage(total=1, tasks=[wait] if self.waiting else [])


def test_a_message_caught_in_a_switch_while_the_old_run_waits_counts_once_its_wait_was_evaluated_twice_since():
    server = WaitingLinkServer(evaluate=1)
    directory, chain = directory_for(server, server.key(0).execution_id)
    server.runs[server.key(1).execution_id]["carry"] = None
    accepted = []
    send(server, directory, chain.execution_id, on_accepted=lambda mid, link: accepted.append(link.number))
    assert accepted == [0] and server.task_reads == 3  # the first look, then two evaluations later: pulled


def test_a_message_caught_in_a_switch_while_the_old_run_is_busy_counts_at_once():
    """Busy when it accepted the message: its next wait is scheduled later and pops it first."""
    server = WaitingLinkServer(waiting=False)
    directory, chain = directory_for(server, server.key(0).execution_id)
    accepted = []
    send(server, directory, chain.execution_id, on_accepted=lambda mid, link: accepted.append(link.number))
    assert accepted == [0] and server.task_reads == 1


def test_a_message_a_slow_switch_drops_long_after_the_push_is_sent_again():
    """A loaded server: the old run's wait is not evaluated again, and the switch's terminate lands well over ten
    seconds after the push, the message still in the queue it drops. The sender waited for the evidence (it used
    to count the message as pulled once the run had run ten seconds more), so it sends it again."""
    server = WaitingLinkServer(evaluate=0)
    directory, chain = directory_for(server, server.key(0).execution_id)

    def slow_switch(reads):
        if reads == 80:  # 20 s of looks at a quarter second each
            server.runs[server.key(0).execution_id].update(status="TERMINATED",
                                                           reason=continued_reason(server.key(1).execution_id))
            server.runs[server.key(1).execution_id]["carry"] = CommitRecord(
                text="t", previous=server.key(0).execution_id, link=1, pulled=()).to_output()
    server.on_task_read = slow_switch
    accepted = []
    send(server, directory, chain.execution_id, on_accepted=lambda mid, link: accepted.append(link.number))
    assert accepted == [0, 1] and len(server.runs[server.key(1).execution_id]["queue"]) == 1
