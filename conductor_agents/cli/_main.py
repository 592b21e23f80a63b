"""The argument parser and the error policy shared by every verb group.

A verb group is a module with ``register(subparsers)``; it adds its parsers and sets
``handler`` (``args -> exit code``) on each. Add new groups to ``VERB_GROUPS``.

Exit codes (:data:`EXIT_CODE_TABLE` is the one list; the top-level ``--help`` (each verb's points to it), README.md
and docs/cli.md show it, and a test holds them to it): 0 ok, 1 error (or the run ended
FAILED/TERMINATED/TIMED_OUT), 2 usage or configuration (also: the server cannot call the model), 3 not found / not
running / nothing to answer, 4 server unreachable, 5 wait timed out, 6 a message can no longer be delivered (send
--wait-delivered), 7 another answer won (approve/reject/respond), 130 interrupted. Errors are one line on standard
error, never a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
import textwrap
from collections.abc import Callable, Sequence

from .._common.early_interrupt import release as release_early_interrupt
from .._version import __version__
from ..errors import ConductorAgentsError, JavaNotFoundError

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_NOT_FOUND = 3
EXIT_UNREACHABLE = 4
EXIT_TIMED_OUT = 5
EXIT_MESSAGE_LOST = 6
EXIT_CONFLICT = 7
_EXIT_INTERRUPTED = 130

EXIT_CODE_TABLE: tuple[tuple[int, str], ...] = (
    (EXIT_OK, ("success; for run/resume/wait/stop --wait: the run COMPLETED; `pending` also when "
               "nothing waits (it prints nothing, or [] with --json)")),
    (EXIT_ERROR, "the run ended FAILED, TERMINATED or TIMED_OUT, or another error"),
    (EXIT_USAGE, ("usage or configuration error: bad arguments, a bad CONDUCTOR_* value or server URL, "
                  "MODULE:AGENT not found; the server cannot call the run's model (no key, no route)")),
    (EXIT_NOT_FOUND, ("unknown execution; it is no longer running (send, pause, unpause, signal, approve, reject, "
                      "respond); no such schedule; nothing of that kind waits (approve, reject, respond); server "
                      "verbs: no server running, or no Java")),
    (EXIT_UNREACHABLE, "the Conductor server cannot be reached"),
    (EXIT_TIMED_OUT, "the wait timed out (--timeout); the run goes on on the server"),
    (EXIT_MESSAGE_LOST, ("send --wait-delivered: the message can no longer reach the run (it ended, or "
                         "the server lost it)")),
    (EXIT_CONFLICT, "approve, reject, respond: another answer won; the run goes on with that one"),
    (_EXIT_INTERRUPTED, "interrupted (Ctrl-C)"),
)
"""Every exit code of the command line and what it means: the one list the help and the docs show."""


def exit_codes_help() -> str:
    """:data:`EXIT_CODE_TABLE` as the ``exit codes:`` section of a ``--help``."""
    lines = ["exit codes:"]
    for code, meaning in EXIT_CODE_TABLE:
        wrapped = textwrap.wrap(meaning, 80)
        lines.append(f"  {code:<3}  {wrapped[0]}")
        lines.extend(f"       {rest}" for rest in wrapped[1:])
    return "\n".join(lines)

VERB_GROUPS: list[str] = ["conductor_agents.cli._server", "conductor_agents.cli._agents", "conductor_agents.cli._serve",
                           "conductor_agents.cli._humans", "conductor_agents.cli._watch",
                           "conductor_agents.cli._schedules"]
"""Modules that add verbs; each exposes ``register(subparsers)``."""

_PROG = "conductor-agents"


def build_parser() -> argparse.ArgumentParser:
    """Return the full parser with every verb group registered."""
    parser = argparse.ArgumentParser(
        prog=_PROG,
        description="Durable AI agents on the Conductor orchestration server.",
        epilog=exit_codes_help(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("-V", "--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="log more (-vv: debug)")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    subparsers.required = True
    for name in VERB_GROUPS:
        importlib.import_module(name).register(subparsers)
    return parser


def error(message: str) -> None:
    """Print ``message`` as the single error line on standard error."""
    first = str(message).strip().splitlines()[0] if str(message).strip() else "unknown error"
    print(f"{_PROG}: error: {first}", file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line with ``argv`` (default ``sys.argv[1:]``); return the exit code.

    Ctrl-C at any point is exit 130 and an empty line (before this runs: see ``_common.early_interrupt``); a
    reader of standard output that went away (``| head``) is exit 1 and no traceback.
    """
    restore_logging: Callable[[], None] = lambda: None  # noqa: E731 - until logging is configured
    try:
        release_early_interrupt()  # from here on, Ctrl-C is the KeyboardInterrupt caught below
        parser = build_parser()
        try:
            args = parser.parse_args(argv)
        except SystemExit as exit_:  # --help, --version and usage errors (2)
            return exit_.code if isinstance(exit_.code, int) else EXIT_USAGE
        restore_logging = _configure_logging(args.verbose)
        return int(args.handler(args))
    except JavaNotFoundError as err:
        error(str(err))
        return EXIT_NOT_FOUND
    except ConductorAgentsError as err:
        error(str(err))
        return EXIT_ERROR
    except KeyboardInterrupt:
        print(file=sys.stderr)
        return _EXIT_INTERRUPTED
    except BrokenPipeError:  # standard output's reader went away (`events ID | head`): nothing is left to say
        _drop_stdout()
        return EXIT_ERROR
    finally:
        restore_logging()


def _drop_stdout() -> None:
    """Point standard output at the null device, so that the interpreter's last flush meets no broken pipe."""
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, sys.stdout.fileno())
    except (OSError, ValueError) as err:  # not a file of this process (a caller's capture): it is theirs
        logging.getLogger("conductor_agents").debug("standard output left as it is: %s", err)
    finally:
        os.close(null)


def _configure_logging(verbosity: int) -> Callable[[], None]:
    """Send the package's log records to standard error; return a function that undoes it.

    Undoing matters when ``main`` runs inside another program (or a test).
    """
    level = logging.WARNING if verbosity == 0 else logging.INFO if verbosity == 1 else logging.DEBUG
    logger = logging.getLogger("conductor_agents")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(f"{_PROG}: %(levelname)s: %(message)s"))
    previous_level = logger.level
    logger.addHandler(handler)
    logger.setLevel(level)

    def restore() -> None:
        logger.removeHandler(handler)
        logger.setLevel(previous_level)

    return restore
