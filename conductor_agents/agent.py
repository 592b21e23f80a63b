"""The :class:`Agent` value type: what the server compiles into a workflow."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

import attrs

from ._answers.guardrails import Guardrail
from ._answers.output_type import OutputSpec
from ._common.checks import Refusal, a_bool, a_number, an_int, optional
from ._common.secrets import check_credential_names
from ._teams.compile import agent_config, check_task_names, worker_groups
from ._teams.gates import Gate
from ._teams.model_settings import MODEL_PATTERN
from ._teams.stopping import StopRule
from ._teams.subagents import Handoff, Strategy, agent_tool, check_plan_execute, merge_worker_tools
from ._teams.termination import Termination
from ._tooldefs.tooldef import AGENT_TOOL, HUMAN, PULL_WORKFLOW_MESSAGES
from .continuation import Continuation
from .errors import AgentDefinitionError, AgentTypeError, ToolDefinitionError
from .tools import ToolDef, as_tool

__all__ = ["Agent"]

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]{0,127}$")
_MODEL = MODEL_PATTERN


def _check_name(instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if not isinstance(value, str):
        raise AgentTypeError(f"Agent.name must be a str, got {value!r}", field="name", value=value)
    if not _NAME.match(value):
        raise AgentDefinitionError(
            f"Agent.name must start with a letter or '_' and use only letters, digits, '_' "
            f"and '-' (at most 128 characters), got {value!r}",
            field="name",
            value=value,
        )


def _check_model(instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if not isinstance(value, str):
        raise AgentTypeError(f"Agent.model must be a str, got {value!r}", field="model", value=value)
    if not _MODEL.match(value):
        raise AgentDefinitionError(
            f"Agent.model must be of the form 'provider/model' (e.g. 'openai/gpt-4o'), got {value!r}",
            field="model",
            value=value,
        )


#: A field of the wrong type raises AgentTypeError, one out of bounds AgentDefinitionError (``field``, ``value``).
_AGENT = Refusal(AgentDefinitionError, type_error=AgentTypeError, prefix="Agent.")


def _check_str(instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if not isinstance(value, str):
        raise AgentTypeError(
            f"Agent.{attribute.name} must be a str, got {value!r}", field=attribute.name, value=value
        )


_check_bool = a_bool(refusal=_AGENT)


def _to_tools(value: Iterable[ToolDef | Callable[..., Any]] | None) -> tuple[ToolDef, ...]:
    if value is None:
        return ()
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        raise AgentTypeError(
            f"Agent.tools must be a sequence of tools, got {value!r}", field="tools", value=value
        )
    tools = []
    for item in value:
        try:
            tools.append(as_tool(item))
        except ToolDefinitionError as err:
            raise AgentTypeError(f"Agent.tools: {err}", field="tools", value=item) from err
    return tuple(tools)


def _check_unique_tools(instance: Any, attribute: attrs.Attribute[Any], value: tuple[ToolDef, ...]) -> None:
    seen: set[str] = set()
    for tool_def in value:
        if tool_def.name in seen:
            raise AgentDefinitionError(
                f"Agent.tools has two tools named {tool_def.name!r}; tool names must be unique",
                field="tools",
                value=tool_def.name,
            )
        seen.add(tool_def.name)


def _to_metadata(value: Mapping[str, Any] | None) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise AgentTypeError(f"Agent.metadata must be a mapping, got {value!r}", field="metadata", value=value)
    return dict(value)


_check_optional_number = optional(a_number(at_least=0, refusal=_AGENT))


def _check_continuation(instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if value is not None and not isinstance(value, Continuation):
        raise AgentTypeError(f"Agent.continuation must be a Continuation or None, got {value!r}",
                             field="continuation", value=value)
def _to_credentials(value: Iterable[str]) -> tuple[str, ...]:
    def error(message: str) -> AgentTypeError:
        return AgentTypeError(f"Agent.{message}", field="credentials", value=value)

    return check_credential_names(value, what="credentials", error=error)


def _check_output_type(instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if value is not None:
        OutputSpec.of(value)  # raises AgentDefinitionError naming the field


_T = TypeVar("_T")


def _to_values(kind: type[_T], field: str) -> Callable[[Any], tuple[_T, ...]]:
    def convert(value: Any) -> tuple[_T, ...]:
        if value is None:
            return ()
        if isinstance(value, (str, bytes, kind)) or not isinstance(value, Iterable):
            raise AgentTypeError(f"Agent.{field} must be a sequence of {kind.__name__}, got {value!r}",
                                 field=field, value=value)
        items = tuple(value)
        for item in items:
            if not isinstance(item, kind):
                raise AgentTypeError(f"Agent.{field} holds {kind.__name__} values, got {item!r}",
                                     field=field, value=item)
        return items

    return convert


def _to_agents(value: Iterable[Agent] | None) -> tuple[Agent, ...]:
    # Agent is defined below; the converter runs at construction, when it exists.
    return _to_values(Agent, "agents")(value)


def _to_handoffs(value: Iterable[Handoff] | None) -> tuple[Handoff, ...]:
    return _to_values(Handoff, "handoffs")(value)


def _to_guardrails(value: Iterable[Guardrail] | None) -> tuple[Guardrail, ...]:
    return _to_values(Guardrail, "guardrails")(value)


def _to_strategy(value: Strategy | str | None) -> Strategy | None:
    return None if value is None else Strategy.parse(value)


def _check_router(instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if value is not None and not isinstance(value, Agent) and not callable(value):
        raise AgentTypeError(f"Agent.router must be an Agent, a callable or None, got {value!r}", field="router",
                             value=value)


def _check_slot(instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if value is not None and not isinstance(value, Agent):
        raise AgentTypeError(f"Agent.{attribute.name} must be an Agent or None, got {value!r}", field=attribute.name,
                             value=value)


def _to_transitions(value: Mapping[str, Iterable[str]] | None) -> Mapping[str, tuple[str, ...]]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise AgentTypeError(f"Agent.allowed_transitions must be a mapping, got {value!r}",
                             field="allowed_transitions", value=value)
    out = {}
    for source, targets in value.items():
        if isinstance(targets, str) or not isinstance(targets, Iterable):
            raise AgentTypeError(f"Agent.allowed_transitions[{source!r}] must be a list of agent names",
                                 field="allowed_transitions", value=targets)
        out[str(source)] = tuple(str(t) for t in targets)
    return out


def _check_stop_when(instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if value is not None and not callable(value):
        raise AgentTypeError(f"Agent.stop_when must be a callable or None, got {value!r}", field="stop_when",
                             value=value)


def _check_gate(instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if value is not None and not isinstance(value, Gate):
        raise AgentTypeError(f"Agent.gate must be a Gate or None (Gate.text_contains(...), Gate.function(...)), "
                             f"got {value!r}", field="gate", value=value)


def _check_unique_names(instance: Any, attribute: attrs.Attribute[Any], value: tuple[Any, ...]) -> None:
    names = [item.name for item in value]
    for name in names:
        if names.count(name) > 1:
            raise AgentDefinitionError(f"Agent.{attribute.name} has two entries named {name!r}",
                                       field=attribute.name, value=name)


@attrs.frozen
class Agent:
    """An agent: a model, instructions, tools and a turn limit.

    Immutable and validated at construction; safe to share between threads and to start
    many times. Each bad field raises a ``ValueError`` or ``TypeError`` subclass
    (:class:`~conductor_agents.errors.AgentDefinitionError`,
    :class:`~conductor_agents.errors.AgentTypeError`) whose message names the field.

    ``stateful=True`` (or any tool marked ``@tool(stateful=True)``) pins every worker task
    of a run to the process that started it, through a per-run task domain.

    ``output_type`` (a dataclass, attrs class, TypedDict, NamedTuple or pydantic model) asks the
    model for a JSON answer of that shape; each answer is checked in the run and, when it does not fit,
    the model is told what does not and asked again, up to ``output_retries`` (2) times, then the run
    fails; ``wait()`` returns an instance as ``result.output`` or raises ``OutputValidationError``
    (see ``docs/tools.md``). ``credentials`` names the secrets the server delivers to every tool that
    declares none of its own (``ctx.secret(name)``).

    ``agents`` and ``strategy`` (with ``router``, ``handoffs``, ``allowed_transitions``,
    ``synthesize``; ``planner``, ``fallback`` and ``fallback_max_turns`` for ``strategy="plan_execute"``, whose
    plan calls this agent's tools) make it a team whose sub-agents run inside its run; :meth:`as_tool` makes it a
    tool of another agent; ``guardrails``, ``stop_when`` and ``termination`` check and end its loop
    (see ``docs/teams.md``). A stateful team pins every worker task of the whole tree.
    """

    name: str = attrs.field(validator=_check_name)
    model: str = attrs.field(validator=_check_model)
    instructions: str = attrs.field(default="", validator=_check_str)
    tools: tuple[ToolDef, ...] = attrs.field(default=(), converter=_to_tools, validator=_check_unique_tools)
    max_turns: int = attrs.field(kw_only=True, default=25, validator=an_int(at_least=1, refusal=_AGENT))
    stateful: bool = attrs.field(kw_only=True, default=False, validator=_check_bool)
    timeout_seconds: int = attrs.field(kw_only=True, default=0, validator=an_int(at_least=0, refusal=_AGENT))
    description: str = attrs.field(kw_only=True, default="", validator=_check_str)
    temperature: float | None = attrs.field(kw_only=True, default=None, validator=_check_optional_number)
    max_tokens: int | None = attrs.field(
        kw_only=True, default=None, validator=optional(an_int(at_least=1, refusal=_AGENT))
    )
    metadata: Mapping[str, Any] = attrs.field(kw_only=True, factory=dict, converter=_to_metadata)
    #: When a long-lived listener is continued as a fresh run (None: the runtime's settings).
    continuation: Continuation | None = attrs.field(kw_only=True, default=None, validator=_check_continuation)
    output_type: type | None = attrs.field(kw_only=True, default=None, validator=_check_output_type)
    #: With ``output_type``: how many times the model is asked again, told what does not fit, when an answer
    #: does not fit (0: never; the server's JSON mode instead, and ``wait()`` checks the final answer only).
    output_retries: int = attrs.field(kw_only=True, default=2, validator=an_int(at_least=0, refusal=_AGENT))
    credentials: tuple[str, ...] = attrs.field(kw_only=True, default=(), converter=_to_credentials)
    #: Sub-agents this agent runs as parts of its run, in the way ``strategy`` says.
    agents: tuple[Agent, ...] = attrs.field(kw_only=True, default=(), converter=_to_agents,
                                             validator=_check_unique_names)
    strategy: Strategy | None = attrs.field(kw_only=True, default=None, converter=_to_strategy)
    #: ``strategy="router"``: the agent whose model picks the next sub-agent (else this agent's model),
    #: or a Python ``router(conversation) -> name | "DONE"`` run as a worker task here.
    router: Agent | Callable[[str], Any] | None = attrs.field(kw_only=True, default=None,
                                                                   validator=_check_router)
    #: ``strategy="swarm"``: rules that pass the conversation to another agent.
    handoffs: tuple[Handoff, ...] = attrs.field(kw_only=True, default=(), converter=_to_handoffs)
    #: ``strategy="plan_execute"``: the agent whose answer is a JSON plan of calls of this agent's tools.
    planner: Agent | None = attrs.field(kw_only=True, default=None, validator=_check_slot)
    #: ``strategy="plan_execute"``: the agent that answers when the plan is missing, invalid or fails.
    fallback: Agent | None = attrs.field(kw_only=True, default=None, validator=_check_slot)
    #: ``strategy="plan_execute"``: the fallback's turn limit (None: its own ``max_turns``).
    fallback_max_turns: int | None = attrs.field(kw_only=True, default=None,
                                                    validator=optional(an_int(at_least=1, refusal=_AGENT)))
    #: ``round_robin``/``random``/``swarm``: for each agent's name, the agents that may come next.
    allowed_transitions: Mapping[str, tuple[str, ...]] = attrs.field(kw_only=True, factory=dict,
                                                                       converter=_to_transitions)
    #: ``handoff``/``router``: False makes the conversation the answer (no final model turn).
    synthesize: bool = attrs.field(kw_only=True, default=True, validator=_check_bool)
    #: Checks of the model's answer before it leaves the run (see :class:`Guardrail`).
    guardrails: tuple[Guardrail, ...] = attrs.field(kw_only=True, default=(),
                                                     converter=_to_guardrails,
                                                     validator=_check_unique_names)

    #: ``stop_when(text, turn)``: True ends the loop after that turn (run as a worker task here).
    stop_when: StopRule | None = attrs.field(kw_only=True, default=None, validator=_check_stop_when)

    #: When the loop ends: the server's conditions (text mention, stop message, turns), evaluated here.
    termination: Termination | None = attrs.field(
        kw_only=True, default=None,
        validator=attrs.validators.optional(attrs.validators.instance_of(Termination)))

    #: A stage of a ``strategy="sequential"`` team: the check after this agent's answer that may stop the
    #: pipeline there (see :class:`Gate`). Refused anywhere the server would ignore it.
    gate: Gate | None = attrs.field(kw_only=True, default=None, validator=_check_gate)

    def __attrs_post_init__(self) -> None:
        _check_team(self)
        check_task_names(self)
        if (self.stop_when is not None or self.termination is not None) and not self.tools and not self.agents:
            which = "termination" if self.termination is not None else "stop_when"
            raise AgentDefinitionError(
                f"Agent {self.name!r}: {which} needs tools or sub-agents; the server (3.32.3) runs an agent "
                "with neither as one model call and never evaluates a stopping rule", field=which,
                value=getattr(self, which))
        local = merge_worker_tools(worker_groups(self), where=f"agent {self.name!r}")
        if self.needs_message_queue and local and not self.is_stateful:
            raise AgentDefinitionError(
                f"Agent {self.name!r} waits for messages and has tools served by this process "
                f"({', '.join(t.name for t in local[:3])}{', ...' if len(local) > 3 else ''}): "
                "it must be stateful=True, so its runs stay with the process that serves them "
                "and are continued when they grow", field="stateful", value=False)

    def as_tool(self, *, name: str | None = None, description: str | None = None) -> ToolDef:
        """This agent as a tool another agent's model calls with a ``request``; its answer is the result.

        The server runs it as a sub-workflow of the caller's run. Its worker tools are served
        with the caller's, on the caller's domain when the caller is stateful.

        Raises:
            ToolDefinitionError: ``name`` (default: the agent's name) or ``description`` is invalid.
        """
        return agent_tool(self, name=name, description=description)

    @property
    def _router_agents(self) -> tuple[Agent, ...]:
        return (self.router,) if isinstance(self.router, Agent) else ()

    @property
    def _plan_agents(self) -> tuple[Agent, ...]:
        return tuple(a for a in (self.planner, self.fallback) if a is not None)

    @property
    def is_stateful(self) -> bool:
        """Whether runs are pinned to one process: the agent, a sub-agent or any of their tools is stateful.

        The pin covers the whole tree: every worker task of every sub-run goes to the run's domain.
        """
        return (self.stateful or any(t.stateful for t in self.tools)
                or any(t.stateful for t in self.worker_tools)
                or any(a.is_stateful for a in (*self.agents, *self._router_agents, *self._plan_agents)))

    @property
    def worker_tools(self) -> tuple[ToolDef, ...]:
        """The tools whose bodies run in this process (not the server's own tools): this agent's,
        its function guardrails', its agent tools' and its sub-agents' (each name once)."""
        return merge_worker_tools(worker_groups(self), where=f"agent {self.name!r}")

    @property
    def has_sub_runs(self) -> bool:
        """Whether runs start sub-runs on the server: the agent has sub-agents or agent tools."""
        return (bool(self.agents) or bool(self._plan_agents)
                or any(t.tool_type == AGENT_TOOL for t in self.tools))

    @property
    def agent_names(self) -> tuple[str, ...]:
        """The names of the sub-agents (``agents``), in order."""
        return tuple(a.name for a in self.agents)

    @property
    def team_names(self) -> tuple[str, ...]:
        """The agents that run as sub-runs of this one and answer: ``agents``, then ``planner`` and
        ``fallback`` (what ``result.agents_run`` is made of)."""
        return tuple(a.name for a in (*self.agents, *self._plan_agents))

    @property
    def is_listener(self) -> bool:
        """Whether runs are stateful and wait for messages: such runs are continued when they grow."""
        return self.is_stateful and self.needs_message_queue

    @property
    def needs_message_queue(self) -> bool:
        """Whether a tool reads the run's message queue (a wait-for-message tool)."""
        return any(t.tool_type == PULL_WORKFLOW_MESSAGES for t in self.tools)

    @property
    def waits_for_people(self) -> bool:
        """Whether a run can wait for a person: a tool needs approval, a tool asks a person, a person
        picks the next sub-agent (``strategy="manual"``), or a guardrail (the agent's or a tool's) hands a
        failed check to a person (``on_fail="human"``)."""
        return (self.strategy is Strategy.MANUAL
                or any(t.approval_required or t.tool_type == HUMAN for t in self.tools)
                or any(g.on_fail == "human" for g in self.guardrails)
                or any(g.on_fail == "human" for t in self.tools for g in t.guardrails))

    @property
    def output_spec(self) -> OutputSpec | None:
        """The schema and converter of ``output_type`` (None without one)."""
        return OutputSpec.of(self.output_type) if self.output_type is not None else None

    def to_config(self) -> dict[str, Any]:
        """The server's ``agentConfig`` for ``POST /agent/start``.

        Raises:
            AgentDefinitionError: the agent has a ``gate``: only a sequential team's stage has one (the server
                ignores it on an agent run on its own or as a tool).
        """
        if self.gate is not None:
            raise AgentDefinitionError(
                f"Agent {self.name!r} has a gate, which only a stage of a sequential team runs "
                "(Agent(agents=[...], strategy='sequential')); the server ignores it on an agent run on its own "
                "or as a tool", field="gate", value=self.gate)
        return agent_config(self)


def _check_team(agent: Agent) -> None:
    """The sub-agent fields fit together.

    Raises:
        AgentDefinitionError: a strategy, router, handoff or transition without the agents it needs.
    """
    for sub in agent.agents:
        if not isinstance(sub, Agent):
            raise AgentTypeError(f"Agent.agents holds Agent values, got {sub!r}", field="agents", value=sub)
        if sub.name == agent.name:
            raise AgentDefinitionError(f"Agent.agents: a sub-agent may not share its parent's name {agent.name!r}",
                                       field="agents", value=sub.name)
    names = set(agent.agent_names)
    check_plan_execute(agent)
    if agent.strategy is not None and agent.strategy is not Strategy.PLAN_EXECUTE and not agent.agents:
        raise AgentDefinitionError("Agent.strategy needs sub-agents (agents=[...])", field="strategy",
                                   value=agent.strategy.value)
    if agent.router is not None and agent.strategy is not Strategy.ROUTER:
        raise AgentDefinitionError("Agent.router is only used with strategy='router'", field="router",
                                   value=getattr(agent.router, "name", agent.router))
    if agent.handoffs and agent.strategy is not Strategy.SWARM:
        raise AgentDefinitionError("Agent.handoffs are only used with strategy='swarm'", field="handoffs",
                                   value=agent.handoffs)
    known = names | {agent.name}
    for handoff in agent.handoffs:
        if handoff.target not in known:
            raise AgentDefinitionError(f"Agent.handoffs: no agent is named {handoff.target!r}", field="handoffs",
                                       value=handoff.target)
    for source, targets in agent.allowed_transitions.items():
        for name in (source, *targets):
            if name not in known:
                raise AgentDefinitionError(f"Agent.allowed_transitions: no agent is named {name!r}",
                                           field="allowed_transitions", value=name)
    _check_gates(agent)
    if agent.agents and any(t.tool_type == PULL_WORKFLOW_MESSAGES for a in agent.agents for t in a.tools):
        raise AgentDefinitionError("Agent.agents: a sub-agent cannot wait for messages (the run's message "
                                   "queue is the parent's)", field="agents", value=agent.agent_names)


def _check_gates(agent: Agent) -> None:
    """Gates only where the server (3.32.3) runs them: after a stage of a sequential team other than the last.

    Raises:
        AgentDefinitionError: a sub-agent of another strategy, the last stage, a router, planner or fallback
            has a gate.
    """
    for sub in (*agent._router_agents, *agent._plan_agents):
        if sub.gate is not None:
            role = "router" if sub is agent.router else "planner" if sub is agent.planner else "fallback"
            raise AgentDefinitionError(
                f"Agent {agent.name!r}: the {role} {sub.name!r} has a gate, which only a stage of a sequential "
                "team runs (the server ignores it)", field="gate", value=sub.name)
    gated = [(i, sub) for i, sub in enumerate(agent.agents) if sub.gate is not None]
    if not gated:
        return
    strategy = agent.strategy or Strategy.HANDOFF
    if strategy is not Strategy.SEQUENTIAL:
        raise AgentDefinitionError(
            f"Agent {agent.name!r}: the sub-agent {gated[0][1].name!r} has a gate, which only strategy='sequential' "
            f"runs (the server ignores it with strategy={strategy.value!r})", field="gate", value=gated[0][1].name)
    last = len(agent.agents) - 1
    if gated[-1][0] == last:
        raise AgentDefinitionError(
            f"Agent {agent.name!r}: the last stage {agent.agents[last].name!r} has a gate, but no stage follows it "
            "(the server never runs a gate after the last stage)", field="gate", value=agent.agents[last].name)


def is_agent_name(value: str) -> bool:
    """Whether ``value`` can be an :attr:`Agent.name` (a letter or ``_``, then letters, digits, ``_``, ``-``)."""
    return bool(_NAME.match(value))


def check_agent(agent: Any) -> Agent:
    """``agent`` if it is an Agent (what every runtime call given an agent checks first).

    Raises: AgentTypeError: it is not.
    """
    if not isinstance(agent, Agent):
        raise AgentTypeError(f"agent must be an Agent, got {agent!r}", field="agent", value=agent)
    return agent
