"""Tools an agent's LLM may call: ``@tool``, :class:`ToolDef`, :class:`ToolRegistry`.

A worker tool is a Python function the SDK runs when the server schedules a task whose task
type is the tool's name; its JSON input schema is derived from the function's signature, and the
LLM's arguments are checked against it before the function runs. A server-side tool (such as
:class:`WaitForMessageTool`) has no function: the server runs it.

Everything here is immutable and thread-safe; whether a tool's *body* is safe to run on several
worker threads at once is up to that body.
"""

from __future__ import annotations

import collections.abc
import inspect
import os
import sys
import warnings
from collections.abc import Callable, Iterable, Iterator
from typing import Any, overload

import attrs

from ._common.checks import Refusal, an_int
from ._tooldefs import schema as _schema
from ._tooldefs.human_tool import HumanTool
from ._tooldefs.server_tools import ApiTool, HttpTool, McpTool
from ._tooldefs.tooldef import (
    CLASSMETHOD,
    FUNCTION,
    METHOD,
    PULL_WORKFLOW_MESSAGES,
    ToolArgumentsError,
    ToolDef,
)
from .errors import ConfigurationError, ToolDefinitionError, ToolDescriptionWarning

__all__ = ["ApiTool", "HttpTool", "HumanTool", "McpTool", "ToolArgumentsError", "ToolDef", "ToolRegistry",
           "WaitForMessageTool", "as_tool", "tool"]

MAX_BATCH_SIZE = 100  # the server's maxBatchSize for pull_workflow_messages


# --- @tool and as_tool ----------------------------------------------------------------

FuncT = Callable[..., Any]


@overload
def tool(func: FuncT, /) -> ToolDef: ...


@overload
def tool(
    *,
    name: str | None = None,
    description: str | None = None,
    stateful: bool = False,
    timeout_seconds: int = 0,
    approval_required: bool = False,
    credentials: Iterable[str] = (),
    guardrails: Iterable[Any] = (),
) -> Callable[[FuncT], ToolDef]: ...


def tool(
    func: FuncT | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    stateful: bool = False,
    timeout_seconds: int = 0,
    approval_required: bool = False,
    credentials: Iterable[str] = (),
    guardrails: Iterable[Any] = (),
) -> ToolDef | Callable[[FuncT], ToolDef]:
    """Make a function (or a method in a class body) a tool: ``@tool`` or ``@tool(...)``.

    The name defaults to the function's name; the description to the docstring's first
    paragraph (with neither, the name, and a :class:`~conductor_agents.errors.ToolDescriptionWarning`:
    the model would see only the name to decide when to call it). The input schema comes from the
    type hints (every parameter needs one); a Google-style ``Args:`` section or ``Annotated[X,
    "text"]`` describes parameters. ``self``/``cls`` of methods are skipped;
    ``@staticmethod``/``@classmethod`` may sit under or over ``@tool``. ``async def`` functions are
    supported; generators are not.

    ``approval_required=True``: each call waits until a person approves it (the run waits on the
    server; ``handle.approve()`` runs the tool, ``handle.reject(reason)`` shows the model the
    rejection instead). ``credentials=["NAME", ...]``: secrets the server delivers with each call,
    read with ``ctx.secret("NAME")`` (they replace the agent's ``credentials`` for this tool).
    ``guardrails=[Guardrail...]``: checks of the model's tool calls before they run (the server
    checks every call of the turn, as text; see ``docs/teams.md``).

    Raises:
        ToolDefinitionError: the function cannot be a tool (missing or unsupported hint,
            ``*args``, bad name, generator...); the message names the function and parameter.
    """
    def make(f: Any) -> ToolDef:
        return _make_tool(f, name=name, description=description, stateful=stateful, timeout_seconds=timeout_seconds,
                          approval_required=approval_required, credentials=credentials, guardrails=guardrails)

    if func is None:
        return make
    if not callable(func) and not isinstance(func, (staticmethod, classmethod)):
        raise ToolDefinitionError(
            f"@tool got {func!r}, which is not a function; to set options use @tool(name=...)"
        )
    return make(func)


def as_tool(obj: ToolDef | FuncT) -> ToolDef:
    """``obj`` as a ToolDef: a ToolDef as is, a plain callable wrapped with :func:`tool`'s defaults.

    Raises:
        ToolDefinitionError: ``obj`` is neither a ToolDef nor a callable that can be a tool.
    """
    if isinstance(obj, ToolDef):
        return obj
    if not callable(obj) and not isinstance(obj, (staticmethod, classmethod)):
        raise ToolDefinitionError(
            f"{obj!r} ({type(obj).__name__}) cannot be a tool: pass a function, a @tool function "
            "or a ToolDef"
        )
    return _make_tool(obj)


def _warn_from_caller(warning: Warning) -> None:
    """Warn with the line of the caller's code that made the tool (the first frame outside this package)."""
    package = os.path.dirname(os.path.abspath(__file__))
    frame, level = sys._getframe(0), 1
    while frame.f_back is not None and (frame.f_code.co_filename.startswith(package)
                                        or frame.f_code.co_filename.startswith("<attrs generated")):
        frame, level = frame.f_back, level + 1
    warnings.warn(warning, stacklevel=level)


def _make_tool(
    obj: Any,
    *,
    name: str | None = None,
    description: str | None = None,
    stateful: bool = False,
    timeout_seconds: int = 0,
    approval_required: bool = False,
    credentials: Iterable[str] = (),
    guardrails: Iterable[Any] = (),
) -> ToolDef:
    """Build the ToolDef of a callable (see :func:`tool`).

    Raises:
        ToolDefinitionError: see :func:`tool`.
    """
    if isinstance(obj, ToolDef) or isinstance(getattr(obj, "__func__", None), ToolDef):
        raise ToolDefinitionError(f"{obj!r} is already a tool; use attrs.evolve() to change it")
    kind = CLASSMETHOD if isinstance(obj, classmethod) else FUNCTION
    static = isinstance(obj, staticmethod)
    if isinstance(obj, (classmethod, staticmethod)):
        obj = obj.__func__
    where = getattr(obj, "__qualname__", None) or repr(obj)
    if inspect.isclass(obj):
        raise ToolDefinitionError(
            f"{where} is a class, not a function; to use its @tool methods pass an instance to "
            "ToolRegistry.from_instance()"
        )
    if _is_generator(obj):
        raise ToolDefinitionError(
            f"{where} is a generator function; a tool must return its result, not yield it"
        )
    if kind == FUNCTION and not static and _is_method(obj):
        kind = METHOD
    derived = _schema.signature_schema(obj, skip_first=kind in (METHOD, CLASSMETHOD))
    tool_name = name if name is not None else getattr(obj, "__name__", None)
    if tool_name is None:
        raise ToolDefinitionError(f"{where} has no __name__; give the tool one with tool(name=...)")
    if description in (None, "") and not derived.summary:
        _warn_from_caller(ToolDescriptionWarning(
            f"tool {tool_name!r} ({where}) has no description, so the model sees only its name to decide when "
            "to call it: give it a docstring or @tool(description=...)"))
    if description in (None, ""):
        description = derived.summary or tool_name
    return ToolDef(
        name=tool_name,
        description=description,
        input_schema=derived.schema,
        func=obj,
        stateful=stateful,
        timeout_seconds=timeout_seconds,
        approval_required=approval_required,
        credentials=credentials,
        guardrails=guardrails,
        _kind=kind,
        _converters=derived.converters,
        _context_param=derived.context_param,
    )


def _is_generator(obj: Any) -> bool:
    targets = [obj] if inspect.isroutine(obj) or not callable(obj) else [obj, type(obj).__call__]
    return any(inspect.isgeneratorfunction(t) or inspect.isasyncgenfunction(t) for t in targets)


def _is_method(func: Any) -> bool:
    """Whether ``func`` is a plain function defined in a class body with ``self``/``cls`` first."""
    if not inspect.isfunction(func):
        return False
    scope = func.__qualname__.split(".")[:-1]
    if not scope or scope[-1] == "<locals>":
        return False
    params = list(inspect.signature(func).parameters.values())
    return bool(params) and params[0].name in ("self", "cls") and params[0].kind in (
        inspect.Parameter.POSITIONAL_ONLY,
        inspect.Parameter.POSITIONAL_OR_KEYWORD,
    )


# --- ToolRegistry -------------------------------------------------------------------


def _tool_tuple(tools: Iterable[ToolDef]) -> tuple[ToolDef, ...]:
    if isinstance(tools, (str, bytes)) or not isinstance(tools, collections.abc.Iterable):
        raise ToolDefinitionError(f"ToolRegistry needs an iterable of ToolDef, got {tools!r}")
    items = tuple(tools)
    seen = set()
    for item in items:
        if not isinstance(item, ToolDef):
            raise ToolDefinitionError(
                f"ToolRegistry holds ToolDef objects, got {item!r}; wrap functions with @tool "
                "or use ToolRegistry.from_functions()"
            )
        if item.name in seen:
            raise ToolDefinitionError(
                f"two tools are named {item.name!r}; tool names must be unique "
                "(rename one with @tool(name=...))"
            )
        seen.add(item.name)
    return items


@attrs.frozen(repr=False)
class ToolRegistry(collections.abc.Sequence[ToolDef]):
    """An immutable, ordered sequence of tools with unique names.

    Use it wherever a list of tools goes: ``tools=ToolRegistry.from_instance(obj)`` or
    ``tools=[receive, *ToolRegistry.from_instance(obj)]``. ``"name" in registry`` tests by name.
    Immutable and thread-safe.

    Raises:
        ToolDefinitionError: an item is not a ToolDef, or two tools share a name.
    """

    _tools: tuple[ToolDef, ...] = attrs.field(default=(), converter=_tool_tuple, alias="tools")

    @classmethod
    def from_instance(cls, obj: Any) -> ToolRegistry:
        """The ``@tool`` methods of ``obj``'s class and its bases, bound to ``obj``.

        Order is definition order, bases first; a subclass attribute overrides a base's in
        place (and removes it if it is not a tool).

        Raises:
            ToolDefinitionError: ``obj`` is a class, has no ``@tool`` methods, or two of its tools
                share a name.
        """
        if inspect.isclass(obj):
            raise ToolDefinitionError(
                f"ToolRegistry.from_instance() needs an instance, got the class {obj.__qualname__}"
            )
        owner = type(obj)
        names = list(dict.fromkeys(n for klass in reversed(owner.__mro__) for n in vars(klass)))
        tools = []
        for attr in names:
            raw = next(vars(k)[attr] for k in owner.__mro__ if attr in vars(k))
            found = _bound_tool(raw, obj)
            if found is not None:
                tools.append(found)
        if not tools:
            raise ToolDefinitionError(
                f"{owner.__qualname__} has no @tool methods; decorate the methods the LLM may "
                "call with @tool"
            )
        return cls(tools)

    @classmethod
    def from_functions(cls, *funcs: ToolDef | FuncT) -> ToolRegistry:
        """A registry of functions and ToolDefs (functions are wrapped with :func:`as_tool`).

        Raises:
            ToolDefinitionError: an item cannot be a tool, or two tools share a name.
        """
        return cls(as_tool(f) for f in funcs)

    @property
    def names(self) -> tuple[str, ...]:
        """The tool names, in order."""
        return tuple(t.name for t in self._tools)

    def get(self, name: str, default: ToolDef | None = None) -> ToolDef | None:
        """The tool called ``name``, else ``default``."""
        return next((t for t in self._tools if t.name == name), default)

    @overload
    def __getitem__(self, index: int) -> ToolDef: ...

    @overload
    def __getitem__(self, index: slice) -> ToolRegistry: ...

    def __getitem__(self, index: int | slice) -> ToolDef | ToolRegistry:
        if isinstance(index, slice):
            return ToolRegistry(self._tools[index])
        return self._tools[index]

    def __len__(self) -> int:
        return len(self._tools)

    def __iter__(self) -> Iterator[ToolDef]:
        return iter(self._tools)

    def __contains__(self, item: object) -> bool:
        if isinstance(item, str):
            return any(t.name == item for t in self._tools)
        return item in self._tools

    def __repr__(self) -> str:
        return f"ToolRegistry({list(self.names)!r})"


def _bound_tool(raw: Any, obj: Any) -> ToolDef | None:
    """The tool a class attribute holds, bound for ``obj``; None if it holds no tool."""
    if isinstance(raw, ToolDef):
        return raw.__get__(obj, type(obj))
    inner = getattr(raw, "__func__", None)
    if isinstance(raw, staticmethod) and isinstance(inner, ToolDef):
        return inner
    if isinstance(raw, classmethod) and isinstance(inner, ToolDef):
        return inner.bind(type(obj))
    return None


# --- WaitForMessageTool ---------------------------------------------------------------


class WaitForMessageTool:
    """The server-side tool that blocks until a message is sent to the run, then returns it.

    It needs ``conductor.workflow-message-queue.enabled=true`` on the server. Messages come from
    ``runtime.send_message(execution_id, payload)``. Stateless; thread-safe.
    """

    @staticmethod
    def create(
        *,
        name: str = "wait_for_message",
        description: str = "Wait for the next external message, then return its content.",
        batch_size: int = 1,
    ) -> ToolDef:
        """A ``pull_workflow_messages`` ToolDef that returns up to ``batch_size`` messages.

        Raises:
            ConfigurationError: ``batch_size`` is not an int from 1 to 100 (``ValueError``).
            ToolDefinitionError: ``name`` or ``description`` is invalid.
        """
        # The upper bound is the server's maximum.
        an_int(at_least=1, at_most=MAX_BATCH_SIZE, refusal=Refusal(ConfigurationError)).check("batch_size", batch_size)
        return ToolDef(
            name=name,
            description=description,
            input_schema={"type": "object", "properties": {}},
            tool_type=PULL_WORKFLOW_MESSAGES,
            config={"batchSize": batch_size},
        )
