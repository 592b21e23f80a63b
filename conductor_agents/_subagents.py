"""Agents made of agents: :class:`Strategy`, :class:`Handoff` and the agent tool (``agent.as_tool()``).

What the server (3.32.3) does with them, checked against its compiler and a running server:

- ``Agent(agents=[...], strategy=...)``: every sub-agent becomes a ``SUB_WORKFLOW`` task named after
  it, inside the parent's run. ``handoff`` and ``router``: a coordinator model (the parent's, or
  the ``router`` agent's) answers with the name of the next sub-agent or ``DONE``; the parent's
  model then writes the final answer from the conversation (``synthesize=False``: the
  conversation is the answer). ``sequential``: each in turn, the last one's answer is the run's.
  ``parallel``: all at once, the answers joined. ``round_robin`` / ``random``: one per turn, up
  to ``max_turns``. ``swarm``: the parent and its sub-agents pass the conversation on by calling
  the transfer tools the server adds (``<agent>_transfer_to_<peer>``) or by :class:`Handoff` rules.
- ``agent.as_tool()``: the model calls the sub-agent like any tool; the server registers the
  sub-agent's own workflow (named after it) and runs it as a ``SUB_WORKFLOW``.
- A sub-run inherits the parent run's task domain, and the server routes every worker tool of the
  tree to it: the sub-agents' tools (``agents``), custom guardrails, and the worker tools an agent
  tool declares in ``config.workerNames``. So a stateful parent pins the whole tree to the process
  that serves it.

Pure values and functions; thread-safe.
"""

from __future__ import annotations

import enum
from typing import Any, Dict, Iterable, Optional

import attrs

from ._tooldef import AGENT_TOOL, ToolDef
from .errors import AgentDefinitionError, AgentTypeError

__all__ = ["Handoff", "Strategy", "agent_tool", "merge_worker_tools"]


class Strategy(str, enum.Enum):
    """How a parent agent runs its sub-agents (``Agent(agents=[...], strategy=...)``)."""

    HANDOFF = "handoff"
    SEQUENTIAL = "sequential"
    PARALLEL = "parallel"
    ROUTER = "router"
    ROUND_ROBIN = "round_robin"
    RANDOM = "random"
    SWARM = "swarm"

    @classmethod
    def parse(cls, value: Any) -> "Strategy":
        """``value`` (a Strategy or its name) as a Strategy.

        Raises:
            AgentDefinitionError: not one of the strategies.
        """
        if isinstance(value, cls):
            return value
        try:
            return cls(str(value).lower())
        except ValueError:
            raise AgentDefinitionError(
                f"Agent.strategy must be one of {[s.value for s in cls]}, got {value!r}",
                field="strategy", value=value) from None


def _check_text(instance: Any, attribute: "attrs.Attribute[Any]", value: Any) -> None:
    if value is not None and (not isinstance(value, str) or not value):
        raise AgentTypeError(f"Handoff.{attribute.name} must be a non-empty str, got {value!r}",
                             field=attribute.name, value=value)


@attrs.frozen
class Handoff:
    """A rule of a ``swarm``: when it matches, the conversation passes to the agent ``target``.

    Build one with :meth:`on_tool_result` or :meth:`on_text_mention`. Immutable; thread-safe.
    """

    kind: str = attrs.field(validator=attrs.validators.in_(("on_tool_result", "on_text_mention")))
    target: str = attrs.field(validator=_check_text)
    tool_name: Optional[str] = attrs.field(default=None, validator=_check_text)
    result_contains: Optional[str] = attrs.field(default=None, validator=_check_text)
    text: Optional[str] = attrs.field(default=None, validator=_check_text)

    def __attrs_post_init__(self) -> None:
        needed = ("tool_name", "result_contains") if self.kind == "on_tool_result" else ("text",)
        for name in needed:
            if getattr(self, name) is None:
                raise AgentDefinitionError(f"Handoff.{self.kind} needs {name}", field=name, value=None)

    @classmethod
    def on_tool_result(cls, target: str, tool_name: str, result_contains: str) -> "Handoff":
        """Hand off once the tool ``tool_name`` returned a result containing ``result_contains``
        (the server requires both)."""
        return cls("on_tool_result", target, tool_name=tool_name, result_contains=result_contains)

    @classmethod
    def on_text_mention(cls, target: str, text: str) -> "Handoff":
        """Hand off once the model's answer mentions ``text``."""
        return cls("on_text_mention", target, text=text)

    def to_config(self) -> Dict[str, Any]:
        """The server's ``HandoffConfig``."""
        config: Dict[str, Any] = {"type": self.kind, "target": self.target}
        if self.kind == "on_tool_result":
            config["toolName"] = self.tool_name
            config["resultContains"] = self.result_contains
        else:
            config["text"] = self.text
        return config


def merge_worker_tools(groups: Iterable[Iterable[ToolDef]], *, where: str) -> "tuple[ToolDef, ...]":
    """The worker tools of a tree of agents, each name once.

    The server routes tasks by tool name, so two different tools of one name anywhere in a tree
    could not both be served.

    Raises:
        AgentDefinitionError: two different tools share a name.
    """
    merged: Dict[str, ToolDef] = {}
    for group in groups:
        for tool_def in group:
            known = merged.get(tool_def.name)
            if known is None:
                merged[tool_def.name] = tool_def
            elif known != tool_def:
                raise AgentDefinitionError(
                    f"{where}: two different tools are named {tool_def.name!r} in this agent and its "
                    "sub-agents; the server routes tool calls by name, so names must be unique across "
                    "the tree", field="tools", value=tool_def.name)
    return tuple(merged.values())


def agent_tool(agent: Any, *, name: Optional[str] = None, description: Optional[str] = None) -> ToolDef:
    """An ``agent_tool`` ToolDef: the model calls ``agent`` with a ``request`` and gets its answer.

    ``agent`` is an :class:`~conductor_agents.Agent` (used through ``to_config()`` and
    ``worker_tools`` only, so this module needs no import of it). Its worker tools travel as the
    tool's ``nested_tools`` (served with the parent's) and as ``config.workerNames`` (so the server
    routes them to the parent run's domain).

    Raises:
        ToolDefinitionError: ``name`` or ``description`` is invalid.
    """
    workers = tuple(agent.worker_tools)
    config: Dict[str, Any] = {"agentConfig": agent.to_config()}
    if workers:
        config["workerNames"] = [t.name for t in workers]
    return ToolDef(
        name=name if name is not None else agent.name,
        description=description or agent.description or f"Ask the agent {agent.name!r}.",
        input_schema={
            "type": "object",
            "properties": {"request": {"type": "string", "description": "What to ask the agent, in full."}},
            "required": ["request"],
        },
        tool_type=AGENT_TOOL,
        config=config,
        nested_tools=workers,
    )
