"""A tool's task handed out in a poll whose answer was lost on the way back (a connection cut as the server
answered) is run within seconds, not at its response timeout (an hour for an agent's tool).

The server marks a polled task IN_PROGRESS for the polling worker before it answers; the SDK never gets that
answer. Seen in the soak (issue 44): a mailbox's forward polled as the serving process's connections were cut, its
message acted on 84 s later (the forward's response timeout is a minute). A proxy drops the answers of the serving
process's next polls of ``act`` while a message's tool call is scheduled; the SDK, polling again, finds the task in
progress under its own worker id and not running here, and makes it due again.
"""

from __future__ import annotations

import logging

import attrs
import pytest

from conductor_agents import AgentRuntime, Continuation
from conductor_agents.testing import listener_policy

from ..helpers import eventually, listener
from ..integration.test_stateful_listener import ActionTools, act_on
from ..proxy import LoopbackProxy
from .support import quiescent
from .test_switch_crash import chain_state

pytestmark = pytest.mark.reliability

_LOST = "handed to this process by a poll whose answer was lost"


def test_a_tool_task_whose_poll_answer_was_lost_runs_within_seconds(agent_settings, scripted_llm, unique_name,
                                                                     conductor_server, caplog):
    caplog.set_level(logging.WARNING, logger="conductor_agents.liveness")
    base = agent_settings.server_url
    model = scripted_llm.script(policy=listener_policy(act_on))
    tools = ActionTools("lost")
    settings = attrs.evolve(agent_settings, liveness_check_interval_seconds=1.0,
                            continuation_enabled=False)  # no switch mid-test
    with LoopbackProxy(conductor_server.url) as proxy, \
            AgentRuntime(attrs.evolve(settings, server_url=proxy.url)) as serving:
        handle = serving.start(listener(unique_name("lost"), model, tools), "Start listening.")
        sent: "list[str]" = []
        # A dropped answer may have been an empty one (the poll ended before the task came): then nothing is lost
        # and the message is acted on as usual; again, until one answer carried the task (bounded).
        for attempt in range(6):
            eventually(lambda: quiescent(base, handle.execution_id), timeout=60, message="at rest")
            proxy.lose_answers("/tasks/poll/batch/act", count=1)
            sent.append(f"a{attempt}")
            handle.send_message({"action": sent[-1]})
            eventually(lambda: len(tools.actions) == len(sent), timeout=45,
                       message=f"{sent[-1]} acted on (a task lost in an answer waits an hour without the SDK's look)")
            if _LOST in caplog.text:
                break
        assert _LOST in caplog.text, f"no poll's answer carried the task in {len(sent)} tries ({proxy.lost} lost)"
        assert [action for action, _ in tools.actions] == sent  # each once, in order
        handle.stop()
        handle.wait(timeout=60)


def test_a_switch_whose_start_lost_its_answer_goes_on(agent_settings, scripted_llm, unique_name, conductor_server,
                                                      caplog):
    """The answer to the start of a listener's next run is dropped (a connection cut as the server answered): the
    run exists, and the SDK's senders may find it. Seen in the hour-long soak: the switch was dropped until the old
    run's next turn, which never came, and the listener acted on nothing for 16 minutes until another process adopted
    it. Two answers are dropped: without the fix the switch was dropped at two turns in a row, the second the one
    before the wait, and the listener acted on nothing more (reproduced here). The start is sent again at once
    (create-once: the key names the run) and the switch goes on without being dropped; every message is acted on
    once, in order, and one run is left live."""
    caplog.set_level(logging.INFO, logger="conductor_agents")
    base = agent_settings.server_url
    model = scripted_llm.script(policy=listener_policy(act_on))
    tools = ActionTools("switch-lost")
    with LoopbackProxy(conductor_server.url) as proxy, \
            AgentRuntime(attrs.evolve(agent_settings, server_url=proxy.url)) as serving:
        handle = serving.start(listener(unique_name("swlost"), model, tools,
                                        continuation=Continuation(max_turns=2)), "Start listening.")
        eventually(lambda: quiescent(base, handle.execution_id), timeout=60, message="at rest")
        proxy.lose_answers("/agent/start", count=2)  # the next starts are a switch's (nothing else starts runs here)
        sent: "list[str]" = []
        while handle.status().runs < 3:
            assert len(sent) < 10, "no second switch for many messages"
            sent.append(f"s{len(sent)}")
            handle.send_message({"action": sent[-1]})
            eventually(lambda: len(tools.actions) == len(sent), timeout=60,
                       message=f"{sent[-1]} acted on (a switch dropped on its lost answer wedged the listener)")
        assert proxy.lost >= 1  # the switch's start lost its answer
        assert "(the same key gives the same run)" in caplog.text  # the start was sent again, not given up on
        assert "could not decide on a continuation" not in caplog.text
        assert [action for action, _ in tools.actions] == sent
        # One live run: each switch ended the run it continued (a switch dropped on the lost answer left the old
        # run waiting for ever beside the new one, which took the messages but whose turns went unseen).
        eventually(lambda: [status for _, status, _ in chain_state(base, serving, handle.execution_id)]
                   .count("RUNNING") == 1, timeout=60, message="one live run")
        handle.stop()
        handle.wait(timeout=60)
