""":class:`ModelSettings`: a model, temperature, token limit and reasoning effort for one run only.

Why a config of its own rather than a changed :class:`~conductor_agents.Agent`: the server (3.32.3)
compiles the ``agentConfig`` sent with each ``POST /agent/start`` into that run's own workflow, so
settings written into the config of one start reach that run (and the team members the server
compiles inline into it) and nothing else; the agent definition in the caller's hands is unchanged.
A continued listener's later runs are started with the same settings (they are recorded in the
config's metadata, so a process that adopts or resumes the listener finds them on the server).

Pure values and functions; thread-safe.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import attrs

from .._common.checks import Refusal, a_bool, a_number, an_int, optional
from .._tooldefs.tooldef import AGENT_TOOL
from ..errors import AgentDefinitionError, AgentTypeError

__all__ = ["METADATA_KEY", "MODEL_PATTERN", "ModelSettings", "REASONING_EFFORTS", "apply_model_settings", "run_model",
           "recorded_model_settings"]

#: Where the settings of a run are recorded in its ``agentConfig.metadata`` (the server keeps the config
#: in the run's workflow definition: ``workflowDefinition.metadata.agentDef``).
METADATA_KEY = "conductor_agents.model_settings"
#: The reasoning efforts the server forwards (OpenAI reasoning models; others ignore it).
REASONING_EFFORTS = ("minimal", "low", "medium", "high")
#: The widest temperature range a provider accepts (OpenAI: 0 to 2; Anthropic: 0 to 1).
MAX_TEMPERATURE = 2.0
#: What a model is named by: ``provider/model`` (``Agent.model`` too).
MODEL_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/\S+$")
#: The config keys of an agent the server compiles inline into the run (an agent tool is not one).
_INLINE_AGENTS = ("agents", "planner", "fallback", "router")


def _check_model(instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if value is None:
        return
    if not isinstance(value, str):
        raise AgentTypeError(f"ModelSettings.model must be a str or None, got {value!r}", field="model", value=value)
    if not MODEL_PATTERN.match(value):
        raise AgentDefinitionError(f"ModelSettings.model must be of the form 'provider/model' (e.g. "
                                   f"'openai/gpt-4o'), got {value!r}", field="model", value=value)


#: A field of the wrong type raises AgentTypeError, one out of bounds AgentDefinitionError (``field``, ``value``).
_SETTINGS = Refusal(AgentDefinitionError, type_error=AgentTypeError, prefix="ModelSettings.")
_check_temperature = optional(a_number(at_least=0, at_most=MAX_TEMPERATURE, refusal=_SETTINGS))
_check_max_tokens = optional(an_int(at_least=1, refusal=_SETTINGS))


def _check_effort(instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if value is None:
        return
    if value not in REASONING_EFFORTS:
        raise AgentDefinitionError(f"ModelSettings.reasoning_effort must be one of {', '.join(REASONING_EFFORTS)} "
                                   f"or None, got {value!r}", field="reasoning_effort", value=value)


_check_bool = a_bool(refusal=_SETTINGS)


@attrs.frozen
class ModelSettings:
    """How one run calls its model: ``start(agent, prompt, model_settings=ModelSettings(...))``.

    Each field left None keeps the agent's own. ``sub_agents`` (True) applies them to the team the run
    is made of too (``agents=``, a router, planner or fallback agent); an agent used as a tool
    (``as_tool``) cannot take them (the server registers its workflow once under its own name, shared by
    every run), so a start with one is refused unless ``sub_agents=False``. Immutable; thread-safe.

    Raises (at construction):
        AgentTypeError: a field of the wrong type.
        AgentDefinitionError: ``model`` not ``provider/model``, ``temperature`` outside 0..2,
            ``max_tokens`` <= 0, ``reasoning_effort`` not one of :data:`REASONING_EFFORTS`.
    """

    model: str | None = attrs.field(default=None, validator=_check_model)
    temperature: float | None = attrs.field(default=None, validator=_check_temperature)
    max_tokens: int | None = attrs.field(default=None, validator=_check_max_tokens)
    #: ``minimal`` | ``low`` | ``medium`` | ``high`` (OpenAI reasoning models; the server drops it for
    #: Anthropic models without extended thinking).
    reasoning_effort: str | None = attrs.field(default=None, validator=_check_effort)
    sub_agents: bool = attrs.field(default=True, kw_only=True, validator=_check_bool)

    @property
    def is_empty(self) -> bool:
        """Whether it changes nothing."""
        return self.model is None and self.temperature is None and self.max_tokens is None \
            and self.reasoning_effort is None

    def to_dict(self) -> dict[str, Any]:
        """The settings as recorded in a run's config (None fields left out)."""
        return {"subAgents": self.sub_agents, **self._config_fields()}

    @classmethod
    def from_dict(cls, data: Any) -> ModelSettings | None:
        """The settings :meth:`to_dict` recorded, or None when ``data`` holds none (or garbled ones)."""
        if not isinstance(data, Mapping):
            return None
        try:
            return cls(model=data.get("model"), temperature=data.get("temperature"), max_tokens=data.get("maxTokens"),
                       reasoning_effort=data.get("reasoningEffort"), sub_agents=bool(data.get("subAgents", True)))
        except (AgentTypeError, AgentDefinitionError):
            return None

    def _config_fields(self) -> dict[str, Any]:
        fields = {"model": self.model, "temperature": self.temperature, "maxTokens": self.max_tokens,
                  "reasoningEffort": self.reasoning_effort}
        return {key: value for key, value in fields.items() if value is not None}


def apply_model_settings(config: dict[str, Any], settings: ModelSettings | None) -> dict[str, Any]:
    """``config`` (an agent's ``agentConfig``, changed in place and returned) with ``settings`` applied.

    Raises:
        AgentDefinitionError: ``settings.sub_agents`` and the agent tree holds an agent tool, which a
            per-run setting cannot reach (nothing was sent).
    """
    if settings is None or settings.is_empty:
        return config
    if settings.sub_agents:
        tools = _agent_tools(config)
        if tools:
            raise AgentDefinitionError(
                f"ModelSettings cannot reach the agent tool{'s' if len(tools) > 1 else ''} {', '.join(tools)}: the "
                "server registers an agent tool's workflow once under its own name, shared by every run; pass "
                "ModelSettings(..., sub_agents=False) to apply them to this agent only, or set them on that agent",
                field="model_settings", value=tools)
    _apply(config, settings)
    metadata = dict(config.get("metadata") or {})
    metadata[METADATA_KEY] = settings.to_dict()
    config["metadata"] = metadata
    return config


def _apply(config: dict[str, Any], settings: ModelSettings) -> None:
    config.update(settings._config_fields())
    if not settings.sub_agents:
        return
    for key in _INLINE_AGENTS:
        value = config.get(key)
        for sub in value if isinstance(value, list) else [value]:
            if isinstance(sub, dict) and "model" in sub:  # an agent (a Python router is a task name)
                _apply(sub, settings)


def _agent_tools(config: Mapping[str, Any]) -> list[str]:
    found = [str(tool.get("name")) for tool in config.get("tools") or ()
             if isinstance(tool, Mapping) and tool.get("toolType") == AGENT_TOOL]
    for key in _INLINE_AGENTS:
        value = config.get(key)
        for sub in value if isinstance(value, list) else [value]:
            if isinstance(sub, Mapping):
                found.extend(_agent_tools(sub))
    return found


def run_model(agent_model: str, settings: ModelSettings | None) -> str:
    """The ``provider/model`` a run of an agent whose own is ``agent_model`` calls with ``settings`` (or None)."""
    return settings.model if settings is not None and settings.model else agent_model


def recorded_model_settings(workflow: Mapping[str, Any]) -> ModelSettings | None:
    """The settings a run was started with, read from its workflow (``GET /workflow/{id}``), or None."""
    definition = workflow.get("workflowDefinition")
    metadata = definition.get("metadata") if isinstance(definition, Mapping) else None
    agent_def = metadata.get("agentDef") if isinstance(metadata, Mapping) else None
    agent_metadata = agent_def.get("metadata") if isinstance(agent_def, Mapping) else None
    return ModelSettings.from_dict(agent_metadata.get(METADATA_KEY)) if isinstance(agent_metadata, Mapping) else None
