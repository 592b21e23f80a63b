"""The :class:`ToolDef` value type: one tool's contract, checks and invocation.

Re-exported by :mod:`conductor_agents.tools`, which builds ToolDefs from functions. Kept apart
so each module stays small; import from ``conductor_agents.tools``.
"""

from __future__ import annotations

import asyncio
import collections.abc
import inspect
import types
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import attrs

from .._common import json_check as _json_check
from .._common.checks import Refusal, a_bool, an_int
from .._common.secrets import check_credential_names
from .._common.task_names import TOOL_NAME
from ..errors import ConductorAgentsError, ToolDefinitionError
from . import context as _context
from . import schema as _schema
from .context import ToolContext

__all__ = ["ToolArgumentsError", "ToolCheck", "ToolDef"]

WORKER = "worker"
PULL_WORKFLOW_MESSAGES = "pull_workflow_messages"
HUMAN = "human"
#: Tools the server itself runs with no worker: an HTTP call, a Model Context Protocol server's
#: tools, an OpenAPI service's operations, a sub-agent run as a sub-workflow (``agent.as_tool()``).
HTTP = "http"
MCP = "mcp"
API = "api"
AGENT_TOOL = "agent_tool"
TOOL_TYPES = (WORKER, PULL_WORKFLOW_MESSAGES, HUMAN, HTTP, MCP, API, AGENT_TOOL)
#: Keys the server adds to a worker task's input next to the LLM's arguments.
SERVER_EXTRAS = ("method", "_agent_state", "_agent_tool_name")
#: The inputs the server adds to each tool call of a ``plan_execute`` plan (3.32.3 ``PLAN_AND_COMPILE``):
#: dropped unless the tool's schema declares them.
PLAN_AMBIENT = ("session_id", "cwd", "media")
#: How the ToolDef descriptor binds its func: not at all, to the instance, to the class.
FUNCTION, METHOD, CLASSMETHOD = "function", "method", "classmethod"


class ToolArgumentsError(ConductorAgentsError, ValueError):
    """The LLM called a tool with arguments that do not match its input schema.

    The message is written for the LLM (it names the tool, each bad argument, what was expected
    and what arrived); ``tool_name`` and ``problems`` (one text per problem) are for code.
    """

    def __init__(self, message: str, *, tool_name: str, problems: Iterable[str] = ()) -> None:
        super().__init__(message)
        self.tool_name = tool_name
        self.problems = tuple(problems)


def _arguments_error(tool_name: str, problems: Iterable[str]) -> ToolArgumentsError:
    problems = tuple(problems)
    message = f"Invalid arguments for tool {tool_name!r}: " + "; ".join(problems)
    return ToolArgumentsError(message, tool_name=tool_name, problems=problems)


# --- field checks -------------------------------------------------------------------


def _check_name(_: Any, __: Any, name: Any) -> None:
    if not isinstance(name, str) or not TOOL_NAME.fullmatch(name):
        raise ToolDefinitionError(
            f"tool name {name!r} is invalid: use 1-64 letters, digits, '_' or '-', starting with "
            "a letter or '_' (tool names become LLM function names and Conductor task types); "
            "set it with @tool(name=...)"
        )


def _check_str(_: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if not isinstance(value, str):
        raise ToolDefinitionError(f"{attribute.name} must be str, got {value!r}")


#: A field with a bad value raises ToolDefinitionError.
_TOOL = Refusal(ToolDefinitionError)
_check_bool = a_bool(refusal=_TOOL)


def _json_object(what: str, value: Any) -> dict[str, Any]:
    if not isinstance(value, collections.abc.Mapping):
        raise ToolDefinitionError(f"{what} must be a mapping, got {value!r}")
    try:
        copied: dict[str, Any] = _json_check.json_copy(value)
    except TypeError as err:
        raise ToolDefinitionError(f"{what} must be JSON: {err}") from None
    return copied


def _to_input_schema(value: Any) -> dict[str, Any]:
    return _json_object("input_schema", value)


def _to_config(value: Any) -> dict[str, Any]:
    return _json_object("config", value)


def _to_converters(value: Mapping[str, Callable[[Any], Any]]) -> Mapping[str, Callable[[Any], Any]]:
    return types.MappingProxyType(dict(value))


def _check_schema(tool: ToolDef, _: Any, schema: dict[str, Any]) -> None:
    properties = schema.get("properties", {})
    if schema.get("type") != "object" or not isinstance(properties, dict):
        raise ToolDefinitionError(
            f"tool {tool.name!r}: input_schema must be a JSON schema of type 'object' "
            f"with a 'properties' mapping, got {schema!r}"
        )
    required = schema.get("required", [])
    if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
        raise ToolDefinitionError(
            f"tool {tool.name!r}: input_schema 'required' must be a list of names, got {required!r}"
        )
    reserved = [p for p in properties if _schema.RESERVED_PARAMETER.match(p)]
    if reserved and tool.tool_type == WORKER:
        raise ToolDefinitionError(
            f"tool {tool.name!r}: argument name {reserved[0]!r} is reserved (the server adds "
            "'method' and '_agent*' keys to every tool call); rename it"
        )


def _check_func(tool: ToolDef, _: Any, func: Any) -> None:
    if tool.tool_type not in TOOL_TYPES:
        return  # _check_tool_type reports it
    if tool.tool_type == WORKER and not callable(func):
        raise ToolDefinitionError(f"worker tool {tool.name!r} needs a callable func, got {func!r}")
    if tool.tool_type != WORKER and func is not None:
        raise ToolDefinitionError(
            f"tool {tool.name!r} of type {tool.tool_type!r} runs on the server; func must be None"
        )


def _check_tool_type(_: Any, __: Any, value: Any) -> None:
    if value not in TOOL_TYPES:
        raise ToolDefinitionError(f"tool_type must be one of {TOOL_TYPES}, got {value!r}")


#: 0 is the server's default.
_check_timeout = an_int(at_least=0, refusal=_TOOL)


def _credentials(value: Any) -> tuple[str, ...]:
    return check_credential_names(value, what="credentials", error=ToolDefinitionError)


def _check_approval(tool: ToolDef, _: Any, value: Any) -> None:
    _check_bool.check("approval_required", value)
    if value and tool.tool_type != WORKER:
        raise ToolDefinitionError(
            f"tool {tool.name!r} ({tool.tool_type}) runs on the server; only worker tools can require "
            "approval (the SDK's worker enforces a rejection)")


def _check_credentials_type(tool: ToolDef, _: Any, value: tuple[str, ...]) -> None:
    if value and tool.tool_type != WORKER:
        raise ToolDefinitionError(
            f"tool {tool.name!r} ({tool.tool_type}) runs on the server; only worker tools receive secrets")


def _to_nested(value: Any) -> tuple[ToolDef, ...]:
    items = tuple(value)
    for item in items:
        if not isinstance(item, ToolDef) or not item.is_worker:
            raise ToolDefinitionError(f"nested_tools holds worker ToolDefs, got {item!r}")
    return items


def _check_nested(tool: ToolDef, _: Any, value: tuple[ToolDef, ...]) -> None:
    if value and tool.tool_type == WORKER:
        raise ToolDefinitionError(
            f"worker tool {tool.name!r} runs in this process; only a server-side tool that runs a "
            "sub-agent has nested_tools")


class ToolCheck:
    """What a tool's ``guardrails`` hold: a check of a turn's tool calls (:class:`~conductor_agents.Guardrail`
    subclasses it).

    A marker, so this module can refuse anything else without importing the guardrails, which build
    their worker tasks from :class:`ToolDef`. Its instances have a ``name``, an ``on_fail`` and
    ``to_config(position=...)``.
    """

    __slots__ = ()

    name: str
    on_fail: str


def _to_guardrails(value: Any) -> tuple[Any, ...]:
    if value is None:
        return ()
    if isinstance(value, (str, bytes)) or not isinstance(value, collections.abc.Iterable):
        value = (value,)
    items = tuple(value)
    for item in items:
        if not isinstance(item, ToolCheck):
            raise ToolDefinitionError(f"guardrails holds Guardrail values, got {item!r}")
        if item.on_fail == "fix":
            raise ToolDefinitionError(
                f"tool guardrail {item.name!r}: on_fail='fix' is not supported on a tool (the server would make "
                "the fixed text the run's answer, not the call's arguments); use 'raise', 'retry' or 'human'")
    names = [g.name for g in items]
    if len(set(names)) != len(names):
        raise ToolDefinitionError(f"two guardrails of one tool share a name: {names}")
    return items


def _empty_object_schema() -> dict[str, Any]:
    return {"type": "object", "properties": {}, "required": [], "additionalProperties": False}


# --- ToolDef ------------------------------------------------------------------------


@attrs.frozen
class ToolDef:
    """One tool: its LLM-facing contract, and the function that runs it (worker tools).

    Build one with :func:`tool`, :func:`as_tool` or :meth:`WaitForMessageTool.create` rather
    than by hand. A ``ToolDef`` is still callable like its function, and in a class body it is a
    descriptor: ``obj.method`` is the tool bound to ``obj``. ``input_schema`` and ``config``
    return fresh copies, so the object cannot be changed from outside.

    Immutable and thread-safe; :meth:`invoke` may run on several worker threads at once, so the
    function body (and any instance state it touches) must tolerate that.

    Raises:
        ToolDefinitionError: a field has a bad value (name pattern, tool type, missing func...).
    """

    name: str = attrs.field(validator=_check_name)
    description: str = attrs.field(default="", validator=_check_str)
    _input_schema: dict[str, Any] = attrs.field(
        factory=_empty_object_schema,
        converter=_to_input_schema,
        validator=_check_schema,
        alias="input_schema",
        repr=False,
        hash=False,
    )
    func: Callable[..., Any] | None = attrs.field(default=None, validator=_check_func)
    tool_type: str = attrs.field(default=WORKER, validator=_check_tool_type)
    stateful: bool = attrs.field(default=False, validator=_check_bool)
    # Not in the repr: an HTTP or MCP tool's headers live here (secrets belong in ${NAME}
    # placeholders, but a literal token must not reach a log through a repr either).
    _config: dict[str, Any] = attrs.field(
        factory=dict, converter=_to_config, alias="config", hash=False, repr=False
    )
    timeout_seconds: int = attrs.field(default=0, validator=_check_timeout)
    #: A person must approve each call before it runs (``handle.approve()`` / ``reject(reason)``).
    approval_required: bool = attrs.field(default=False, validator=_check_approval, kw_only=True)
    #: Names of the secrets the server delivers with each call (``ctx.secret(name)``).
    credentials: tuple[str, ...] = attrs.field(default=(), converter=_credentials,
                                                 validator=_check_credentials_type, kw_only=True)
    #: Checks of each turn's tool calls before any of them runs (see :mod:`conductor_agents._answers.guardrails`).
    guardrails: tuple[Any, ...] = attrs.field(default=(), converter=_to_guardrails, kw_only=True, repr=False,
                                                hash=False)
    #: The worker tools this server-side tool's sub-run calls (an agent tool's sub-agent tree):
    #: served by whoever serves the agent, on the run's domain when it is stateful.
    nested_tools: tuple[ToolDef, ...] = attrs.field(default=(), converter=_to_nested,
                                                     validator=_check_nested, kw_only=True, repr=False)
    # How the descriptor binds func (set by @tool): not at all, to the instance, to the class.
    _kind: str = attrs.field(default=FUNCTION, alias="_kind", repr=False)
    # Per-parameter converters from checked JSON values to hinted Python values (set by @tool).
    _converters: Mapping[str, Callable[[Any], Any]] = attrs.field(
        factory=dict, converter=_to_converters, alias="_converters",
        eq=False, repr=False,
    )
    # The parameter that receives the ToolContext (set by @tool), if the function declares one.
    _context_param: str | None = attrs.field(default=None, alias="_context_param", repr=False)

    @property
    def input_schema(self) -> dict[str, Any]:
        """The JSON schema of the arguments (a copy)."""
        copied: dict[str, Any] = _json_check.json_copy(self._input_schema)
        return copied

    @property
    def config(self) -> dict[str, Any]:
        """The tool-type specific configuration sent to the server (a copy)."""
        copied: dict[str, Any] = _json_check.json_copy(self._config)
        return copied

    @property
    def is_worker(self) -> bool:
        """Whether this process runs the tool (``tool_type == "worker"``)."""
        return self.tool_type == WORKER

    @property
    def __wrapped__(self) -> Callable[..., Any]:
        """The function, so ``inspect.signature(tool)`` shows its signature."""
        if self.func is None:
            raise AttributeError("__wrapped__")  # server-side tools wrap nothing
        return self.func

    def to_config(self) -> dict[str, Any]:
        """The server's ``ToolConfig`` for this tool (camelCase, JSON-ready)."""
        config: dict[str, Any] = {
            "name": self.name,
            "description": self.description or self.name,
            "inputSchema": self.input_schema,
            "toolType": self.tool_type,
            "stateful": self.stateful,
            "config": self.config,
        }
        if self.timeout_seconds:
            config["timeoutSeconds"] = self.timeout_seconds
        if self.approval_required:
            config["approvalRequired"] = True
        if self.credentials:
            config["config"] = {**config["config"], "credentials": list(self.credentials)}
        if self.guardrails:
            config["guardrails"] = [g.to_config(position="input") for g in self.guardrails]
        return config

    def bind(self, instance: Any) -> ToolDef:
        """This tool with its method bound to ``instance`` (itself if it is not a method).

        A ``@classmethod`` tool is bound to whatever it is given (the descriptor passes the class).
        """
        if self._kind == FUNCTION or self.func is None:
            return self
        func = self.func.__func__ if isinstance(self.func, types.MethodType) else self.func
        return attrs.evolve(self, func=types.MethodType(func, instance))

    def __get__(self, instance: Any, owner: type | None = None) -> ToolDef:
        if self._kind == CLASSMETHOD:
            return self.bind(owner if owner is not None else type(instance))
        return self if instance is None else self.bind(instance)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Call the function directly, as if it were not a tool.

        Raises:
            ToolDefinitionError: the tool runs on the server and has no function.
        """
        return self._function()(*args, **kwargs)

    def parse_arguments(self, input_data: Mapping[str, Any]) -> dict[str, Any]:
        """The keyword arguments for the function, from a task's ``inputData``.

        Drops the server's extras (``method``, every ``_agent*`` key, and the ``session_id``, ``cwd`` and
        ``media`` a plan's step adds, unless the schema declares them), gives a ``str`` parameter the JSON
        text the server read into an object back as text, checks the rest against
        ``input_schema`` and converts values to the hinted types (``Enum`` members, ``tuple``).

        Raises:
            ToolArgumentsError: the arguments do not match the schema; the message is meant to be
                shown to the LLM.
        """
        if not isinstance(input_data, collections.abc.Mapping):
            got = _json_check.json_type(input_data)
            raise _arguments_error(self.name, [f"arguments must be a JSON object, got {got}"])
        declared = self._input_schema.get("properties") if isinstance(self._input_schema, Mapping) else None
        declared = declared if isinstance(declared, Mapping) else {}
        arguments = {
            key: value
            for key, value in input_data.items()
            if not (isinstance(key, str) and (key in SERVER_EXTRAS or key.startswith("_agent")
                                              or (key in PLAN_AMBIENT and key not in declared)))
        }
        arguments = _json_check.json_strings_restored(self._input_schema, arguments)
        values, problems = _json_check.check_arguments(self._input_schema, arguments)
        for key, convert in self._converters.items():
            if key in values and not problems:
                try:
                    values[key] = convert(values[key])
                except (TypeError, ValueError) as err:
                    problems.append(f"argument '{key}': {err}")
        if problems:
            raise _arguments_error(self.name, problems)
        return values

    @property
    def takes_context(self) -> bool:
        """Whether the function declares a ``ToolContext`` parameter."""
        return self._context_param is not None

    def invoke(self, input_data: Mapping[str, Any], context: ToolContext | None = None) -> Any:
        """Run the tool for a task's ``inputData`` and return what the function returns.

        ``context`` goes to the function's ``ToolContext`` parameter (if it declares one) and is
        what :func:`~conductor_agents.current_tool_context` returns during the call. An
        ``async def`` function (or one returning an awaitable) is run to completion with
        :func:`asyncio.run` in the calling thread, which must not be running an event loop
        (tool worker threads are not); the context is visible inside its loop too. Exceptions
        from the body propagate unchanged.

        Raises:
            ToolArgumentsError: see :meth:`parse_arguments`.
            ToolDefinitionError: the tool runs on the server and has no function, or it takes a
                ``ToolContext`` and none was given.
            RuntimeError: the tool is async and the calling thread runs an event loop.
        """
        func = self._function()
        arguments = self.parse_arguments(input_data)
        if self._context_param is not None:
            if context is None:
                raise ToolDefinitionError(
                    f"tool {self.name!r} takes a ToolContext ({self._context_param!r}); pass invoke(..., "
                    "context=ToolContext(...))"
                )
            arguments[self._context_param] = context
        token = _context.set_current(context)
        try:
            result = func(**arguments)
            if inspect.isawaitable(result):
                return _run_awaitable(self.name, result)
            return result
        finally:
            _context.reset_current(token)

    def _function(self) -> Callable[..., Any]:
        if self.func is None:
            raise ToolDefinitionError(
                f"tool {self.name!r} ({self.tool_type}) runs on the server; it has no function"
            )
        return self.func


def _run_awaitable(name: str, awaitable: Any) -> Any:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        pass
    else:
        if inspect.iscoroutine(awaitable):
            awaitable.close()
        raise RuntimeError(
            f"tool {name!r} is async and invoke() was called from a running event loop; "
            "call invoke() from a thread without one (tool worker threads have none)"
        )
    if not inspect.iscoroutine(awaitable):
        awaitable = _await(awaitable)
    return asyncio.run(awaitable)


async def _await(awaitable: Any) -> Any:
    return await awaitable
