"""Unit tests for the public face: every exported class and function names its public home as ``__module__``.

Reprs, tracebacks, ``help()`` and pickles say ``conductor_agents.WorkerStallError``, never the private module
the class is written in; type hints still resolve, and values still pickle across processes.
"""

import importlib
import inspect
import multiprocessing
import pickle
import pydoc
import subprocess
import sys
import traceback
import types
import typing

import attrs
import pytest

import conductor_agents
import conductor_agents.aio
import conductor_agents.local_server
import conductor_agents.testing
from conductor_agents import (
    AgentDefinitionError,
    AgentResult,
    RunStatus,
    ConfigurationError,
    Continuation,
    ModelSettings,
    ServerError,
    TokenUsage,
    ToolCallRecord,
    ToolCancelled,
    ToolRetry,
    ToolArgumentsError,
    WaitTimeoutError,
    WorkerStallError,
    tool,
)
from conductor_agents._common.public import publish
from conductor_agents.testing import Failure, Reply, ScriptError, ToolOutput, Usage

#: The public packages, in the order that decides a name's home: the first whose ``__all__`` lists it.
PUBLIC = [conductor_agents, conductor_agents.testing, conductor_agents.aio, conductor_agents.local_server]


def exported():
    """``(package, name, object)`` of each class and function a public package exports, lazy ones included."""
    for package in PUBLIC:
        for name in package.__all__:
            obj = getattr(package, name)
            if inspect.isclass(obj) or inspect.isfunction(obj):
                yield package, name, obj


EXPORTED = list(exported())
IDS = [f"{package.__name__}.{name}" for package, name, _ in EXPORTED]


def home_of(name):
    return next(package.__name__ for package in PUBLIC if name in package.__all__)


@pytest.mark.parametrize("package,name,obj", EXPORTED, ids=IDS)
def test_every_exported_name_reports_its_public_home(package, name, obj):
    """__module__ is the first public package that exports the name (the top level for its names)."""
    assert home_of(name) == obj.__module__
    assert obj is getattr(importlib.import_module(obj.__module__), obj.__qualname__)


def test_the_top_level_names_say_conductor_agents():
    """Every class and function of conductor_agents.__all__ (LocalServer, imported lazily, too) says so."""
    names = [name for name in conductor_agents.__all__ if name != "__version__"]
    assert {"conductor_agents"} == {getattr(conductor_agents, name).__module__ for name in names}
    assert "LocalServer" in names and "WorkerStallError" in names


def test_the_plain_values_are_left_alone():
    """Constants and type aliases are not given a __module__ (the loop skips them)."""
    assert conductor_agents.aio.WAIT_SLICE_SECONDS == 5.0
    assert typing.get_origin(conductor_agents.testing.Turn) is typing.Union


@pytest.mark.parametrize("package,name,obj", EXPORTED, ids=IDS)
def test_every_exported_name_pickles_as_itself(package, name, obj):
    """Pickle finds each class and function at its public home."""
    assert pickle.loads(pickle.dumps(obj)) is obj


@pytest.mark.parametrize("package,name,obj", [e for e in EXPORTED if inspect.isclass(e[2])],
                         ids=[i for i, e in zip(IDS, EXPORTED) if inspect.isclass(e[2])])
def test_every_exported_class_keeps_its_type_hints(package, name, obj):
    """typing.get_type_hints resolves every exported class after the move (and attrs.resolve_types)."""
    hints = typing.get_type_hints(obj, include_extras=True)
    assert not [hint for hint in hints.values() if isinstance(hint, (str, typing.ForwardRef))]
    if attrs.has(obj):
        attrs.resolve_types(obj)
        assert all(field.type is None or not isinstance(field.type, str) for field in attrs.fields(obj))


@pytest.mark.parametrize("package,name,obj", EXPORTED, ids=IDS)
def test_every_exported_signature_shows_types_not_strings(package, name, obj):
    """``help()``, ``inspect.signature`` and notebooks show ``name: str``, not ``name: 'str'`` (issue 41,
    point 6: doubly quoted annotations), for the class, its methods and properties, and functions; and no
    argument of Agent is ``Any`` where it takes known types (it said ``tools: Any``)."""
    functions = [obj] if inspect.isfunction(obj) else [
        func for member in vars(obj).values()
        for func in (member, getattr(member, "__func__", None), getattr(member, "fget", None))
        if inspect.isfunction(func)]
    quoted = [f"{func.__qualname__}: {key}={value!r}" for func in functions
              for key, value in func.__annotations__.items() if isinstance(value, str)]
    assert not [entry for entry in quoted if not _only_for_type_checkers(entry)], quoted


def _only_for_type_checkers(entry: str) -> bool:
    """A hint naming a private class its module imports only for type checkers stays a string (not a
    public name: a user never passes it)."""
    names = set(typing.cast(str, entry.split("=", 1)[1]).replace("|", " ").replace("'", " ").split())
    return not names & {name for package in PUBLIC for name in package.__all__}


def test_agents_arguments_say_what_they_take():
    parameters = inspect.signature(conductor_agents.Agent).parameters
    assert [name for name, parameter in parameters.items() if parameter.annotation is typing.Any] == []
    assert "ToolDef" in str(parameters["tools"].annotation)
    assert inspect.signature(conductor_agents.AgentRuntime).parameters["settings"].annotation != "AgentSettings | None"


def test_agent_result_type_hints():
    """AgentResult's hints name the public classes themselves."""
    hints = typing.get_type_hints(AgentResult)
    assert RunStatus == hints["status"]
    assert TokenUsage == hints["token_usage"]


def test_tool_parameters_of_public_types_get_a_schema():
    """A tool whose parameters are the SDK's own value types derives their schema and builds them."""

    @tool
    def report(usage: TokenUsage, output: ToolOutput) -> str:
        """Report a usage."""
        return f"{usage.total_tokens} {output.call_id}"

    properties = report.input_schema["properties"]
    assert ["prompt_tokens", "completion_tokens", "total_tokens"] == list(properties["usage"]["properties"])
    assert ["name", "call_id", "arguments", "output"] == list(properties["output"]["properties"])
    assert "7 c1" == report.invoke({"usage": {"total_tokens": 7}, "output": {"name": None, "call_id": "c1"}})


def test_a_traceback_names_the_public_home():
    """traceback.format_exception of an SDK error says conductor_agents.WorkerStallError."""
    error = WorkerStallError("no worker", execution_id="e1", task_reference_name="t1", domain=None,
                             waited_seconds=3.0)
    text = "".join(traceback.format_exception(error))
    assert text.endswith("conductor_agents.WorkerStallError: no worker\n")


def test_repr_and_help_name_the_public_home():
    """A class's repr and help() say conductor_agents, and the testing package's say conductor_agents.testing."""
    assert "<class 'conductor_agents.ToolDef'>" == repr(conductor_agents.ToolDef)
    assert "<class 'conductor_agents.testing.ScriptedLLM'>" == repr(conductor_agents.testing.ScriptedLLM)
    assert "in module conductor_agents\n" in pydoc.render_doc(conductor_agents.PendingRequest, renderer=pydoc.plaintext)


#: Values that pickle: errors (also those whose fields are required keywords) and attrs value types.
VALUES = [
    WaitTimeoutError("too slow", execution_id="e1", timeout=2.5),
    WorkerStallError("no worker", execution_id="e1", task_reference_name="t1", domain=None, waited_seconds=3.0),
    ToolArgumentsError("bad", tool_name="t", problems=("x is missing",)),
    ConfigurationError("bad", variable="CONDUCTOR_AGENT_WORKER_THREADS"),
    AgentDefinitionError("bad", field="max_turns", value=0),
    ServerError("down", status=503),
    ToolRetry("later", after_seconds=2.0),
    ToolCancelled(reason="run_ended"),
    ScriptError("no", model="m"),
    TokenUsage(1, 2, 3),
    ToolCallRecord(name="t", task_reference_name="t_1", status="COMPLETED", arguments={"a": 1}, output={"b": 2}),
    ModelSettings(model="openai/gpt-4o", temperature=0.5),
    Continuation(max_turns=10),
    RunStatus.COMPLETED,
    Usage(input_tokens=3, output_tokens=4),
    Reply("hi"),
    Failure(status=503),
]


def fields_of(value):
    if isinstance(value, BaseException):
        return type(value), value.args, vars(value)
    return value


def _instance(cls):
    """An instance of error class ``cls`` with each required keyword field set to a value naming it."""
    try:
        params = inspect.signature(cls).parameters.values()
    except ValueError:  # no __init__ of its own: Exception's (message only)
        params = []
    required = {p.name: f"<{p.name}>" for p in params if p.kind is p.KEYWORD_ONLY and p.default is p.empty}
    return cls("the message", **required)


ERRORS = sorted({obj for _, _, obj in EXPORTED if inspect.isclass(obj) and issubclass(obj, BaseException)},
                key=lambda cls: cls.__qualname__)


@pytest.mark.parametrize("cls", ERRORS, ids=[cls.__qualname__ for cls in ERRORS])
def test_every_exported_error_pickles_with_its_fields(cls):
    """Each exported error comes back from pickle as its class, with its message and every field."""
    error = _instance(cls)
    back = pickle.loads(pickle.dumps(error))
    assert fields_of(error) == fields_of(back)
    assert str(error) == str(back)


def test_values_pickle_across_processes():
    """Each value crosses to a fresh (spawned) interpreter and back: both sides find its class at its home."""
    context = multiprocessing.get_context("spawn")
    with context.Pool(1) as pool:
        # The child unpickles the list (importing each public home), builds a tuple and pickles it back.
        back = pool.apply_async(tuple, (VALUES,)).get(timeout=120)
    assert [fields_of(v) for v in VALUES] == [fields_of(v) for v in back]


def test_the_lazy_homes_do_not_depend_on_import_order():
    """Importing only conductor_agents.local_server already gives LocalServer and LocalCluster their homes."""
    code = ("import conductor_agents.local_server as s; "
            "print(s.LocalServer.__module__, s.LocalCluster.__module__, s.JavaRuntime.__module__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert "conductor_agents conductor_agents.testing conductor_agents.local_server" == out.stdout.strip()


class TestPublish:
    """publish() itself, on a private module made for the test."""

    @pytest.fixture
    def private(self, monkeypatch):
        module = types.ModuleType("fake_private_module")
        exec(  # noqa: S102 - the module under test, written with string annotations
            "from __future__ import annotations\n"
            "from decimal import Decimal\n"
            "import typing\n"
            "if typing.TYPE_CHECKING:\n"
            "    from fractions import Fraction\n"
            "class Priced:\n"
            "    price: Decimal\n"
            "    other: Priced | None\n"
            "class Unresolved:\n"
            "    part: Fraction\n"
            "def helper(x: Decimal) -> Decimal:\n"
            "    return x\n"
            "LIMIT = 3\n"
            "__all__ = ['Priced', 'Unresolved', 'helper', 'LIMIT']\n",
            module.__dict__,
        )
        monkeypatch.setitem(sys.modules, module.__name__, module)
        monkeypatch.setitem(sys.modules, "fake_public_home", types.ModuleType("fake_public_home"))
        return module

    def test_classes_and_functions_move(self, private):
        """Classes and functions of __all__ report the home; plain values are untouched."""
        publish(vars(private), "fake_public_home")
        assert "fake_public_home" == private.Priced.__module__ == private.helper.__module__
        assert 3 == private.LIMIT

    def test_hints_resolve_after_the_move(self, private):
        """A hint naming something only the private module imported still resolves after the move."""
        from decimal import Decimal

        publish(vars(private), "fake_public_home")
        assert {"price": Decimal, "other": typing.Optional[private.Priced]} == typing.get_type_hints(private.Priced)

    def test_hints_fail_after_a_move_without_resolution(self, private):
        """The resolution is what keeps them: moved by hand, the same class's hints stop resolving."""
        private.Priced.__module__ = "fake_public_home"
        with pytest.raises(NameError):
            typing.get_type_hints(private.Priced)

    def test_an_unresolvable_hint_is_left_as_it_was(self, private):
        """A hint that did not resolve before (a type-checking-only import) stays a string, and publish works."""
        publish(vars(private), "fake_public_home")
        assert {"part": "Fraction"} == private.Unresolved.__annotations__
        assert "fake_public_home" == private.Unresolved.__module__

    def test_elsewhere(self, private):
        """elsewhere gives a name another home; a name not in the namespace (a lazy one) is skipped."""
        namespace = {**vars(private), "__all__": [*private.__all__, "Lazy"]}
        publish(namespace, "fake_public_home", elsewhere={"helper": "other_home"})
        assert "fake_public_home" == private.Priced.__module__
        assert "other_home" == private.helper.__module__


@pytest.mark.parametrize("cls", [conductor_agents.AgentRuntime, conductor_agents.AsyncAgentRuntime])
def test_a_runtimes_init_says_what_each_argument_is(cls):
    """``help(AgentRuntime.__init__)`` and an IDE's hint said "Initialize self" (issue 41, point 6)."""
    doc = inspect.getdoc(cls.__init__)
    assert doc is not None and "Initialize self" not in doc
    arguments = doc.split("Args:", 1)[1].split("Raises:", 1)[0]
    for name, parameter in inspect.signature(cls.__init__).parameters.items():
        if name != "self":
            shown = f"**{name}" if parameter.kind is parameter.VAR_KEYWORD else name
            assert f"\n    {shown}: " in arguments, name
    assert "Initialize self" not in pydoc.render_doc(cls.__init__)
