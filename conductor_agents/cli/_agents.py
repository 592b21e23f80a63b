"""``conductor-agents run|start|resume|send|status|wait|stop|cancel``: agents from the shell.

``run`` and ``resume`` serve the agent's tools from this process in the foreground
until the run ends (Ctrl-C stops it gracefully, a second Ctrl-C cancels it). ``start``
only starts a run and prints its id: a process that exits cannot serve tools, so it is
for agents whose tools run elsewhere, or for a later ``resume``. The other verbs act on
an execution id and register no workers.

Progress goes to standard error (a status line on a terminal, plain lines otherwise);
results go to standard output, so ``ID=$(conductor-agents start ...)`` and
``conductor-agents wait ID --json | jq .status`` work.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from typing import Any

import attrs

from .._common.answer_text import answer_text
from .._serving.served import unserved_line
from ..agent import Agent
from ..errors import MessageLostError, WaitTimeoutError
from ..handle import AgentHandle
from ..result import AgentResult, AgentStatus
from ..runtime import AgentRuntime
from ._foreground import wait_in_foreground
from ._main import EXIT_ERROR, EXIT_MESSAGE_LOST, EXIT_OK, EXIT_TIMED_OUT, EXIT_UNREACHABLE, error
from ._options import (
    EXIT_CODES,
    Handler,
    add_on_run,
    add_target,
    add_verb,
    camel,
    guarded,
    note,
    parse_message,
    positive_seconds,
    settings,
)
from ._progress import ProgressDisplay, RunWatcher, ServedWatch
from ._target import load_agent

__all__ = ["EXIT_MESSAGE_LOST", "EXIT_TIMED_OUT", "EXIT_UNREACHABLE", "register"]

_WAIT_TIMEOUT = 600.0
_STOP_GRACE = 30.0


def register(subparsers: Any) -> None:
    """Add the agent verbs to the top-level ``subparsers``."""
    follow = argparse.ArgumentParser(add_help=False)
    follow.add_argument("--json", action="store_true", help="print the result as JSON on stdout")
    follow.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")

    def add(name: str, handler: Handler, help_: str, description: str,
            *parents: argparse.ArgumentParser) -> argparse.ArgumentParser:
        return add_verb(subparsers, name, guarded(handler), help_, description, *parents, epilog=EXIT_CODES)

    def on_run(name: str, handler: Handler, help_: str, description: str,
               *parents: argparse.ArgumentParser) -> argparse.ArgumentParser:
        return add_on_run(subparsers, name, guarded(handler), help_, description, *parents)

    run = add("run", _run, "start an agent and serve its tools until the run ends",
              "Import MODULE:AGENT (an Agent, or a function returning one), start a run with PROMPT and "
              "serve its tools from this process, printing progress, until the run ends. Ctrl-C stops "
              "the run gracefully (it ends once it has read what it was sent before); a second Ctrl-C cancels it.",
              follow)
    add_target(run)
    run.add_argument("prompt", metavar="PROMPT", help="what the agent starts with")
    _foreground_args(run)

    start = add("start", _start, "start a run and print its execution id (serves no tools)",
                "Start a run of MODULE:AGENT and print its execution id. This process exits at once, so "
                "it serves none of the agent's tools: use it for agents whose tools run elsewhere, or "
                "serve them later with `conductor-agents resume MODULE:AGENT ID`.")
    add_target(start)
    start.add_argument("prompt", metavar="PROMPT", help="what the agent starts with")
    start.add_argument("--idempotency-key", help="starting twice with one key returns the first run")

    resume = add("resume", _resume, "serve a run's tools from this process until it ends",
                 "Re-attach to run EXECUTION_ID with MODULE:AGENT's tools (after a crash, or after "
                 "`start`) and serve them in the foreground, like `run`.", follow)
    add_target(resume)
    resume.add_argument("execution_id", metavar="EXECUTION_ID")
    resume.add_argument("--force", action="store_true",
                        help="take the run over even if another worker polled its domain lately "
                             "(that process is known to be dead)")
    _foreground_args(resume)

    send = on_run("send", _send, "send a message to a running execution",
                      "Push MESSAGE into the run's message queue and print the message id. MESSAGE is parsed as "
                      "JSON (an object is sent as is, another value as {\"message\": value}); anything that is "
                      "not JSON is sent as text, {\"message\": \"...\"}.")
    send.add_argument("message", metavar="MESSAGE", help="JSON or text")
    send.add_argument("--text", action="store_true", help="send MESSAGE as text even if it parses as JSON")
    send.add_argument("--wait-delivered", action="store_true",
                      help="after printing the id, wait until the run has pulled the message; exit 6 if it "
                           "can no longer arrive")
    _wait_timeout(send, "with --wait-delivered: give up after SECONDS")

    status = on_run("status", _status, "print an execution's status",
                        "Print the run's status (exit 0 whatever it is, 3 when the execution is unknown).")
    status.add_argument("--json", action="store_true", help="print JSON")

    wait = on_run("wait", _wait, "wait for an execution to end, with progress",
                      "Wait until the run ends and print its output; the exit code says how it ended. "
                      "Ctrl-C stops waiting (the run goes on).", follow)
    _wait_timeout(wait, "give up waiting after SECONDS")

    stop = on_run("stop", _stop, "ask an execution to finish gracefully",
                      "Ask the run to stop, COMPLETED: a listener once its model read the messages sent before the "
                      "stop, any other run after its current turn (a run blocked on "
                      "wait-for-message gets a stop signal). With --wait, wait for it to end.", follow)
    stop.add_argument("--wait", action="store_true", help="wait for the run to end")
    _wait_timeout(stop, "with --wait: give up after SECONDS")

    for verb, verb_handler, what, detail in (
            ("pause", _pause, "pause an execution", ("Pause the run: it takes no model turn and refuses messages "
             "(409) until unpaused; tool calls already handed out finish.")),
            ("unpause", _unpause, "let a paused execution go on", "Let a paused run go on where it stopped.")):
        on_run(verb, verb_handler, what, detail)

    signalled = on_run("signal", _signal, "set or clear an execution's standing signal",
                           "Set the run's standing signal: the server puts TEXT before every later model turn of the "
                           "agent, also in a listener's later runs, until the next signal replaces it. An empty TEXT "
                           "('') clears it (see docs/steering.md).")
    signalled.add_argument("text", metavar="TEXT", help="the signal; '' clears it")

    cancel = on_run("cancel", _cancel, "terminate an execution at once",
                        "Terminate the run now (TERMINATED). A tool already running is not interrupted.")
    cancel.add_argument("--reason", default="cancelled from the command line", help="recorded on the run")


def _wait_timeout(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument("--timeout", type=positive_seconds, default=_WAIT_TIMEOUT, metavar="SECONDS",
                        help=f"{what} (default {_WAIT_TIMEOUT:g}); exit 5")


def _foreground_args(parser: argparse.ArgumentParser) -> None:
    # No default deadline: serving a run is what the command is for (a listener may wait for days).
    parser.add_argument("--timeout", type=positive_seconds, default=None, metavar="SECONDS",
                        help="stop serving after SECONDS (default: serve until the run ends or Ctrl-C); "
                             "exit 5, the run goes on")
    parser.add_argument("--stop-grace", type=positive_seconds, default=_STOP_GRACE, metavar="SECONDS",
                        help=f"after Ctrl-C, cancel the run if it has not stopped within SECONDS "
                             f"(default {_STOP_GRACE:g})")


# --- verbs that serve tools ----------------------------------------------------------------


def _run(args: argparse.Namespace) -> int:
    agent = load_agent(args.target)
    with AgentRuntime(settings(args, auto_start_workers=True)) as runtime:
        handle = runtime.start(agent, args.prompt)
        note(f"started {agent.name}: execution {handle.execution_id}")
        return _serve(runtime, handle, agent, args)


def _resume(args: argparse.Namespace) -> int:
    agent = load_agent(args.target)
    with AgentRuntime(settings(args, auto_start_workers=True)) as runtime:
        handle = runtime.resume(args.execution_id, agent, force=args.force)
        note(f"resumed {agent.name}: execution {handle.execution_id}"
              + ("" if handle.workers_attached else " (already ended)"))
        return _serve(runtime, handle, agent, args)


def _serve(runtime: AgentRuntime, handle: AgentHandle, agent: Agent, args: argparse.Namespace) -> int:
    if not args.quiet and agent.needs_message_queue:
        note(f"send it messages with: conductor-agents send {handle.execution_id} '{{...}}'")
    if not args.quiet:
        note("Ctrl-C stops the run gracefully; press it twice to cancel")
    display = ProgressDisplay()
    started = time.monotonic()
    with _Watching(runtime, handle, display, args.quiet, args.timeout):
        result = wait_in_foreground(handle, display, timeout=args.timeout, stop_grace=args.stop_grace)
    return _report(result, args, time.monotonic() - started)


# --- verbs on an execution id ---------------------------------------------------------------


def _start(args: argparse.Namespace) -> int:
    agent = load_agent(args.target)
    with AgentRuntime(settings(args, auto_start_workers=False)) as runtime:
        handle = runtime.start(agent, args.prompt, idempotency_key=args.idempotency_key)
    print(handle.execution_id, flush=True)
    if agent.worker_tools:
        note(f"started {agent.name}; its tools are not served by this command: serve them with "
              f"`conductor-agents resume {args.target} {handle.execution_id}`")
    return EXIT_OK


def _send(args: argparse.Namespace) -> int:
    payload = parse_message(args.message, as_text=args.text)
    with AgentRuntime(settings(args)) as runtime:
        message_id = runtime.send_message(args.execution_id, payload)
        print(message_id, flush=True)
        if not args.wait_delivered:
            return EXIT_OK
        try:
            delivery = runtime.wait_delivered(args.execution_id, message_id, timeout=args.timeout)
        except MessageLostError as err:
            error(str(err))
            return EXIT_MESSAGE_LOST
        except WaitTimeoutError:
            error(f"message {message_id} was not pulled by run {args.execution_id} within {args.timeout:g}s; "
                  "it may still arrive")
            return EXIT_TIMED_OUT
    others = delivery.batch_count - 1
    where = "" if delivery.execution_id == args.execution_id else f" (its run {delivery.execution_id})"
    note(f"delivered: run {args.execution_id} read it{where}"
          + (f" with {others} other message{'s' if others != 1 else ''}" if others else ""))
    return EXIT_OK


def _status(args: argparse.Namespace) -> int:
    with AgentRuntime(settings(args)) as runtime:
        handle = runtime.attach(args.execution_id)
        status = handle.status()
    if args.json:
        print(json.dumps(_status_dict(status, handle), indent=2, default=str))
        return EXIT_OK
    rows = [("execution", status.execution_id or handle.execution_id), ("agent", handle.agent_name),
            ("status", status_line(status, handle.execution_id))]
    if handle.run_id:
        rows.append(("run id", handle.run_id))
    if status.waiting_for == "person" and status.pending_tool and status.pending_tool.get("taskRefName"):
        rows.append(("pending", str(status.pending_tool.get("taskRefName"))))  # what `--request` takes
    output = _answer(status)
    if output is not None:
        rows.append(("output", output))
    if status.reason:
        rows.append(("reason", status.reason))
    for key, value in rows:
        print(f"{key:<10} {value}")
    return EXIT_OK


def _answer(status: AgentStatus) -> str | None:
    """The run's answer as text, as ``wait`` prints it; None after a turn of tool calls (then the server's
    ``result`` is its placeholder for the calls, no answer: ``wait --json`` says ``"output": null``)."""
    raw = status.output or {}
    if raw.get("finishReason") == "TOOL_CALLS" or raw.get("result") is None:
        return None
    return answer_text(raw.get("result"))


def status_line(status: AgentStatus, execution_id: str) -> str:
    """``status``'s status row: the status, what a running run waits for, and whether a process serves it."""
    state = status.status.value
    if status.waiting_for == "person":
        state += f" (waiting for a person: conductor-agents pending {execution_id})"
    elif status.waiting_for == "message":
        state += " (waiting for a message)"
    if status.served is False:
        state += ", " + unserved_line(status.unserved_for)
    return state


def _status_dict(status: AgentStatus, handle: AgentHandle) -> dict[str, Any]:
    return {
        "executionId": status.execution_id or handle.execution_id,
        "agent": handle.agent_name,
        "runId": handle.run_id,
        "status": status.status.value,
        "terminal": status.is_terminal,
        "waitingFor": status.waiting_for,
        "served": status.served,
        "unservedFor": status.unserved_for,
        "isWaiting": status.is_waiting,
        "pendingTool": status.pending_tool,
        "output": status.output,
        "reason": status.reason,
    }


def _wait(args: argparse.Namespace) -> int:
    with AgentRuntime(settings(args)) as runtime:
        handle = runtime.attach(args.execution_id)
        return _wait_on(runtime, handle, args)


def _wait_on(runtime: AgentRuntime, handle: AgentHandle, args: argparse.Namespace) -> int:
    display = ProgressDisplay()
    started = time.monotonic()
    with _Watching(runtime, handle, display, args.quiet, args.timeout, served=True):
        result = handle.wait(timeout=args.timeout)
    return _report(result, args, time.monotonic() - started)


def _stop(args: argparse.Namespace) -> int:
    with AgentRuntime(settings(args)) as runtime:
        handle = runtime.attach(args.execution_id)
        status = handle.status()
        if status.is_terminal:
            note(f"execution {handle.execution_id} already ended ({status.status.value})")
        else:
            handle.stop()
            note(f"stop requested for execution {handle.execution_id}")
        if not args.wait:
            return EXIT_OK
        return _wait_on(runtime, handle, args)


def _pause(args: argparse.Namespace) -> int:
    with AgentRuntime(settings(args)) as runtime:
        runtime.attach(args.execution_id).pause()
    note(f"paused execution {args.execution_id}")
    return EXIT_OK


def _unpause(args: argparse.Namespace) -> int:
    with AgentRuntime(settings(args)) as runtime:
        runtime.attach(args.execution_id).unpause()
    note(f"unpaused execution {args.execution_id}")
    return EXIT_OK


def _signal(args: argparse.Namespace) -> int:
    with AgentRuntime(settings(args)) as runtime:
        runtime.attach(args.execution_id).signal(args.text)
    note(f"set the signal of execution {args.execution_id}" if args.text
          else f"cleared the signal of execution {args.execution_id}")
    return EXIT_OK


def _cancel(args: argparse.Namespace) -> int:
    with AgentRuntime(settings(args)) as runtime:
        handle = runtime.attach(args.execution_id)
        handle.cancel(args.reason)
    note(f"cancelled execution {args.execution_id}")
    return EXIT_OK


# --- progress and results -------------------------------------------------------------------


class _Watching:
    """Context manager: a :class:`RunWatcher` on ``handle`` for the block (none when quiet).

    ``timeout`` None: the block has no deadline, and neither has the event stream. ``served``: also say
    when no process serves the run (:class:`ServedWatch`; for a run this process does not serve).
    """

    def __init__(self, runtime: AgentRuntime, handle: AgentHandle, display: ProgressDisplay, quiet: bool,
                 timeout: float | None, *, served: bool = False) -> None:
        self._watcher: RunWatcher | None = None
        self._served: ServedWatch | None = None
        if quiet:
            return
        if served:
            self._served = ServedWatch(display, handle.status, runtime.settings.liveness_check_interval_seconds)
        events = getattr(handle, "events", None)
        if callable(events):
            self._watcher = RunWatcher(display, handle.execution_id,
                                       events=lambda: events(timeout=math.inf if timeout is None else timeout + 30.0))
        else:  # an SDK without handle.events(): sample the task list
            api = runtime._api  # the CLI is part of the package
            self._watcher = RunWatcher(display, handle.execution_id,
                                       fetch=lambda: api.get_workflow(handle.current_execution_id, include_tasks=True))

    def __enter__(self) -> _Watching:
        if self._watcher is not None:
            self._watcher.start()
        if self._served is not None:
            self._served.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._served is not None:
            self._served.stop()
        if self._watcher is not None:
            self._watcher.stop(grace=1.0 if exc[0] is None else 0.0)


def _report(result: AgentResult, args: argparse.Namespace, elapsed: float) -> int:
    if args.json:
        print(json.dumps(result_dict(result), indent=2, default=str), flush=True)
    elif result.output is not None:
        print(result.output, flush=True)
    if not args.quiet:
        tools = len(result.tool_calls)
        took = result.duration_seconds if result.duration_seconds is not None else elapsed  # the run's own
        how = _ENDED_BY.get(result.ended_by or "", "")
        summary = (f"{result.status.value}{how} after {took:.1f}s: {tools} tool call{'s' if tools != 1 else ''}, "
                   f"{result.token_usage.total_tokens} tokens{_over_runs(result)}")
        if result.error:
            summary += f"; {result.error}"
        note(summary)
    return EXIT_OK if result.ok else EXIT_ERROR


def _over_runs(result: AgentResult) -> str:
    """What the summary's counts cover for a continued listener (nothing for a run of its own)."""
    if result.runs <= 1:
        return ""
    if not result.retired_runs:
        return f" over its {result.runs} runs"
    held = result.runs - result.retired_runs
    text = (f" over the {held} run{'s' if held != 1 else ''} still held ({result.retired_runs} older "
            f"run{'s' if result.retired_runs != 1 else ''} retired from the server")
    if result.totals is not None:
        text += f"; all {result.totals.runs} runs: {result.totals.token_usage.total_tokens} tokens"
    return text + ")"


#: What the summary line adds after COMPLETED when the run ended without an answer.
_ENDED_BY = {"stop": " (stopped)",
             "turn_limit": " (turn limit reached: max_turns ran out while the model still called tools)"}


def result_dict(result: AgentResult) -> dict[str, Any]:
    """An :class:`AgentResult` as the JSON the ``--json`` flags print."""
    return {
        "executionId": result.execution_id,
        "status": result.status.value,
        "output": result.output,
        "finishReason": result.finish_reason,
        "endedBy": result.ended_by,
        "error": result.error,
        "tokenUsage": camel(attrs.asdict(result.token_usage)),  # promptTokens, ...: camelCase as every key
        "runs": result.runs,
        "retiredRuns": result.retired_runs,
        "toolCalls": [
            {"name": c.name, "status": c.status, "arguments": dict(c.arguments), "output": dict(c.output),
             "error": c.error}
            for c in result.tool_calls
        ],
    }
