"""``conductor-agents list AGENT`` and ``conductor-agents events ID``: which runs of an agent are running and
what each waits for; a run's events as they happen, until it ends.

Both register no workers and change nothing on the server. ``list`` sends one request for the running runs
and one status per run (a task-list read more for a run between two looks at its message queue); ``events``
reads the run's event stream (or its task list when the stream is unavailable) and follows a continued
listener from run to run.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import attrs

from .._serving.served import SERVE_HINT
from ..runtime import AgentRuntime
from ._main import EXIT_OK
from ._options import EXIT_CODES, add_on_run, add_verb, camel, guarded, note, positive_seconds, settings
from ._progress import describe_event

__all__ = ["register"]

_EVENTS_TIMEOUT = 3600.0


def register(subparsers: Any) -> None:
    """Add ``list`` and ``events`` to the top-level ``subparsers``."""
    listing = add_verb(subparsers, "list", guarded(_list), "list the running runs of an agent",
                       "Print the running runs of the agent named AGENT (its Agent.name), oldest first: execution "
                       "id, status, what the run waits for (a message, a person, or nothing: it is working), or that "
                       "no process serves it and for how long, and since when it runs. Exit 0 also when none runs.",
                       epilog=EXIT_CODES)
    listing.add_argument("agent", metavar="AGENT", help="the agent's name (Agent.name)")
    listing.add_argument("--json", action="store_true", help="print a JSON list")

    events = add_on_run(subparsers, "events", guarded(_events), "follow a run's events until it ends",
                        "Print the run's events, oldest first, and follow them until the run ends (a continued "
                        "listener is followed from run to run); the history of a run that already ended comes at "
                        "once. Ctrl-C stops following (the run goes on).")
    events.add_argument("--json", action="store_true", help="one JSON object per event and line (JSON Lines)")
    events.add_argument("--timeout", type=positive_seconds, default=_EVENTS_TIMEOUT, metavar="SECONDS",
                        help=f"stop following after SECONDS (default {_EVENTS_TIMEOUT:g}); exit 5, the run goes on")


def _list(args: argparse.Namespace) -> int:
    with AgentRuntime(settings(args)) as runtime:
        rows = [run.to_dict() for run in runtime.running(args.agent)]
    if args.json:
        print(json.dumps(rows, indent=2))
        return EXIT_OK
    now = time.time()
    for row in rows:
        since = f"{_age(now - row['startTime'])} ago" if row["startTime"] else "-"
        print(f"{row['executionId']}  {row['status']:<8}  {_doing(row):<28}  started {since}")
    if any(row["served"] is False for row in rows):
        note(f"a run not served waits for a process: serve them with: {SERVE_HINT}")
    return EXIT_OK


def _doing(row: dict[str, Any]) -> str:
    """What a listed run waits for, or that no process serves it (for how long)."""
    waits = row["waitingFor"]
    if row["served"] is False:
        since = f" for {_age(row['unservedFor'])}" if row["unservedFor"] is not None else ""
        return f"not served{since}" + (f" (waits for {waits})" if waits else "")
    return f"waits for {waits or 'nothing (working)'}"


def _events(args: argparse.Namespace) -> int:
    turns: list[Any] = [0]
    with AgentRuntime(settings(args)) as runtime:
        handle = runtime.attach(args.execution_id)
        with handle.events(timeout=args.timeout) as events:
            for event in events:
                if args.json:
                    print(json.dumps(_event_dict(event), default=str), flush=True)
                    continue
                lines, _ = describe_event(event, turns)
                for line in lines:
                    print(f"{_clock(event.timestamp)}  {line}", flush=True)
    return EXIT_OK


def _event_dict(event: Any) -> dict[str, Any]:
    """An event as JSON: its kind first, then its fields (camelCase, as the other verbs' ``--json``)."""
    fields = attrs.asdict(event, recurse=True) if attrs.has(type(event)) else dict(vars(event))
    return {"kind": fields.pop("kind", getattr(event, "kind", "")), **camel(fields)}


def _clock(timestamp: Any) -> str:
    if not isinstance(timestamp, (int, float)):
        return "--:--:--"
    return time.strftime("%H:%M:%S", time.localtime(timestamp))


def _age(seconds: float) -> str:
    seconds = max(0.0, seconds)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f}{unit}"
    return f"{seconds:.0f}s"
