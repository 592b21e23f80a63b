"""Unit tests for the server-sent events decoder (conductor_agents._wire.sse) and the typed events."""

from __future__ import annotations

import logging

import pytest

from conductor_agents._wire.sse import SseDecoder, SseMessage
from conductor_agents.events import (
    DoneEvent,
    ErrorEvent,
    ThinkingEvent,
    ToolCallEvent,
    ToolResultEvent,
    WaitingEvent,
    event_from_sse,
)


def decode(*chunks: bytes, last_event_id: str = "") -> "list[SseMessage]":
    decoder = SseDecoder(last_event_id)
    out = []
    for chunk in chunks:
        out.extend(decoder.feed(chunk))
    decoder.close()
    return out


def every_split(data: bytes) -> "list[list[SseMessage]]":
    """The decoded events for the stream cut in two at every byte position, and byte by byte."""
    results = [decode(data[:i], data[i:]) for i in range(len(data) + 1)]
    results.append(decode(*[data[i:i + 1] for i in range(len(data))]))
    return results


# --- the basics ---------------------------------------------------------------------------------


def test_one_event_with_type_id_and_data():
    """event/id/data lines and a blank line make one message."""
    assert decode(b"id:7\nevent:thinking\ndata:{\"a\":1}\n\n") == [SseMessage("thinking", '{"a":1}', "7")]


def test_one_space_after_the_colon_is_dropped_and_only_one():
    """'data: x' is 'x'; 'data:  x' keeps the second space."""
    assert decode(b"data: x\n\ndata:  y\n\n") == [SseMessage("message", "x"), SseMessage("message", " y")]


def test_multi_line_data_is_joined_with_newlines():
    """Several data lines join with LF; an empty data line adds an empty line."""
    assert decode(b"data: first\ndata:\ndata: third\n\n") == [SseMessage("message", "first\n\nthird")]


def test_an_empty_data_field_dispatches_an_empty_message():
    """'data' alone (no colon) is a data line with an empty value."""
    assert decode(b"data\n\n") == [SseMessage("message", "")]


def test_comments_and_heartbeats_are_counted_not_dispatched():
    """':connected' and ':heartbeat' lines, alone or between fields, produce nothing."""
    decoder = SseDecoder()
    out = decoder.feed(b":connected\n\n:heartbeat\n\nevent:done\n:inline comment\ndata:{}\n\n:heartbeat\n\n")
    assert out == [SseMessage("done", "{}")]
    assert decoder.comments == 4


def test_a_blank_line_without_data_dispatches_nothing_but_keeps_the_id():
    """An event with only id/event lines is not dispatched; its id still counts."""
    decoder = SseDecoder()
    assert decoder.feed(b"id:5\nevent:x\n\n") == []
    assert decoder.last_event_id == "5"
    assert decoder.feed(b"data:y\n\n") == [SseMessage("message", "y", "5")]  # the event type was reset


def test_the_last_event_id_persists_across_events():
    """An event without an id field carries the last id seen (the spec's last-event-id buffer)."""
    assert decode(b"id:1\ndata:a\n\ndata:b\n\nid\ndata:c\n\n") == [
        SseMessage("message", "a", "1"), SseMessage("message", "b", "1"), SseMessage("message", "c", "")]


def test_an_id_with_nul_is_ignored():
    """An id field holding U+0000 does not change the last event id."""
    assert decode(b"id:1\ndata:a\n\nid:2\x003\ndata:b\n\n")[1].id == "1"


def test_the_decoder_can_start_from_a_known_last_event_id():
    """A decoder for a resumed connection starts with the id it resumed after."""
    assert decode(b"data:x\n\n", last_event_id="41") == [SseMessage("message", "x", "41")]


def test_retry_is_taken_only_when_it_is_digits():
    """retry: 2500 sets the reconnection time; retry: 1.5 or retry: x is ignored."""
    decoder = SseDecoder()
    decoder.feed(b"retry: 2500\n\nretry: 1.5\n\nretry: x\n\nretry:\n\n")
    assert decoder.retry_ms == 2500


def test_unknown_fields_are_ignored():
    """A field the spec does not know (or a misspelt one) changes nothing."""
    assert decode(b"foo: bar\nEvent: x\ndata: y\n\n") == [SseMessage("message", "y")]


def test_a_leading_bom_is_dropped_once():
    """A UTF-8 BOM at the very start is not part of the first field name."""
    assert decode(b"\xef\xbb\xbfdata: x\n\n") == [SseMessage("message", "x")]
    assert decode(b"\xef\xbb\xbf", b"data: x\n\n") == [SseMessage("message", "x")]


def test_invalid_utf8_becomes_the_replacement_character():
    """Broken UTF-8 does not stop the stream; it decodes as U+FFFD."""
    assert decode(b"data: a\xffb\n\n") == [SseMessage("message", "a\ufffdb")]


# --- line endings -------------------------------------------------------------------------------


@pytest.mark.parametrize("eol", [b"\n", b"\r\n", b"\r"], ids=["LF", "CRLF", "CR"])
def test_every_line_ending_works(eol):
    """LF, CRLF and CR each end a line (and two of them end an event)."""
    data = eol.join([b"id: 3", b"event: tool_call", b"data: one", b"data: two", b"", b":hb", b"", b""])
    assert decode(data) == [SseMessage("tool_call", "one\ntwo", "3")]


def test_mixed_line_endings_in_one_stream():
    """Line endings may change from line to line."""
    data = b"data: a\r\ndata: b\rdata: c\n\r\ndata: d\r\r"
    assert decode(data) == [SseMessage("message", "a\nb\nc"), SseMessage("message", "d")]


def test_cr_then_lf_in_the_next_chunk_is_one_line_ending():
    """A CRLF split across chunks does not make an extra blank line (which would dispatch early)."""
    assert decode(b"data: a\r", b"\ndata: b\r\n\r\n") == [SseMessage("message", "a\nb")]


def test_cr_at_the_end_of_a_chunk_dispatches_without_waiting():
    """An event ended by CR CR is dispatched as soon as it arrives, not when the next chunk comes."""
    decoder = SseDecoder()
    assert decoder.feed(b"data: now\r\r") == [SseMessage("message", "now")]
    assert decoder.feed(b"\ndata: later\n\n") == [SseMessage("message", "later")]


# --- partial chunks -----------------------------------------------------------------------------

STREAM = (
    ":connected\r\n\r\n"
    "id:1\r\nevent:thinking\r\ndata:{\"content\":\"llm__1\",\"text\":\"h\u00e9llo \u20ac \U0001f600\"}\r\n\r\n"
    ":heartbeat\n\n"
    "id:2\nevent:tool_call\ndata:{\"toolName\":\"act\",\n"
    "data:\"args\":{}}\n\n"
    "retry: 1000\rid:3\revent:done\rdata:{}\r\r"
).encode("utf-8")

EXPECTED = [
    SseMessage("thinking", "{\"content\":\"llm__1\",\"text\":\"h\u00e9llo \u20ac \U0001f600\"}", "1"),
    SseMessage("tool_call", "{\"toolName\":\"act\",\n\"args\":{}}", "2"),
    SseMessage("done", "{}", "3"),
]


def test_a_stream_split_at_every_position_decodes_the_same():
    """Cut anywhere (mid-UTF-8 sequence, mid-line, mid-CRLF, mid-field name), or fed byte by
    byte, the stream gives the same events."""
    for result in every_split(STREAM):
        assert result == EXPECTED


def test_a_multibyte_character_split_over_three_chunks():
    """A 4-byte UTF-8 character arriving one byte at a time is decoded once, intact."""
    emoji = "\U0001f600".encode("utf-8")
    assert decode(b"data: ", emoji[:1], emoji[1:3], emoji[3:], b"\n\n") == [SseMessage("message", "\U0001f600")]


# --- end of stream ------------------------------------------------------------------------------


def test_an_event_without_its_blank_line_at_eof_is_discarded():
    """The spec: an event cut off by the end of the stream is not dispatched."""
    assert decode(b"data: complete\n\ndata: cut off\n") == [SseMessage("message", "complete")]
    assert decode(b"data: complete\n\ndata: no newline either") == [SseMessage("message", "complete")]


def test_close_forgets_the_unfinished_event():
    """After close() (a dropped connection), a new stream on the same decoder starts clean."""
    decoder = SseDecoder()
    assert decoder.feed(b"event: tool_call\ndata: half") == []
    decoder.close()
    assert decoder.feed(b"data: fresh\n\n") == [SseMessage("message", "fresh")]


# --- typed events -------------------------------------------------------------------------------

EXEC = "4eac9501-9b8a-455f-9dff-00f0f9c6ea5e"


def sse(event: str, data: str, id: str = "1") -> SseMessage:
    return SseMessage(event, data, id)


def test_the_servers_event_shapes_become_typed_events():
    """The exact payloads the server sends (recorded from Conductor 3.32) map to typed events."""
    thinking = event_from_sse(sse("thinking", '{"id":1,"type":"thinking","executionId":"%s",'
                                             '"content":"probe1_llm__1","timestamp":1795946832408}' % EXEC), EXEC)
    assert thinking == ThinkingEvent(execution_id=EXEC, id="1", timestamp=1795946832.408,
                                     task_reference_name="probe1_llm__1")
    waiting = event_from_sse(sse("waiting", '{"id":2,"type":"waiting","executionId":"%s","pendingTool":'
                                            '{"taskRefName":"call_1_0__1"},"timestamp":1}' % EXEC, "2"), EXEC)
    assert (waiting.kind, waiting.task_reference_name, waiting.id) == ("waiting", "call_1_0__1", "2")
    call = event_from_sse(sse("tool_call", '{"id":4,"type":"tool_call","executionId":"%s","toolName":"act",'
                                           '"args":{"_agent_tool_name":"act","_agent_state":{},"method":"act",'
                                           '"action":"one"},"timestamp":1}' % EXEC, "4"), EXEC)
    assert isinstance(call, ToolCallEvent) and call.tool_name == "act" and call.arguments == {"action": "one"}
    result = event_from_sse(sse("tool_result", '{"id":5,"type":"tool_result","executionId":"%s",'
                                               '"toolName":"act","result":{"done":"one"}}' % EXEC, "5"), EXEC)
    assert isinstance(result, ToolResultEvent) and result.result == {"done": "one"} and result.timestamp is None
    error = event_from_sse(sse("error", '{"type":"error","executionId":"%s","content":"RuntimeError: kaboom",'
                                        '"toolName":"call_7_0__4"}' % EXEC, "9"), EXEC)
    assert error == ErrorEvent(execution_id=EXEC, id="9", message="RuntimeError: kaboom",
                               task_reference_name="call_7_0__4")
    assert not error.ends_run
    done = event_from_sse(sse("done", '{"type":"done","executionId":"%s","output":{"result":"bye",'
                                      '"finishReason":"STOP","context":{}}}' % EXEC, "12"), EXEC)
    assert isinstance(done, DoneEvent) and done.ends_run
    assert (done.result, done.finish_reason) == ("bye", "STOP")


def test_a_run_level_error_ends_the_run():
    """The server's error with toolName 'workflow' (terminated / failed run) is the run's last event."""
    event = event_from_sse(sse("error", '{"type":"error","content":"cancelled by the caller",'
                                        '"toolName":"workflow"}'), EXEC)
    assert event.run_level and event.ends_run and event.task_reference_name is None


def test_the_json_type_is_used_when_the_sse_event_name_is_missing():
    """A message without 'event:' is typed by its JSON 'type'; its id by the JSON 'id'."""
    event = event_from_sse(SseMessage("message", '{"id":3,"type":"thinking","content":"x"}', ""), EXEC)
    assert isinstance(event, ThinkingEvent) and event.id == "3"


def test_unknown_event_types_are_ignored_with_a_debug_log(caplog):
    """subagent_start (or anything new) gives None and one DEBUG line on conductor_agents.events."""
    with caplog.at_level(logging.DEBUG, logger="conductor_agents.events"):
        assert event_from_sse(sse("subagent_start", '{"type":"subagent_start"}'), EXEC) is None
    records = [r for r in caplog.records if r.name == "conductor_agents.events"]
    assert records and records[0].levelno == logging.DEBUG and "subagent_start" in records[0].getMessage()


@pytest.mark.parametrize("data", ["not json", "[1, 2]", '"text"'])
def test_malformed_data_is_ignored(data):
    """Data that is not a JSON object is skipped, not an error."""
    assert event_from_sse(sse("thinking", data), EXEC) is None


def test_events_are_frozen_values():
    """Events are immutable and compare by value; kind is fixed by the class."""
    event = WaitingEvent(execution_id=EXEC, id="2", task_reference_name="r")
    with pytest.raises(AttributeError):
        event.id = "3"  # type: ignore[misc]
    assert event == WaitingEvent(execution_id=EXEC, id="2", task_reference_name="r")
    assert event.kind == "waiting" and event.source == "stream"
