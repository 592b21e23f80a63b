"""Unit tests for conductor_agents.tools: @tool, ToolDef, ToolRegistry, WaitForMessageTool."""

import asyncio
import enum
import functools
import inspect
import threading
from typing import List, Literal, Optional

import attrs
import pytest

from conductor_agents import tools as tools_module
from conductor_agents.errors import ConductorAgentsError, ConfigurationError, ToolDefinitionError
from conductor_agents.tools import (
    ToolArgumentsError,
    ToolDef,
    ToolRegistry,
    WaitForMessageTool,
    as_tool,
    tool,
)

SUPPORTED = (
    "supported: str, int, float, bool, None, Any, Optional[X] / X | None, Union[X, Y], list[X], "
    "Sequence[X], tuple[X, ...], dict[str, X], Mapping[str, X], Literal[...], Enum subclasses "
    "with str/int/float/bool values, Annotated[X, 'description'], dataclasses, TypedDict, NamedTuple, "
    "pydantic v2 models"
)


class Unit(enum.Enum):
    CELSIUS = "c"
    FAHRENHEIT = "f"


def make_weather():
    @tool
    def weather(
        city: str,
        days: int = 1,
        unit: Unit = Unit.CELSIUS,
        scale: float = 1.0,
        tags: List[str] = [],  # noqa: B006 - never mutated
        coords: tuple = (),
        mode: Literal["brief", "full"] = "brief",
        note: Optional[str] = None,
    ) -> dict:
        """Look up the weather."""
        return dict(city=city, days=days, unit=unit, scale=scale, tags=tags, coords=coords,
                    mode=mode, note=note)

    return weather


class Counter:
    """Tools with per-instance state."""

    def __init__(self, start: int = 0) -> None:
        self.value = start

    @tool
    def add(self, amount: int) -> int:
        """Add to the counter."""
        self.value += amount
        return self.value

    @tool(name="read_counter", stateful=True)
    def read(self) -> int:
        """Read the counter."""
        return self.value

    def helper(self) -> int:
        return self.value


def test_in_all():
    """The public names are exported."""
    assert set(tools_module.__all__) == {
        "ApiTool", "HttpTool", "HumanTool", "McpTool", "ToolArgumentsError", "ToolDef", "ToolRegistry", "WaitForMessageTool",
        "as_tool", "tool",
    }


class TestTool:
    """@tool and @tool(...)."""

    def test_bare_decorator(self):
        """@tool makes a worker ToolDef named after the function."""

        @tool
        def greet(name: str) -> str:
            """Say hello."""
            return f"hi {name}"

        assert isinstance(greet, ToolDef)
        assert (greet.name, greet.description, greet.tool_type) == ("greet", "Say hello.", "worker")
        assert greet.input_schema == {
            "type": "object",
            "properties": {"name": {"type": "string"}},
            "required": ["name"],
            "additionalProperties": False,
        }

    def test_options(self):
        """name, description, stateful and timeout_seconds are kept."""

        @tool(name="lookup-v2", description="Look it up.", stateful=True, timeout_seconds=30)
        def lookup(key: str) -> str:
            """Ignored docstring."""
            return key

        assert (lookup.name, lookup.description, lookup.stateful, lookup.timeout_seconds) == (
            "lookup-v2", "Look it up.", True, 30,
        )

    def test_still_callable(self):
        """The decorated function is still callable like the function."""

        @tool
        def add(a: int, b: int = 2) -> int:
            return a + b

        assert add(1) == 3
        assert add(1, b=5) == 6
        assert list(inspect.signature(add).parameters) == ["a", "b"]

    def test_docstring_first_paragraph(self):
        """The description is the docstring's first paragraph, lines joined."""

        @tool
        def f(x: int) -> None:
            """Do a thing
            over two lines.

            Details the LLM does not need.
            """

        assert f.description == "Do a thing over two lines."

    def test_args_section_describes_parameters(self):
        """A Google-style Args: section describes the parameters."""

        @tool
        def f(city: str, days: int = 1) -> None:
            """Forecast.

            Args:
                city: The city, e.g.
                    "Paris".
                days (int): How many days.

            Returns:
                Nothing.
            """

        props = f.input_schema["properties"]
        assert props["city"]["description"] == 'The city, e.g. "Paris".'
        assert props["days"]["description"] == "How many days."

    def test_no_description_uses_name(self):
        """A tool without any description is described by its name."""

        @tool
        def quiet(x: int) -> None:
            pass

        assert quiet.description == "quiet"

    def test_rejects_non_callable(self):
        """@tool("name") is a mistake and says how to set the name."""
        with pytest.raises(ToolDefinitionError) as info:
            tool("lookup")
        assert str(info.value) == (
            "@tool got 'lookup', which is not a function; to set options use @tool(name=...)"
        )

    def test_rejects_lambda_name(self):
        """A lambda's name is not a valid tool name."""
        with pytest.raises(ToolDefinitionError, match="tool name '<lambda>' is invalid"):
            tool(lambda: None)

    def test_rejects_class(self):
        """A class cannot be a tool."""
        with pytest.raises(ToolDefinitionError, match="is a class, not a function"):
            tool(Counter)

    def test_rejects_generators(self):
        """Generator and async generator functions are rejected at definition time."""

        def gen(x: int):
            yield x

        async def agen(x: int):
            yield x

        for func in (gen, agen):
            with pytest.raises(ToolDefinitionError, match="is a generator function"):
                tool(func)

    def test_rejects_missing_annotation(self):
        """A parameter without annotation is rejected, naming function and parameter."""

        def f(a: int, b) -> None:
            pass

        with pytest.raises(ToolDefinitionError) as info:
            tool(f)
        assert str(info.value) == (
            "TestTool.test_rejects_missing_annotation.<locals>.f: parameter 'b' has no type "
            "annotation; a tool's parameters are the LLM's contract, so annotate each one "
            f"({SUPPORTED})"
        )

    def test_rejects_star_args(self):
        """*args and **kwargs are rejected."""

        def f(*items: int) -> None:
            pass

        def g(**options: int) -> None:
            pass

        with pytest.raises(ToolDefinitionError, match=r"parameter \*items is not allowed"):
            tool(f)
        with pytest.raises(ToolDefinitionError, match=r"parameter \*\*options is not allowed"):
            tool(g)

    def test_rejects_positional_only(self):
        """Positional-only parameters are rejected (tools are called with keywords)."""

        def f(a: int, /) -> None:
            pass

        with pytest.raises(ToolDefinitionError, match="parameter 'a' is positional-only"):
            tool(f)

    @pytest.mark.parametrize("param", ["method", "_agent_state", "_agent_x"])
    def test_rejects_reserved_parameter(self, param):
        """Parameters the server's extras would clobber are rejected."""
        ns: dict = {}
        exec(f"def f({param}: int) -> None: pass", ns)
        with pytest.raises(ToolDefinitionError, match=f"parameter '{param}' is reserved"):
            tool(ns["f"])

    def test_rejects_double_decoration(self):
        """A ToolDef is already a tool."""
        weather = make_weather()
        with pytest.raises(ToolDefinitionError, match="is already a tool"):
            tool(weather)

    def test_bad_options(self):
        """Bad options are definition errors."""

        def f(x: int) -> None:
            pass

        with pytest.raises(ToolDefinitionError, match="^timeout_seconds must be an int >= 0, got -1$"):
            tool(timeout_seconds=-1)(f)
        with pytest.raises(ToolDefinitionError, match="^stateful must be True or False, got 'yes'$"):
            tool(stateful="yes")(f)
        with pytest.raises(ToolDefinitionError, match="description must be str, got 3"):
            tool(description=3)(f)

    def test_callable_instance(self):
        """A callable object's __call__ signature becomes the schema."""

        class Doubler:
            __name__ = "double"

            def __call__(self, x: int) -> int:
                """Double a number."""
                return 2 * x

        t = tool(Doubler())
        assert (t.name, t.description) == ("double", "Double a number.")
        assert t.input_schema["properties"] == {"x": {"type": "integer"}}
        assert t.invoke({"x": 4}) == 8


class TestMethods:
    """@tool on methods: descriptor binding, static and class methods."""

    def test_schema_skips_self(self):
        """self is not part of the schema."""
        assert Counter.add.input_schema["properties"] == {"amount": {"type": "integer"}}
        assert Counter.read.input_schema["required"] == []

    def test_instance_access_binds(self):
        """obj.method is a ToolDef bound to obj, callable like the method."""
        c = Counter(10)
        assert isinstance(c.add, ToolDef)
        assert c.add(5) == 15
        assert c.add.invoke({"amount": 1}) == 16
        assert c.read() == 16

    def test_two_instances_keep_separate_state(self):
        """Each bound tool carries its own instance."""
        a, b = Counter(), Counter(100)
        a_add, b_add = a.add, b.add
        a_add.invoke({"amount": 1})
        a_add.invoke({"amount": 1})
        b_add.invoke({"amount": 5})
        assert (a.value, b.value) == (2, 105)
        assert a_add != b_add

    def test_class_access_is_unbound(self):
        """Counter.add is the unbound tool; it can be called with an explicit instance."""
        c = Counter(1)
        assert Counter.add is Counter.__dict__["add"]
        assert Counter.add(c, 2) == 3

    def test_bind(self):
        """bind(instance) binds, and rebinding a bound tool moves it to the new instance."""
        a, b = Counter(), Counter()
        bound = Counter.add.bind(a).bind(b)
        bound.invoke({"amount": 3})
        assert (a.value, b.value) == (0, 3)

    def test_bind_plain_function_is_identity(self):
        """Binding a function tool (or a server-side tool) returns it unchanged."""
        weather = make_weather()
        wait = WaitForMessageTool.create()
        assert weather.bind(object()) is weather
        assert wait.bind(object()) is wait

    def test_staticmethod_either_order(self):
        """@staticmethod may sit over or under @tool."""

        class T:
            @staticmethod
            @tool
            def over(x: int) -> int:
                return x + 1

            @tool
            @staticmethod
            def under(x: int) -> int:
                return x + 2

        t = T()
        assert (t.over(1), t.under(1), T.under(1)) == (2, 3, 3)
        assert [tl.invoke({"x": 1}) for tl in ToolRegistry.from_instance(t)] == [2, 3]

    def test_classmethod_either_order(self):
        """@classmethod may sit over or under @tool; cls is bound and skipped in the schema."""

        class T:
            label = "T"

            @tool
            @classmethod
            def under(cls, x: int) -> str:
                return f"{cls.label}{x}"

            @classmethod
            @tool
            def over(cls, x: int) -> str:
                return f"{cls.label}{x}!"

        class U(T):
            label = "U"

        registry = ToolRegistry.from_instance(U())
        assert [t.invoke({"x": 1}) for t in registry] == ["U1", "U1!"]
        assert registry[0].input_schema["properties"] == {"x": {"type": "integer"}}
        assert T.under(2) == "T2"

    def test_class_defined_in_function(self):
        """Methods of a class defined inside a function are methods too."""

        class Local:
            @tool
            def ping(self, n: int) -> int:
                return n

        assert Local().ping.invoke({"n": 7}) == 7
        assert list(Local.ping.input_schema["properties"]) == ["n"]

    def test_module_function_named_self_parameter(self):
        """A function outside a class keeps a parameter called self."""

        def f(self: int) -> int:
            return self

        assert tool(f).input_schema["required"] == ["self"]


class TestToolDef:
    """ToolDef construction, immutability and to_config."""

    def test_to_config_shape(self):
        """to_config is the server's ToolConfig, camelCase."""

        @tool(timeout_seconds=20, stateful=True)
        def lookup(key: str) -> str:
            """Find a key."""
            return key

        assert lookup.to_config() == {
            "name": "lookup",
            "description": "Find a key.",
            "inputSchema": {
                "type": "object",
                "properties": {"key": {"type": "string"}},
                "required": ["key"],
                "additionalProperties": False,
            },
            "toolType": "worker",
            "stateful": True,
            "config": {},
            "timeoutSeconds": 20,
        }

    def test_to_config_without_timeout_or_description(self):
        """timeoutSeconds is left out at 0; an empty description falls back to the name."""
        t = ToolDef(name="x", func=lambda: None)
        config = t.to_config()
        assert "timeoutSeconds" not in config
        assert config["description"] == "x"
        assert config["inputSchema"] == {
            "type": "object", "properties": {}, "required": [], "additionalProperties": False,
        }

    @pytest.mark.parametrize("name", ["a", "_x", "get_weather", "get-weather", "A1", "x" * 64])
    def test_valid_names(self, name):
        """Names usable as OpenAI function names and task types are accepted."""
        assert ToolDef(name=name, func=print).name == name

    @pytest.mark.parametrize(
        "name", ["", "1abc", "-abc", "has space", "dot.ted", "x" * 65, "tail\n", "é", None, 3]
    )
    def test_invalid_names(self, name):
        """Other names are rejected with an explanation."""
        with pytest.raises(ToolDefinitionError) as info:
            ToolDef(name=name, func=print)
        assert str(info.value) == (
            f"tool name {name!r} is invalid: use 1-64 letters, digits, '_' or '-', starting with "
            "a letter or '_' (tool names become LLM function names and Conductor task types); "
            "set it with @tool(name=...)"
        )

    def test_validators(self):
        """Every field is checked on construction."""
        cases = [
            (dict(tool_type="ftp"), "tool_type must be one of ('worker', 'pull_workflow_messages', 'human', 'http', "
             "'mcp', 'api', 'agent_tool'), got 'ftp'"),
            (dict(func=None), "worker tool 't' needs a callable func, got None"),
            (dict(func=3), "worker tool 't' needs a callable func, got 3"),
            (dict(tool_type="pull_workflow_messages"), "tool 't' of type 'pull_workflow_messages' runs on the server; func must be None"),
            (dict(timeout_seconds=True), "timeout_seconds must be an int >= 0 (not a bool), got True"),
            (dict(timeout_seconds=-5), "timeout_seconds must be an int >= 0, got -5"),
            (dict(stateful=1), "stateful must be True or False, got 1"),
            (dict(input_schema=[1]), "input_schema must be a mapping, got [1]"),
            (dict(input_schema={"type": "array"}), "tool 't': input_schema must be a JSON schema of type 'object' with a 'properties' mapping, got {'type': 'array'}"),
            (dict(input_schema={"type": "object", "properties": {"method": {}}}), "tool 't': argument name 'method' is reserved (the server adds 'method' and '_agent*' keys to every tool call); rename it"),
            (dict(config={"x": {1, 2}}), "config must be JSON: set is not a JSON value: {1, 2}"),
            (dict(config={1: "a"}), "config must be JSON: object keys must be strings, got [1]"),
        ]
        for overrides, message in cases:
            fields = {"name": "t", "func": print, **overrides}
            if fields.get("tool_type") == "pull_workflow_messages":
                fields["func"] = print
            with pytest.raises(ToolDefinitionError) as info:
                ToolDef(**fields)
            assert str(info.value) == message, overrides

    def test_frozen(self):
        """Fields cannot be set."""
        t = make_weather()
        with pytest.raises(attrs.exceptions.FrozenInstanceError):
            t.name = "other"

    def test_dicts_cannot_be_changed_from_outside(self):
        """input_schema and config are copied in and out."""
        schema = {"type": "object", "properties": {"a": {"type": "string"}}}
        config = {"k": [1]}
        t = ToolDef(name="t", func=print, input_schema=schema, config=config)
        schema["properties"]["a"]["type"] = "integer"
        config["k"].append(2)
        t.input_schema["properties"]["a"]["type"] = "boolean"
        t.config["k"].append(3)
        t.to_config()["inputSchema"]["properties"].clear()
        assert t.input_schema["properties"] == {"a": {"type": "string"}}
        assert t.config == {"k": [1]}

    def test_is_worker(self):
        """is_worker tells worker tools from server-side ones."""
        assert make_weather().is_worker is True
        assert WaitForMessageTool.create().is_worker is False

    def test_equality_and_hash(self):
        """Equal definitions are equal and hash alike; tools can be set members."""
        a = ToolDef(name="t", func=print, config={"a": 1})
        b = ToolDef(name="t", func=print, config={"a": 1})
        assert a == b and hash(a) == hash(b)
        assert a != attrs.evolve(a, stateful=True)
        assert len({a, b}) == 1

    def test_evolve_keeps_method_binding(self):
        """attrs.evolve keeps a method tool a method tool."""
        renamed = attrs.evolve(Counter.__dict__["add"], name="plus")

        class C(Counter):
            plus = renamed

        c = C(1)
        assert c.plus.invoke({"amount": 2}) == 3

    def test_server_side_tool_is_not_callable(self):
        """Calling or invoking a server-side tool is an error."""
        wait = WaitForMessageTool.create()
        message = "tool 'wait_for_message' (pull_workflow_messages) runs on the server; it has no function"
        with pytest.raises(ToolDefinitionError) as info:
            wait()
        assert str(info.value) == message
        with pytest.raises(ToolDefinitionError):
            wait.invoke({})


# (input, expected keyword arguments) for make_weather()
VALID_ARGUMENTS = [
    ({"city": "Paris"}, {"city": "Paris"}),
    ({"city": "Paris", "days": 3}, {"city": "Paris", "days": 3}),
    ({"city": "Paris", "days": 3.0}, {"city": "Paris", "days": 3}),
    ({"city": "Paris", "unit": "f"}, {"city": "Paris", "unit": Unit.FAHRENHEIT}),
    ({"city": "Paris", "scale": 2}, {"city": "Paris", "scale": 2.0}),
    ({"city": "Paris", "tags": ["a", "b"]}, {"city": "Paris", "tags": ["a", "b"]}),
    ({"city": "Paris", "coords": [1, "x"]}, {"city": "Paris", "coords": (1, "x")}),
    ({"city": "Paris", "mode": "full"}, {"city": "Paris", "mode": "full"}),
    ({"city": "Paris", "note": None}, {"city": "Paris", "note": None}),
    ({"city": "Paris", "days": None, "unit": None}, {"city": "Paris"}),
    (
        {"city": "Paris", "method": "weather", "_agent_state": {}, "_agent_tool_name": "weather",
         "_agent_future": 1},
        {"city": "Paris"},
    ),
]

# (input, the problems of the ToolArgumentsError) for make_weather()
INVALID_ARGUMENTS = [
    ({}, ["missing required argument 'city' (string)"]),
    ({"city": 3}, ["argument 'city': expected string, got 3 (integer)"]),
    ({"city": None}, ["argument 'city': expected string, got null (null)"]),
    ({"city": "P", "days": True}, ["argument 'days': expected integer, got true (boolean)"]),
    ({"city": "P", "days": 1.5}, ["argument 'days': expected integer, got 1.5 (number)"]),
    ({"city": "P", "days": "2"}, ["argument 'days': expected integer, got \"2\" (string)"]),
    ({"city": "P", "scale": False}, ["argument 'scale': expected number, got false (boolean)"]),
    ({"city": "P", "unit": "k"}, ["argument 'unit': expected one of \"c\", \"f\", got \"k\" (string)"]),
    ({"city": "P", "unit": "C"}, ["argument 'unit': expected one of \"c\", \"f\", got \"C\" (string)"]),
    ({"city": "P", "mode": "short"}, ["argument 'mode': expected one of \"brief\", \"full\", got \"short\" (string)"]),
    ({"city": "P", "tags": "a,b"}, ["argument 'tags': expected array of string, got \"a,b\" (string)"]),
    ({"city": "P", "tags": ["a", 2, None]}, [
        "argument 'tags[1]': expected string, got 2 (integer)",
        "argument 'tags[2]': expected string, got null (null)",
    ]),
    ({"city": "P", "note": 5}, ["argument 'note': expected string or null, got 5 (integer)"]),
    ({"city": "P", "country": "FR"}, [
        "unexpected argument 'country' (allowed: city, days, unit, scale, tags, coords, mode, note)",
    ]),
    ({"days": 0, "city": 7.5}, ["argument 'city': expected string, got 7.5 (number)"]),
    ({"city": "x" * 100}, None),  # long strings are fine...
    ({"city": "P", "tags": "x" * 100}, [
        "argument 'tags': expected array of string, got \"" + "x" * 56 + "... (string)",  # ...and truncated when shown
    ]),
    ({"days": "x", "unit": 1}, [
        "missing required argument 'city' (string)",
        "argument 'days': expected integer, got \"x\" (string)",
        "argument 'unit': expected one of \"c\", \"f\", got 1 (integer)",
    ]),
]


class TestParseArguments:
    """ToolDef.parse_arguments: server extras, validation, conversion."""

    @pytest.mark.parametrize("data,expected", VALID_ARGUMENTS)
    def test_valid(self, data, expected):
        """Valid arguments become call kwargs, converted to the hinted types."""
        assert make_weather().parse_arguments(data) == expected

    @pytest.mark.parametrize("data,problems", INVALID_ARGUMENTS)
    def test_invalid(self, data, problems):
        """Invalid arguments raise ToolArgumentsError listing every problem."""
        weather = make_weather()
        if problems is None:
            assert weather.parse_arguments(data) == data
            return
        with pytest.raises(ToolArgumentsError) as info:
            weather.parse_arguments(data)
        assert list(info.value.problems) == problems
        assert info.value.tool_name == "weather"
        assert str(info.value) == "Invalid arguments for tool 'weather': " + "; ".join(problems)

    def test_types_after_conversion(self):
        """Enum, tuple and float values have the hinted Python types."""
        args = make_weather().parse_arguments({"city": "P", "unit": "c", "coords": [], "scale": 1})
        assert args["unit"] is Unit.CELSIUS
        assert type(args["coords"]) is tuple
        assert type(args["scale"]) is float

    def test_not_a_mapping(self):
        """Input that is not an object is an argument error."""
        with pytest.raises(ToolArgumentsError) as info:
            make_weather().parse_arguments(["Paris"])
        assert str(info.value) == (
            "Invalid arguments for tool 'weather': arguments must be a JSON object, got array"
        )

    def test_input_not_changed(self):
        """The task's input data is not modified."""
        data = {"city": "P", "unit": "c", "method": "weather"}
        make_weather().parse_arguments(data)
        assert data == {"city": "P", "unit": "c", "method": "weather"}

    def test_hand_written_schema(self):
        """A ToolDef built by hand is checked against its own schema."""
        t = ToolDef(
            name="t",
            func=lambda **kw: kw,
            input_schema={
                "type": "object",
                "properties": {"n": {"type": "integer"}, "opts": {"type": "object"}},
                "required": ["n"],
            },
        )
        assert t.invoke({"n": 1, "free": True, "opts": {"a": [1]}}) == {
            "n": 1, "free": True, "opts": {"a": [1]},
        }
        with pytest.raises(ToolArgumentsError, match="missing required argument 'n'"):
            t.parse_arguments({})


class TestToolArgumentsError:
    """ToolArgumentsError."""

    def test_bases_and_fields(self):
        """It is a ValueError and a ConductorAgentsError with typed fields."""
        err = ToolArgumentsError("bad", tool_name="t", problems=["a", "b"])
        assert isinstance(err, ValueError) and isinstance(err, ConductorAgentsError)
        assert (str(err), err.tool_name, err.problems) == ("bad", "t", ("a", "b"))


class TestInvoke:
    """ToolDef.invoke: sync, async, errors."""

    def test_sync(self):
        """invoke parses the arguments and calls the function."""
        result = make_weather().invoke({"city": "Oslo", "method": "weather"})
        assert result["city"] == "Oslo" and result["unit"] is Unit.CELSIUS

    def test_async_def(self):
        """An async def tool runs to completion on the calling thread."""

        @tool
        async def slow_double(x: int) -> int:
            await asyncio.sleep(0)
            return 2 * x

        assert slow_double.invoke({"x": 21}) == 42

    def test_async_in_worker_thread(self):
        """Async tools run on worker threads (no event loop there)."""

        @tool
        async def ident(x: int) -> int:
            return x

        results = []
        threads = [threading.Thread(target=lambda i=i: results.append(ident.invoke({"x": i})))
                   for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=10)
        assert sorted(results) == [0, 1, 2, 3]

    def test_sync_returning_awaitable(self):
        """A sync function that returns an awaitable has it awaited."""

        class Ready:
            def __await__(self):
                if False:
                    yield
                return "done"

        async def coro() -> str:
            return "coro"

        @tool
        def gives_awaitable(kind: str):
            return Ready() if kind == "awaitable" else coro()

        assert gives_awaitable.invoke({"kind": "awaitable"}) == "done"
        assert gives_awaitable.invoke({"kind": "coroutine"}) == "coro"

    def test_exceptions_propagate_unchanged(self):
        """The body's exception reaches the caller as is."""
        boom = KeyError("boom")

        @tool
        def fails() -> None:
            raise boom

        @tool
        async def fails_async() -> None:
            raise boom

        for t in (fails, fails_async):
            with pytest.raises(KeyError) as info:
                t.invoke({})
            assert info.value is boom

    def test_bad_arguments_do_not_call(self):
        """The function is not called when the arguments are invalid."""
        calls = []

        @tool
        def f(x: int) -> None:
            calls.append(x)

        with pytest.raises(ToolArgumentsError):
            f.invoke({"x": "1"})
        assert calls == []

    def test_async_from_running_loop(self):
        """Invoking an async tool inside a running event loop is a clear error."""

        @tool
        async def f() -> int:
            return 1

        async def main():
            f.invoke({})

        with pytest.raises(RuntimeError, match="tool 'f' is async and invoke\\(\\) was called from a running event loop"):
            asyncio.run(main())


class TestAsTool:
    """as_tool."""

    def test_tooldef_unchanged(self):
        """A ToolDef is returned as is."""
        weather = make_weather()
        assert as_tool(weather) is weather

    def test_function_wrapped(self):
        """A plain function is wrapped with the defaults."""

        def echo(text: str) -> str:
            """Echo."""
            return text

        t = as_tool(echo)
        assert (t.name, t.description, t.stateful, t.timeout_seconds) == ("echo", "Echo.", False, 0)
        assert t.invoke({"text": "hi"}) == "hi"

    def test_bound_method(self):
        """A bound method of an undecorated method becomes a tool of that instance."""
        c = Counter(4)
        t = as_tool(c.helper)
        assert (t.name, t.invoke({})) == ("helper", 4)

    @pytest.mark.parametrize("value", [None, 3, "name", ["f"]])
    def test_non_callable(self, value):
        """A non-callable is rejected, naming the value."""
        with pytest.raises(ToolDefinitionError) as info:
            as_tool(value)
        assert str(info.value) == (
            f"{value!r} ({type(value).__name__}) cannot be a tool: pass a function, a @tool "
            "function or a ToolDef"
        )

    def test_partial_needs_a_name(self):
        """A callable without __name__ needs tool(name=...)."""

        def add(a: int, b: int) -> int:
            return a + b

        with pytest.raises(ToolDefinitionError, match=r"has no __name__; give the tool one"):
            as_tool(functools.partial(add, 1))
        t = tool(name="add_one")(functools.partial(add, 1))
        assert t.input_schema["required"] == ["b"] and t.invoke({"b": 2}) == 3


class Base:
    @tool
    def first(self) -> str:
        return "base-first"

    @tool
    def second(self) -> str:
        return "base-second"

    @tool
    def dropped(self) -> str:
        return "base-dropped"


class Child(Base):
    @tool
    def third(self) -> str:
        return "child-third"

    @tool
    def first(self) -> str:
        return "child-first"

    dropped = None


class TestToolRegistry:
    """ToolRegistry."""

    def test_from_instance(self):
        """@tool methods are bound, in definition order; other methods are ignored."""
        c = Counter(1)
        registry = ToolRegistry.from_instance(c)
        assert registry.names == ("add", "read_counter")
        registry.get("add").invoke({"amount": 2})
        assert registry.get("read_counter").invoke({}) == 3

    def test_inheritance(self):
        """Bases first; subclass overrides win in place; a non-tool override removes a tool."""
        registry = ToolRegistry.from_instance(Child())
        assert registry.names == ("first", "second", "third")
        assert [t.invoke({}) for t in registry] == ["child-first", "base-second", "child-third"]

    def test_no_tools(self):
        """An object without @tool methods is almost certainly a mistake."""
        with pytest.raises(ToolDefinitionError) as info:
            ToolRegistry.from_instance(object())
        assert str(info.value) == (
            "object has no @tool methods; decorate the methods the LLM may call with @tool"
        )

    def test_class_instead_of_instance(self):
        """Passing the class is an error that says so."""
        with pytest.raises(ToolDefinitionError, match="needs an instance, got the class Counter"):
            ToolRegistry.from_instance(Counter)

    def test_duplicate_names(self):
        """Two tools with one name are rejected."""

        class Dup:
            @tool(name="same")
            def a(self) -> None:
                pass

            @tool(name="same")
            def b(self) -> None:
                pass

        with pytest.raises(ToolDefinitionError) as info:
            ToolRegistry.from_instance(Dup())
        assert str(info.value) == (
            "two tools are named 'same'; tool names must be unique (rename one with @tool(name=...))"
        )

    def test_is_an_immutable_sequence(self):
        """It is a Sequence: len, index, slice, iteration, unpacking; no mutation."""
        receive = WaitForMessageTool.create()
        registry = ToolRegistry.from_instance(Counter())
        combined = [receive, *registry]
        assert [t.name for t in combined] == ["wait_for_message", "add", "read_counter"]
        assert len(registry) == 2 and registry[-1].name == "read_counter"
        assert isinstance(registry[:1], ToolRegistry) and registry[:1].names == ("add",)
        assert registry.index(registry[1]) == 1
        assert list(reversed(registry.names)) == ["read_counter", "add"]
        assert not hasattr(registry, "append")
        with pytest.raises(attrs.exceptions.FrozenInstanceError):
            registry._tools = ()

    def test_contains_and_get(self):
        """`in` works by name (and by ToolDef); get returns the tool or a default."""
        weather = make_weather()
        registry = ToolRegistry([weather])
        assert "weather" in registry and weather in registry and "other" not in registry
        assert registry.get("weather") is weather
        assert registry.get("other") is None
        assert registry.get("other", weather) is weather

    def test_from_functions(self):
        """Functions and ToolDefs make a registry."""

        def echo(text: str) -> str:
            return text

        weather = make_weather()
        registry = ToolRegistry.from_functions(echo, weather)
        assert registry.names == ("echo", "weather") and registry[1] is weather
        with pytest.raises(ToolDefinitionError, match="two tools are named 'echo'"):
            ToolRegistry.from_functions(echo, echo)

    def test_rejects_non_tools(self):
        """Items must be ToolDefs; the registry itself needs an iterable."""
        with pytest.raises(ToolDefinitionError, match="ToolRegistry holds ToolDef objects, got 3"):
            ToolRegistry([3])
        with pytest.raises(ToolDefinitionError, match="needs an iterable of ToolDef, got 'abc'"):
            ToolRegistry("abc")

    def test_equality_and_repr(self):
        """Registries compare by content and show their names."""
        weather = make_weather()
        assert ToolRegistry([weather]) == ToolRegistry((weather,))
        assert repr(ToolRegistry([weather])) == "ToolRegistry(['weather'])"
        assert ToolRegistry() == ToolRegistry([]) and len(ToolRegistry()) == 0


class TestWaitForMessageTool:
    """WaitForMessageTool.create."""

    def test_defaults(self):
        """The default tool matches the server's pull_workflow_messages config."""
        wait = WaitForMessageTool.create()
        assert wait.func is None
        assert wait.to_config() == {
            "name": "wait_for_message",
            "description": "Wait for the next external message, then return its content.",
            "inputSchema": {"type": "object", "properties": {}},
            "toolType": "pull_workflow_messages",
            "stateful": False,
            "config": {"batchSize": 1},
        }

    def test_options(self):
        """name, description and batch_size are used."""
        wait = WaitForMessageTool.create(name="inbox", description="Read the inbox.", batch_size=100)
        assert (wait.name, wait.description, wait.config) == ("inbox", "Read the inbox.", {"batchSize": 100})

    @pytest.mark.parametrize("batch_size", [0, 101, -1, True, 1.5, "3", None])
    def test_bad_batch_size(self, batch_size):
        """batch_size must be an int from 1 to 100; the error is a ValueError naming it."""
        with pytest.raises(ConfigurationError) as info:
            WaitForMessageTool.create(batch_size=batch_size)
        assert isinstance(info.value, ValueError)
        assert info.value.variable == "batch_size"
        not_a_bool = " (not a bool)" if isinstance(batch_size, bool) else ""
        assert str(info.value) == f"batch_size must be an int from 1 to 100{not_a_bool}, got {batch_size!r}"

    def test_bad_name(self):
        """A bad name is a definition error."""
        with pytest.raises(ToolDefinitionError, match="tool name 'wait for' is invalid"):
            WaitForMessageTool.create(name="wait for")
