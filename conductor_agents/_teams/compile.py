"""An :class:`~conductor_agents.Agent` as the server gets it: its ``agentConfig`` and the worker tasks it needs.

The server (3.32.3) compiles the ``agentConfig`` of ``POST /agent/start`` into the run's workflow.
The parts of an agent that run in Python (its worker tools, function guardrails, a stop rule, a
termination condition, a Python router, a ``manual`` team's pick, ``on_condition`` handoffs,
function gates) are worker tasks this SDK serves; the config names them (see
:mod:`conductor_agents._common.task_names`). Kept apart from :mod:`conductor_agents.agent`, which
holds the value and its checks; this package sits below it, so an agent is read through its fields
(and its ``_router_agents`` / ``_plan_agents``: the router, planner and fallback that are agents).

Pure functions; thread-safe.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from .._answers.output_check import output_check_config, output_check_worker, schema_instructions
from .._answers.output_type import OutputSpec
from .._common.task_names import (
    gate_task_name,
    handoff_task_name,
    output_check_task_name,
    router_task_name,
    selection_task_name,
    stop_task_name,
    termination_task_name,
)
from .._tooldefs.tooldef import ToolDef
from .gates import gate_worker
from .stopping import stop_worker
from .subagents import Strategy, handoff_worker, router_worker, selection_worker
from .termination import termination_worker

__all__ = ["agent_config", "check_task_names", "checks_answers", "worker_groups"]


def check_task_names(agent: Any) -> None:
    """Make the name of each worker task the agent's Python parts need, so a name too long for one
    is refused when the agent is built.

    Raises:
        AgentDefinitionError: no task name can be made of the agent's name.
    """
    if checks_answers(agent):
        output_check_task_name(agent.name)
    if agent.stop_when is not None:
        stop_task_name(agent.name)
    if agent.termination is not None:
        termination_task_name(agent.name)
    if agent.router is not None and not agent._router_agents:
        router_task_name(agent.name)
    if agent.strategy is Strategy.MANUAL:
        selection_task_name(agent.name)


def checks_answers(agent: Any) -> bool:
    """Whether the run checks each answer against ``output_type`` and asks the model again
    (``output_retries`` >= 1; not for a team, whose guardrails would run the whole team again)."""
    return (agent.output_type is not None and agent.output_retries > 0 and not agent.agents
            and agent.strategy is None)


def worker_groups(agent: Any) -> list[Iterable[ToolDef]]:
    """The worker tools of the agent's tree, a group per source: its tools, its agent tools' sub-runs,
    the function guardrails, its team's Python parts, then each sub-agent's, router's, planner's and
    fallback's worker tools (merged, each name once, by ``merge_worker_tools``)."""
    agent_names = agent.agent_names
    groups: list[Iterable[ToolDef]] = [[t for t in agent.tools if t.is_worker]]
    groups += [t.nested_tools for t in agent.tools]
    if checks_answers(agent):
        groups.append([output_check_worker(agent.name, agent.output_spec, agent.output_retries, agent.max_turns)])
    groups.append([g.worker for g in agent.guardrails if g.worker is not None])
    groups.append([g.worker for t in agent.tools for g in t.guardrails if g.worker is not None])
    if agent.stop_when is not None:
        groups.append([stop_worker(agent.name, agent.stop_when)])
    if agent.termination is not None:
        groups.append([termination_worker(agent.name, agent.termination)])
    if agent.router is not None and not agent._router_agents:
        groups.append([router_worker(agent.name, agent.router, agent_names)])
    if agent.strategy is Strategy.MANUAL:
        groups.append([selection_worker(agent.name, agent_names)])
    groups.append([handoff_worker(agent.name, i, h, agent_names)
                   for i, h in enumerate(agent.handoffs) if h.kind == "on_condition"])
    groups.append([gate_worker(agent.name, i, a.name, a.gate)
                   for i, a in enumerate(agent.agents) if a.gate is not None and a.gate.needs_worker])
    groups += [a.worker_tools for a in (*agent.agents, *agent._router_agents, *agent._plan_agents)]
    return groups


def _stage_config(team: Any, index: int, stage: Any) -> dict[str, Any]:
    """A sub-agent's config as its team sends it: with its ``gate`` (a sequential team's stage only)."""
    config = agent_config(stage)
    if stage.gate is not None:
        config["gate"] = stage.gate.to_config(gate_task_name(team.name, index) if stage.gate.needs_worker
                                              else None)
    return config


def agent_config(agent: Any) -> dict[str, Any]:
    """The server's ``agentConfig`` of ``agent``, without the check of its own ``gate`` (``Agent.to_config``
    makes it; a team's stages carry theirs)."""
    config: dict[str, Any] = {
        "name": agent.name,
        "model": agent.model,
        "instructions": agent.instructions,
        "tools": [t.to_config() for t in agent.tools],
        "maxTurns": agent.max_turns,
    }
    if agent.description:
        config["description"] = agent.description
    if agent.timeout_seconds:
        config["timeoutSeconds"] = agent.timeout_seconds
    if agent.temperature is not None:
        config["temperature"] = agent.temperature
    if agent.max_tokens is not None:
        config["maxTokens"] = agent.max_tokens
    if agent.metadata:
        config["metadata"] = dict(agent.metadata)
    guardrails = [g.to_config() for g in agent.guardrails]
    if checks_answers(agent):
        # Without the schema the server neither adds its sentence nor turns on JSON mode, which fails the
        # model call on prose before any guardrail runs: the sentence goes into the instructions here, and
        # prose reaches the check, which tells the model what is wrong.
        spec = OutputSpec.of(agent.output_type)
        config["instructions"] = "\n\n".join(p for p in (agent.instructions, schema_instructions(
            spec, bool(agent.tools))) if p)
        config["outputType"] = {"className": agent.output_type.__qualname__}
        guardrails.insert(0, output_check_config(agent.name, agent.max_turns))
    elif agent.output_type is not None:
        config["outputType"] = OutputSpec.of(agent.output_type).to_config()
    if agent.credentials:
        config["credentials"] = list(agent.credentials)
    if guardrails:
        config["guardrails"] = guardrails
    if agent.agents:
        config["agents"] = [_stage_config(agent, i, a) for i, a in enumerate(agent.agents)]
        config["strategy"] = (agent.strategy or Strategy.HANDOFF).value
        if not agent.synthesize:
            config["synthesize"] = False
    if agent.strategy is Strategy.PLAN_EXECUTE:
        config["strategy"] = Strategy.PLAN_EXECUTE.value
        assert agent.planner is not None  # checked when the agent was built
        config["planner"] = agent.planner.to_config()
        if agent.fallback is not None:
            config["fallback"] = agent.fallback.to_config()
        # The compiler never runs ``agents`` of a plan_execute agent, but the server (3.32.3) routes to a
        # stateful run's domain, and registers, only the worker tools of the agent and of its ``agents``
        # (never of planner/fallback): listed there too, their tools stay in the run's process.
        config["agents"] = [a.to_config() for a in agent._plan_agents]
        if agent.fallback_max_turns is not None:
            config["fallbackMaxTurns"] = agent.fallback_max_turns
    if agent._router_agents:
        config["router"] = agent.router.to_config()
    elif agent.router is not None:
        config["router"] = {"taskName": router_task_name(agent.name)}
    if agent.handoffs:
        config["handoffs"] = [h.to_config(handoff_task_name(agent.name, i) if h.kind == "on_condition" else None)
                              for i, h in enumerate(agent.handoffs)]
    if agent.stop_when is not None:
        config["stopWhen"] = {"taskName": stop_task_name(agent.name)}
    if agent.termination is not None:
        config["termination"] = agent.termination.to_config()
    if agent.allowed_transitions:
        config["allowedTransitions"] = {k: list(v) for k, v in agent.allowed_transitions.items()}
    return config
