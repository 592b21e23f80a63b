"""``conductor-agents schedule create|list|pause|unpause|delete``: an agent started on a cron expression by
the server's scheduler (``runtime.schedules``).

The runs a schedule starts are served by the processes that serve the agent (``conductor-agents serve
MODULE:AGENT``): they adopt them. These verbs register no workers.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import attrs

from .._scheduling import Schedule
from ..errors import AgentDefinitionError, ScheduleNotFoundError
from ..runtime import AgentRuntime
from ._main import EXIT_NOT_FOUND, EXIT_OK, EXIT_USAGE
from ._options import AGENT_ERRORS, EXIT_CODES, add_target, add_verb, camel, on_errors, settings
from ._target import load_agent

__all__ = ["register"]


def register(subparsers: Any) -> None:
    """Add ``schedule`` and its actions to the top-level ``subparsers``."""
    parser = subparsers.add_parser(
        "schedule", help="run an agent on a cron expression (the server's scheduler)",
        description="Create, list, pause, unpause and delete the server's cron schedules of agents. A scheduled "
                    "run is served by the processes running `conductor-agents serve MODULE:AGENT`.")
    actions = parser.add_subparsers(dest="action", metavar="ACTION")
    actions.required = True
    epilog = EXIT_CODES

    create = add_verb(actions, "create", _guarded(_create), "create (or replace) a schedule",
                      "Have the server start MODULE:AGENT (a stateful agent) with PROMPT on CRON: six fields, "
                      "seconds first ('0 0 9 * * MON-FRI': 9:00 on weekdays).", epilog=epilog)
    add_target(create)
    create.add_argument("prompt", metavar="PROMPT")
    create.add_argument("--name", required=True, help="the schedule's name (creating it again replaces it)")
    create.add_argument("--cron", required=True, help="six fields, seconds first")
    create.add_argument("--zone", default="UTC", help="the time zone CRON is read in (default UTC)")
    create.add_argument("--paused", action="store_true", help="create it paused")
    create.add_argument("--json", action="store_true", help="print the schedule as JSON")

    listing = add_verb(actions, "list", _guarded(_list), "list the schedules",
                       "Print every schedule (or those of AGENT, by its name): name, agent, cron, next run.",
                       epilog=epilog)
    listing.add_argument("agent", metavar="AGENT", nargs="?", help="only this agent's (its Agent.name)")
    listing.add_argument("--json", action="store_true", help="print a JSON list")

    for action, handler, what in (("pause", _pause, "start no more runs until unpaused"),
                                  ("unpause", _unpause, "start runs again"),
                                  ("delete", _delete, "delete the schedule (runs already started go on)")):
        verb = add_verb(actions, action, _guarded(handler), what, what[0].upper() + what[1:] + ".", epilog=epilog)
        verb.add_argument("name", metavar="NAME")


def _guarded(handler: Any) -> Any:
    return on_errors(handler, (ScheduleNotFoundError, EXIT_NOT_FOUND), ((ValueError, AgentDefinitionError), EXIT_USAGE),
                     *AGENT_ERRORS)


def _as_dict(schedule: Schedule) -> dict[str, Any]:
    row = attrs.asdict(schedule, recurse=False)
    row["context"] = dict(schedule.context)
    for key in ("next_run", "created"):
        row[key] = row[key].isoformat() if row[key] is not None else None
    return camel(row)  # agentName, nextRun: camelCase as every --json


def _print(schedules: tuple[Schedule, ...], as_json: bool) -> None:
    if as_json:
        print(json.dumps([_as_dict(s) for s in schedules], indent=2))
        return
    for s in schedules:
        when = "paused" if s.paused else f"next {s.next_run:%Y-%m-%d %H:%M:%S} UTC" if s.next_run else "-"
        print(f"{s.name}  {s.agent_name}  {s.cron!r} ({s.zone})  {when}")


def _create(args: argparse.Namespace) -> int:
    agent = load_agent(args.target)
    with AgentRuntime(settings(args)) as runtime:
        made = runtime.schedules.create(agent, args.prompt, name=args.name, cron=args.cron, zone=args.zone,
                                        paused=args.paused)
    _print((made,), args.json)
    return EXIT_OK


def _list(args: argparse.Namespace) -> int:
    with AgentRuntime(settings(args)) as runtime:
        _print(runtime.schedules.list(args.agent), args.json)
    return EXIT_OK


def _pause(args: argparse.Namespace) -> int:
    with AgentRuntime(settings(args)) as runtime:
        _print((runtime.schedules.pause(args.name),), False)
    return EXIT_OK


def _unpause(args: argparse.Namespace) -> int:
    with AgentRuntime(settings(args)) as runtime:
        _print((runtime.schedules.unpause(args.name),), False)
    return EXIT_OK


def _delete(args: argparse.Namespace) -> int:
    with AgentRuntime(settings(args)) as runtime:
        if not runtime.schedules.delete(args.name):
            raise ScheduleNotFoundError(f"no schedule named {args.name!r} on the server", name=args.name)
    return EXIT_OK
