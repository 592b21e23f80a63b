"""Unit tests for people in the loop across a switch: a request held by the run a switch drains is listed
and answered by any id of the listener (``_listener.by_id``, ``_people.approvals``), and ``on_pending``
follows the listener's runs (``_people.pending_watch``). Against a fake server that keeps a chain of runs
whose tasks a test sets."""

import copy

import pytest

from conductor_agents import AgentSettings
from conductor_agents._listener.chain import continued_reason
from conductor_agents._listener.directory import ChainDirectory
from conductor_agents._people import approvals
from conductor_agents._people.approvals import holder, pending_of_runs
from conductor_agents._people.pending import PendingRequest
from conductor_agents._people.pending_watch import PendingMonitor
from conductor_agents._listener.by_id import RunsById, people_runs
from conductor_agents.errors import AnswerConflictError, ExecutionNotRunningError, NothingPendingError
from tests.unit.fakes import FakeClock
from tests.unit.test_chain_directory_and_sending import FakeChainServer

APPROVAL_REF = "ops_approval_human__2"


def approval(task_id="h1", ref=APPROVAL_REF, seq=9):
    return {"taskId": task_id, "taskType": "HUMAN", "status": "IN_PROGRESS", "seq": seq, "startTime": 1000,
            "referenceTaskName": ref, "inputData": {
                "response_schema": {}, "tool_calls": [{"name": "deploy", "inputParameters": {"version": "v2"}}]}}


def question(task_id="q1", ref="call_1_0__2", seq=12):
    return {"taskId": task_id, "taskType": "HUMAN", "status": "IN_PROGRESS", "seq": seq, "referenceTaskName": ref,
            "inputData": {"_agent_tool_name": "ask", "question": "Which colour?", "response_schema": {}}}


class FakePeopleServer(FakeChainServer):
    """A chain of runs with task lists; answers complete HUMAN tasks the way the server routes on them."""

    def __init__(self, links=2):
        self.tasks = {}
        self.updates = []
        super().__init__(links=links)

    def add_link(self, number, **kwargs):
        execution_id = super().add_link(number, **kwargs)
        self.tasks[execution_id] = []
        return execution_id

    def run(self, number):
        return self.key(number).execution_id

    def get_workflow(self, execution_id, include_tasks=False):
        self.calls.append(("workflow", execution_id))
        run = self.runs[execution_id]
        return {"workflowId": execution_id, "status": run["status"], "tasks": copy.deepcopy(self.tasks[execution_id])}

    def agent_status(self, execution_id, timeout=None):
        status = super().agent_status(execution_id)
        human = [t for t in self.tasks[execution_id] if t["taskType"] == "HUMAN" and t["status"] == "IN_PROGRESS"]
        if human and status["status"] == "RUNNING":
            status.update(isWaiting=True, pendingTool={"response_schema": {}})
        return status

    def update_task(self, body):
        self.updates.append(body)
        execution_id = body["workflowInstanceId"]
        task = next(t for t in self.tasks[execution_id] if t["taskId"] == body["taskId"])
        if task["status"] != "IN_PROGRESS" or self.runs[execution_id]["status"] != "RUNNING":
            return  # the server ignores an update of a finished task
        output = body["outputData"]
        task.update(status="COMPLETED", outputData=output)
        ref = task["referenceTaskName"]
        if "_approval_human" in ref:
            base, _, turn = ref.rpartition("__")
            extra = {k: v for k, v in output.items() if k not in ("approved", "reason")}
            self.tasks[execution_id].append({
                "taskId": f"p-{task['taskId']}", "taskType": "INLINE", "status": "COMPLETED", "seq": task["seq"] + 1,
                "referenceTaskName": f"{base}_process__{turn}",
                "outputData": {"result": {"approved": output["approved"], "reason": output.get("reason"),
                                          "extra": extra}}})
        else:
            self.tasks[execution_id].append({"taskId": f"j-{task['taskId']}", "taskType": "JOIN",
                                             "status": "COMPLETED", "seq": task["seq"] + 1,
                                             "outputData": {ref: output}})

    def end_switch(self):
        """The switch came to rest: link 0 ended, continued as link 1."""
        self.runs[self.run(0)].update(status="TERMINATED", reason=continued_reason(self.run(1)))


class ByAnyId:
    """RunsById's verbs as a handle calls them: with the chain the directory knows the id by."""

    def __init__(self, server):
        self.directory = ChainDirectory(server)
        self.runs = RunsById(server, self.directory, AgentSettings.from_env(environ={}), FakeClock())

    def __getattr__(self, verb):
        method = getattr(self.runs, verb)
        return lambda execution_id, *args, **kwargs: method(execution_id, *args,
                                                             chain=self.directory.chain(execution_id), **kwargs)


def by_id(server):
    return ByAnyId(server)


def test_a_request_held_by_the_run_a_switch_drains_is_listed_and_answered_by_any_id_of_the_listener():
    """The old run waits for an approval while the new one exists: pending() by the first id and by the new
    run's id lists it once; approve() by the first id completes the old run's task, once; a second
    approve() is told that nothing waits and who answered last."""
    server = FakePeopleServer(links=2)
    server.tasks[server.run(0)] = [approval()]
    verbs = by_id(server)
    for execution_id in (server.run(0), server.run(1)):
        [request] = verbs.pending(execution_id)
        assert (request.execution_id, request.task_id, request.kind) == (server.run(0), "h1", PendingRequest.APPROVAL)
    answer = verbs.approve(server.run(0), reason=None, by="ann", request=None, timeout=5)
    assert (answer.execution_id, answer.approved, answer.answered_by) == (server.run(0), True, "ann")
    assert [(u["workflowInstanceId"], u["taskId"]) for u in server.updates] == [(server.run(0), "h1")]
    assert verbs.pending(server.run(1)) == ()
    with pytest.raises(NothingPendingError) as nothing:
        verbs.reject(server.run(1), "no", by="bob", request=None, timeout=5)
    assert nothing.value.last_answer.answer_id == answer.answer_id and "by ann" in str(nothing.value)
    assert len(server.updates) == 1  # never applied twice


def test_a_late_answer_to_a_named_request_is_told_who_won_after_the_switch_came_to_rest():
    """The old run took an answer and ended (continued): an answer naming the request (its reference name,
    or the PendingRequest) by the first id gets AnswerConflictError with the winner, and sends nothing."""
    server = FakePeopleServer(links=2)
    server.tasks[server.run(0)] = [approval()]
    verbs = by_id(server)
    [request] = verbs.pending(server.run(0))
    won = verbs.approve(server.run(0), reason=None, by="ann", request=request, timeout=5)
    server.end_switch()
    for named in (APPROVAL_REF, request):
        with pytest.raises(AnswerConflictError) as late:
            verbs.reject(server.run(0), "no", by="bob", request=named, timeout=5)
        assert late.value.winner.answer_id == won.answer_id and late.value.winner.answered_by == "ann"
    with pytest.raises(NothingPendingError):  # unnamed: nothing waits in the current run
        verbs.approve(server.run(1), reason=None, by="bob", request=None, timeout=5)
    assert len(server.updates) == 1


def test_an_ended_run_is_read_only_for_an_answer_that_names_a_request():
    """pending() and an unnamed answer read the task list of live runs only (an ended run's status is
    enough to skip it); a named request also looks at the run before."""
    server = FakePeopleServer(links=2)
    server.end_switch()
    directory = ChainDirectory(server)
    assert people_runs(server, directory, server.run(0)) == (server.run(1),)
    assert people_runs(server, directory, server.run(0), request="x") == (server.run(0), server.run(1))
    server.runs[server.run(0)]["status"] = "RUNNING"  # a switch under way
    assert people_runs(server, directory, server.run(1)) == (server.run(0), server.run(1))
    server.calls.clear()
    assert by_id(server).pending(server.run(1)) == ()
    assert [c for c in server.calls if c[0] == "workflow"] == [("workflow", server.run(0)), ("workflow", server.run(1))]
    server.end_switch()
    server.continue_link(1)  # two switches later, a PendingRequest still names the run that held it
    old = PendingRequest(execution_id=server.run(0), kind="approval", task_id="h1", task_reference_name=APPROVAL_REF)
    assert people_runs(server, directory, server.run(2), request=old) == (server.run(0), server.run(1), server.run(2))
    assert people_runs(server, directory, server.run(2)) == (server.run(2),)
    server.calls.clear()
    assert by_id(server).pending(server.run(2)) == ()
    assert [c for c in server.calls if c[0] == "workflow"] == [("workflow", server.run(2))]


def test_a_run_that_is_not_a_listener_is_its_own_only_run():
    server = FakePeopleServer(links=1)
    server.key = lambda number, key=server.key: type("K", (), {"key": "order-42",
                                                                "execution_id": key(number).execution_id})()
    assert people_runs(server, ChainDirectory(server), server.run(0)) == (server.run(0),)


def test_the_run_an_answer_goes_to():
    """The oldest run holding a request of the answer's kind (or the named one); else one that waits for
    something else (it tells what); else the run where a named request was answered; else the current."""
    old, new = ("old", {"status": "RUNNING", "tasks": [question(), approval(seq=14)]}), ("new", {"tasks": []})
    assert holder([old, new], ("approval", "review"), None) is old
    assert holder([("old", {"tasks": []}), ("new", {"tasks": [question()]})], ("approval",), None)[0] == "new"
    assert holder([("old", {"tasks": []}), new], ("approval",), None) is new
    answered = ("old", {"status": "TERMINATED", "tasks": [dict(approval(), status="COMPLETED")]})
    assert holder([answered, new], ("approval",), APPROVAL_REF) is answered
    assert holder([answered, new], ("approval",), "h1") is answered
    assert holder([answered, new], ("approval",), "elsewhere") is new
    request = PendingRequest(execution_id="new", kind="approval", task_id="h9", task_reference_name="r")
    assert holder([old, new], ("approval",), request) is new  # a PendingRequest names its run


def test_each_request_is_listed_once_oldest_run_first():
    runs = [("old", {"status": "RUNNING", "tasks": [approval()]}),
            ("new", {"status": "RUNNING", "tasks": [question(), approval()]})]
    assert [(r.execution_id, r.task_id) for r in pending_of_runs(runs)] == [("old", "h1"), ("new", "q1")]


def test_the_agents_queue_lists_a_run_once_even_when_the_server_names_it_twice():
    server = FakePeopleServer(links=2)
    server.tasks[server.run(0)] = [approval()]
    server.running_workflow_ids = lambda name: [server.run(0), server.run(1), server.run(0)]
    assert [r.task_id for r in approvals.pending_of_agent(server, "ops")] == ["h1"]


def test_an_answer_sent_as_the_old_run_ends_is_not_taken_and_the_caller_is_told():
    """The old run was cancelled between the read and the update (its task never took the answer): the
    caller learns the run ended before it took an answer; nothing is taken twice or silently."""
    server = FakePeopleServer(links=2)
    server.tasks[server.run(0)] = [approval()]
    real_update = server.update_task

    def cancelled_first(body):
        server.runs[server.run(0)]["status"] = "TERMINATED"
        server.tasks[server.run(0)][0]["status"] = "CANCELED"
        real_update(body)

    server.update_task = cancelled_first
    with pytest.raises(ExecutionNotRunningError):
        by_id(server).approve(server.run(0), reason=None, by=None, request=None, timeout=5)


class Handle:
    execution_id = "first"


def test_on_pending_follows_the_listener_across_its_runs_and_reports_once():
    """A request of the run a switch drains is reported once (to the listener's handle); once that run
    ended and the current one holds nothing, nothing more; the listener is forgotten when its current run
    ends, not when a switch moved on between two looks."""
    server = FakePeopleServer(links=2)
    server.tasks[server.run(0)] = [approval()]
    runs = [server.run(0), server.run(1)]
    seen = []
    monitor = PendingMonitor(server, lambda handle, request: seen.append((handle.execution_id, request.task_id)),
                             interval=60.0, runs_of=lambda execution_id: tuple(runs))
    with monitor._lock:
        monitor._runs["first"] = Handle()
        monitor._reported["first"] = set()
    monitor.sample("first", Handle())
    monitor.sample("first", Handle())
    assert seen == [("first", "h1")]
    server.update_task({"workflowInstanceId": server.run(0), "taskId": "h1", "status": "COMPLETED",
                        "outputData": {"approved": True}})
    server.end_switch()
    runs[:] = [server.run(1)]
    monitor.sample("first", Handle())
    assert seen == [("first", "h1")] and monitor.watched == ("first",)
    server.runs[server.run(1)]["status"] = "TERMINATED"  # continued meanwhile: a newer run is found next time
    moved = iter([[server.run(1)], [server.run(2)]])
    monitor._runs_of = lambda execution_id: next(moved)
    server.add_link(2)
    monitor.sample("first", Handle())
    assert monitor.watched == ("first",)
    server.runs[server.run(2)]["status"] = "COMPLETED"
    monitor._runs_of = lambda execution_id: [server.run(2)]
    monitor.sample("first", Handle())
    assert monitor.watched == ()
    monitor.close()
