"""Unit tests for a listener's mailbox (_listener.mailbox): its definitions, and what a forward pushes on
a first delivery, after a crash (the mark) and once the listener has ended."""

import pytest

from conductor_agents._listener import mailbox
from conductor_agents._listener.directory import ChainDirectory
from conductor_agents.errors import ExecutionNotRunningError, RunPausedError
from tests.unit.fakes import FakeClock
from tests.unit.test_retention import MAILBOX, MailboxServer, chain_of


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


def test_the_loop_keeps_two_iterations_and_forwards_on_the_listeners_domain():
    task_defs, (workflow,) = mailbox.definitions()
    loop = workflow["tasks"][0]
    assert loop["type"] == "DO_WHILE" and loop["inputParameters"]["keepLastN"] == 2
    assert [t["type"] for t in loop["loopOver"]] == ["PULL_WORKFLOW_MESSAGES", "SIMPLE"]
    assert task_defs[0]["name"] == loop["loopOver"][1]["name"] == mailbox.FORWARD_TASK


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
