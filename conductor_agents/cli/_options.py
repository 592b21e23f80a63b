"""What the verb groups that talk to a server share: ``--server-url`` and its settings, adding a verb,
seconds and ``MODULE:AGENT`` arguments, turning errors into exit codes (:func:`guarded`), a note on
standard error (:func:`note`) and a message or answer read from the command line (:func:`parse_message`).

``_agents``, ``_humans`` and ``_serve`` build every verb with :func:`add_verb`, so each verb has the
same ``--server-url`` option (one parent parser) and help layout.
"""

from __future__ import annotations

import argparse
import json
import sys
import textwrap
from collections.abc import Callable, Mapping
from typing import Any

from ..errors import (
    ConductorAgentsError,
    ConfigurationError,
    ExecutionNotFoundError,
    ExecutionNotRunningError,
    ServerUnavailableError,
    WaitTimeoutError,
    WorkerStallError,
)
from ..settings import AgentSettings
from ._main import (
    EXIT_ERROR,
    EXIT_NOT_FOUND,
    EXIT_TIMED_OUT,
    EXIT_UNREACHABLE,
    EXIT_USAGE,
    error,
)
from ._target import TargetError, TargetImportError

__all__ = ["AGENT_ERRORS", "EXIT_CODES", "ErrorRule", "Handler", "add_on_run", "add_target", "add_verb", "camel",
           "guarded", "note", "on_errors", "parse_message", "positive_seconds", "server_options", "settings"]

#: A verb's body: the parsed arguments in, the exit code out.
Handler = Callable[[argparse.Namespace], int]
#: ``(error type or types, exit code)``, or ``(error type or types, exit code, message)`` where
#: ``message(err)`` is the line printed (default ``str(err)``).
ErrorRule = tuple[Any, ...]
#: The epilog of the verbs: where the exit codes are (the table is in the top-level ``--help`` only).
EXIT_CODES = "exit codes: see conductor-agents --help"

#: The agent verbs' errors: their exit codes, tried in order.
AGENT_ERRORS: tuple[ErrorRule, ...] = (
    ((TargetError, ConfigurationError), EXIT_USAGE),
    (TargetImportError, EXIT_ERROR),
    ((ExecutionNotFoundError, ExecutionNotRunningError), EXIT_NOT_FOUND),
    (ServerUnavailableError, EXIT_UNREACHABLE,
     lambda err: f"{err} (is the Conductor server running? set CONDUCTOR_SERVER_URL or --server-url)"),
    (WaitTimeoutError, EXIT_TIMED_OUT,
     lambda err: f"run {err.execution_id} did not end within {err.timeout:g}s; it goes on on the server and is "
                 f"not cancelled (see `conductor-agents status|wait|resume|stop|cancel`)"),
    (WorkerStallError, EXIT_ERROR),
    (ConductorAgentsError, EXIT_ERROR),
)


def server_options() -> argparse.ArgumentParser:
    """The parent parser of every verb that talks to a server: ``--server-url``."""
    parent = argparse.ArgumentParser(add_help=False)
    parent.add_argument("--server-url", metavar="URL",
                        help="Conductor API base URL (default: CONDUCTOR_SERVER_URL, else http://localhost:8080/api)")
    return parent


def settings(args: argparse.Namespace, **overrides: Any) -> AgentSettings:
    """The settings of a verb: ``--server-url`` over the environment, plus ``overrides``."""
    if args.server_url:
        overrides["server_url"] = args.server_url
    return AgentSettings.from_env(**overrides)


def add_verb(subparsers: argparse._SubParsersAction[argparse.ArgumentParser], name: str, handler: Handler, help_: str,
             description: str, *parents: argparse.ArgumentParser, epilog: str) -> argparse.ArgumentParser:
    """Add the verb ``name`` (``--server-url`` and then ``parents``' options) that runs ``handler``."""
    parser = subparsers.add_parser(name, help=help_, description=textwrap.fill(description, 88), epilog=epilog,
                                   parents=[server_options(), *parents],
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.set_defaults(handler=handler)
    return parser


def add_on_run(subparsers: argparse._SubParsersAction[argparse.ArgumentParser], name: str, handler: Handler,
               help_: str, description: str, *parents: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the verb ``name`` (as :func:`add_verb`, :data:`EXIT_CODES` its epilog) that acts on the run
    EXECUTION_ID, its first argument."""
    parser = add_verb(subparsers, name, handler, help_, description, *parents, epilog=EXIT_CODES)
    parser.add_argument("execution_id", metavar="EXECUTION_ID")
    return parser


def add_target(parser: argparse.ArgumentParser) -> None:
    """The ``MODULE:AGENT`` argument of the verbs that load an agent."""
    parser.add_argument("target", metavar="MODULE:AGENT",
                        help="a module (dotted name or .py file) and the Agent in it, or a function returning one")


def positive_seconds(text: str) -> float:
    """An argument's number of seconds: finite and > 0.

    Raises:
        argparse.ArgumentTypeError: anything else (argparse makes it a usage error).
    """
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a number of seconds > 0, got {text!r}")
    return value


def on_errors(handler: Handler, *rules: ErrorRule) -> Handler:
    """``handler`` with each error a rule names printed as one line on standard error and answered with
    the rule's exit code; rules are tried in order, like ``except`` clauses (others propagate)."""
    caught = tuple(kind for rule in rules for kind in (rule[0] if isinstance(rule[0], tuple) else (rule[0],)))

    def run(args: argparse.Namespace) -> int:
        try:
            return handler(args)
        except caught as err:
            for kinds, code, *message in rules:
                if isinstance(err, kinds):
                    error(message[0](err) if message else str(err))
                    exit_code: int = code
                    return exit_code
            raise  # not reached: every caught type has a rule

    return run


def guarded(handler: Handler) -> Handler:
    """Map the errors of an agent verb to its documented exit code and one line on stderr."""
    return on_errors(handler, *AGENT_ERRORS)


def camel(fields: Mapping[str, Any]) -> dict[str, Any]:
    """``fields`` (an SDK value's, by attribute name) with camelCase keys, as every ``--json`` prints them
    (``prompt_tokens`` → ``promptTokens``); the values are left as they are (they may be the user's data)."""
    out: dict[str, Any] = {}
    for key, value in fields.items():
        head, *rest = key.split("_")
        out[head + "".join(part.title() for part in rest)] = value
    return out


def note(text: str) -> None:
    """Print ``text`` on standard error (progress and notes; results go to standard output)."""
    print(text, file=sys.stderr, flush=True)


def parse_message(text: str, *, as_text: bool) -> Any:
    """``text`` as JSON when it parses, else as text; text that looks like JSON (an object or a list)
    but does not parse is sent as text with a warning saying why (``--text`` silences it)."""
    if as_text:
        return text
    try:
        return json.loads(text)
    except ValueError as err:
        if text.lstrip()[:1] in ("{", "["):
            reason = f"{err.msg} at column {err.colno}" if isinstance(err, json.JSONDecodeError) else str(err)
            note(f"conductor-agents: warning: the message looks like JSON but is not ({reason}); "
                 "it is sent as text, {\"message\": \"...\"} (--text: that is meant)")
        return text
