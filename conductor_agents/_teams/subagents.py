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
  ``Handoff.on_condition`` is a Python callable the server asks after every turn of the swarm's
  loop: a ``SIMPLE`` task (the handoff's ``taskName``) with the turn's ``result``, the
  ``conversation``, the ``context`` (the run's state), the ``active_agent`` (its index: 0 the
  parent, then the sub-agents in order) and the turn's ``tool_results``; its output's ``handoff``
  (a boolean, else the run fails) says whether the conversation passes to the target. Rules are
  tried in order, the model's own transfer first; the first that matches wins.
- ``strategy="router"`` with a Python ``router``: the server's ``RouterConfig`` is a ``WorkerRef``
  (``{"taskName": ...}``), compiled into a ``SIMPLE`` task in place of the router model, given the
  ``conversation`` (also as ``prompt``) and returning ``result``: the next sub-agent's name or
  ``DONE`` (the server normalises the answer; this SDK refuses one that names no sub-agent).
- ``manual``: each turn of the loop (``max_turns`` of them, fewer with ``stop_when`` or a
  ``termination``) is a ``HUMAN`` task ``<agent>_pick_agent`` (its input: ``agent_options``, each
  sub-agent's name and index, and the ``conversation``), then a ``SIMPLE`` task
  ``<agent>_process_selection`` the client serves, given the person's answer (``human_output``) and
  answering ``selected``: the index of the sub-agent to run (a ``SWITCH`` on it; no case matches an
  unknown index, so that turn runs nobody). This SDK's worker takes the name a person answered with
  and refuses one that is no sub-agent's. The server's names use the agent's name with every
  character other than letters, digits and ``_`` made ``_``.
- ``plan_execute`` (``planner=`` required, ``fallback=`` optional; ``agents`` unused): the planner runs as a
  sub-workflow named after it, given the prompt plus the server's list of the parent's tools and its
  plan schema; its answer must hold a JSON plan (a ```json fence, or the answer itself) with
  ``steps`` of ``operations`` (``{"tool", "args"}`` or ``{"tool", "generate"}``), each naming one of
  the parent's tools. The server task ``PLAN_AND_COMPILE`` validates it (unknown tools, missing
  args, cycles) and compiles it into the sub-workflow ``pe_<parent>_plan``: a worker tool becomes a
  ``SIMPLE`` task served by this SDK, its inputs the plan's ``args`` plus ``session_id``, ``cwd`` and
  ``media``. The run's answer is the last step's output (an object as JSON text). A plan that is
  missing, does not compile or whose sub-workflow fails goes to the ``fallback`` agent (its prompt:
  the user's, the planner's text and the errors; at most ``fallbackMaxTurns`` turns), whose answer
  is then the run's; without a fallback the run fails. The server refuses a tool input schema
  outside its validator's subset and, without a fallback, a tool guardrail whose ``onFail`` is not
  ``raise``. A stateful run's domain covers only the worker tools of the agent and of its ``agents``,
  so the config lists the planner and fallback under ``agents`` too (the plan's compiler ignores them).
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
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import attrs

from .._common.answer_text import answer_text
from .._common.task_names import handoff_task_name, router_task_name, selection_task_name
from .._tooldefs.tooldef import AGENT_TOOL, HUMAN, PULL_WORKFLOW_MESSAGES, ToolDef
from ..errors import AgentDefinitionError, AgentTypeError

__all__ = ["Handoff", "HandoffContext", "Strategy", "agent_tool", "check_plan_execute", "check_plan_schema",
           "handoff_worker", "merge_worker_tools", "router_worker", "selection_worker"]

#: ``router(conversation)``: the name of the sub-agent to run next, or ``"DONE"`` (None: done).
RouterFunction = Callable[[str], Any]
#: ``condition(ctx)``: true hands the conversation to the handoff's target.
HandoffCondition = Callable[["HandoffContext"], Any]
DONE = "DONE"


class Strategy(str, enum.Enum):
    """How a parent agent runs its sub-agents (``Agent(agents=[...], strategy=...)``)."""

    HANDOFF = "handoff"
    SEQUENTIAL = "sequential"
    PARALLEL = "parallel"
    ROUTER = "router"
    ROUND_ROBIN = "round_robin"
    RANDOM = "random"
    SWARM = "swarm"
    #: A person picks the sub-agent of each turn (``handle.pending()`` / ``handle.respond(name)``).
    MANUAL = "manual"
    #: The ``planner`` agent writes a JSON plan of calls of this agent's tools; the server compiles and
    #: runs it, and the ``fallback`` agent (if any) takes over when the plan is missing or fails.
    PLAN_EXECUTE = "plan_execute"

    @classmethod
    def parse(cls, value: Any) -> Strategy:
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


def _check_text(instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if value is not None and (not isinstance(value, str) or not value):
        raise AgentTypeError(f"Handoff.{attribute.name} must be a non-empty str, got {value!r}",
                             field=attribute.name, value=value)


def _check_condition(instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if value is not None and not callable(value):
        raise AgentTypeError(f"Handoff.on_condition needs a callable, got {value!r}", field="handoffs", value=value)


_NEEDED = {"on_tool_result": ("tool_name", "result_contains"), "on_text_mention": ("text",),
           "on_condition": ("condition",)}


@attrs.frozen
class Handoff:
    """A rule of a ``swarm``: when it matches, the conversation passes to the agent ``target``.

    Build one with :meth:`on_tool_result`, :meth:`on_text_mention` or :meth:`on_condition`.
    Immutable; thread-safe (a condition may run on several worker threads at once).
    """

    kind: str = attrs.field(validator=attrs.validators.in_(tuple(_NEEDED)))
    target: str = attrs.field(validator=_check_text)
    tool_name: str | None = attrs.field(default=None, validator=_check_text)
    result_contains: str | None = attrs.field(default=None, validator=_check_text)
    text: str | None = attrs.field(default=None, validator=_check_text)
    condition: HandoffCondition | None = attrs.field(default=None, validator=_check_condition)

    def __attrs_post_init__(self) -> None:
        for name in _NEEDED[self.kind]:
            if getattr(self, name) is None:
                raise AgentDefinitionError(f"Handoff.{self.kind} needs {name}", field=name, value=None)

    @classmethod
    def on_tool_result(cls, target: str, tool_name: str, result_contains: str) -> Handoff:
        """Hand off once the tool ``tool_name`` returned a result containing ``result_contains``
        (the server requires both)."""
        return cls("on_tool_result", target, tool_name=tool_name, result_contains=result_contains)

    @classmethod
    def on_text_mention(cls, target: str, text: str) -> Handoff:
        """Hand off once the model's answer mentions ``text``."""
        return cls("on_text_mention", target, text=text)

    @classmethod
    def on_condition(cls, target: str, condition: HandoffCondition) -> Handoff:
        """Hand off when ``condition(ctx)`` (a :class:`HandoffContext`) returns true.

        It runs in Python, as a worker task served with the swarm's tools (on the run's domain
        when the swarm is stateful), after every turn of an agent other than ``target``. An
        exception fails the run.
        """
        if not callable(condition):
            raise AgentTypeError(f"Handoff.on_condition needs a callable, got {condition!r}", field="handoffs",
                                 value=condition)
        return cls("on_condition", target, condition=condition)

    def to_config(self, task_name: str | None = None) -> dict[str, Any]:
        """The server's ``HandoffConfig`` (``task_name``: an ``on_condition`` rule's worker task)."""
        config: dict[str, Any] = {"type": self.kind, "target": self.target}
        if self.kind == "on_tool_result":
            config["toolName"] = self.tool_name
            config["resultContains"] = self.result_contains
        elif self.kind == "on_text_mention":
            config["text"] = self.text
        else:
            if not task_name:
                raise AgentDefinitionError("Handoff.on_condition: its task name comes from the swarm "
                                           "(Agent.to_config())", field="handoffs", value=self.target)
            config["taskName"] = task_name
        return config


@attrs.frozen
class HandoffContext:
    """What an ``on_condition`` handoff sees after a turn of the swarm.

    ``agent``: the name of the agent that just answered; ``result``: its answer (text);
    ``conversation``: the swarm's whole conversation so far; ``tool_results``: that turn's tool
    calls (``{"name", "output", ...}`` each); ``state``: the run's context state (a dict).
    """

    agent: str
    result: str
    conversation: str
    tool_results: tuple[Mapping[str, Any], ...] = ()
    state: Mapping[str, Any] = attrs.field(factory=dict)


def _text(value: Any) -> str:
    # an answer the server parsed from JSON is JSON text again; a turn of tool calls is ""
    return answer_text(value)


@attrs.frozen
class _ConditionCheck:
    """The worker body of an ``on_condition`` handoff: ``{"handoff": bool}`` as the server requires."""

    condition: HandoffCondition
    target: str
    #: The swarm's agents by the server's index: the parent first, then its sub-agents.
    agents: tuple[str, ...]

    def __call__(self, **inputs: Any) -> dict[str, Any]:
        active = _text(inputs.get("active_agent")) or "0"
        try:
            agent = self.agents[int(active)]
        except (ValueError, IndexError):
            agent = active
        if agent == self.target:  # handing the conversation to the agent that has it would loop
            return {"handoff": False}
        results = inputs.get("tool_results")
        state = inputs.get("context")
        context = HandoffContext(
            agent=agent, result=_text(inputs.get("result")), conversation=_text(inputs.get("conversation")),
            tool_results=tuple(r for r in results if isinstance(r, Mapping)) if isinstance(results, list) else (),
            state=dict(state) if isinstance(state, Mapping) else {})
        return {"handoff": bool(self.condition(context))}


def handoff_worker(agent_name: str, index: int, handoff: Handoff, agents: Sequence[str]) -> ToolDef:
    """The worker ToolDef of the swarm ``agent_name``'s ``index``-th handoff (``on_condition``);
    ``agents``: the swarm's sub-agents' names, in order."""
    assert handoff.condition is not None
    return ToolDef(name=handoff_task_name(agent_name, index),
                   description=f"handoff {index} of {agent_name} to {handoff.target}",
                   input_schema={"type": "object", "properties": {}},
                   func=_ConditionCheck(handoff.condition, handoff.target, (agent_name, *agents)))


@attrs.frozen
class _RouteCheck:
    """The worker body of a Python router: ``{"result": <sub-agent name or DONE>}``."""

    router: RouterFunction
    agents: tuple[str, ...]

    def __call__(self, **inputs: Any) -> dict[str, Any]:
        choice = self.router(_text(inputs.get("conversation", inputs.get("prompt"))))
        name = choice
        if choice is not None and not isinstance(choice, str) and hasattr(choice, "to_config"):
            name = getattr(choice, "name", None)  # an Agent
        if name is None or (isinstance(name, str) and name.strip().upper() == DONE):
            return {"result": DONE}
        if not isinstance(name, str) or name not in self.agents:
            raise ValueError(f"the router returned {choice!r}; it must return one of {list(self.agents)} "
                             f"(a sub-agent's name or Agent) or {DONE!r}")
        return {"result": name}


def router_worker(agent_name: str, router: RouterFunction, agents: Sequence[str]) -> ToolDef:
    """The worker ToolDef of the agent ``agent_name``'s Python router over the sub-agents ``agents``."""
    return ToolDef(name=router_task_name(agent_name), description=f"router of {agent_name}",
                   input_schema={"type": "object", "properties": {}}, func=_RouteCheck(router, tuple(agents)))


def merge_worker_tools(groups: Iterable[Iterable[ToolDef]], *, where: str) -> tuple[ToolDef, ...]:
    """The worker tools of a tree of agents, each name once.

    The server routes tasks by tool name, so two different tools of one name anywhere in a tree
    could not both be served.

    Raises:
        AgentDefinitionError: two different tools share a name.
    """
    merged: dict[str, ToolDef] = {}
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


def agent_tool(agent: Any, *, name: str | None = None, description: str | None = None) -> ToolDef:
    """An ``agent_tool`` ToolDef: the model calls ``agent`` with a ``request`` and gets its answer.

    ``agent`` is an :class:`~conductor_agents.Agent` (used through ``to_config()`` and
    ``worker_tools`` only, so this module needs no import of it). Its worker tools travel as the
    tool's ``nested_tools`` (served with the parent's) and as ``config.workerNames`` (so the server
    routes them to the parent run's domain).

    Raises:
        ToolDefinitionError: ``name`` or ``description`` is invalid.
    """
    workers = tuple(agent.worker_tools)
    config: dict[str, Any] = {"agentConfig": agent.to_config()}
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


@attrs.frozen
class _Selection:
    """The worker body of a ``manual`` pick: the person's answer (a sub-agent's name) as the server's index."""

    agents: tuple[str, ...]

    def __call__(self, **inputs: Any) -> dict[str, Any]:
        output = inputs.get("human_output")
        picked: Any = output
        if isinstance(output, Mapping):  # this SDK's respond() sends answer; the server's own form, selected
            picked = output.get("selected", output.get("answer"))
        if isinstance(picked, Mapping):
            picked = picked.get("selected", picked.get("agent"))
        if isinstance(picked, str) and picked.strip() in self.agents:
            return {"selected": str(self.agents.index(picked.strip()))}
        raise ValueError(f"the person picked {picked!r}; the answer must be one of {list(self.agents)}")


def selection_worker(agent_name: str, agents: Sequence[str]) -> ToolDef:
    """The worker ToolDef of the ``manual`` team ``agent_name`` over the sub-agents ``agents``."""
    return ToolDef(name=selection_task_name(agent_name), description=f"the pick of {agent_name}'s next agent",
                   input_schema={"type": "object", "properties": {}}, func=_Selection(tuple(agents)))


#: The JSON Schema keywords the server's plan validator implements (3.32.3 ``SchemaSubsetValidator``);
#: a ``plan_execute`` agent's tool whose input schema uses another is refused when the run starts.
PLAN_SCHEMA_KEYWORDS = frozenset((
    "type", "properties", "required", "additionalProperties", "items", "enum", "minLength", "maxLength",
    "pattern", "minimum", "maximum", "minItems", "maxItems", "title", "description", "examples", "default",
    "$schema", "$id"))


def check_plan_schema(tool_name: str, schema: Any, *, where: str) -> None:
    """Refuse a ``plan_execute`` tool's input schema the server's plan validator would refuse.

    Raises:
        AgentDefinitionError: ``schema`` uses a keyword outside :data:`PLAN_SCHEMA_KEYWORDS`.
    """

    def walk(node: Any, path: str) -> None:
        if not isinstance(node, Mapping):
            return
        for key in node:
            if key not in PLAN_SCHEMA_KEYWORDS:
                raise AgentDefinitionError(
                    f"{where}: the tool {tool_name!r}'s input schema uses {key!r} at {path or '<root>'}; the server "
                    f"(3.32.3) compiles plans only for tools whose schemas use {sorted(PLAN_SCHEMA_KEYWORDS)}"
                    + (" (an Optional[...] or Union hint makes 'anyOf': use one type with a default)"
                       if key == "anyOf" else ""),
                    field="tools", value=tool_name)
        properties = node.get("properties")
        if isinstance(properties, Mapping):
            for name, sub in properties.items():
                walk(sub, f"{path}/properties/{name}")
        items = node.get("items")
        if isinstance(items, Mapping):
            walk(items, f"{path}/items")
        elif isinstance(items, list):
            for i, sub in enumerate(items):
                walk(sub, f"{path}/items[{i}]")

    walk(schema, "")


def check_plan_execute(agent: Any) -> None:
    """A ``plan_execute`` agent has what the server's compiler (3.32.3) needs, and only it has a planner.

    Raises:
        AgentDefinitionError: ``planner``/``fallback``/``fallback_max_turns`` without ``plan_execute``; a
            ``plan_execute`` agent without a planner or tools, with ``agents`` (the strategy never runs
            them), a stopping rule (never evaluated), a tool schema or tool guardrail the server refuses.
    """
    where = f"Agent {agent.name!r} (strategy='plan_execute')"
    if agent.strategy is not Strategy.PLAN_EXECUTE:
        for field in ("planner", "fallback", "fallback_max_turns"):
            value = getattr(agent, field)
            if value is not None:
                raise AgentDefinitionError(f"Agent.{field} is only used with strategy='plan_execute'", field=field,
                                           value=getattr(value, "name", value))
        return
    if agent.planner is None:
        raise AgentDefinitionError(f"{where} needs planner=<Agent>: the agent whose answer is the JSON plan",
                                   field="planner", value=None)
    if agent.agents:
        raise AgentDefinitionError(
            f"{where}: the server never runs agents=[...] in a plan; a plan calls this agent's tools, so give a "
            "sub-agent to the plan as a tool (tools=[sub.as_tool()])", field="agents", value=agent.agent_names)
    if not agent.tools:
        raise AgentDefinitionError(f"{where} needs tools: a plan's every step calls one of this agent's tools",
                                   field="tools", value=())
    if agent.fallback_max_turns is not None and agent.fallback is None:
        raise AgentDefinitionError(f"{where}: fallback_max_turns needs a fallback agent", field="fallback_max_turns",
                                   value=agent.fallback_max_turns)
    for field in ("stop_when", "termination"):
        if getattr(agent, field) is not None:
            raise AgentDefinitionError(f"{where}: the server (3.32.3) never evaluates {field} in a plan",
                                       field=field, value=getattr(agent, field))
    slots = agent._plan_agents
    for sub in slots:
        if sub.name == agent.name:
            raise AgentDefinitionError(f"{where}: the planner and fallback may not share their parent's name",
                                       field="planner" if sub is agent.planner else "fallback", value=sub.name)
        if sub.needs_message_queue:
            raise AgentDefinitionError(f"{where}: a planner or fallback cannot wait for messages (the run's message "
                                       "queue is the parent's)", field="planner" if sub is agent.planner
                                       else "fallback", value=sub.name)
    if len(slots) == 2 and slots[0].name == slots[1].name and slots[0] != slots[1]:
        raise AgentDefinitionError(f"{where}: two different agents are named {slots[0].name!r}", field="fallback",
                                   value=slots[1].name)
    for tool_def in agent.tools:
        check_plan_schema(tool_def.name, tool_def.input_schema, where=where)
        if tool_def.approval_required or tool_def.tool_type in (HUMAN, PULL_WORKFLOW_MESSAGES):
            what = ("needs approval" if tool_def.approval_required else
                    "asks a person" if tool_def.tool_type == HUMAN else "waits for messages")
            raise AgentDefinitionError(
                f"{where}: the tool {tool_def.name!r} {what}; the server (3.32.3) runs a plan's steps with no "
                "approval, person or message queue, so a plan cannot use it (give it to the planner or fallback)",
                field="tools", value=tool_def.name)
        if agent.fallback is None:
            for guardrail in tool_def.guardrails:
                if guardrail.on_fail != "raise":
                    raise AgentDefinitionError(
                        f"{where}: the tool {tool_def.name!r}'s guardrail {guardrail.name!r} has "
                        f"on_fail={guardrail.on_fail!r}; in a plan the server can only stop the plan, so without "
                        "a fallback agent it needs on_fail='raise'", field="tools", value=guardrail.name)
