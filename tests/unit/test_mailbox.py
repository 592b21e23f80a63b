"""Unit tests for a listener's mailbox (_listener.mailbox): its definitions, and what a forward pushes on
a first delivery, after a crash (the mark) and once the listener has ended."""

import pytest

from conductor_agents._common.task_names import MAILBOX_REST_TASK, REST_SECONDS
from conductor_agents._listener import mailbox, sending
from conductor_agents._listener.directory import ChainDirectory
from conductor_agents._wire.transport import HttpError
from conductor_agents.errors import (
    ExecutionNotFoundError,
    ExecutionNotRunningError,
    RunPausedError,
    ServerUnavailableError,
)
from tests.unit.fakes import FakeClock
from tests.unit.test_retention import MAILBOX, RUN, MailboxServer, chain_of


def envelopes(*ids):
    return [{"id": i, "workflowId": MAILBOX, "payload": {"action": i}, "receivedAt": "2026-12-03T17:50:07.5Z"}
            for i in ids]


IDS = ("0a0a0a0a-0000-4000-8000-00000000000a", "0b0b0b0b-0000-4000-8000-00000000000b",
       "0c0c0c0c-0000-4000-8000-00000000000c")


@pytest.fixture
def pushes(monkeypatch):
    """The forward's pushes (the actions), in order; ``pushes.ended`` makes the listener refuse them."""
    class Pushes(list):
        ended = False
        paused = False

    done = Pushes()

    def send(api, directory, execution_id, body, **kwargs):
        if done.ended:
            raise ExecutionNotRunningError("ended", execution_id=execution_id)
        if done.paused:
            raise RunPausedError("paused", execution_id=execution_id)
        done.append(body["action"])
        return f"link-{len(done)}"

    monkeypatch.setattr(mailbox, "send_to_listener", send)
    return done


def forward(server, messages):
    clock = FakeClock()
    return mailbox._forward(server, ChainDirectory(server), MAILBOX, messages, switch_wait=30, clock=clock,
                            pause=clock.advance)


def test_the_round_pulls_without_blocking_then_forwards_or_rests_keeping_two_iterations():
    """Version 4: DO_WHILE (keepLastN 2) [non-blocking PULL of up to 100, SWITCH on its count and what the last
    forward holds: "0/0" or "0/null" rests, anything else forwards (the same SIMPLE task as versions 1 to 3, given
    what the last forward held and which one it was)]. The rest: a HUMAN task (nothing evaluates it), optional, timed
    out after a second: the next decide of the mailbox ends it and the round goes on."""
    task_defs, (workflow,) = mailbox.definitions()
    assert (workflow["name"], workflow["version"]) == (mailbox.MAILBOX_WORKFLOW, 4)
    (loop,) = workflow["tasks"]
    assert loop["type"] == "DO_WHILE" and loop["inputParameters"]["keepLastN"] == 2
    pull, switch = loop["loopOver"]
    assert (pull["type"], pull["inputParameters"]) == ("PULL_WORKFLOW_MESSAGES", {"batchSize": 100, "blocking": False})
    assert pull["inputParameters"]["blocking"] is False  # the server reads a Boolean, not "false"
    assert (switch["type"], switch["evaluatorType"], switch["expression"]) == ("SWITCH", "value-param", "taken")
    assert switch["inputParameters"] == {"taken": "${pull.output.count}/${forward.output.holding}"}
    assert set(switch["decisionCases"]) == {"0/0", "0/null"}  # the server writes a null as "null"
    (rest,) = switch["decisionCases"]["0/null"]
    (rest_after,) = switch["decisionCases"]["0/0"]  # the same rest under another name (a name is used once)
    assert {**rest_after, "taskReferenceName": "rest"} == rest
    assert (rest["type"], rest["name"], rest["optional"]) == ("HUMAN", MAILBOX_REST_TASK, True)
    rest_def = rest["taskDefinition"]
    assert (rest_def["timeoutSeconds"], rest_def["responseTimeoutSeconds"], rest_def["retryCount"],
            rest_def["timeoutPolicy"]) == (REST_SECONDS, REST_SECONDS, 0, "RETRY")
    (forward,) = switch["defaultCase"]
    assert forward["type"] == "SIMPLE" and task_defs[0]["name"] == forward["name"] == mailbox.FORWARD_TASK
    assert forward["inputParameters"] == {"messages": f"${{{pull['taskReferenceName']}.output.messages}}",
                                          "held": "${forward.output.held}", "held_by": "${forward.referenceTaskName}",
                                          "holds": True}
    # A round that rested has no forward of its own: the loop goes on unless the newest forward said "end".
    assert loop["loopCondition"] == "$.forward == null || $.forward['end'] != true"


LOOP = {"taskType": "DO_WHILE", "status": "IN_PROGRESS", "referenceTaskName": "loop", "taskId": "loop"}
FORWARD = {"taskType": "conductor_agents_forward", "status": "IN_PROGRESS", "referenceTaskName": "forward__3",
           "taskId": "forward"}
#: A pull the server is evaluating (it wrote its start first): it may have read the queue before the push.
PULL = {"taskType": "PULL_WORKFLOW_MESSAGES", "status": "SCHEDULED", "referenceTaskName": "pull__3", "taskId": "pull",
        "startTime": 1_700_000_000_000, "pollCount": 1}
#: A pull whose evaluation has not begun (a loaded server's system-task queue holds it): it reads the queue later.
PULL_NOT_BEGUN = {**PULL, "startTime": 0, "pollCount": 0}
WAIT = {"taskType": "WAIT", "taskDefName": MAILBOX_REST_TASK, "status": "IN_PROGRESS", "referenceTaskName": "rest__3",
        "taskId": "wait"}  # version 3's rest: the same name


def resting(started_ms: float, task_id: str = "rest") -> dict:
    return {"taskType": "HUMAN", "taskDefName": MAILBOX_REST_TASK, "status": "IN_PROGRESS",
            "referenceTaskName": "rest__3", "taskId": task_id, "startTime": started_ms}


class Mailbox:
    """The server as a wake sees a mailbox: its tasks in flight at each read (``frames``, the last one repeated),
    the decides and signals asked for, and what ``signal_wait`` answers."""

    def __init__(self, *frames, signals=(), clock=None):
        self.frames = [f if isinstance(f, Exception) else list(f) for f in frames] or [[LOOP]]
        self.signals = list(signals)
        self.clock = clock
        self.calls = []
        self.started = []
        self.reads = 0

    def workflow_tasks(self, execution_id, statuses=(), start=0, count=15):
        from conductor_agents._wire.api import TaskPage
        tasks = self.frames[min(self.reads, len(self.frames) - 1)]
        self.reads += 1
        if isinstance(tasks, Exception):
            raise tasks
        return TaskPage(total=len(tasks), tasks=[t for t in tasks if not statuses or t["status"] in statuses])

    def decide_workflow(self, execution_id):
        self.calls.append(("decide", execution_id, self.clock.time() if self.clock else None))

    def signal_wait(self, execution_id):
        self.calls.append(("signal", execution_id))
        return self.signals.pop(0)

    def register_definitions(self, task_defs, workflow_defs):
        self.calls.append(("register", workflow_defs[0]["version"]))

    def start_workflow(self, body):
        self.started.append(body)
        return "5e1d7c3a-0b2f-4e6a-9c8d-1a2b3c4d5e6f"

    def mark_presence(self, task_type, *, worker_id, domain):
        self.calls.append(("mark", worker_id))

    def poll_data(self, task_type):
        marks = [c[1] for c in self.calls if isinstance(c, tuple) and c[0] == "mark"]
        return [{"workerId": m} for m in marks]


def test_a_wake_that_finds_the_round_going_on_asks_for_nothing():
    """The common case: the server's decide after the push ended a rest over a second old, and its pull (or, for a
    busy listener, a forward, whose next pull follows) is in flight: one look, then the sender goes on."""
    clock = FakeClock()
    api = Mailbox([LOOP, FORWARD])
    assert mailbox.wake(api, MAILBOX, pause=clock.advance, clock=clock) is False
    assert (api.calls, api.reads, clock.monotonic()) == ([], 1, FakeClock().monotonic())
    api = Mailbox([LOOP, PULL], [LOOP, FORWARD])  # a pull first: looked at again until its forward shows
    assert mailbox.wake(api, MAILBOX, pause=clock.advance, clock=clock) is False
    assert (api.calls, api.reads) == ([], 2)


def test_a_pull_not_yet_begun_takes_the_message_so_the_wake_asks_for_nothing():
    """A pull still waiting in the server's system-task queue (no start written) reads the queue after the push."""
    clock = FakeClock()
    api = Mailbox([LOOP, PULL_NOT_BEGUN])
    assert mailbox.wake(api, MAILBOX, pause=clock.advance, clock=clock) is False
    assert (api.calls, api.reads, clock.monotonic()) == ([], 1, FakeClock().monotonic())


def test_a_rest_younger_than_a_second_is_ended_by_a_decide_once_it_has_rested_one():
    """A push within a second of the previous round: the rest was too young for the push's decide to end it, so the
    wake asks for a decide once it has rested a second (by its start on the server's clock, with 0.2 s margin)."""
    clock = FakeClock()
    started_ms = (clock.time() - 0.3) * 1000  # it began 0.3 s before the look
    api = Mailbox([LOOP, resting(started_ms)], [LOOP, PULL], clock=clock)
    t0 = clock.time()
    assert mailbox.wake(api, MAILBOX, pause=clock.advance, clock=clock) is True
    ((what, box, at),) = api.calls
    assert (what, box) == ("decide", MAILBOX) and at - t0 == pytest.approx(REST_SECONDS + 0.2 - 0.3)


def test_a_rest_a_decide_did_not_end_gets_one_more_after_its_own_second():
    """Clocks further apart than the margin (a cluster): the rest is still there after the decide; one more comes,
    at most a second and a fifth later, and the wake ends there (the checks of the serving process are the rest)."""
    clock = FakeClock()
    api = Mailbox([LOOP, resting(clock.time() * 1000 + 5_000)], clock=clock)  # a clock five seconds ahead
    assert mailbox.wake(api, MAILBOX, pause=clock.advance, clock=clock) is True
    assert [c[0] for c in api.calls] == ["decide", "decide"]
    assert api.calls[1][2] - api.calls[0][2] == pytest.approx(REST_SECONDS + 0.2)
    assert clock.time() - FakeClock().time() <= 2 * (REST_SECONDS + 0.2) + 1e-6


def test_a_pull_that_took_nothing_just_before_the_push_is_followed_by_its_rest():
    """The pull's result not yet written when first looked at: looked at again; the rest that follows is ended."""
    clock = FakeClock()
    api = Mailbox([LOOP, PULL], [LOOP], [LOOP, resting(clock.time() * 1000)], [LOOP, PULL], clock=clock)
    assert mailbox.wake(api, MAILBOX, pause=clock.advance, clock=clock) is True
    assert [c[0] for c in api.calls] == ["decide"]


def test_a_wake_that_finds_no_rest_or_forward_looks_on_for_its_bound_then_gives_up():
    """A pull whose result a loaded server has not written yet: looked at again, soon at first, then every second,
    for at most ``_WAKE_SECONDS`` (the serving process's next check may be minutes away), then left to that check."""
    clock = FakeClock()
    api = Mailbox([LOOP, PULL])
    assert mailbox.wake(api, MAILBOX, pause=clock.advance, clock=clock) is False
    waited = clock.monotonic() - FakeClock().monotonic()
    assert api.calls == [] and sending._WAKE_SECONDS - 1 < waited <= sending._WAKE_SECONDS
    assert api.reads == 1 + len(sending._WAKE_PAUSES) + int(sending._WAKE_SECONDS - sum(sending._WAKE_PAUSES))


def test_a_slow_round_is_waited_for_seconds_until_its_rest_shows():
    """The rest showed 3 s after the push (a server slow to write the pull's result): it is ended all the same."""
    clock = FakeClock()
    frames = [[LOOP, PULL]] * 7 + [[LOOP, resting(clock.time() * 1000 + 3_000)], [LOOP, PULL]]
    api = Mailbox(*frames, clock=clock)
    assert mailbox.wake(api, MAILBOX, pause=clock.advance, clock=clock) is True
    assert [c[0] for c in api.calls] == ["decide"]


@pytest.mark.parametrize("error", [ServerUnavailableError("read timed out"), HttpError(
    "boom", status=500, server_message="Failed to connect", method="GET", path="/workflow/x/tasks")])
def test_a_wake_asks_again_after_an_error_that_may_pass(error):
    """A read that timed out, or a server answering 500 for a moment (a Redis restart): asked again, and the rest
    found then is ended. Given up only after ``_WAKE_SECONDS`` of them."""
    clock = FakeClock()
    api = Mailbox(error, error, [LOOP, resting(clock.time() * 1000 - 5_000)], [LOOP, PULL], clock=clock)
    assert mailbox.wake(api, MAILBOX, pause=clock.advance, clock=clock) is True
    assert [c[0] for c in api.calls] == ["decide"] and api.reads == 4
    api = Mailbox(error)
    assert mailbox.wake(api, MAILBOX, pause=clock.advance, clock=clock) is False
    assert api.calls == [] and api.reads > 10


def test_a_wake_of_a_mailbox_that_is_gone_asks_nothing_again():
    for error in (ExecutionNotRunningError("ended", execution_id=MAILBOX),
                  ExecutionNotFoundError("no such run", execution_id=MAILBOX)):
        api = Mailbox(error)
        assert mailbox.wake(api, MAILBOX, pause=FakeClock().advance) is False
        assert api.reads == 1


def test_a_mailbox_of_version_3_resting_in_a_wait_is_signalled():
    clock = FakeClock()
    api = Mailbox([LOOP, WAIT], signals=[True])
    assert mailbox.wake(api, MAILBOX, pause=clock.advance, clock=clock) is True
    assert api.calls == [("signal", MAILBOX)]


def test_a_wake_never_raises_and_stops_when_the_process_closes():
    api = Mailbox([LOOP, PULL])
    assert mailbox.wake(api, MAILBOX, pause=lambda seconds: True) is False
    assert api.reads == 1
    clock = FakeClock()
    api = Mailbox([LOOP, resting(clock.time() * 1000)], clock=clock)
    assert mailbox.wake(api, MAILBOX, pause=lambda seconds: True, clock=clock) is False
    assert api.calls == []  # closing while it waited for the rest's second: no decide


def test_a_mailbox_opens_as_version_4_with_its_forward_on_the_listeners_domain():
    api = Mailbox()
    assert mailbox.Mailboxes(api).open(RUN, "listener") == "5e1d7c3a-0b2f-4e6a-9c8d-1a2b3c4d5e6f"
    (body,) = api.started
    assert (body["name"], body["version"], body["input"]) == (mailbox.MAILBOX_WORKFLOW, 4, {})
    assert body["taskToDomain"] == {mailbox.FORWARD_TASK: RUN}


def test_a_forward_pushes_each_message_in_order_with_a_mark_before_each(pushes):
    server = MailboxServer()
    chain_of(server, 2)
    assert forward(server, envelopes(*IDS)) == {"forwarded": 3}
    assert pushes == list(IDS)
    marks = [c for c in server.calls if c[0] == "poll" and c[1].startswith("conductor_agents_forward_")]
    assert len(marks) == 3
    assert mailbox._read_mark(server, server.key(0).run_id)[0] == IDS[2]


@pytest.mark.parametrize("reached", [True, False])
def test_a_forward_delivered_again_skips_what_went_through_and_settles_the_marked_one(pushes, monkeypatch, reached):
    server = MailboxServer()
    chain_of(server, 2)
    mailbox._write_mark(server, server.key(0).run_id, IDS[1])  # the process died while pushing IDS[1]
    asked = []
    monkeypatch.setattr(mailbox, "_was_pushed", lambda api, directory, chain, envelope, since, **kw:
                        asked.append(envelope["id"]) or reached)
    assert forward(server, envelopes(*IDS)) == {"forwarded": 3}
    assert asked == [IDS[1]]
    assert pushes == ([IDS[2]] if reached else [IDS[1], IDS[2]])


def test_a_forward_to_a_listener_that_ended_ends_the_loop_and_says_what_was_not_delivered(pushes):
    server = MailboxServer()
    chain_of(server, 1)
    pushes.ended = True
    assert forward(server, envelopes(*IDS)) == {"end": True, "forwarded": 0, "undelivered": list(IDS)}


def test_a_forward_to_a_paused_listener_keeps_its_messages_for_the_next_delivery(pushes):
    """A paused run refuses pushes (409): unlike an ended listener, nothing is given up; the task is
    handed back (the tool turns the error into a ToolRetry) and its next delivery pushes them."""
    server = MailboxServer()
    chain_of(server, 1)
    pushes.paused = True
    with pytest.raises(RunPausedError):
        forward(server, envelopes(*IDS))
    assert pushes == []


def test_receivedat_is_read_in_the_servers_milliseconds():
    assert mailbox._received_ms("2026-12-03T17:50:07.501946192Z") == 1796320207501
    assert mailbox._received_ms("garbage") == 0
