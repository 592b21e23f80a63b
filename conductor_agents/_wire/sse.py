"""An incremental decoder for ``text/event-stream`` (server-sent events).

It follows the WHATWG HTML "event stream interpretation" rules: UTF-8 (a leading BOM is
dropped, invalid bytes become U+FFFD); lines end with CRLF, LF or CR; ``:`` starts a
comment; ``field: value`` loses exactly one space after the colon; ``data`` lines are
joined with ``\\n``; ``id`` sets the last-event-id (ignored when it holds NUL) and persists
across events; ``retry`` is honoured only when it is all ASCII digits; a blank line
dispatches the event, but only when it carried data; an event cut off by the end of the
stream (no blank line after it) is discarded.

Bytes may arrive split anywhere: in the middle of a UTF-8 sequence, a line, or a CRLF.
"""

from __future__ import annotations

import codecs

import attrs

__all__ = ["SseDecoder", "SseMessage"]


@attrs.frozen
class SseMessage:
    """One dispatched server-sent event.

    ``event`` is the event type (``"message"`` when the server named none), ``data`` the
    joined data lines, ``id`` the last-event-id in force when it was dispatched (``""``
    when the server never sent one).
    """

    event: str
    data: str
    id: str = ""


class SseDecoder:
    """Turns byte chunks into :class:`SseMessage` values. Not thread-safe (one per connection)."""

    def __init__(self, last_event_id: str = "") -> None:
        self._text = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._line = ""            # the current, unfinished line
        self._skip_lf = False      # the previous chunk ended with CR: a leading LF belongs to it
        self._started = False      # the BOM check is done
        self._event = ""
        self._data: list[str] = []
        self._has_data = False
        #: The last event id seen (persists across events, as the spec says).
        self.last_event_id = last_event_id
        #: The reconnection time the server asked for, in milliseconds (None: never sent).
        self.retry_ms: int | None = None
        #: How many comment lines (heartbeats included) were read.
        self.comments = 0

    def feed(self, chunk: bytes) -> list[SseMessage]:
        """Decode ``chunk`` and return the events it completes, in order."""
        text = self._text.decode(chunk)
        if not self._started and text:
            self._started = True
            if text.startswith("\ufeff"):
                text = text[1:]
        return self._consume(text)

    def close(self) -> None:
        """The stream ended: drop the unfinished line and event (never dispatched)."""
        self._text.reset()
        self._line = ""
        self._skip_lf = False
        self._reset_event()

    # -- internals --------------------------------------------------------------------

    def _consume(self, text: str) -> list[SseMessage]:
        out: list[SseMessage] = []
        start = 0
        if self._skip_lf and text:
            self._skip_lf = False
            if text[0] == "\n":
                start = 1
        i = start
        n = len(text)
        while i < n:
            ch = text[i]
            if ch == "\r" or ch == "\n":
                line = self._line + text[start:i]
                self._line = ""
                if ch == "\r":
                    if i + 1 < n:
                        if text[i + 1] == "\n":
                            i += 1
                    else:
                        self._skip_lf = True
                message = self._process_line(line)
                if message is not None:
                    out.append(message)
                start = i + 1
            i += 1
        if start < n:
            self._line += text[start:]
        return out

    def _process_line(self, line: str) -> SseMessage | None:
        if line == "":
            return self._dispatch()
        if line[0] == ":":
            self.comments += 1
            return None
        field, sep, value = line.partition(":")
        if sep and value.startswith(" "):
            value = value[1:]
        if field == "event":
            self._event = value
        elif field == "data":
            self._data.append(value)
            self._has_data = True
        elif field == "id" and "\x00" not in value:
            self.last_event_id = value
        elif field == "retry" and value and value.isascii() and value.isdigit():
            self.retry_ms = int(value)
        return None  # unknown fields are ignored, as the spec says

    def _dispatch(self) -> SseMessage | None:
        if not self._has_data:
            self._reset_event()
            return None
        message = SseMessage(event=self._event or "message", data="\n".join(self._data), id=self.last_event_id)
        self._reset_event()
        return message

    def _reset_event(self) -> None:
        self._event = ""
        self._data = []
        self._has_data = False
