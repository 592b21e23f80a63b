"""Unit tests for conductor_agents._listener.carryover: what a continued run is told, and the commit record."""

import json

from conductor_agents import Continuation
from conductor_agents._listener.carryover import PENDING_CLOSE, PENDING_OPEN, CommitRecord, build_record, pulled_message_ids
from conductor_agents.testing import LLMRequest, ToolCall, listener_policy


def envelope(mid, action):
    return {"id": mid, "payload": {"action": action}, "receivedAt": "2026-12-01T00:00:00Z"}


def wait_result(*envelopes):
    return {"messages": list(envelopes), "count": len(envelopes)}


def llm_task(seq, history, calls, iteration):
    """A finished model turn: its input holds the conversation so far, its output the turn itself."""
    return {"taskType": "LLM_CHAT_COMPLETE", "status": "COMPLETED", "seq": seq, "iteration": iteration,
            "inputData": {"messages": history}, "outputData": {"toolCalls": calls}}


def history_of(pairs):
    messages = [{"role": "system", "message": "Loop."}, {"role": "user", "message": "Start listening."}]
    for name, args, output in pairs:
        messages.append({"role": "tool_call", "toolCalls": [{"name": name, "inputParameters": {"method": name, **args}}]})
        messages.append({"role": "tool", "message": json.dumps(output),
                         "toolCalls": [{"name": name, "inputParameters": args, "output": output}]})
    return messages


def pull(seq, status, *envelopes):
    return {"taskType": "PULL_WORKFLOW_MESSAGES", "status": status, "seq": seq,
            "outputData": wait_result(*envelopes) if envelopes else {}}


PAIRS = [("wait_for_message", {}, wait_result(envelope("m1", "a1"))), ("act", {"action": "a1"}, {"done": "a1"}),
         ("wait_for_message", {}, wait_result(envelope("m2", "a2"))), ("act", {"action": "a2"}, {"done": "a2"})]
DIGEST = {"_last_tool_results": [{"name": n, "output": o} for n, _, o in PAIRS]}


def record(tail=(), continuation=Continuation(keep_exchanges=2), earlier=None):
    last = llm_task(40, history_of(PAIRS), [{"name": "wait_for_message", "inputParameters": {}}], iteration=5)
    return build_record(continuation=continuation, prompt="Start listening.", previous_id="old", new_link=3,
                        earlier=earlier, last_llm=last, tail=list(tail), variables=DIGEST)


def test_the_record_lists_every_pulled_message_and_the_totals():
    built = record()
    assert (built.pulled, built.pending, built.turns, built.messages, built.link) == (("m1", "m2"), (), 5, 2, 3)
    assert built == CommitRecord.from_output(built.to_output())  # what the carry task holds reads back the same


def test_the_text_keeps_the_last_items_verbatim_and_summarises_the_rest():
    text = record().text
    assert "run 4" in text and "5 model turns" in text and "2 messages" in text
    verbatim = text.split("verbatim (oldest first):\n", 1)[1]
    assert '[tool] act -> {"done": "a2"}' in verbatim and "[tool_call] wait_for_message()" in verbatim
    summary = text.split("Earlier in the conversation", 1)[1].split("The last items", 1)[0]
    assert 'messages [{"action": "a1"}]' in summary and PENDING_OPEN not in text


def test_a_message_pulled_after_the_last_turn_is_pending_and_shown_to_the_model():
    built = record(tail=[pull(41, "COMPLETED", envelope("m3", "a3")), pull(45, "CANCELED")])
    assert built.pending == (envelope("m3", "a3"),) and "m3" in built.pulled and built.messages == 3
    block = built.text.split(PENDING_OPEN, 1)[1].split(PENDING_CLOSE, 1)[0]
    assert json.loads(block) == wait_result(envelope("m3", "a3"))


def test_the_compact_record_is_carried_forward_within_its_size():
    first = record(continuation=Continuation(keep_exchanges=0, record_chars=10_000))
    second = record(continuation=Continuation(keep_exchanges=0, record_chars=400), earlier=first)
    assert second.turns == 10 and second.messages == 4 and len(second.record) <= 430
    assert second.record.startswith("(") and "earlier items omitted" in second.record.splitlines()[0]


def test_a_carry_function_replaces_the_text():
    seen = []
    continuation = Continuation(carry=lambda carry: seen.append(carry) or f"{len(carry.exchanges)} items")
    assert "9 items" == record(continuation=continuation).text[:7]  # 8 before the last turn, and its call
    assert seen[0].runs == 4 and seen[0].prompt == "Start listening." and seen[0].kept == 5


def test_pulled_ids_come_from_the_digest_and_later_wait_tasks():
    tail = [pull(50, "COMPLETED", envelope("m9", "x"))]
    assert ["m1", "m2", "m9"] == pulled_message_ids(DIGEST, tail)


def test_the_listener_policy_acts_on_carried_messages_first_then_waits():
    policy = listener_policy(lambda p: ToolCall("act", {"action": p["action"]}))
    carried = record(tail=[pull(41, "COMPLETED", envelope("m3", "a3"))]).text
    first = LLMRequest.from_body({"model": "m", "instructions": f"Loop.\n## conductor_agents_carry\n\n{carried}",
                                  "input": [{"type": "message", "role": "user", "content": "Start listening."}]},
                                 received_at=0.0)
    assert first.is_continuation and first.carried_over is not None
    assert [ToolCall("act", {"action": "a3"})] == policy(first)
    plain = LLMRequest.from_body({"model": "m", "instructions": "Loop.", "input": []}, received_at=0.0)
    assert policy(plain) == ToolCall("wait_for_message", {}) and not plain.is_continuation
