"""``conductor-agents serve MODULE:AGENT``: serve an agent's runs (and adopt orphans) until told to stop.

The process serves every run of the agent that no live process serves, and the runs other processes
hand over; SIGTERM or Ctrl-C closes the runtime, which hands this process's runs over to the other
serving processes (see ``docs/operations.md``). It starts no run itself.
"""

from __future__ import annotations

import argparse
import signal
import threading
from typing import Any

from ..runtime import AgentRuntime
from ._options import EXIT_CODES, add_target, add_verb, guarded, note, positive_seconds, settings
from ._target import load_agent

__all__ = ["register"]


def register(subparsers: Any) -> None:
    parser = add_verb(
        subparsers, "serve", guarded(_serve),
        "serve an agent's runs from this process, adopting orphans, until SIGTERM",
        "Import MODULE:AGENT (a stateful Agent, or a function returning one) and serve its runs from this "
        "process: the runs no live process serves are adopted here (spread over every process that serves "
        "the agent), each run served by exactly one process. SIGTERM or Ctrl-C hands this process's runs "
        "over to the others and exits 0.", epilog=EXIT_CODES)
    add_target(parser)
    parser.add_argument("--timeout", type=positive_seconds, default=None, metavar="SECONDS",
                        help="hand over and exit after SECONDS (default: serve until SIGTERM or Ctrl-C)")


def _serve(args: argparse.Namespace) -> int:
    agent = load_agent(args.target)
    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        with AgentRuntime(settings(args, auto_start_workers=True)) as runtime:
            adopted = []
            runtime.serve(agent, on_adopt=lambda handle: adopted.append(handle.execution_id))
            note(f"serving {agent.name} as {runtime.worker_id}; SIGTERM or Ctrl-C hands its runs over")
            stop.wait(args.timeout)
            note(f"handing over ({len(adopted)} runs adopted here) ...")
        note("handed over")
        return 0
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
