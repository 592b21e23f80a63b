"""``Agent(stop_when=...)``: a Python rule that ends the agent's loop, run as a worker task.

The server (3.32.3) puts a ``SIMPLE`` task (a ``WorkerRef``'s ``taskName``) in the agent's loop after
each turn, with the turn's text (``result``), the loop's ``iteration`` and the ``messages`` the model
was shown, and goes on only while its output says ``should_continue``. The SDK names that task
``<agent name>_stop_when`` and serves it with the agent's tools (pinned to the run's domain when the
agent is stateful).

Pure values; thread-safe. The rule may run on several worker threads at once.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs

from .._common.answer_text import answer_text
from .._common.task_names import stop_task_name
from .._tooldefs.tooldef import ToolDef

__all__ = ["StopRule", "stop_worker"]

#: ``stop_when(text, turn)``: True ends the loop after this turn.
StopRule = Callable[[str, int], Any]


@attrs.frozen
class _StopCheck:
    """The worker body: ``should_continue`` is the rule's answer negated."""

    rule: StopRule

    def __call__(self, **inputs: Any) -> dict[str, Any]:
        text = inputs.get("result")
        turn = inputs.get("iteration")
        stop = self.rule(answer_text(text), int(turn) if isinstance(turn, (int, float)) else 0)
        return {"should_continue": not bool(stop)}


def stop_worker(agent_name: str, rule: StopRule) -> ToolDef:
    """The worker ToolDef that runs ``rule`` for the agent ``agent_name``."""
    return ToolDef(name=stop_task_name(agent_name), description=f"stop rule of {agent_name}",
                   input_schema={"type": "object", "properties": {}}, func=_StopCheck(rule))
