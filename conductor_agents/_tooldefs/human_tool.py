""":class:`HumanTool`: a tool the model calls to ask a person a question.

Re-exported by :mod:`conductor_agents.tools`. The server runs it as a ``HUMAN`` task: the run waits
(its status says ``isWaiting``; :meth:`AgentHandle.pending` lists the question) until someone
answers with :meth:`AgentHandle.respond` (or ``runtime.respond(execution_id, answer)``, or
``conductor-agents respond``); the answer is the tool's result the model sees next turn.
"""

from __future__ import annotations

from ..errors import ToolDefinitionError
from .tooldef import HUMAN, ToolDef

__all__ = ["HumanTool"]


class HumanTool:
    """The server-side tool that asks a person and waits for the answer. Stateless; thread-safe.

    It runs no Python and needs no worker: the run waits on the server, so no process has to be
    alive while a person thinks, and the liveness monitor never counts the wait as a stall.
    """

    @staticmethod
    def create(
        *,
        name: str = "ask_human",
        description: str = ("Ask a person a question and wait for the answer. Use it when you need a "
                            "decision or information only a person can give."),
        question_description: str = "The question, written for a person.",
    ) -> ToolDef:
        """A ``human`` ToolDef whose one argument is ``question``.

        Raises:
            ToolDefinitionError: ``name`` or a description is invalid.
        """
        if not isinstance(question_description, str):
            raise ToolDefinitionError(f"question_description must be a str, got {question_description!r}")
        return ToolDef(
            name=name,
            description=description,
            input_schema={
                "type": "object",
                "properties": {"question": {"type": "string", "description": question_description}},
                "required": ["question"],
            },
            tool_type=HUMAN,
        )
