"""What the verb groups that talk to a server share: ``--server-url`` and its settings, adding a verb,
seconds and ``MODULE:AGENT`` arguments, and turning errors into exit codes.

``_agents``, ``_humans`` and ``_serve`` build every verb with :func:`add_verb`, so each verb has the
same ``--server-url`` option (one parent parser) and help layout.
"""

from __future__ import annotations

import argparse
import textwrap
from collections.abc import Callable
from typing import Any

from ..settings import AgentSettings
from ._main import error

__all__ = ["ErrorRule", "Handler", "add_target", "add_verb", "on_errors", "positive_seconds", "server_options",
           "settings"]

#: A verb's body: the parsed arguments in, the exit code out.
Handler = Callable[[argparse.Namespace], int]
#: ``(error type or types, exit code)``, or ``(error type or types, exit code, message)`` where
#: ``message(err)`` is the line printed (default ``str(err)``).
ErrorRule = tuple[Any, ...]


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
