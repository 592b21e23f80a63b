"""A continued listener reads as one history (issue 41): its result's tool calls and tokens, and its events, cover
every run the server still holds, oldest first; retired runs are said, not crashed on; the SDK's own stop message
is never counted or shown as a sender's.

No sockets: the server is a fake that holds some links of one listener (the others answer 404, as retired runs do).
"""

from __future__ import annotations

from typing import Any

import pytest

from conductor_agents import AgentResult, RunStatus, TokenUsage
from conductor_agents._listener.carryover import CommitRecord, build_record, pulled_message_ids, senders_messages
from conductor_agents._listener.chain import continued_reason, link_key
from conductor_agents._listener.chained_events import ChainedEvents
from conductor_agents._listener.directory import Chain, ChainDirectory
from conductor_agents._listener.history import HeldRun, carried_tokens, held_tokens, with_history
from conductor_agents._wire.api import TaskPage
from conductor_agents.cli._agents import _over_runs
from conductor_agents.cli._progress import describe_event
from conductor_agents.continuation import Continuation
from conductor_agents.errors import ExecutionNotFoundError
from conductor_agents.events import ContinuedEvent, RetiredEvent
from conductor_agents.result import STOP_SIGNAL, ListenerTotals, ToolCallRecord, is_control_message

RUN_ID = "1" * 32
MAILBOX = Chain("the-mailbox", RUN_ID, "listener", 0, mailbox=True)
FIRST = Chain(MAILBOX.link(0).execution_id, RUN_ID, "listener", 0)  # a listener without a mailbox: link 0 held


def tokens(n: int) -> TokenUsage:
    return TokenUsage(prompt_tokens=2 * n, completion_tokens=n, total_tokens=3 * n)


def task(seq: int, task_type: str, status: str = "COMPLETED", **extra: Any) -> dict:
    return {"seq": seq, "taskId": f"t{seq}", "taskType": task_type, "referenceTaskName": f"{task_type}_{seq}",
            "status": status, "scheduledTime": 100 * seq, "startTime": 100 * seq + 1, "endTime": 100 * seq + 50,
            **extra}


def envelope(mid: str, payload: Any) -> dict:
    return {"id": mid, "payload": payload}


def link_workflow(number: int, action: str, *, carried: TokenUsage | None, status: str = "TERMINATED",
                  reason: str | None = None, stop: bool = False) -> dict:
    """A link that took one message and acted on it (one ``act`` call); its carry task records ``carried``."""
    act = {"inputData": {"method": "act", "action": action}, "outputData": {"done": action},
           "taskDefinition": {"name": "act"}}
    tasks = []
    if number > 0:
        record = CommitRecord(text="", previous="x", link=number, tokens=carried or TokenUsage())
        tasks.append(task(1, "conductor_agents_carry", outputData=record.to_output()))
    tasks += [task(2, "LLM_CHAT_COMPLETE"),
              task(3, "PULL_WORKFLOW_MESSAGES", outputData={"messages": [envelope(f"m{number}", {"action": action})],
                                                            "count": 1}),
              task(4, "LLM_CHAT_COMPLETE"), task(5, "act", **act), task(6, "LLM_CHAT_COMPLETE")]
    if stop:
        tasks.append(task(7, "PULL_WORKFLOW_MESSAGES", outputData={"messages": [envelope("stop", STOP_SIGNAL)],
                                                                  "count": 1}))
    return {"status": status, "reasonForIncompletion": reason, "tasks": tasks, "endTime": 5000,
            "correlationId": link_key(RUN_ID, number, "listener"),
            "output": {"result": "bye", "finishReason": "STOP"} if status == "COMPLETED" else {}}


class ListenerServer:
    """The links of one listener the server still holds (by execution id); any other id answers 404."""

    def __init__(self, chain: Chain, held: dict[int, dict], own_tokens: dict[int, TokenUsage] | None = None,
                 head: int = 0) -> None:
        self.chain = chain
        self.workflows = {chain.link(n).execution_id: wf for n, wf in held.items()}
        self.own = {chain.link(n).execution_id: t for n, t in (own_tokens or {}).items()}
        self.head = head
        self.reads: list[tuple[str, str]] = []

    def _get(self, what: str, execution_id: str) -> dict:
        self.reads.append((what, execution_id))
        if execution_id not in self.workflows:
            raise ExecutionNotFoundError(f"no execution {execution_id!r}", execution_id=execution_id)
        return self.workflows[execution_id]

    def get_workflow(self, execution_id: str, *, include_tasks: bool = False, timeout: Any = None) -> dict:
        return self._get("workflow", execution_id)

    def agent_status(self, execution_id: str, *, timeout: Any = None) -> dict:
        wf = self._get("status", execution_id)
        return {"executionId": execution_id, "status": wf["status"],
                "reasonForIncompletion": wf["reasonForIncompletion"]}

    def workflow_status(self, execution_id: str, **kwargs: Any) -> dict:
        wf = self._get("status", execution_id)
        return {k: wf[k] for k in ("status", "reasonForIncompletion", "correlationId", "output")}

    def workflow_tasks(self, execution_id: str, *, start: int = 0, count: int = 15, statuses: Any = ()) -> TaskPage:
        tasks = self._get("tasks", execution_id)["tasks"]
        return TaskPage(total=len(tasks), tasks=tasks[start:start + count])

    def agent_execution(self, execution_id: str) -> dict:
        self.reads.append(("execution", execution_id))
        usage = self.own[execution_id]
        return {"tokenUsage": {"promptTokens": usage.prompt_tokens, "completionTokens": usage.completion_tokens,
                               "totalTokens": usage.total_tokens}}

    def poll_data(self, task_type: str) -> list:
        return [{"workerId": f"head:{self.head}"}]


def chain_of(chain: Chain, numbers: list[int], ended: int, per_run: int = 5) -> dict[int, dict]:
    """Links ``numbers`` of a listener whose every run used ``per_run`` tokens; ``ended`` is where it ended."""
    held = {}
    for n in numbers:
        if n == ended:
            held[n] = link_workflow(n, f"a{n}", carried=tokens(per_run * n), status="COMPLETED", stop=True)
        else:
            held[n] = link_workflow(n, f"a{n}", carried=tokens(per_run * n),
                                    reason=continued_reason(chain.link(n + 1).execution_id))
    return held


def last_run_result(server: ListenerServer, chain: Chain, ended: int, own: TokenUsage) -> AgentResult:
    from conductor_agents.result import AgentStatus
    tasks = server.workflows[chain.link(ended).execution_id]["tasks"]
    status = AgentStatus(execution_id=chain.execution_id, status=RunStatus.COMPLETED)
    result = AgentResult.from_server(status, {"tokenUsage": {"promptTokens": own.prompt_tokens,
                                                             "completionTokens": own.completion_tokens,
                                                             "totalTokens": own.total_tokens}}, tasks)
    return result


# --- the merge (pure) -----------------------------------------------------------------------------------------


def test_tokens_of_held_runs_come_from_their_successors_records():
    """Runs 2-4 held, the last one's own count read: 2 and 3 are what the next record carries less their own."""
    runs = [HeldRun(2, carried=tokens(10)), HeldRun(3, carried=tokens(15)),
            HeldRun(4, carried=tokens(21), own=tokens(7))]
    asked: list[int] = []
    assert held_tokens(runs, lambda run: asked.append(run.number) or TokenUsage()) == tokens(5 + 6 + 7)
    assert asked == []  # no read of its own for any run


def test_a_run_followed_by_retired_runs_is_read_on_its_own():
    """The first run of a listener without a mailbox, then runs retired, then the last: the first run's record
    cannot tell its share, so its own count is read (and only its)."""
    runs = [HeldRun(0, carried=TokenUsage()), HeldRun(4, carried=tokens(40), own=tokens(3))]
    asked: list[int] = []

    def own(run: HeldRun) -> TokenUsage:
        asked.append(run.number)
        return tokens(9)

    assert held_tokens(runs, own) == tokens(12) and asked == [0]


def test_a_record_that_is_missing_falls_back_to_the_runs_own_count():
    runs = [HeldRun(1, carried=tokens(4)), HeldRun(2, carried=None, own=tokens(1))]
    assert held_tokens(runs, lambda run: tokens(2)) == tokens(3)


def test_carried_tokens_read_the_carry_tasks_record():
    record = CommitRecord(text="", previous="x", link=3, tokens=tokens(8)).to_output()
    assert carried_tokens([task(1, "conductor_agents_carry", outputData=record)], 3) == tokens(8)
    assert carried_tokens([task(1, "conductor_agents_carry", status="IN_PROGRESS")], 3) is None
    assert carried_tokens([task(1, "LLM_CHAT_COMPLETE")], 3) is None
    assert carried_tokens([], 0) == TokenUsage()  # the first run: nothing before it


# --- the result over the held runs -----------------------------------------------------------------------------


def test_a_result_covers_every_held_run_oldest_first_with_one_read_each():
    """A mailbox listener whose four runs are all held ended in the fourth: the result has the four ``act`` calls
    in order and the tokens of all four, from one workflow read per older run (no token read of their own)."""
    server = ListenerServer(MAILBOX, chain_of(MAILBOX, [0, 1, 2, 3], ended=3))
    result = last_run_result(server, MAILBOX, 3, own=tokens(5))
    merged = with_history(server, ChainDirectory(server), MAILBOX, result, MAILBOX.link(3),  # type: ignore[arg-type]
                          server.workflows[MAILBOX.link(3).execution_id]["tasks"])
    assert [c.arguments["action"] for c in merged.tool_calls if c.name == "act"] == ["a0", "a1", "a2", "a3"]
    assert merged.token_usage == tokens(20) and merged.retired_runs == 0
    older = [MAILBOX.link(n).execution_id for n in (2, 1, 0)]
    assert server.reads == [("workflow", e) for e in older]


def test_a_result_after_retention_covers_the_held_runs_and_counts_the_retired_ones():
    """Runs 1-3 of a mailbox listener retired (links 0-2), links 3-5 held: three runs' calls and tokens, three
    retired; the walk stops at the first run missing."""
    server = ListenerServer(MAILBOX, chain_of(MAILBOX, [3, 4, 5], ended=5))
    result = last_run_result(server, MAILBOX, 5, own=tokens(5))
    merged = with_history(server, ChainDirectory(server), MAILBOX, result, MAILBOX.link(5),  # type: ignore[arg-type]
                          server.workflows[MAILBOX.link(5).execution_id]["tasks"])
    assert [c.arguments["action"] for c in merged.tool_calls if c.name == "act"] == ["a3", "a4", "a5"]
    assert (merged.token_usage, merged.retired_runs) == (tokens(15), 3)
    assert len(server.reads) == 3  # links 4, 3, then 2 answers 404


def test_a_listener_without_a_mailbox_keeps_its_first_run_before_the_retired_ones():
    """Link 0 (the id callers hold, never retired), links 1-2 retired, 3-4 held: link 0's calls come first and its
    own token count is read (its successor is gone)."""
    server = ListenerServer(FIRST, chain_of(FIRST, [0, 3, 4], ended=4), own_tokens={0: tokens(5)})
    result = last_run_result(server, FIRST, 4, own=tokens(5))
    merged = with_history(server, ChainDirectory(server), FIRST, result, FIRST.link(4),  # type: ignore[arg-type]
                          server.workflows[FIRST.link(4).execution_id]["tasks"])
    assert [c.arguments["action"] for c in merged.tool_calls if c.name == "act"] == ["a0", "a3", "a4"]
    assert (merged.token_usage, merged.retired_runs) == (tokens(15), 2)
    assert ("execution", FIRST.link(0).execution_id) in server.reads


def test_a_result_read_through_a_later_runs_id_starts_at_the_listeners_first_run():
    """A caller that holds link 2's id (``current_execution_id`` of long ago) of a listener without a mailbox: the
    history is found from the listener's first run (its anchor), not from the link the caller holds."""
    server = ListenerServer(FIRST, chain_of(FIRST, [0, 1, 2, 3], ended=3))
    later = Chain(FIRST.link(2).execution_id, RUN_ID, "listener", 2)
    result = last_run_result(server, FIRST, 3, own=tokens(5))
    merged = with_history(server, ChainDirectory(server), later, result, FIRST.link(3),  # type: ignore[arg-type]
                          server.workflows[FIRST.link(3).execution_id]["tasks"])
    assert acts_of(merged.tool_calls) == ["a0", "a1", "a2", "a3"] and merged.token_usage == tokens(20)


def acts_of(calls: tuple[ToolCallRecord, ...]) -> list[str]:
    return [c.arguments["action"] for c in calls if c.name == "act"]


# --- the SDK's own messages ------------------------------------------------------------------------------------


def test_the_stop_signal_is_no_senders_message():
    """``totals.messages`` counted the stop signal: 5 for 4 messages. The ids still list it (delivery checks)."""
    tail = [task(3, "PULL_WORKFLOW_MESSAGES", outputData={"messages": [envelope("m1", {"action": "x"})]}),
            task(8, "PULL_WORKFLOW_MESSAGES", outputData={"messages": [envelope("s", STOP_SIGNAL)]})]
    assert senders_messages({}, tail) == 1 and pulled_message_ids({}, tail) == ["m1", "s"]
    built = build_record(continuation=Continuation(), prompt="p", previous_id="x", new_link=1, earlier=None,
                         last_llm=None, tail=tail, variables={})
    assert built.messages == 1 and "received 1 messages" in built.text
    assert is_control_message(STOP_SIGNAL) and not is_control_message({"_signal": "stop", "action": "x"})


def test_a_wait_that_took_the_stop_signal_lists_no_message():
    """``AgentResult``'s repr showed ``{'_signal': 'stop'}`` among the listener's messages."""
    wait = task(7, "PULL_WORKFLOW_MESSAGES", outputData={
        "messages": [envelope("m", {"action": "x"}), envelope("s", STOP_SIGNAL)], "count": 2})
    record = ToolCallRecord.from_task(wait)
    assert record.output == {"messages": [envelope("m", {"action": "x"})], "count": 1}
    assert "_signal" not in repr(record)
    other = ToolCallRecord.from_task(task(5, "act", outputData={"messages": [{"payload": STOP_SIGNAL}]}))
    assert other.output == {"messages": [{"payload": STOP_SIGNAL}]}  # a tool's own output is left as it is


# --- events over the held runs ---------------------------------------------------------------------------------


def read_events(server: ListenerServer, chain: Chain) -> list:
    directory = ChainDirectory(server)  # type: ignore[arg-type]
    with ChainedEvents(server, directory, chain, timeout=10, poll_interval=0.01) as events:
        return list(events)


def test_events_of_a_second_process_cover_every_held_run_oldest_first():
    """A fresh process holding only the mailbox's id: the events of links 0-2, a ``continued`` between them."""
    server = ListenerServer(MAILBOX, chain_of(MAILBOX, [0, 1, 2], ended=2))
    events = read_events(server, MAILBOX)
    acts = [e.arguments["action"] for e in events if e.kind == "tool_call"]
    assert acts == ["a0", "a1", "a2"]
    continued = [e for e in events if isinstance(e, ContinuedEvent)]
    assert [(e.run, e.next_execution_id) for e in continued] == [(2, MAILBOX.link(1).execution_id),
                                                                  (3, MAILBOX.link(2).execution_id)]
    assert events[-1].kind == "done" and not any(e.kind == "error" for e in events)
    # Each link's task list read once, and a few small reads each (the reader's status, the next link's probe);
    # a continued link's reason is in its closing error: no status read more to learn it.
    for number in range(3):
        reads = [what for what, e in server.reads if e == MAILBOX.link(number).execution_id]
        assert reads.count("tasks") == 1 and len(reads) <= 5, (number, reads)


def test_events_say_where_retired_runs_were_and_go_on_with_the_held_ones():
    """Links 0-2 retired, 3-4 held: a ``retired`` event for runs 1-3 first, then the held runs' events."""
    server = ListenerServer(MAILBOX, chain_of(MAILBOX, [3, 4], ended=4), head=4)
    events = read_events(server, MAILBOX)
    assert isinstance(events[0], RetiredEvent)
    assert (events[0].first_run, events[0].last_run, events[0].count) == (1, 3, 3)
    assert events[0].execution_id == MAILBOX.execution_id
    assert [e.arguments["action"] for e in events if e.kind == "tool_call"] == ["a3", "a4"]
    assert [e.run for e in events if e.kind == "continued"] == [5] and events[-1].kind == "done"


def test_events_of_a_listener_without_a_mailbox_jump_its_retired_runs_after_the_first():
    server = ListenerServer(FIRST, chain_of(FIRST, [0, 3], ended=3), head=3)
    events = read_events(server, FIRST)
    kinds = [e.kind for e in events]
    assert kinds.index("continued") + 1 == kinds.index("retired")
    retired = next(e for e in events if isinstance(e, RetiredEvent))
    assert (retired.first_run, retired.last_run) == (2, 3)
    assert [e.arguments["action"] for e in events if e.kind == "tool_call"] == ["a0", "a3"]


# --- the command line ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("runs", "retired", "expected"), [
    (1, 0, ""),
    (4, 0, " over its 4 runs"),
    (5, 3, " over the 2 runs still held (3 older runs retired from the server; all 5 runs: 99 tokens)"),
])
def test_the_wait_summary_says_which_runs_its_counts_cover(runs, retired, expected):
    totals = ListenerTotals(runs=runs, token_usage=TokenUsage(total_tokens=99)) if runs > 1 else None
    result = AgentResult(execution_id="x", status=RunStatus.COMPLETED, runs=runs, retired_runs=retired, totals=totals)
    assert _over_runs(result) == expected


def test_the_events_verb_prints_a_line_for_a_continuation_and_for_retired_runs():
    continued = ContinuedEvent(execution_id="a", id="continued:b", next_execution_id="b", run=3)
    assert describe_event(continued, [0]) == (["continued as run 3 (b)"], None)
    retired = RetiredEvent(execution_id="held", id="retired:2-4", first_run=2, last_run=4)
    assert describe_event(retired, [0])[0] == [
        "runs 2-4 were retired from the server, their events are gone (the listener's totals count them)"]
