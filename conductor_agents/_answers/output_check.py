"""``Agent(output_type=..., output_retries=N)``: each answer checked in the run, the model asked again.

The server (3.32.3) does not check an answer against ``output_type``. When ``output_retries`` is at
least 1, the SDK adds a function guardrail of its own, ahead of the agent's, whose worker task
``<agent>_output_type`` runs the check ``wait()`` runs (:meth:`OutputSpec.parse`) on every answer:

- it fits: the answer passes;
- it does not: the model is shown ``Output validation failed: <what does not fit>. Please revise
  your response.`` (the server's retry) and answers again;
- after ``N`` answers asked again (or on the loop's last turn) it still does not: the worker
  answers ``on_fail="raise"`` with a message starting with :data:`FAILED_PREFIX`, which the server
  makes the run's ``reasonForIncompletion`` as it is, and ``wait()`` raises
  :class:`~conductor_agents.OutputValidationError`.

Counting: the guardrail's ``iteration`` counts every turn of the agent's loop, tool-call turns and
turns another guardrail retried included, so a failed check after the first turn counts the
answers this check refused before from the run's tasks (one read, on the failure path only; the
executor hands it over as ``earlier_failures``). Nothing is kept in memory: any process serving the
run counts the same.

Prose reaches the check only without the server's JSON mode (which fails the model call, before
any guardrail, on an answer that is not a JSON object): an agent with the check sends the server
the class name only and puts the schema sentence in its instructions itself (see ``docs/tools.md``).

Pure values; thread-safe.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs

from .._common.task_names import MODEL_TASK_TYPE, output_check_task_name, server_ref
from .._tooldefs.tooldef import ToolDef
from .output_type import FAILED_PREFIX, OutputSpec, Rejection

__all__ = ["EARLIER_FAILURES_INPUT", "OutputCheck", "output_check_config", "output_check_worker",
           "rejection_of", "schema_instructions"]

#: The input the executor adds for the check: a function counting the answers it refused before in the run.
EARLIER_FAILURES_INPUT = "earlier_failures"
#: How much of each problem the model is shown (a pydantic error can be long).
_PROBLEM_CHARS = 300
_JSON_HINT = "answer again with only a JSON object (double-quoted keys and strings) that matches the schema"


def schema_instructions(spec: OutputSpec, has_tools: bool) -> str:
    """The sentence that asks for the schema, as the server would add it (with the JSON schema itself)."""
    schema = json.dumps(spec.schema, ensure_ascii=False, separators=(", ", ": "))
    lead = "When you give your final answer, respond" if has_tools else "Respond"
    return f"{lead} with a JSON object matching this schema: {schema}. Output only valid JSON, no other text."


def _problems(problems: Sequence[str]) -> str:
    cut = [p if len(p) <= _PROBLEM_CHARS else p[:_PROBLEM_CHARS] + "..." for p in problems]
    return "; ".join(" ".join(p.split()) for p in cut).rstrip(". ")


def _turn(value: Any) -> int:
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 0


@attrs.frozen
class OutputCheck:
    """The worker body: the verdict on one answer, in the shape the server's guardrail normaliser reads.

    Immutable; thread-safe.
    """

    spec: OutputSpec
    retries: int
    max_turns: int

    #: Read by the executor: hand this check ``earlier_failures`` (a function; it reads the run's tasks).
    needs_earlier_failures = True

    def __call__(self, **inputs: Any) -> dict[str, Any]:
        content = inputs.get("content")
        if isinstance(content, list) and not content:  # a turn of tool calls: the server passes it anyway
            return {"passed": True}
        _, problems = self.spec.parse(content)
        if not problems:
            return {"passed": True}
        turn = _turn(inputs.get("iteration"))
        earlier = 0
        if turn > 1:
            count: Callable[[], int] | None = inputs.get(EARLIER_FAILURES_INPUT)
            earlier = count() if callable(count) else turn - 1
        answers = earlier + 1
        name = self.spec.output_type.__qualname__
        if answers > self.retries or (turn and turn >= self.max_turns):
            return {"passed": False, "on_fail": "raise",
                    "message": f"{FAILED_PREFIX} {name} after {answers} answer{'s' if answers != 1 else ''}: "
                               f"{_problems(problems)}"}
        # No trailing period: the server appends ". Please revise your response."
        return {"passed": False, "on_fail": "retry",
                "message": f"your answer does not fit {name}: {_problems(problems)}; {_JSON_HINT}"}


def output_check_worker(agent_name: str, spec: OutputSpec, retries: int, max_turns: int) -> ToolDef:
    """The worker ToolDef of the answer check of the agent ``agent_name``."""
    return ToolDef(name=output_check_task_name(agent_name), description=f"output_type check of {agent_name}",
                   input_schema={"type": "object", "properties": {}},
                   func=OutputCheck(spec, retries, max_turns))


def output_check_config(agent_name: str, max_turns: int) -> dict[str, Any]:
    """The server's ``GuardrailConfig`` of the check.

    ``maxRetries`` is the turn limit: the server turns a ``retry`` into a ``raise`` once the loop's
    turn reaches it, and the check decides itself (its ``iteration`` counts tool turns too).
    """
    name = output_check_task_name(agent_name)
    return {"name": name, "guardrailType": "custom", "position": "output", "onFail": "retry",
            "maxRetries": max_turns, "taskName": name}


def rejection_of(tasks: Sequence[Mapping[str, Any]], agent_name: str) -> Rejection | None:
    """Why the agent's run failed on its answer, from its task list: the check gave up (the answer
    it refused last), or the server's JSON mode failed the agent's model call (the model's text);
    None when neither."""
    check = output_check_task_name(agent_name)
    llm_ref = server_ref(agent_name) + "_llm"
    refused = [t for t in tasks if t.get("taskType") == check and t.get("status") == "COMPLETED"
               and (t.get("outputData") or {}).get("passed") is False]
    if refused and (refused[-1].get("outputData") or {}).get("on_fail") == "raise":
        return Rejection("check", (refused[-1].get("inputData") or {}).get("content"), len(refused))
    for task in reversed(tasks):
        ref = str(task.get("referenceTaskName") or "")
        if task.get("taskType") != MODEL_TASK_TYPE or not (ref == llm_ref or ref.startswith(llm_ref + "__")):
            continue
        if str(task.get("status") or "").startswith("FAILED") and (task.get("inputData") or {}).get("jsonOutput"):
            return Rejection("json_mode", _model_text(task.get("reasonForIncompletion")))
        return None
    return None


def _model_text(reason: Any) -> str | None:
    """The model's text in the reason of a model call JSON mode failed (3.32.3: ``Task execution failed:
    {"error": <parser message>, "response": <the model's text>}``)."""
    text = str(reason or "")
    start = text.find("{")
    if start < 0:
        return None
    try:
        detail = json.loads(text[start:])
    except ValueError:
        return None
    response = detail.get("response") if isinstance(detail, dict) else None
    return response if isinstance(response, str) else None
