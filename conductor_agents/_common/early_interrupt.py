"""Ctrl-C while the command line starts: exit 130 with one line, never a ``KeyboardInterrupt`` traceback.

``cli._main.main`` answers Ctrl-C (exit 130), but only once it runs, and the package it lives in takes a few
hundred milliseconds to import. So the package's ``__init__`` calls :func:`hold` before its other imports: in a
process launched as the command line (``conductor-agents ...`` or ``python -m conductor_agents ...``), and only
there, a SIGINT until ``main`` calls :func:`release` ends the process at once (exit 130, the empty line ``main``
prints for Ctrl-C). A program that imports the package is left alone, and so is a SIGINT handler of its own.

May import: the standard library.
"""

from __future__ import annotations

import signal
import sys
from collections.abc import Sequence
from types import FrameType

__all__ = ["hold", "launched_as_cli", "release"]

#: ``cli._main``'s exit code for Ctrl-C (that module cannot be imported this early).
_EXIT_INTERRUPTED = 130
#: The console script's names: as installed, and as Windows launchers run it.
_SCRIPTS = frozenset({"conductor-agents", "conductor-agents.exe", "conductor-agents-script.py"})


def launched_as_cli(argv0: str, orig_argv: Sequence[str]) -> bool:
    """Whether this process is the command line, from ``sys.argv[0]`` and ``sys.orig_argv`` while the package
    is imported (``python -m`` says ``-m`` in ``sys.argv[0]`` until the module is found)."""
    if argv0.replace("\\", "/").rsplit("/", 1)[-1] in _SCRIPTS:  # a Windows path on any system
        return True
    if argv0 != "-m":
        return False
    for at, arg in enumerate(orig_argv):
        if arg == "-m":
            return orig_argv[at + 1:at + 2] == ["conductor_agents"]
        if arg.startswith("-m"):
            return arg == "-mconductor_agents"
    return False


def _exit_interrupted(signum: int, frame: FrameType | None) -> None:
    print(file=sys.stderr, flush=True)
    raise SystemExit(_EXIT_INTERRUPTED)


def hold() -> None:
    """In the command line's process, make SIGINT exit 130 until :func:`release`; elsewhere do nothing."""
    if not launched_as_cli(sys.argv[0] if sys.argv else "", list(getattr(sys, "orig_argv", ()))):
        return
    if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        return  # someone chose what Ctrl-C does: theirs
    try:
        signal.signal(signal.SIGINT, _exit_interrupted)
    except ValueError:  # not the main thread: nothing to hold
        return


def release() -> None:
    """Give SIGINT back to Python's ``KeyboardInterrupt`` if :func:`hold` took it (``main`` catches it from here)."""
    if signal.getsignal(signal.SIGINT) is _exit_interrupted:
        signal.signal(signal.SIGINT, signal.default_int_handler)
