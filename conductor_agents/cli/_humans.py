"""``conductor-agents pending|approve|reject|respond``: answer a run that waits for a person.

Any shell can answer, by execution id: the process that serves the run may be anywhere. These
verbs register no workers. ``pending`` prints what the run waits for; ``approve`` / ``reject``
answer a tool call that needs approval; ``respond`` answers a question a ``HumanTool`` asked.

Exit codes as the other agent verbs, plus: 3 nothing of that kind waits (or the run has ended),
7 another answer won (the run goes on with that one).
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from ..errors import AnswerConflictError, NothingPendingError
from ..runtime import AgentRuntime
from ._main import EXIT_CONFLICT, EXIT_NOT_FOUND, EXIT_OK
from ._options import Handler, add_on_run, guarded, note, on_errors, parse_message, settings

__all__ = ["EXIT_CONFLICT", "register"]


def register(subparsers: Any) -> None:
    """Add the verbs to the top-level ``subparsers``."""
    answer = argparse.ArgumentParser(add_help=False)
    answer.add_argument("--by", metavar="NAME", help="who answers (shown with the answer)")
    answer.add_argument("--request", metavar="REF",
                        help="the request to answer (its task reference name from `pending`); default: the oldest")
    answer.add_argument("--json", action="store_true", help="print the answer the run took as JSON")

    def add(name: str, handler: Handler, help_: str, description: str,
            *parents: argparse.ArgumentParser) -> argparse.ArgumentParser:
        return add_on_run(subparsers, name, _answers_guarded(handler), help_, description, *parents)

    pending = add("pending", _pending, "print what a run waits for from a person",
                  "Print the tool calls the run waits to have approved and the questions it waits to have "
                  "answered (nothing when it waits for nobody).")
    pending.add_argument("--json", action="store_true", help="print JSON (a list)")

    approve = add("approve", _approve, "approve the tool calls a run waits on",
                  "Approve the tool calls the run waits on: they run in the process that serves the run.",
                  answer)
    approve.add_argument("--reason", help="a note shown to the model with the approval")

    reject = add("reject", _reject, "reject the tool calls a run waits on",
                 "Reject the tool calls the run waits on: none of them runs, the model is shown REASON, "
                 "and the run goes on.", answer)
    reject.add_argument("reason", metavar="REASON", help="why (the model reads it)")

    respond = add("respond", _respond, "answer the question a run asks",
                  "Answer the question the run asks (a HumanTool call). ANSWER is parsed as JSON when it "
                  "is JSON, else sent as text; the model gets {\"answer\": ANSWER}.", answer)
    respond.add_argument("answer", metavar="ANSWER", help="JSON or text")
    respond.add_argument("--text", action="store_true", help="send ANSWER as text even if it parses as JSON")


def _answers_guarded(handler: Handler) -> Handler:
    """The agent verbs' error policy, plus exit 3 for nothing pending and 7 for a lost race."""
    return guarded(on_errors(handler, (NothingPendingError, EXIT_NOT_FOUND), (AnswerConflictError, EXIT_CONFLICT)))


def _pending(args: argparse.Namespace) -> int:
    with AgentRuntime(settings(args)) as runtime:
        requests = runtime.pending(args.execution_id)
    if args.json:
        print(json.dumps([r.to_dict() for r in requests], indent=2, default=str))
        return EXIT_OK
    if not requests:
        note(f"run {args.execution_id} waits for no person")
    for request in requests:
        if request.kind == request.APPROVAL:
            calls = ", ".join(f"{c.name}({json.dumps(dict(c.arguments))})" for c in request.tool_calls)
            print(f"approval  {request.task_reference_name}  {calls}")
        elif request.kind == request.REVIEW:
            print(f"review    {request.task_reference_name}  {request.guardrail}: {request.guardrail_message}  "
                  f"{json.dumps(request.output)}")
        else:
            print(f"question  {request.task_reference_name}  {request.question}")
    return EXIT_OK


def _approve(args: argparse.Namespace) -> int:
    with AgentRuntime(settings(args)) as runtime:
        answer = runtime.approve(args.execution_id, reason=args.reason, by=args.by, request=args.request)
    return _print(args, answer, f"approved {answer.task_reference_name} of run {answer.execution_id}")


def _reject(args: argparse.Namespace) -> int:
    with AgentRuntime(settings(args)) as runtime:
        answer = runtime.reject(args.execution_id, args.reason, by=args.by, request=args.request)
    return _print(args, answer, f"rejected {answer.task_reference_name} of run {answer.execution_id}")


def _respond(args: argparse.Namespace) -> int:
    value = parse_message(args.answer, as_text=args.text)
    with AgentRuntime(settings(args)) as runtime:
        answer = runtime.respond(args.execution_id, value, by=args.by, request=args.request)
    return _print(args, answer, f"answered {answer.task_reference_name} of run {answer.execution_id}")


def _print(args: argparse.Namespace, answer: Any, summary: str) -> int:
    if args.json:
        print(json.dumps(answer.to_dict(), indent=2, default=str))
    else:
        note(summary)
    return EXIT_OK
