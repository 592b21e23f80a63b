"""Unit tests for listeners that wait on a HUMAN task (issue 42): how the wait is sent and recognised, and the
mailbox forward's hand-over (in order, in batches, exactly once across a crash, never to a link being continued)."""

import threading

import pytest

from conductor_agents import AgentSettings
from conductor_agents._common.task_names import MESSAGE_WAIT_MARK, is_message_wait
from conductor_agents._listener import mailbox
from conductor_agents._listener.chain import is_human_wait_key, mailbox_key, parse_mailbox_key
from conductor_agents._listener.directory import ChainDirectory
from conductor_agents._listener.parking import PARK_SECONDS, JoinParker, _Watch
from conductor_agents._listener.switch import as_human_wait
from conductor_agents._people.pending import PendingRequest
from conductor_agents.errors import ConfigurationError, ToolRetry
from tests.helpers import eventually
from tests.unit.fakes import FakeClock
from tests.unit.test_chain_directory_and_sending import NAME, RUN, FakeChainServer

MAILBOX = "5e1d0c2b-9a51-4d1b-8f35-0d6e2a7c9b11"


def wait_task(link, number):
    return {"taskType": "HUMAN", "taskId": f"wait-{link[:6]}-{number}", "status": "IN_PROGRESS",
            "referenceTaskName": f"call_{number}", "workflowInstanceId": link,
            "inputData": {"_description": f"Wait for the next message. {MESSAGE_WAIT_MARK}"}}


class HumanWaitServer(FakeChainServer):
    """A listener whose links wait on a HUMAN task: the newest one waits (``waiting``) until completed; each
    completion is kept as a COMPLETED task, and the link waits again after ``turns`` looks (a model turn)."""

    def __init__(self, links=1):
        super().__init__(links)
        self.waiting = {self.key(n).execution_id: 0 for n in range(links)}  # link -> looks until it waits again
        self.handed = []  # (link, [message ids]) in order
        self.completed = {}  # link -> [completed wait tasks]
        self.turn_looks = 0
        self.updates = []

    def workflow_status(self, execution_id, include_variables=False):
        if execution_id == MAILBOX:
            return {"workflowId": MAILBOX, "status": "RUNNING",
                    "correlationId": mailbox_key(RUN, NAME, human_wait=True)}
        return super().workflow_status(execution_id, include_variables)

    def workflow_tasks(self, execution_id, start=0, count=15, statuses=()):
        from conductor_agents._wire.api import TaskPage
        if execution_id not in self.runs:
            from conductor_agents.errors import ExecutionNotFoundError
            raise ExecutionNotFoundError("gone", execution_id=execution_id)
        if statuses == ("COMPLETED",):
            done = self.completed.get(execution_id, [])
            return TaskPage(total=len(done), tasks=done[start:start + count])
        looks = self.waiting.get(execution_id)
        if looks is None or self.runs[execution_id]["status"] != "RUNNING":
            return TaskPage(total=0, tasks=[])
        if looks > 0:
            self.waiting[execution_id] = looks - 1
            return TaskPage(total=0, tasks=[])
        number = len(self.completed.get(execution_id, []))
        join = {"taskType": "JOIN", "taskId": f"join-{number}", "status": "IN_PROGRESS",
                "workflowInstanceId": execution_id}
        return TaskPage(total=2, tasks=[wait_task(execution_id, number), join])

    def update_task(self, result):
        self.updates.append(result)
        if not str(result["taskId"]).startswith("wait-"):
            return
        link = result["workflowInstanceId"]
        assert self.waiting.get(link) == 0, "a wait completed while the listener was busy"
        ids = [m["id"] for m in result["outputData"]["messages"]]
        self.handed.append((link, ids))
        task = {**wait_task(link, len(self.completed.get(link, []))), "status": "COMPLETED",
                "outputData": result["outputData"]}
        self.completed.setdefault(link, []).append(task)
        self.waiting[link] = self.turn_looks

    def terminate_workflow(self, execution_id, reason):
        self.terminated = (execution_id, reason)

    def get_task(self, task_id):
        if task_id.startswith("wait-"):
            done = any(t["taskId"] == task_id for ts in self.completed.values() for t in ts)
            return {"taskId": task_id, "status": "COMPLETED" if done else "IN_PROGRESS"}
        parks = [u["callbackAfterSeconds"] for u in self.updates if u["taskId"] == task_id]
        return {"taskId": task_id, "status": "IN_PROGRESS", "callbackAfterSeconds": parks[-1] if parks else 0,
                "pollCount": 7, "workflowInstanceId": self.key(0).execution_id}


def join_callbacks(server):
    return [u.get("callbackAfterSeconds") for u in server.updates if u["taskId"].startswith("join")]


def envelopes(*ids):
    return [{"id": i, "workflowId": MAILBOX, "payload": {"action": i}} for i in ids]


IDS = tuple(f"{n:08x}-0000-4000-8000-0000000000{n:02x}" for n in range(1, 8))


def hand_over(server, messages, *, batch_size=1, clock=None):
    clock = clock or FakeClock()
    directory = ChainDirectory(server)
    return mailbox.hand_over(server, directory, directory.chain(MAILBOX), messages, batch_size=batch_size,
                             worker_id="test", clock=clock, pause=clock.advance)


def test_the_wait_is_sent_as_a_marked_human_tool_and_recognised_as_a_wait_not_a_question():
    pull = {"name": "wait_for_message", "description": "Wait.", "toolType": "pull_workflow_messages",
            "config": {"batchSize": 3}}
    sent = as_human_wait(pull)
    assert sent["toolType"] == "human" and sent["description"] == f"Wait. {MESSAGE_WAIT_MARK}"
    assert as_human_wait({"name": "act", "toolType": "worker"}) == {"name": "act", "toolType": "worker"}
    task = wait_task("run", 0)
    assert is_message_wait(task) and is_message_wait({"taskType": "PULL_WORKFLOW_MESSAGES"})
    question = {**task, "inputData": {"_description": "Ask a person.", "question": "Ship it?"}}
    assert not is_message_wait(question) and not is_message_wait({"taskType": "SIMPLE"})
    assert PendingRequest.from_task(task, "run") is None  # never listed as a request to a person
    assert PendingRequest.from_task(question, "run") is not None


def test_the_mailbox_key_says_which_wait_its_listener_has():
    for human in (True, False):
        key = mailbox_key(RUN, NAME, human_wait=human)
        assert is_human_wait_key(key) is human
        assert (parse_mailbox_key(key).run_id, parse_mailbox_key(key).agent_name) == (RUN, NAME)
    assert ChainDirectory(HumanWaitServer()).chain(MAILBOX).human_wait


def test_the_setting_takes_pull_or_human_only():
    assert AgentSettings().listener_wait in ("pull", "human")
    assert AgentSettings.from_env({"CONDUCTOR_AGENT_LISTENER_WAIT": " Human "}).listener_wait == "human"
    with pytest.raises(ConfigurationError, match="CONDUCTOR_AGENT_LISTENER_WAIT"):
        AgentSettings.from_env({"CONDUCTOR_AGENT_LISTENER_WAIT": "poll"})
    with pytest.raises(ConfigurationError, match="listener_wait"):
        AgentSettings(listener_wait="parked")


def test_messages_are_handed_in_order_in_batches_one_wait_at_a_time():
    server = HumanWaitServer()
    server.turn_looks = 3  # the listener is busy for a few looks after each wait
    assert hand_over(server, envelopes(*IDS), batch_size=3) == {"forwarded": 7}
    link = server.key(0).execution_id
    assert server.handed == [(link, list(IDS[:3])), (link, list(IDS[3:6])), (link, [IDS[6]])]


def test_a_delivery_after_a_crash_skips_what_a_completed_wait_holds():
    server = HumanWaitServer()
    server.turn_looks = 10_000  # busy for good after the first wait: the task is handed back
    with pytest.raises(ToolRetry):
        hand_over(server, envelopes(*IDS[:4]), batch_size=2)
    assert [ids for _, ids in server.handed] == [list(IDS[:2])]
    server.waiting[server.key(0).execution_id] = 0  # it waits again; the same task comes back
    server.turn_looks = 0
    assert hand_over(server, envelopes(*IDS[:4]), batch_size=2) == {"forwarded": 4}
    assert [ids for _, ids in server.handed] == [list(IDS[:2]), list(IDS[2:4])]


def test_a_crash_between_the_mark_and_the_completion_hands_the_marked_message_once():
    server = HumanWaitServer()
    mailbox._write_mark(server, RUN, IDS[1])  # marked, never completed (the process died in between)
    server.handed.append(("earlier", [IDS[0]]))
    server.completed[server.key(0).execution_id] = [
        {**wait_task(server.key(0).execution_id, 0), "status": "COMPLETED",
         "outputData": {"messages": envelopes(IDS[0]), "count": 1}}]
    assert hand_over(server, envelopes(*IDS[:3])) == {"forwarded": 3}
    assert [ids for _, ids in server.handed[1:]] == [[IDS[1]], [IDS[2]]]


class DiedBeforeTheNudge(HumanWaitServer):
    """A forward completed the wait holding ``IDS[0]`` (``call_0``), then its process died before it nudged the join
    around that wait, which it had parked: the join stays in progress, parked, until something nudges it."""

    def __init__(self):
        super().__init__()
        link = self.key(0).execution_id
        self.stuck = {"taskType": "JOIN", "taskId": "join-0", "status": "IN_PROGRESS", "workflowInstanceId": link,
                      "inputData": {"joinOn": ["call_0"]}}
        mailbox._write_mark(self, RUN, IDS[0])
        self.completed[link] = [{**wait_task(link, 0), "status": "COMPLETED",
                                 "outputData": {"messages": envelopes(IDS[0]), "count": 1}}]
        self.updates.append({"taskId": "join-0", "callbackAfterSeconds": PARK_SECONDS})  # the dead process's park

    def workflow_tasks(self, execution_id, start=0, count=15, statuses=()):
        if statuses == ("IN_PROGRESS",) and self.stuck is not None:
            from conductor_agents._wire.api import TaskPage
            return TaskPage(total=1, tasks=[self.stuck])  # the listener is not waiting: its join holds it
        return super().workflow_tasks(execution_id, start, count, statuses)

    def update_task(self, result):
        if result["taskId"] == "join-0" and result.get("callbackAfterSeconds") == 0:
            self.stuck = None  # due: the join ends, the listener's next turn comes and it waits again
        super().update_task(result)


def test_a_delivery_after_a_crash_between_the_completion_and_the_nudge_wakes_the_parked_join():
    """Without the nudge the answered listener would wait out the park (an hour): the next delivery of the forward
    finds the marked message in a completed wait, nudges the join around it and has it looked at again."""
    server = DiedBeforeTheNudge()
    clock = FakeClock()
    answered = []
    directory = ChainDirectory(server)
    assert mailbox.hand_over(server, directory, directory.chain(MAILBOX), envelopes(*IDS[:2]), batch_size=1,
                             worker_id="test", clock=clock, pause=clock.advance,
                             answered=answered.append) == {"forwarded": 2}
    assert [u["callbackAfterSeconds"] for u in server.updates if u["taskId"] == "join-0"] == [PARK_SECONDS, 0]
    # join-0 woken by the later delivery; join-1, around the wait it then completed, looked at again although it
    # read unparked (a park sent by a process killed since can hold its queue message: nothing here undid it)
    assert [join["taskId"] for join in answered] == ["join-0", "join-1"]
    assert [ids for _, ids in server.handed] == [[IDS[1]]]  # the completed wait's message is not handed twice


def test_a_listener_being_continued_gets_nothing_until_its_new_run_waits():
    server = HumanWaitServer()
    server.add_link(1)  # a switch began: link 1 exists and does not wait yet; link 0 still waits
    server.waiting[server.key(1).execution_id] = 10_000
    with pytest.raises(ToolRetry, match="busy"):
        hand_over(server, envelopes(IDS[0]))
    assert server.handed == []  # never the old link's wait: the switch may be ending it


def test_an_ended_listener_reports_what_it_did_not_take():
    server = HumanWaitServer()
    server.runs[server.key(0).execution_id]["status"] = "COMPLETED"
    assert hand_over(server, envelopes(*IDS[:2])) == {"end": True, "forwarded": 0, "undelivered": list(IDS[:2])}
    assert server.terminated[0] == MAILBOX  # ended by the SDK, with its reason: not taken for an end from outside


def test_a_join_is_parked_while_its_wait_waits_and_nudged_after_the_wait_is_answered_never_parked_after():
    server = HumanWaitServer()
    clock = FakeClock()
    parker = JoinParker(server, worker_id="test", stopping=threading.Event(), clock=clock)
    link = server.key(0).execution_id
    watch = _Watch(until=clock.monotonic() + 60, run_id=RUN)
    assert parker._step(link, watch) is False  # found waiting: parked, read back twice later
    assert [u["callbackAfterSeconds"] for u in server.updates] == [PARK_SECONDS]
    assert parker._step(link, watch) is False and parker._step(link, watch) is False  # held: looked at again
    assert parker._step(link, watch) is False and parker.parked == 1  # trusted: looked at now and then while it waits
    assert watch.due == clock.monotonic() + 30.0
    assert parker._step(link, watch) is False and watch.due == clock.monotonic() + 60.0  # then at doubling gaps
    assert parker._step(link, watch) is False and watch.due == clock.monotonic() + 120.0
    # The forward answers the wait, then nudges the parked join: due at once.
    assert hand_over(server, envelopes(IDS[0])) == {"forwarded": 1}
    assert join_callbacks(server) == [PARK_SECONDS, 0]
    # A park that comes after the answer (the parker raced the forward) is not sent: it would hold the listener.
    late = _Watch(until=clock.monotonic() + 60, run_id=RUN, join={"taskId": "join-0", "workflowInstanceId": link},
                  wait_id="wait-" + link[:6] + "-0")
    assert parker._park(late, clock.monotonic()) is True
    assert join_callbacks(server) == [PARK_SECONDS, 0]


def test_a_join_whose_park_an_evaluation_overwrote_on_the_task_is_nudged_all_the_same():
    """The server's evaluation and a park both write the queue, then the task: the task may read the evaluation's
    callback while the queue holds the park. The forward nudges a join this process parked whatever the task says."""
    server = HumanWaitServer()
    clock = FakeClock()
    parker = JoinParker(server, worker_id="test", stopping=threading.Event(), clock=clock)
    link = server.key(0).execution_id
    parker._step(link, _Watch(until=clock.monotonic() + 60, run_id=RUN))
    server.updates.append({"taskId": "join-0", "callbackAfterSeconds": 0})  # the evaluation's write, last
    directory = ChainDirectory(server)
    assert mailbox.hand_over(server, directory, directory.chain(MAILBOX), envelopes(IDS[0]), batch_size=1,
                             worker_id="test", clock=clock, pause=clock.advance,
                             parked_here=parker.sent_park) == {"forwarded": 1}
    nudges = [u for u in server.updates if u["taskId"] == "join-0" and u.get("workerId") == "test"]
    assert [u["callbackAfterSeconds"] for u in nudges] == [PARK_SECONDS, 0]


def parker_threads():
    return [t for t in threading.enumerate() if t.name == "conductor-agents-join-parker"]


def test_an_ended_link_is_forgotten_and_the_parker_thread_ends_once_nothing_is_left():
    """A watched link that ended (a stop, a switch) costs no further request, nor do the later looks at its answered
    waits' joins; with nothing left to look at, the thread ends; the next watch starts one again."""
    server = HumanWaitServer()
    link = server.key(0).execution_id
    server.waiting[link] = 10**9  # busy in a turn for good: without the forget, looked at every quarter second
    looks = []
    polled = server.workflow_tasks
    server.workflow_tasks = lambda *a, **kw: (looks.append(a[0]), polled(*a, **kw))[1]
    stopping = threading.Event()
    parker = JoinParker(server, worker_id="test", stopping=stopping, clock=FakeClock())  # no check ever comes due
    others = set(parker_threads())  # other tests' parkers (an xdist worker runs many), ending on their own

    def mine() -> list:
        return [t for t in parker_threads() if t not in others]

    assert mine() == []
    try:
        parker.watch(link, RUN)
        parker.answered({"taskId": "join-0", "workflowInstanceId": link})
        eventually(lambda: len(looks) >= 2, timeout=10, message="the busy link looked at")
        parker.forget(link)
        eventually(lambda: not mine(), timeout=10, message="the parker thread ended")
        before = len(looks)
        stopping.wait(1.0)  # four looks' worth: none comes
        assert len(looks) == before
        assert [u for u in server.updates if u["taskId"] == "join-0"] == []  # its answered join: not nudged
        parker.watch(link, RUN)
        eventually(lambda: len(looks) > before and mine(), timeout=10, message="a new watch looked at")
    finally:
        stopping.set()


def test_a_closed_parker_ends_its_thread_at_once_and_starts_no_other():
    """The parker's thread ends with its runtime: ``close`` stops and joins it while it watches a busy link; a watch
    after that starts no thread (a runtime closed, or a fork's parent)."""
    server = HumanWaitServer()
    link = server.key(0).execution_id
    server.waiting[link] = 10**9  # busy in a turn for good: the thread keeps looking
    parker = JoinParker(server, worker_id="test", stopping=threading.Event())
    before = parker_threads()
    parker.watch(link, RUN)
    started = [t for t in parker_threads() if t not in before]
    assert len(started) == 1
    parker.close(timeout=10)
    assert not started[0].is_alive()
    parker.watch(link, RUN)
    parker.answered({"taskId": "join-0", "workflowInstanceId": link})
    assert [t for t in parker_threads() if t not in before] == []  # (other tests' parkers may have ended meanwhile)


def test_a_park_that_held_at_the_first_look_is_looked_at_again_and_parked_again_when_undone():
    """On a loaded server an evaluation already under way can write the join (and its queue message) after the first
    look found the park holding: the parker looks once more a few seconds later and parks it again."""
    server = HumanWaitServer()
    clock = FakeClock()
    parker = JoinParker(server, worker_id="test", stopping=threading.Event(), clock=clock)
    link = server.key(0).execution_id
    watch = _Watch(until=clock.monotonic() + 600, run_id=RUN)

    def step() -> bool:
        clock.advance(max(0.0, watch.due - clock.monotonic()))
        return parker._step(link, watch)

    assert parker._step(link, watch) is False  # parked
    assert step() is False  # the count read back
    assert step() is False  # held at the first look: looked at again later
    assert parker.parked == 0
    server.updates.append({"taskId": "join-0", "callbackAfterSeconds": 0})  # the late evaluation's write
    assert step() is False  # undone: parked again
    parks = [u["callbackAfterSeconds"] for u in server.updates if u.get("workerId") == "test"]
    assert parks == [PARK_SECONDS, PARK_SECONDS]
    for _ in range(10):
        step()
        if parker.parked:
            break
    assert parker.parked == 1
    # Trusted, then undone later still (on the cluster an evaluation came after the looks above): the slow look
    # finds it and parks it again at once; counted once.
    assert step() is False and len(server.updates) == 3  # 30 s later: still held, nothing sent
    server.updates.append({"taskId": "join-0", "callbackAfterSeconds": 0})
    assert step() is False
    parks = [u["callbackAfterSeconds"] for u in server.updates if u.get("workerId") == "test"]
    assert parks == [PARK_SECONDS, PARK_SECONDS, PARK_SECONDS]
    for _ in range(10):
        step()
    assert parker.parked == 1 and watch.held_looks >= 2


def test_the_next_turn_watches_the_next_wait_while_the_previous_park_is_still_looked_at():
    """A trusted park is looked at every half-minute while its wait waits; the model turn after its answer begins a
    watch of the next wait, which is parked in turn (the old watch stood in for it, and the next wait's join went
    unparked: evaluated at the server's pace for as long as it waited)."""
    server = HumanWaitServer()
    clock = FakeClock()
    parker = JoinParker(server, worker_id="test", stopping=threading.Event(), clock=clock)
    link = server.key(0).execution_id
    parker._start_locked = lambda: None  # the test steps the watches itself
    parker.watch(link, RUN)

    def step() -> bool:
        watch = parker._watched[link]
        clock.advance(max(0.0, watch.due - clock.monotonic()))
        return parker._step(link, watch)

    for _ in range(4):
        step()
    assert parker.parked == 1 and parker._watched[link].join["taskId"] == "join-0"
    assert hand_over(server, envelopes(IDS[0])) == {"forwarded": 1}  # answered; the next turn begins
    parker.watch(link, RUN)
    assert step() is False  # the next wait found and its join parked
    assert [u["taskId"] for u in server.updates if u.get("callbackAfterSeconds") == PARK_SECONDS] == [
        "join-0", "join-1"]


def test_a_watch_whose_request_failed_is_kept_and_parks_the_join_later(monkeypatch):
    """A read that timed out on a loaded server dropped the watch, and the wait's join went unparked for as long as
    it waited (the server's own pace). The watch is kept and looked at again a little later."""
    from conductor_agents._listener import parking
    from conductor_agents.errors import ServerUnavailableError

    monkeypatch.setattr(parking, "_AFTER_FAILURE", 0.05, raising=False)
    server = HumanWaitServer()
    failures = [ServerUnavailableError("GET /workflow/x/tasks: the server did not answer in time (ReadTimeout)")]
    tasks = server.workflow_tasks

    def flaky_tasks(*args, **kwargs):
        if failures:
            raise failures.pop()
        return tasks(*args, **kwargs)
    server.workflow_tasks = flaky_tasks
    stopping = threading.Event()
    parker = JoinParker(server, worker_id="test", stopping=stopping)
    try:
        parker.watch(server.key(0).execution_id, RUN)
        eventually(lambda: PARK_SECONDS in join_callbacks(server), timeout=10, message="the join parked after all")
        assert failures == []
    finally:
        parker.close(timeout=10)


def test_serving_a_link_that_waits_on_a_human_task_watches_its_wait_though_its_first_turn_came_first():
    """The run's domain is polled from its start, and its mailbox is opened before the driver serves it: on a loaded
    machine the first turn's task was handled first, found nothing served, and the first wait's join was never
    parked (the server evaluated it every second, ``pollCount`` 300 in two minutes). Serving the link watches it."""
    from conductor_agents import Agent
    from conductor_agents._listener.directory import Chain, Link
    from conductor_agents._listener.driver import ContinuationDriver
    from conductor_agents._listener.switch import LinkSpec
    from conductor_agents.continuation import Continuation

    class Directory:
        def advance(self, chain, link):
            pass

    link = "0b7a5c1e-2f3d-4e5a-8b6c-7d8e9f0a1b2c"
    driver = ContinuationDriver(object(), Directory(), worker_id="w",  # type: ignore[arg-type]
                                locally_busy=lambda _: False)
    watched = []
    driver.parker.watch = lambda execution_id, run_id: watched.append((execution_id, run_id))  # type: ignore
    try:
        driver.on_turn(link, 1)  # before it is served: nothing known of it
        assert watched == []
        for human_wait in (False, True):
            spec = LinkSpec(Agent(name=NAME, model="openai/x"), "go", Continuation(max_turns=4),
                            human_wait=human_wait)
            driver.serve(Chain(link, RUN, NAME, 0), spec, Link(0, link), turns_before=0,
                         handle_link=lambda on, execution_id: None)
        assert watched == [(link, RUN)]  # the pull listener's wait is the server's: nothing to park
    finally:
        driver.close()
