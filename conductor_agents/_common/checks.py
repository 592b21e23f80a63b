"""Argument checks written once: small named validators that compose, in attrs' manner.

Each validator is both an attrs field validator (``attrs.field(validator=an_int(at_least=1))``) and a
plain check a function calls (``an_int(at_least=1).check("max_threads", max_threads)``, which returns the
value). A failed check says one thing in one shape::

    max_turns must be an int >= 1 (not a bool), got True

and raises what its call site has always raised: :class:`Refusal` says which exception (one for a value of
the wrong type, one for a value out of bounds), the prefix that names the owner (``"Agent."``) and the
``field``/``variable`` the error carries. ``bool`` is an ``int`` to Python but never a count or a number here.

May import: the standard library, ``attrs`` and :mod:`conductor_agents.errors`.
"""

from __future__ import annotations

import numbers
from typing import Any, TypeVar

import attrs

from ..errors import AgentDefinitionError, AgentTypeError, ConfigurationError

__all__ = ["A_TIMEOUT", "Check", "Refusal", "VALUE_ERROR", "a_bool", "a_number", "an_int", "optional"]

T = TypeVar("T")

#: What a failed check finds: the value's type, or its bounds.
_WRONG_TYPE = "type"
_OUT_OF_BOUNDS = "bounds"


@attrs.frozen
class Refusal:
    """How a check refuses a value at its call site: the exception it raises, and what the message and error name.

    ``error`` is raised for a value out of bounds, and for one of the wrong type unless ``type_error`` is
    given. An ``AgentTypeError``/``AgentDefinitionError`` carries ``field`` (the checked name unless
    ``field`` is set) and ``value``; a ``ConfigurationError`` carries ``variable``; any other exception
    only the message. ``prefix`` goes before the name in the message (``"Agent."``, ``"tool 'x': "``).
    Immutable; thread-safe.
    """

    error: type[Exception] = ValueError
    type_error: type[Exception] | None = None
    prefix: str = ""
    field: str | None = None

    def refuse(self, name: str, value: Any, expected: str, problem: str) -> Exception:
        """The exception for ``value`` of ``name``, which is not ``expected`` (``problem``: its type or bounds)."""
        message = f"{self.prefix}{name} must be {expected}, got {value!r}"
        cls = self.type_error if problem == _WRONG_TYPE and self.type_error is not None else self.error
        if issubclass(cls, (AgentTypeError, AgentDefinitionError)):
            return cls(message, field=self.field or name, value=value)
        if issubclass(cls, ConfigurationError):
            return cls(message, variable=self.field or name)
        return cls(message)


#: The default: a ValueError naming the argument.
VALUE_ERROR = Refusal()


@attrs.frozen
class Check:
    """What every validator shares: called by attrs with the attribute, or by :meth:`check` with a name."""

    refusal: Refusal

    @property
    def expected(self) -> str:
        """What a value must be, for the message (``"an int >= 1"``)."""
        raise NotImplementedError

    def problem(self, value: Any) -> str | None:
        """``"type"`` or ``"bounds"`` when ``value`` fails, else None."""
        raise NotImplementedError

    def refuses_bools(self) -> bool:
        """Whether a bool is refused as not a number (the message then says so: ``True`` is an ``int`` to Python)."""
        return False

    def check(self, name: str, value: T) -> T:
        """``value`` if it passes; otherwise raise the refusal's exception, naming ``name``."""
        problem = self.problem(value)
        if problem is not None:
            note = " (not a bool)" if isinstance(value, bool) and self.refuses_bools() else ""
            raise self.refusal.refuse(name, value, self.expected + note, problem)
        return value

    def __call__(self, instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
        self.check(attribute.name, value)


def _show(bound: float) -> str:
    return str(bound) if isinstance(bound, int) else f"{bound:g}"


def _bounds_text(kind: str, above: float | None, at_least: float | None, at_most: float | None) -> str:
    low = f"> {_show(above)}" if above is not None else None
    if at_least is not None and at_most is not None:
        return f"{kind} from {_show(at_least)} to {_show(at_most)}"
    if at_least is not None:
        low = f">= {_show(at_least)}"
    parts = [part for part in (low, f"<= {_show(at_most)}" if at_most is not None else None) if part]
    return " ".join([kind, " and ".join(parts)]) if parts else kind


def _out_of_bounds(value: Any, above: float | None, at_least: float | None, at_most: float | None) -> bool:
    # ``value``: any real number (a Fraction, a NumPy number). Written as "not within" so that NaN, which
    # compares false with everything, is out of any bound.
    return ((above is not None and not value > above) or (at_least is not None and not value >= at_least)
            or (at_most is not None and not value <= at_most))


@attrs.frozen
class _AnInt(Check):
    at_least: int | None = None
    at_most: int | None = None

    def refuses_bools(self) -> bool:
        return True

    @property
    def expected(self) -> str:
        return _bounds_text("an int", None, self.at_least, self.at_most)

    def problem(self, value: Any) -> str | None:
        if isinstance(value, bool) or not isinstance(value, int):
            return _WRONG_TYPE
        return _OUT_OF_BOUNDS if _out_of_bounds(value, None, self.at_least, self.at_most) else None


@attrs.frozen
class _ANumber(Check):
    above: float | None = None
    at_least: float | None = None
    at_most: float | None = None
    real: bool = False

    def refuses_bools(self) -> bool:
        return True

    @property
    def expected(self) -> str:
        return _bounds_text("a number", self.above, self.at_least, self.at_most)

    def problem(self, value: Any) -> str | None:
        if isinstance(value, bool) or not isinstance(value, numbers.Real if self.real else (int, float)):
            return _WRONG_TYPE
        return _OUT_OF_BOUNDS if _out_of_bounds(value, self.above, self.at_least, self.at_most) else None


@attrs.frozen
class _ABool(Check):
    @property
    def expected(self) -> str:
        return "True or False"

    def problem(self, value: Any) -> str | None:
        return None if isinstance(value, bool) else _WRONG_TYPE


@attrs.frozen
class _Optional(Check):
    inner: Check

    def refuses_bools(self) -> bool:
        return self.inner.refuses_bools()

    @property
    def expected(self) -> str:
        return f"{self.inner.expected} or None"

    def problem(self, value: Any) -> str | None:
        return None if value is None else self.inner.problem(value)


def an_int(*, at_least: int | None = None, at_most: int | None = None, refusal: Refusal = VALUE_ERROR) -> Check:
    """An ``int`` (not a ``bool``) within the bounds given (both inclusive)."""
    return _AnInt(refusal, at_least, at_most)


def a_number(*, above: float | None = None, at_least: float | None = None, at_most: float | None = None,
             real: bool = False, refusal: Refusal = VALUE_ERROR) -> Check:
    """An ``int`` or ``float`` (not a ``bool``) within the bounds given; NaN is outside any bound.

    ``above`` is exclusive, ``at_least`` and ``at_most`` inclusive. ``real``: any :class:`numbers.Real` (a
    ``fractions.Fraction``, a NumPy integer), for a value the caller turns into a ``float`` itself; without it
    only ``int`` and ``float``, for a value sent as it is (JSON has no other numbers). Never a ``str``.
    """
    return _ANumber(refusal, above, at_least, at_most, real)


def a_bool(*, refusal: Refusal = VALUE_ERROR) -> Check:
    """``True`` or ``False`` (not a truthy value); a failure is always one of type."""
    return _ABool(refusal)


def optional(check: Check) -> Check:
    """``None``, or a value ``check`` accepts; refused as ``check`` refuses (its message adds "or None")."""
    return _Optional(check.refusal, check)


@attrs.frozen
class _ATimeout(_ANumber):
    @property
    def expected(self) -> str:
        return "a number of seconds > 0 (math.inf: no deadline)"


#: A timeout in seconds that a call is given: a real number > 0 (``math.inf``: no deadline; a ``Fraction`` or a
#: NumPy number too: the call takes its ``float()``); a ValueError otherwise, which names ``math.inf``: 0 is no
#: "look once" (``status()`` is that), and a caller who meant "no deadline" learns how to say it.
A_TIMEOUT: Check = _ATimeout(VALUE_ERROR, above=0, real=True)
