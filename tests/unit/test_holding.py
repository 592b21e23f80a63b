"""Unit tests for what a mailbox's forward holds for a busy HUMAN-wait listener (mailbox version 3, issue 42): held
messages first, then the round's own, each once; only the previous round's held ones; read from the server when the
forward's inputs were resolved again (a crash); a busy listener gets everything at its next wait, in one hand-over."""

import logging
import threading

import pytest

from conductor_agents._listener import holding, mailbox
from conductor_agents._listener.directory import ChainDirectory
from conductor_agents._wire.api import TaskPage
from conductor_agents.errors import ToolRetry
from conductor_agents.result import STOP_SIGNAL
from tests.unit.fakes import FakeClock
from tests.unit.test_human_wait import IDS, MAILBOX, HumanWaitServer, envelopes


def ids_of(messages):
    return [m["id"] for m in messages]


class Forwards(HumanWaitServer):
    """The listener's links, and the mailbox's completed forwards (``forwards``: reference name -> output)."""

    def __init__(self):
        super().__init__()
        self.forwards = {}
        self.mailbox_reads = 0

    def workflow_tasks(self, execution_id, start=0, count=15, statuses=()):
        if execution_id == MAILBOX:
            self.mailbox_reads += 1
            tasks = [{"referenceTaskName": "pull__1", "status": "COMPLETED", "outputData": {}}]
            tasks += [{"referenceTaskName": ref, "status": "COMPLETED", "outputData": out}
                      for ref, out in self.forwards.items()]
            return TaskPage(total=len(tasks), tasks=tasks[start:start + count])
        return super().workflow_tasks(execution_id, start, count, statuses)


def hand_over(server, messages, *, batch_size=100):
    clock = FakeClock()
    directory = ChainDirectory(server)
    return mailbox.hand_over(server, directory, directory.chain(MAILBOX), messages, batch_size=batch_size,
                             worker_id="test", clock=clock, pause=clock.advance, holds=True)


def test_the_round_of_a_loop_task_is_read_from_its_reference_name():
    assert holding.round_of("forward__12") == 12 and holding.round_of("my__task__3") == 3
    assert holding.round_of("forward") is None and holding.round_of(None) is None and holding.round_of("x__") is None


def test_the_previous_rounds_held_messages_come_first_then_the_rounds_own_each_once():
    server = Forwards()
    held, pulled = envelopes(*IDS[:2]), envelopes(IDS[1], *IDS[2:4])  # IDS[1] in both: given once
    given = holding.carried(server, MAILBOX, "forward__5", pulled, held, "forward__4")
    assert ids_of(given) == list(IDS[:4])
    assert ids_of(holding.carried(server, MAILBOX, "forward__5", pulled, None, None)) == [IDS[1], *IDS[2:4]]
    assert server.mailbox_reads == 0  # given in the inputs: nothing read


def test_what_an_older_rounds_forward_held_is_never_delivered_again(caplog):
    """The previous round rested, so ``forward`` names an older round's forward: its held messages were taken by the
    round after it (a round after a forward that holds never rests)."""
    server = Forwards()
    with caplog.at_level(logging.WARNING, logger="conductor_agents.continuation"):
        given = holding.carried(server, MAILBOX, "forward__9", envelopes(IDS[3]), envelopes(*IDS[:2]), "forward__7")
    assert ids_of(given) == [IDS[3]]
    assert "not delivered again" in caplog.text


def test_a_forward_delivered_again_after_a_crash_reads_the_previous_rounds_held_messages_from_the_server():
    """The server delivers a timed-out forward again as a new task whose inputs it resolves again: ``forward`` is
    then the attempt that timed out (its own name, its output empty), not the previous round's forward."""
    server = Forwards()
    server.forwards = {"forward__3": {"forwarded": 1, "held": envelopes(*IDS[:2]), "holding": 2},
                       "forward__4": {}}
    given = holding.carried(server, MAILBOX, "forward__4", envelopes(IDS[2]), None, "forward__4")
    assert ids_of(given) == list(IDS[:3]) and server.mailbox_reads == 1
    server.forwards = {"forward__4": {}}  # the previous round rested: nothing was held
    assert ids_of(holding.carried(server, MAILBOX, "forward__4", envelopes(IDS[2]), None, "forward__4")) == [IDS[2]]


def test_a_busy_listener_gets_what_arrived_meanwhile_in_one_hand_over_at_its_next_wait():
    server = Forwards()
    link = server.key(0).execution_id
    server.waiting[link] = 10_000  # busy
    first = hand_over(server, envelopes(*IDS[:2]))
    assert first == {"forwarded": 0, "held": envelopes(*IDS[:2]), "holding": 2} and server.handed == []
    second = hand_over(server, holding.carried(server, MAILBOX, "forward__2", envelopes(IDS[2]), first["held"],
                                               "forward__1"))
    assert second["held"] == envelopes(*IDS[:3]) and server.handed == []  # still busy: all three held, in order
    server.waiting[link] = 0  # it waits
    third = holding.carried(server, MAILBOX, "forward__3", envelopes(*IDS[3:5]), second["held"], "forward__2")
    assert hand_over(server, third) == {"forwarded": 5}
    assert server.handed == [(link, list(IDS[:5]))]  # one hand-over, held first, in push order


def test_held_messages_go_at_most_a_batch_per_wait_and_the_rest_is_held_again():
    server = Forwards()
    server.turn_looks = 10_000  # busy for good after the first wait
    result = hand_over(server, envelopes(*IDS[:5]), batch_size=2)
    assert [ids for _, ids in server.handed] == [list(IDS[:2])]
    assert result == {"forwarded": 2, "held": envelopes(*IDS[2:5]), "holding": 3}


def test_a_forward_delivered_again_after_it_completed_a_wait_with_held_messages_hands_none_twice():
    server = Forwards()
    server.turn_looks = 10_000
    given = holding.carried(server, MAILBOX, "forward__2", envelopes(IDS[2]), envelopes(*IDS[:2]), "forward__1")
    assert hand_over(server, given) == {"forwarded": 3}
    assert [ids for _, ids in server.handed] == [list(IDS[:3])]
    # The process died before its output was posted: the same task (same inputs) is delivered again, the listener
    # busy with what it was handed: nothing is handed twice, nothing held.
    assert hand_over(server, given) == {"forwarded": 3}
    assert [ids for _, ids in server.handed] == [list(IDS[:3])]


def test_beyond_the_most_it_holds_the_forward_hands_its_task_back():
    server = Forwards()
    server.waiting[server.key(0).execution_id] = 10_000
    many = [{"id": f"{n:08x}-0000-4000-8000-000000000000", "payload": {"n": n}} for n in range(holding.MAX_HELD + 1)]
    with pytest.raises(ToolRetry, match="busy"):
        hand_over(server, many)
    assert hand_over(server, many[:holding.MAX_HELD])["holding"] == holding.MAX_HELD


def test_a_listener_that_ended_while_messages_were_held_reports_them_undelivered(caplog):
    server = Forwards()
    server.runs[server.key(0).execution_id]["status"] = "COMPLETED"
    stop = {"id": IDS[2], "payload": STOP_SIGNAL}
    given = holding.carried(server, MAILBOX, "forward__2", [stop], envelopes(*IDS[:2]), "forward__1")
    with caplog.at_level(logging.WARNING, logger="conductor_agents.continuation"):
        assert hand_over(server, given) == {"end": True, "forwarded": 0, "undelivered": list(IDS[:3])}
    assert "2 message(s)" in caplog.text  # the stop's own wake-up is not reported as a message
    assert server.terminated[0] == MAILBOX


def test_a_held_stop_signal_is_handed_over_after_what_was_held_before_it():
    server = Forwards()
    link = server.key(0).execution_id
    server.waiting[link] = 10_000
    stop = {"id": IDS[1], "payload": STOP_SIGNAL}
    first = hand_over(server, [*envelopes(IDS[0]), stop])
    assert first["holding"] == 2
    server.waiting[link] = 0
    assert hand_over(server, holding.carried(server, MAILBOX, "forward__2", [], first["held"], "forward__1")) \
        == {"forwarded": 2}
    assert server.handed == [(link, [IDS[0], IDS[1]])]


def forward_tool(server):
    from conductor_agents._tooldefs.context import ToolContext
    clock = FakeClock()

    class Stopping(threading.Event):  # never set: its waits pass the fake clock's time
        def wait(self, timeout=None):
            clock.advance(timeout or 0)
            return False

    tool = mailbox.make_forward_tool(server, ChainDirectory(server), switch_wait=30, clock=clock,
                                     stopping=Stopping(), batch_size_of=lambda run_id: 100)
    return lambda ref, **inputs: tool(ToolContext(execution_id=MAILBOX, task_id="t", reference_name=ref), **inputs)


def test_the_forward_takes_either_shape_of_input_and_holds_only_for_a_version_3_mailbox():
    """A version 2 round gives the forward its pull only: a busy listener's messages go back with the task (they
    would be lost in an output nobody reads); version 3 gives it what the last forward held, and says it holds."""
    server = Forwards()
    server.waiting[server.key(0).execution_id] = 10_000
    forward = forward_tool(server)
    with pytest.raises(ToolRetry, match="busy"):
        forward("forward__2", messages=envelopes(IDS[2]))
    held = forward("forward__2", messages=envelopes(IDS[2]), held=envelopes(*IDS[:2]), held_by="forward__1",
                   holds=True)
    assert held == {"forwarded": 0, "held": envelopes(*IDS[:3]), "holding": 3}


def test_a_wait_found_after_the_first_look_is_not_answered_with_a_stale_pull_but_held_for_the_next_round():
    """The listener came to wait while the forward looked: what was pushed since the round's pull is queued in the
    mailbox. The forward completes holding everything; the next round's forward (its pull fresh) hands it all over."""
    server = Forwards()
    link = server.key(0).execution_id
    server.waiting[link] = 2  # busy at the first two looks, then waiting
    first = hand_over(server, envelopes(*IDS[:2]))
    assert first == {"forwarded": 0, "held": envelopes(*IDS[:2]), "holding": 2} and server.handed == []
    given = holding.carried(server, MAILBOX, "forward__2", envelopes(IDS[2]), first["held"], "forward__1")
    assert hand_over(server, given) == {"forwarded": 3}
    assert server.handed == [(link, list(IDS[:3]))]
