"""The names of the tasks this SDK serves or adds to a run, and the rule every tool name obeys.

These names live on the server: in the task definitions it registered, the task lists of running
runs and the domains workers poll. A run started before an upgrade must find its worker after it,
so each maker keeps the name it has always made, byte for byte: ``_stop_when`` keeps 44 characters
of a long agent name, the others as many as fit (an old difference that stays), and the
termination and ``manual`` selection tasks are named by the server, so a name too long for a task
of this SDK is refused rather than cut.

Pure functions and constants; thread-safe.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from typing import Any

from ..errors import AgentDefinitionError

__all__ = [
    "HUMAN_TASK_TYPE",
    "MESSAGE_WAIT_MARK",
    "MESSAGE_WAIT_TASK_TYPE",
    "MODEL_TASK_TYPE",
    "CARRY_TASK",
    "FORWARD_TASK",
    "MAILBOX_REST_TASK",
    "REST_SECONDS",
    "INTERNAL_TASK_TYPES",
    "PICK_SUFFIX",
    "SELECTION_SUFFIX",
    "TOOL_NAME",
    "TURN_TASK",
    "gate_task_name",
    "is_message_wait",
    "handoff_task_name",
    "output_check_task_name",
    "router_task_name",
    "selection_task_name",
    "server_ref",
    "stop_task_name",
    "termination_task_name",
]

#: A tool's name, hence a worker task's type: 1-64 letters, digits, ``_`` or ``-``, not starting with
#: a digit or ``-`` (tool names become LLM function names and Conductor task types).
TOOL_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_-]{0,63}")
_LONGEST = 64

#: The prefill task that holds a new link until the switch is committed; its output is the commit
#: record (first writer wins: the server ignores updates to a finished task).
#: The server's task type of a model call (an agent's turn).
MODEL_TASK_TYPE = "LLM_CHAT_COMPLETE"
#: The server's task type of a wait for messages (a ``WaitForMessageTool`` call).
MESSAGE_WAIT_TASK_TYPE = "PULL_WORKFLOW_MESSAGES"
#: The server's task type of a question to a person, and of a listener's wait when it waits on a ``HUMAN``
#: task (``listener_wait="human"``: see ``docs/idle-listeners.md``).
HUMAN_TASK_TYPE = "HUMAN"
#: How the SDK tells a listener's wait from a question to a person when both are ``HUMAN`` tasks: the end of
#: the wait tool's description, which the server copies into the task's input as ``_description``.
MESSAGE_WAIT_MARK = "(conductor-agents: waits for messages)"


def is_message_wait(task: Mapping[str, Any]) -> bool:
    """Whether a task (as the server lists it) is a listener's wait for messages, of either kind."""
    task_type = task.get("taskType")
    if task_type == MESSAGE_WAIT_TASK_TYPE:
        return True
    if task_type != HUMAN_TASK_TYPE:
        return False
    inputs = task.get("inputData")
    return isinstance(inputs, Mapping) and str(inputs.get("_description") or "").endswith(MESSAGE_WAIT_MARK)

CARRY_TASK = "conductor_agents_carry"
#: The worker task the SDK adds before each model call of a continued listener (a ``before_model``
#: callback): it tells the serving process that a turn began, and which, without any polling.
TURN_TASK = "conductor_agents_turn"
#: The worker task of a listener's mailbox (``_listener.mailbox``): pushes its messages into the listener.
FORWARD_TASK = "conductor_agents_forward"
#: A mailbox's rest (version 4: a ``HUMAN`` task that the next decide of the mailbox ends once it has rested
#: ``REST_SECONDS``, whole seconds: the least the server's task timeout takes).
MAILBOX_REST_TASK = "mailbox_rest"
REST_SECONDS = 1
#: The task types the SDK adds to a listener's runs for itself: never a tool call of the model's.
INTERNAL_TASK_TYPES = frozenset({CARRY_TASK, TURN_TASK, FORWARD_TASK})

#: A ``manual`` team's turn: the server's ``HUMAN`` task ``<agent>_pick_agent``, then the worker task
#: ``<agent>_process_selection`` this SDK serves.
PICK_SUFFIX, SELECTION_SUFFIX = "_pick_agent", "_process_selection"
_STOP_SUFFIX, _ROUTE_SUFFIX, _TERMINATION_SUFFIX = "_stop_when", "_route", "_termination"
_OUTPUT_CHECK_SUFFIX = "_output_type"
#: How much of a long agent name a ``_stop_when`` task keeps (one less than the other makers keep).
_STOP_KEEPS = 44


def server_ref(agent_name: str) -> str:
    """The server's ``toRef``: the name with every character other than letters, digits and ``_`` made ``_``."""
    return re.sub(r"[^A-Za-z0-9_]", "_", agent_name)


def _made(agent_name: str, suffix: str, field: str, keep: int | None = None) -> str:
    """``<agent name><suffix>``, or for a name too long for a task (64 characters) its first ``keep``
    characters (default: as many as fit), ``_``, a hash of the whole name and the suffix (the same each time).

    Raises:
        AgentDefinitionError: no task name can be made of the agent's name.
    """
    name = agent_name + suffix
    if len(name) > _LONGEST:
        digest = hashlib.sha1(agent_name.encode("utf-8"), usedforsecurity=False).hexdigest()[:8]
        cut = _LONGEST - len(suffix) - 9 if keep is None else keep
        name = f"{agent_name[:cut]}_{digest}{suffix}"
    if not TOOL_NAME.fullmatch(name):
        raise AgentDefinitionError(f"Agent.{field}: no task name can be made of the agent's name {agent_name!r}",
                                   field=field, value=agent_name)
    return name


def _named_by_server(agent_name: str, suffix: str, where: str, field: str) -> str:
    """``server_ref(agent name) + suffix``, the name the server gives the task.

    Raises:
        AgentDefinitionError: that name is not one this SDK serves (longer than 64 characters).
    """
    name = server_ref(agent_name) + suffix
    if not TOOL_NAME.fullmatch(name):
        raise AgentDefinitionError(
            f"{where}: the server names its task {name!r}, longer than the {_LONGEST} characters this SDK "
            f"serves; use an agent name of at most {_LONGEST - len(suffix)} characters", field=field,
            value=agent_name)
    return name


def stop_task_name(agent_name: str) -> str:
    """The worker task of an agent's stop rule: ``<name>_stop_when``, or for a name too long for a task
    name (64 characters) its first 44 characters and a hash of the whole name.

    Raises:
        AgentDefinitionError: no task name can be made of the agent's name.
    """
    return _made(agent_name, _STOP_SUFFIX, "stop_when", keep=_STOP_KEEPS)


def router_task_name(agent_name: str) -> str:
    """The worker task of the agent ``agent_name``'s Python router.

    Raises:
        AgentDefinitionError: no task name can be made of the agent's name.
    """
    return _made(agent_name, _ROUTE_SUFFIX, "router")


def handoff_task_name(agent_name: str, index: int) -> str:
    """The worker task of the swarm ``agent_name``'s ``index``-th handoff (an ``on_condition`` one).

    Raises:
        AgentDefinitionError: no task name can be made of the agent's name.
    """
    return _made(agent_name, f"_handoff_{index}", "handoffs")


def gate_task_name(agent_name: str, index: int) -> str:
    """The worker task of the gate after stage ``index`` of the sequential team ``agent_name``.

    Raises:
        AgentDefinitionError: no task name can be made of the agent's name.
    """
    return _made(agent_name, f"_gate_{index}", "gate")


def output_check_task_name(agent_name: str) -> str:
    """The worker task (and guardrail name) that checks the answers of the agent ``agent_name`` against
    its ``output_type``.

    Raises:
        AgentDefinitionError: no task name can be made of the agent's name.
    """
    return _made(agent_name, _OUTPUT_CHECK_SUFFIX, "output_type")


def termination_task_name(agent_name: str) -> str:
    """The task the server schedules for an agent's termination condition.

    Raises:
        AgentDefinitionError: the name is too long for a task this SDK serves (64 characters).
    """
    return _named_by_server(agent_name, _TERMINATION_SUFFIX, "Agent.termination", "termination")


def selection_task_name(agent_name: str) -> str:
    """The worker task the server schedules after a person picked a ``manual`` team's next sub-agent.

    Raises:
        AgentDefinitionError: the server's name for it is longer than a task this SDK serves (64 characters).
    """
    return _named_by_server(agent_name, SELECTION_SUFFIX, "Agent.strategy='manual'", "strategy")
