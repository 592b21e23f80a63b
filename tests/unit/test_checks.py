"""Unit tests for the argument checks written once (conductor_agents._common.checks), one class per validator."""

import math
import numbers

import attrs
import pytest

from conductor_agents import (
    Agent,
    AgentDefinitionError,
    AgentSettings,
    AgentTypeError,
    ConfigurationError,
    Continuation,
    Gate,
    Guardrail,
    McpTool,
    ModelSettings,
    Termination,
    ToolDefinitionError,
    WaitForMessageTool,
)
from conductor_agents._common import checks
from conductor_agents._events.stream import EventStream
from conductor_agents._listener.chained_events import ChainedEvents
from conductor_agents._common.checks import Refusal, a_bool, a_number, an_int, optional
from conductor_agents.testing import Failure, ScriptError, Usage

#: What every timeout is refused as: it names math.inf, the way to wait with no deadline (issue 41, point 6).
T = "timeout must be a number of seconds > 0 (math.inf: no deadline)"
AGENT = Refusal(AgentDefinitionError, type_error=AgentTypeError, prefix="Agent.")


def refused(check, value, name="x"):
    """The exception ``check`` raises for ``value`` (failing the test if it passes)."""
    with pytest.raises(Exception) as info:
        check.check(name, value)
    return info.value


class TestAnInt:
    """an_int: an int, not a bool, within inclusive bounds."""

    @pytest.mark.parametrize("value", [1, 2, 10**12])
    def test_accepts_and_returns(self, value):
        """A value in bounds passes, and check() returns it."""
        assert value == an_int(at_least=1).check("n", value)

    @pytest.mark.parametrize("value", [True, False])
    def test_refuses_bools(self, value):
        """A bool is refused although Python calls it an int, and the message says why."""
        error = refused(an_int(), value, "max_turns")
        assert f"max_turns must be an int (not a bool), got {value!r}" == str(error)

    @pytest.mark.parametrize("value", [1.0, "1", None, [1]])
    def test_refuses_other_types(self, value):
        """Floats (even whole ones), strings and None are not ints."""
        assert f"n must be an int >= 0, got {value!r}" == str(refused(an_int(at_least=0), value, "n"))

    def test_bounds(self):
        """at_least and at_most are inclusive."""
        check = an_int(at_least=1, at_most=100)
        assert (1, 100) == (check.check("count", 1), check.check("count", 100))
        assert "count must be an int from 1 to 100, got 0" == str(refused(check, 0, "count"))
        assert "count must be an int from 1 to 100, got 101" == str(refused(check, 101, "count"))
        assert "count must be an int <= 5, got 6" == str(refused(an_int(at_most=5), 6, "count"))

    def test_default_exception_is_value_error(self):
        """Without a refusal the check raises a plain ValueError."""
        assert ValueError is type(refused(an_int(at_least=1), 0))

    def test_type_and_bounds_raise_their_own_types(self):
        """A refusal with a type_error raises it for the wrong type, its error for the bounds, with field and value."""
        wrong_type = refused(an_int(at_least=1, refusal=AGENT), "10", "max_turns")
        too_small = refused(an_int(at_least=1, refusal=AGENT), 0, "max_turns")
        assert (AgentTypeError, "max_turns", "10") == (type(wrong_type), wrong_type.field, wrong_type.value)
        assert (AgentDefinitionError, "max_turns", 0) == (type(too_small), too_small.field, too_small.value)
        assert "Agent.max_turns must be an int >= 1, got 0" == str(too_small)

    def test_as_an_attrs_validator(self):
        """As an attrs validator it names the attribute."""

        @attrs.frozen
        class Thing:
            size: int = attrs.field(validator=an_int(at_least=1, refusal=AGENT))

        assert 3 == Thing(3).size
        with pytest.raises(AgentDefinitionError) as info:
            Thing(0)
        assert ("Agent.size must be an int >= 1, got 0", "size") == (str(info.value), info.value.field)


class TestANumber:
    """a_number: an int or float, not a bool; NaN is outside any bound."""

    @pytest.mark.parametrize("value", [0.5, 1, 1e9, math.inf])
    def test_accepts(self, value):
        """Ints and floats above the bound pass (infinity too, unless finite)."""
        assert value == a_number(above=0).check("seconds", value)

    def test_refuses_bools(self):
        """True is not a number of seconds."""
        assert "seconds must be a number > 0 (not a bool), got True" == str(refused(a_number(above=0), True, "seconds"))

    @pytest.mark.parametrize("value", ["1", None, 1j])
    def test_refuses_other_types(self, value):
        """Strings, None and complex numbers are refused as of the wrong type."""
        assert f"seconds must be a number > 0, got {value!r}" == str(refused(a_number(above=0), value, "seconds"))

    def test_bounds(self):
        """above is exclusive; at_least and at_most inclusive; NaN fails every bound."""
        assert "s must be a number > 0, got 0" == str(refused(a_number(above=0), 0, "s"))
        assert 0 == a_number(at_least=0).check("s", 0)
        assert "t must be a number from 0 to 2, got 2.5" == str(refused(a_number(at_least=0, at_most=2.0), 2.5, "t"))
        assert "t must be a number > 0 and <= 5, got 6" == str(refused(a_number(above=0, at_most=5), 6, "t"))
        assert "s must be a number >= 0, got nan" == str(refused(a_number(at_least=0), math.nan, "s"))

    def test_infinity_is_within_a_lower_bound(self):
        """Infinity passes a lower bound (a wait may be endless) and fails an upper one."""
        assert math.inf == a_number(at_least=0).check("s", math.inf)
        assert "t must be a number <= 5, got inf" == str(refused(a_number(at_most=5), math.inf, "t"))

    def test_configuration_error_names_the_variable(self):
        """A ConfigurationError refusal carries the name as ``variable``."""
        error = refused(a_number(above=0, refusal=Refusal(ConfigurationError)), -1, "wait_timeout_seconds")
        assert (ConfigurationError, "wait_timeout_seconds") == (type(error), error.variable)
        assert "wait_timeout_seconds must be a number > 0, got -1" == str(error)


class TestABool:
    """a_bool: True or False, never a truthy value."""

    @pytest.mark.parametrize("value", [True, False])
    def test_accepts(self, value):
        """Both bools pass."""
        assert value is a_bool().check("stateful", value)

    @pytest.mark.parametrize("value", [1, 0, "yes", None])
    def test_refuses_other_values(self, value):
        """Truthy and falsy non-bools are refused; the message has no bool note."""
        assert f"stateful must be True or False, got {value!r}" == str(refused(a_bool(), value, "stateful"))

    def test_a_failure_is_one_of_type(self):
        """A refusal with a type_error raises the type error, with the refusal's field when it sets one."""
        refusal = Refusal(AgentDefinitionError, type_error=AgentTypeError, prefix="Gate.text_contains: ", field="gate")
        error = refused(a_bool(refusal=refusal), 1, "case_sensitive")
        assert (AgentTypeError, "gate", 1) == (type(error), error.field, error.value)
        assert "Gate.text_contains: case_sensitive must be True or False, got 1" == str(error)


class TestOptional:
    """optional: None, or what the inner check accepts."""

    def test_accepts_none_and_inner_values(self):
        """None and in-bounds values pass."""
        check = optional(an_int(at_least=1))
        assert (None, 3) == (check.check("limit", None), check.check("limit", 3))

    def test_message_says_or_none(self):
        """The message adds "or None" and keeps the bool note."""
        check = optional(an_int(at_least=1))
        assert "limit must be an int >= 1 or None, got 0" == str(refused(check, 0, "limit"))
        assert "limit must be an int >= 1 or None (not a bool), got True" == str(refused(check, True, "limit"))

    def test_refuses_as_the_inner_check(self):
        """The inner check's refusal decides the exception type and fields."""
        check = optional(a_number(at_least=0, refusal=AGENT))
        assert AgentTypeError is type(refused(check, "warm", "temperature"))
        error = refused(check, -1, "temperature")
        assert (AgentDefinitionError, "temperature", -1) == (type(error), error.field, error.value)

    def test_as_an_attrs_validator(self):
        """optional() works on an attrs field too."""

        @attrs.frozen
        class Thing:
            limit: int | None = attrs.field(default=None, validator=optional(an_int(at_least=1)))

        assert (None, 2) == (Thing().limit, Thing(2).limit)
        with pytest.raises(ValueError, match=r"^limit must be an int >= 1 or None, got 0$"):
            Thing(0)


class TestRefusal:
    """Refusal: which exception a failed check raises, and what it carries."""

    @pytest.mark.parametrize("error", [ValueError, ToolDefinitionError, ScriptError])
    def test_plain_exceptions_get_the_message_only(self, error):
        """Exceptions without fields are built from the message."""
        raised = refused(an_int(at_least=1, refusal=Refusal(error, prefix="tool 'x': ")), 0, "max_tools")
        assert (error, "tool 'x': max_tools must be an int >= 1, got 0") == (type(raised), str(raised))

    def test_without_type_error_the_error_is_used_for_both(self):
        """A refusal with one error raises it for the wrong type too (Termination's limits do)."""
        refusal = Refusal(AgentDefinitionError, field="termination")
        error = refused(an_int(at_least=1, refusal=refusal), "3", "count")
        assert (AgentDefinitionError, "termination", "3") == (type(error), error.field, error.value)

    def test_the_module_exports(self):
        """The validators and Refusal are the module's public names."""
        assert {"A_TIMEOUT", "Check", "Refusal", "VALUE_ERROR", "a_bool", "a_number", "an_int", "optional"} == set(
            checks.__all__)


def _pool(max_threads):
    from conductor_agents.aio import _Pool

    return _Pool(max_threads)


def _next_runs(count):
    from conductor_agents import Schedules

    return Schedules(api=None).next_runs("0 0 9 * * *", count)  # refused before any request


def _script_book():
    from conductor_agents.testing._scripts import ScriptBook

    return ScriptBook()


def _handle():
    """A handle that costs nothing: its timeout checks come before any request."""
    from conductor_agents import AgentRuntime

    return AgentRuntime(AgentSettings(server_url="http://127.0.0.1:9/api")).get_handle("run-1")


def _async_wait(timeout):
    import asyncio

    from conductor_agents.aio import AsyncAgentRuntime

    async def wait():
        async with AsyncAgentRuntime(AgentSettings(server_url="http://127.0.0.1:9/api")) as runtime:
            await runtime.get_handle("run-1").wait(timeout)

    asyncio.run(wait())


def _approve(timeout):
    from conductor_agents._people import approvals

    return approvals.approve(None, "run-1", reason=None, by=None, request=None, timeout=timeout)


def _events(cls, *args):
    return cls(None, *args, timeout=-1)


#: Each call site: the call with a bad value, the exception it raises, its message, and its field/variable.
SITES = [
    ("settings-int", lambda: AgentSettings(worker_threads=0), ConfigurationError,
     "worker_threads must be an int >= 1, got 0", "worker_threads"),
    ("settings-number", lambda: AgentSettings(http_timeout_seconds=True), ConfigurationError,
     "http_timeout_seconds must be a number > 0 (not a bool), got True", "http_timeout_seconds"),
    ("settings-bool", lambda: AgentSettings(liveness_enabled=1), ConfigurationError,
     "liveness_enabled must be True or False, got 1", "liveness_enabled"),
    ("settings-optional", lambda: AgentSettings(keep_runs=-1), ConfigurationError,
     "keep_runs must be an int >= 0 or None, got -1", "keep_runs"),
    ("agent-int-bool", lambda: Agent("a", "openai/m", max_turns=True), AgentTypeError,
     "Agent.max_turns must be an int >= 1 (not a bool), got True", "max_turns"),
    ("agent-number", lambda: Agent("a", "openai/m", temperature=-1), AgentDefinitionError,
     "Agent.temperature must be a number >= 0 or None, got -1", "temperature"),
    ("agent-bool", lambda: Agent("a", "openai/m", stateful="yes"), AgentTypeError,
     "Agent.stateful must be True or False, got 'yes'", "stateful"),
    ("continuation-int", lambda: Continuation(max_turns=1), AgentDefinitionError,
     "Continuation.max_turns must be an int >= 2, got 1", "max_turns"),
    ("continuation-optional", lambda: Continuation(keep_runs="2"), AgentTypeError,
     "Continuation.keep_runs must be an int >= 0 or None, got '2'", "keep_runs"),
    ("guardrail", lambda: Guardrail.regex("g", ["x"], max_retries=0), AgentDefinitionError,
     "Guardrail: max_retries must be an int >= 1, got 0", "max_retries"),
    ("gate", lambda: Gate.text_contains("done", case_sensitive=1), AgentTypeError,
     "Gate.text_contains: case_sensitive must be True or False, got 1", "gate"),
    ("model-settings", lambda: ModelSettings(temperature="warm"), AgentTypeError,
     "ModelSettings.temperature must be a number from 0 to 2 or None, got 'warm'", "temperature"),
    ("termination-limit", lambda: Termination.token_usage(max_total_tokens=0), AgentDefinitionError,
     "Termination.token_usage: max_total_tokens must be an int >= 1 or None, got 0", "termination"),
    ("termination-count", lambda: Termination.max_messages(False), AgentDefinitionError,
     "Termination.max_messages: count must be an int >= 1 (not a bool), got False", "termination"),
    ("mcp-max-tools", lambda: McpTool.create(server_url="http://localhost:9/mcp", name="m", max_tools=0),
     ToolDefinitionError, "tool 'm': max_tools must be an int >= 1, got 0", None),
    ("wait-tool", lambda: WaitForMessageTool.create(batch_size=101), ConfigurationError,
     "batch_size must be an int from 1 to 100, got 101", "batch_size"),
    ("async-pool", lambda: _pool(0), ValueError, "max_threads must be an int >= 1, got 0", None),
    ("next-runs", lambda: _next_runs(101), ValueError, "count must be an int from 1 to 100, got 101", None),
    ("fail-next", lambda: _script_book().fail_next("openai/m", Failure(), 0), ScriptError,
     "count must be an int >= 1, got 0", None),
    ("wait-for-requests", lambda: _script_book().wait_for_requests("openai/m", 1, -1), ScriptError,
     "timeout must be a number >= 0, got -1", None),
    ("usage", lambda: Usage(input_tokens=-1), ScriptError, "input_tokens must be an int >= 0 or None, got -1", None),
    ("failure-status", lambda: Failure(status=200), ScriptError, "status must be an int from 400 to 599, got 200",
     None),
    ("wait-timeout", lambda: _handle().wait(timeout=0), ValueError, T + ", got 0", None),
    ("wait-delivered-timeout", lambda: _handle().wait_delivered("m-1", timeout=True), ValueError,
     T + " (not a bool), got True", None),
    ("async-wait-timeout", lambda: _async_wait(math.nan), ValueError, T + ", got nan", None),
    ("approve-timeout", lambda: _approve(-2.5), ValueError, T + ", got -2.5", None),
    ("stream-timeout", lambda: _events(EventStream, "run-1"), ValueError, T + ", got -1",
     None),
    ("chained-events-timeout", lambda: _events(ChainedEvents, None, None), ValueError,
     T + ", got -1", None),
]


@pytest.mark.parametrize("call,error,message,field", [site[1:] for site in SITES], ids=[site[0] for site in SITES])
def test_every_call_site_refuses_in_the_one_shape(call, error, message, field):
    """Each site raises the exception it always raised, with the one message shape and its field or variable."""
    with pytest.raises(error) as info:
        call()
    assert (error, message) == (type(info.value), str(info.value))
    if field is not None:
        assert field == (info.value.variable if error is ConfigurationError else info.value.field)


class Count:
    """An integer that is not an ``int``: a :class:`numbers.Integral` as NumPy's are (registered, no subclass)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __gt__(self, other: float) -> bool:
        return self.n > other

    def __ge__(self, other: float) -> bool:
        return self.n >= other

    def __le__(self, other: float) -> bool:
        return self.n <= other

    def __float__(self) -> float:
        return float(self.n)

    def __repr__(self) -> str:
        return f"Count({self.n})"


numbers.Integral.register(Count)


def test_a_timeout_is_any_real_number_but_a_bool_or_a_string():
    """wait(timeout=numpy.int64(5)) or a Fraction worked through float(timeout): A_TIMEOUT takes any
    numbers.Real; its bound still holds, and a bool or a string is still refused."""
    from fractions import Fraction

    assert Fraction(1, 2) == checks.A_TIMEOUT.check("timeout", Fraction(1, 2))
    five = Count(5)
    assert five is checks.A_TIMEOUT.check("timeout", five)
    for refused, shown in [(Fraction(0), "Fraction(0, 1)"), (Count(-1), "Count(-1)"), ("5", "'5'")]:
        with pytest.raises(ValueError) as error:
            checks.A_TIMEOUT.check("timeout", refused)
        assert f"{T}, got {shown}" == str(error.value)
    with pytest.raises(ValueError) as error:
        checks.A_TIMEOUT.check("timeout", True)
    assert f"{T} (not a bool), got True" == str(error.value)


def test_a_number_sent_as_it_is_stays_an_int_or_a_float():
    """Without ``real`` (an agent's temperature goes to the server as JSON): a Fraction is refused."""
    from fractions import Fraction

    with pytest.raises(ValueError, match="got Fraction"):
        a_number(at_least=0).check("temperature", Fraction(1, 2))
    with pytest.raises(AgentTypeError, match="^Agent.temperature must be a number >= 0 or None, got Fraction"):
        Agent(name="a", model="openai/gpt-4o-mini", temperature=Fraction(1, 2))
