"""The public face: every exported class and function reports its public home as ``__module__``.

A public package calls :func:`publish` once, after its imports, so reprs, tracebacks, ``help()`` and
pickles say ``conductor_agents.WorkerStallError``, never the private file the class is written in
(httpx does the same in its ``__init__``). Before a class moves, its own annotations are resolved in the
module that wrote them, so ``typing.get_type_hints`` (and ``attrs.resolve_types``, and the schema of a
tool whose parameter is one of these classes) still finds every name after the move. The names a package
imports only on first use get its ``__getattr__`` from :func:`lazy_attributes`.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import sys
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["lazy_attributes", "publish"]


def publish(namespace: Mapping[str, Any], home: str, *, elsewhere: Mapping[str, str] | None = None) -> None:
    """Set ``__module__`` of each class and function that ``namespace`` exports (its ``__all__``).

    ``home`` is the public module that exports them; ``elsewhere`` gives the home of a name whose public
    home is another package (one that re-exports it lazily, so its own :func:`publish` never sees it).
    Plain values (constants, type aliases) are left alone, and so are names not in ``namespace`` (those
    a package's ``__getattr__`` imports on first use).
    """
    elsewhere = elsewhere or {}
    for name in namespace["__all__"]:
        obj = namespace.get(name)
        if isinstance(obj, type):
            _resolve_own_annotations(obj)
            _resolve_signatures(obj, namespace)
            obj.__module__ = elsewhere.get(name, home)
        elif isinstance(obj, types.FunctionType):
            _resolve_function(obj, {**namespace, **vars(sys.modules.get(obj.__module__, types))})
            obj.__module__ = elsewhere.get(name, home)


def _resolve_own_annotations(cls: type) -> None:
    """Replace the class's own string annotations with what they name, while its module still says where.

    ``typing.get_type_hints(cls)`` evaluates a string annotation in ``sys.modules[cls.__module__]``: after
    the move that is the public package, which need not hold the names the private module imported.
    Hints that cannot be resolved now (a name only imported for type checkers) stay as they are.
    """
    own = inspect.get_annotations(cls)
    if not own or not any(isinstance(value, str) for value in own.values()) or cls.__module__ not in sys.modules:
        return
    try:
        hints = typing.get_type_hints(cls, include_extras=True)
    except Exception:  # noqa: BLE001 - unresolvable today already: leave the strings
        return
    cls.__annotations__ = {name: hints.get(name, value) for name, value in own.items()}


def _resolve_signatures(cls: type, namespace: Mapping[str, Any]) -> None:
    """Resolve the string annotations of the class's own methods (``__init__`` too, attrs' included) and
    properties, in the module that wrote them (then in the public package's ``namespace``, for a name that
    module imports only for type checkers): ``help()``, ``inspect.signature`` and notebooks show
    ``name: str``, not ``name: 'str'``. One that cannot be resolved now stays a string."""
    module = sys.modules.get(cls.__module__)
    if module is None:
        return
    scope = {**namespace, **vars(module), cls.__name__: cls}
    for member in vars(cls).values():
        for func in (member, getattr(member, "__func__", None), getattr(member, "fget", None)):
            if isinstance(func, types.FunctionType):
                _resolve_function(func, scope)


def _resolve_function(func: types.FunctionType, scope: Mapping[str, Any]) -> None:
    own = getattr(func, "__annotations__", None)
    if not own or not any(isinstance(value, str) for value in own.values()):
        return
    resolved = dict(own)
    for name, value in own.items():
        if isinstance(value, str):
            with contextlib.suppress(Exception):  # a name only imported for type checkers: left as it is
                resolved[name] = typing.get_type_hints(_Probe({name: value}), dict(scope), None)[name]
    func.__annotations__ = resolved


class _Probe:
    """Something with annotations for ``typing.get_type_hints`` to evaluate one at a time."""

    def __init__(self, annotations: dict[str, Any]) -> None:
        self.__annotations__ = annotations


def lazy_attributes(module: str, **homes: str) -> Callable[[str], object]:
    """The ``__getattr__`` (PEP 562) of the public module ``module``: each name of ``homes`` imported from the
    module named there on first use (for what most programs never need: ``LocalServer``, ``LocalCluster``);
    any other name raises :class:`AttributeError` as a module does. The package imports each such name under
    ``TYPE_CHECKING`` as well, so type checkers see the class, not ``object``."""

    def attribute(name: str) -> object:
        home = homes.get(name)
        if home is None:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        return getattr(importlib.import_module(home), name)

    return attribute
