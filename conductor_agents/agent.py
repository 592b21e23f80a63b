"""The :class:`Agent` value type: what the server compiles into a workflow."""

from __future__ import annotations

import re
from typing import Any, Iterable, Mapping, Optional

import attrs

from .continuation import Continuation
from ._output_type import OutputSpec
from ._secrets import check_credential_names
from .errors import AgentDefinitionError, AgentTypeError, ToolDefinitionError
from .tools import ToolDef, as_tool

__all__ = ["Agent"]

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]{0,127}$")
_MODEL = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/\S+$")


def _check_name(instance: Any, attribute: "attrs.Attribute[Any]", value: Any) -> None:
    if not isinstance(value, str):
        raise AgentTypeError(f"Agent.name must be a str, got {value!r}", field="name", value=value)
    if not _NAME.match(value):
        raise AgentDefinitionError(
            f"Agent.name must start with a letter or '_' and use only letters, digits, '_' "
            f"and '-' (at most 128 characters), got {value!r}",
            field="name",
            value=value,
        )


def _check_model(instance: Any, attribute: "attrs.Attribute[Any]", value: Any) -> None:
    if not isinstance(value, str):
        raise AgentTypeError(f"Agent.model must be a str, got {value!r}", field="model", value=value)
    if not _MODEL.match(value):
        raise AgentDefinitionError(
            f"Agent.model must be of the form 'provider/model' (e.g. 'openai/gpt-4o'), got {value!r}",
            field="model",
            value=value,
        )


def _check_int(minimum: int) -> Any:
    def check(instance: Any, attribute: "attrs.Attribute[Any]", value: Any) -> None:
        if isinstance(value, bool) or not isinstance(value, int):
            raise AgentTypeError(
                f"Agent.{attribute.name} must be an int, got {value!r}", field=attribute.name, value=value
            )
        if value < minimum:
            raise AgentDefinitionError(
                f"Agent.{attribute.name} must be >= {minimum}, got {value!r}",
                field=attribute.name,
                value=value,
            )

    return check


def _check_str(instance: Any, attribute: "attrs.Attribute[Any]", value: Any) -> None:
    if not isinstance(value, str):
        raise AgentTypeError(
            f"Agent.{attribute.name} must be a str, got {value!r}", field=attribute.name, value=value
        )


def _check_bool(instance: Any, attribute: "attrs.Attribute[Any]", value: Any) -> None:
    if not isinstance(value, bool):
        raise AgentTypeError(
            f"Agent.{attribute.name} must be True or False, got {value!r}", field=attribute.name, value=value
        )


def _to_tools(value: Any) -> "tuple[ToolDef, ...]":
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


def _check_unique_tools(instance: Any, attribute: "attrs.Attribute[Any]", value: "tuple[ToolDef, ...]") -> None:
    seen: set[str] = set()
    for tool_def in value:
        if tool_def.name in seen:
            raise AgentDefinitionError(
                f"Agent.tools has two tools named {tool_def.name!r}; tool names must be unique",
                field="tools",
                value=tool_def.name,
            )
        seen.add(tool_def.name)


def _to_metadata(value: Any) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise AgentTypeError(f"Agent.metadata must be a mapping, got {value!r}", field="metadata", value=value)
    return dict(value)


def _check_optional_number(instance: Any, attribute: "attrs.Attribute[Any]", value: Any) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise AgentTypeError(
            f"Agent.{attribute.name} must be a number or None, got {value!r}", field=attribute.name, value=value
        )
    if value < 0:
        raise AgentDefinitionError(
            f"Agent.{attribute.name} must be >= 0, got {value!r}", field=attribute.name, value=value
        )


def _check_continuation(instance: Any, attribute: "attrs.Attribute[Any]", value: Any) -> None:
    if value is not None and not isinstance(value, Continuation):
        raise AgentTypeError(f"Agent.continuation must be a Continuation or None, got {value!r}",
                             field="continuation", value=value)
def _to_credentials(value: Any) -> "tuple[str, ...]":
    def error(message: str) -> AgentTypeError:
        return AgentTypeError(f"Agent.{message}", field="credentials", value=value)

    return check_credential_names(value, what="credentials", error=error)


def _check_output_type(instance: Any, attribute: "attrs.Attribute[Any]", value: Any) -> None:
    if value is not None:
        OutputSpec.of(value)  # raises AgentDefinitionError naming the field


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
    model for a JSON answer of that shape; ``wait()`` checks it and returns an instance as
    ``result.output``. ``credentials`` names the secrets the server delivers to every tool that
    declares none of its own (``ctx.secret(name)``).
    """

    name: str = attrs.field(validator=_check_name)
    model: str = attrs.field(validator=_check_model)
    instructions: str = attrs.field(default="", validator=_check_str)
    tools: "tuple[ToolDef, ...]" = attrs.field(default=(), converter=_to_tools, validator=_check_unique_tools)
    max_turns: int = attrs.field(kw_only=True, default=25, validator=_check_int(1))
    stateful: bool = attrs.field(kw_only=True, default=False, validator=_check_bool)
    timeout_seconds: int = attrs.field(kw_only=True, default=0, validator=_check_int(0))
    description: str = attrs.field(kw_only=True, default="", validator=_check_str)
    temperature: Optional[float] = attrs.field(kw_only=True, default=None, validator=_check_optional_number)
    max_tokens: Optional[int] = attrs.field(
        kw_only=True, default=None, validator=attrs.validators.optional(_check_int(1))
    )
    metadata: Mapping[str, Any] = attrs.field(kw_only=True, factory=dict, converter=_to_metadata)
    #: When a long-lived listener is continued as a fresh run (None: the runtime's settings).
    continuation: Optional[Continuation] = attrs.field(kw_only=True, default=None, validator=_check_continuation)
    output_type: Optional[type] = attrs.field(kw_only=True, default=None, validator=_check_output_type)
    credentials: "tuple[str, ...]" = attrs.field(kw_only=True, default=(), converter=_to_credentials)

    @property
    def is_stateful(self) -> bool:
        """Whether runs are pinned to one process: the agent or any of its tools is stateful."""
        return self.stateful or any(t.stateful for t in self.tools)

    @property
    def worker_tools(self) -> "tuple[ToolDef, ...]":
        """The tools whose bodies run in this process (not the server's own tools)."""
        return tuple(t for t in self.tools if t.is_worker)

    @property
    def is_listener(self) -> bool:
        """Whether runs are stateful and wait for messages: such runs are continued when they grow."""
        return self.is_stateful and self.needs_message_queue

    @property
    def needs_message_queue(self) -> bool:
        """Whether a tool reads the run's message queue (a wait-for-message tool)."""
        return any(t.tool_type == "pull_workflow_messages" for t in self.tools)

    @property
    def waits_for_people(self) -> bool:
        """Whether a run can wait for a person: a tool needs approval, or a tool asks a person."""
        return any(t.approval_required or t.tool_type == "human" for t in self.tools)

    @property
    def output_spec(self) -> Optional[OutputSpec]:
        """The schema and converter of ``output_type`` (None without one)."""
        return OutputSpec.of(self.output_type) if self.output_type is not None else None

    def to_config(self) -> dict:
        """The server's ``agentConfig`` for ``POST /agent/start``."""
        config: dict[str, Any] = {
            "name": self.name,
            "model": self.model,
            "instructions": self.instructions,
            "tools": [t.to_config() for t in self.tools],
            "maxTurns": self.max_turns,
        }
        if self.description:
            config["description"] = self.description
        if self.timeout_seconds:
            config["timeoutSeconds"] = self.timeout_seconds
        if self.temperature is not None:
            config["temperature"] = self.temperature
        if self.max_tokens is not None:
            config["maxTokens"] = self.max_tokens
        if self.metadata:
            config["metadata"] = dict(self.metadata)
        if self.output_type is not None:
            config["outputType"] = OutputSpec.of(self.output_type).to_config()
        if self.credentials:
            config["credentials"] = list(self.credentials)
        return config
