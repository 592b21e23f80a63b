"""Unit tests for a listener's mailbox (_listener.mailbox): its definitions, and what a forward pushes on
a first delivery, after a crash (the mark) and once the listener has ended."""

import pytest

from conductor_agents._listener import mailbox
from conductor_agents._listener.directory import ChainDirectory
from conductor_agents.errors import ExecutionNotRunningError, RunPausedError, ServerUnavailableError
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
    """Version 3: DO_WHILE (keepLastN 2) [non-blocking PULL of up to 100, SWITCH on its count and what the last
    forward holds: "0/0" or "0/null" rests in a WAIT of the run's checkEvery, anything else forwards (the same SIMPLE
    task as versions 1 and 2, given what the last forward held and which one it was)]."""
    task_defs, (workflow,) = mailbox.definitions()
    assert (workflow["name"], workflow["version"]) == (mailbox.MAILBOX_WORKFLOW, 3)
    (loop,) = workflow["tasks"]
    assert loop["type"] == "DO_WHILE" and loop["inputParameters"]["keepLastN"] == 2
    pull, switch = loop["loopOver"]
    assert (pull["type"], pull["inputParameters"]) == ("PULL_WORKFLOW_MESSAGES", {"batchSize": 100, "blocking": False})
    assert pull["inputParameters"]["blocking"] is False  # the server reads a Boolean, not "false"
    assert (switch["type"], switch["evaluatorType"], switch["expression"]) == ("SWITCH", "value-param", "taken")
    assert switch["inputParameters"] == {"taken": "${pull.output.count}/${forward.output.holding}"}
    assert set(switch["decisionCases"]) == {"0/0", "0/null"}  # the server writes a null as "null"
    (rest,) = switch["decisionCases"]["0/null"]
    (rest_after,) = switch["decisionCases"]["0/0"]  # the same WAIT under another name (a name is used once)
    assert {**rest_after, "taskReferenceName": "rest"} == rest
    assert (rest["type"], rest["inputParameters"]) == ("WAIT", {"duration": "${workflow.input.checkEvery}"})
    (forward,) = switch["defaultCase"]
    assert forward["type"] == "SIMPLE" and task_defs[0]["name"] == forward["name"] == mailbox.FORWARD_TASK
    assert forward["inputParameters"] == {"messages": f"${{{pull['taskReferenceName']}.output.messages}}",
                                          "held": "${forward.output.held}", "held_by": "${forward.referenceTaskName}",
                                          "holds": True}
    # A round that rested has no forward of its own: the loop goes on unless the newest forward said "end".
    assert loop["loopCondition"] == "$.forward == null || $.forward['end'] != true"


@pytest.mark.parametrize("seconds, duration", [(1, "1s"), (30, "30s"), (3600, "3600s")])
def test_the_check_is_given_to_the_wait_as_the_servers_duration(seconds, duration):
    assert mailbox.check_every(seconds) == duration


class Signals:
    """An api whose ``signal_wait`` answers from a script (True: a WAIT was completed; an exception: raised)."""

    def __init__(self, *answers, in_flight=()):
        self.answers = list(answers)
        self.calls = []
        self.started = []
        self.in_flight = list(in_flight)  # the mailbox's tasks scheduled or in progress
        self.reads = []

    def workflow_tasks(self, execution_id, statuses=(), start=0, count=15):
        from conductor_agents._wire.api import TaskPage
        self.reads.append((execution_id, tuple(statuses)))
        return TaskPage(total=len(self.in_flight), tasks=self.in_flight[start:start + count])

    def signal_wait(self, execution_id):
        self.calls.append(execution_id)
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

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


def test_a_wake_signals_once_when_the_mailbox_rests():
    api, clock = Signals(True), FakeClock()
    assert mailbox.wake(api, MAILBOX, pause=clock.advance) is True
    assert api.calls == [MAILBOX] and clock.monotonic() == FakeClock().monotonic()


def test_a_wake_that_finds_the_mailbox_mid_round_signals_again_for_a_third_of_a_second():
    """No WAIT yet (the push landed after an empty pull, before its WAIT): signalled again until one is found,
    at most three more times within 0.35 s in all."""
    api, clock = Signals(False, False, True), FakeClock()
    assert mailbox.wake(api, MAILBOX, pause=clock.advance) is True
    assert len(api.calls) == 3
    api, clock = Signals(*[False] * 4), FakeClock()
    assert mailbox.wake(api, MAILBOX, pause=clock.advance) is False
    assert len(api.calls) == 4 and clock.monotonic() - FakeClock().monotonic() == pytest.approx(0.35)


def test_a_wake_that_finds_a_forward_in_flight_signals_once_and_returns():
    """A busy listener's mailbox forwards (or holds) most of the time: the pull after that forward takes the message,
    so the sender goes on after one look instead of signalling for a third of a second (that paced its sends at
    about two a second)."""
    forward = {"taskType": "conductor_agents_forward", "status": "IN_PROGRESS", "referenceTaskName": "forward__3"}
    loop = {"taskType": "DO_WHILE", "status": "IN_PROGRESS", "referenceTaskName": "rounds"}
    api, clock = Signals(False, in_flight=[loop, forward]), FakeClock()
    assert mailbox.wake(api, MAILBOX, pause=clock.advance) is False
    assert api.calls == [MAILBOX] and api.reads == [(MAILBOX, ("SCHEDULED", "IN_PROGRESS"))]
    assert clock.monotonic() == FakeClock().monotonic()
    # Only the loop in flight (between an empty pull and its WAIT): signalled again, the tasks read once.
    api, clock = Signals(False, False, True, in_flight=[loop]), FakeClock()
    assert mailbox.wake(api, MAILBOX, pause=clock.advance) is True
    assert len(api.calls) == 3 and len(api.reads) == 1


def test_a_wake_never_raises_and_stops_when_the_process_closes():
    assert mailbox.wake(Signals(ServerUnavailableError("down")), MAILBOX, pause=FakeClock().advance) is False
    api = Signals(False, False)
    assert mailbox.wake(api, MAILBOX, pause=lambda seconds: True) is False
    assert len(api.calls) == 1


def test_a_mailbox_opens_with_its_check_as_the_runs_input():
    api = Signals()
    assert mailbox.Mailboxes(api, check_every_seconds=7).open(RUN, "listener") == "5e1d7c3a-0b2f-4e6a-9c8d-1a2b3c4d5e6f"
    (body,) = api.started
    assert (body["name"], body["version"], body["input"]) == (mailbox.MAILBOX_WORKFLOW, 3, {"checkEvery": "7s"})
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
