"""Finding the agent a ``MODULE:AGENT`` argument names.

``MODULE`` is a dotted module name (imported with the current directory on ``sys.path``,
the way ``python -m`` does) or the path of a ``.py`` file. ``AGENT`` is an attribute of
that module (dots reach into it): an :class:`~conductor_agents.Agent`, or a callable
taking no arguments that returns one.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from ..agent import Agent

__all__ = ["TargetError", "TargetImportError", "load_agent"]


class TargetError(Exception):
    """The ``MODULE:AGENT`` argument does not name an agent (a usage error, exit 2)."""


class TargetImportError(Exception):
    """The module was found but importing it (or calling the factory) raised (exit 1)."""


def load_agent(spec: str) -> Agent:
    """Return the :class:`Agent` that ``spec`` (``MODULE:AGENT``) names.

    Raises:
        TargetError: malformed spec, no such module or attribute, or not an agent.
        TargetImportError: the module's own code (or the factory) raised.
    """
    module_part, sep, attr = spec.rpartition(":")
    if not sep or not module_part or not attr:
        raise TargetError(f"expected MODULE:AGENT (e.g. samples/stateful_resume.py:make_agent or "
                          f"my_pkg.agents:agent), got {spec!r}")
    module = _import(module_part)
    obj: Any = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise TargetError(f"{module_part} has no attribute {attr!r}") from None
    if isinstance(obj, Agent):
        return obj
    if callable(obj):
        try:
            made = obj()
        except TypeError as err:
            raise TargetError(f"{spec} is callable but could not be called without arguments: {err}") from None
        except Exception as err:  # noqa: BLE001 - the user's factory failed: report it on one line
            raise TargetImportError(f"{spec}() raised {type(err).__name__}: {err}") from None
        if isinstance(made, Agent):
            return made
        raise TargetError(f"{spec}() returned {type(made).__name__}, not an Agent")
    kind = type(obj).__name__
    raise TargetError(f"{spec} is {'an' if kind[:1].lower() in 'aeiou' else 'a'} {kind}, not an Agent or a function "
                      "returning one")


def _import(module_part: str) -> ModuleType:
    if module_part.endswith(".py") or os.sep in module_part or "/" in module_part:
        return _import_file(Path(module_part))
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    try:
        return importlib.import_module(module_part)
    except ModuleNotFoundError as err:
        if err.name and (module_part == err.name or module_part.startswith(err.name + ".")):
            raise TargetError(f"no module named {module_part!r} (from {cwd})") from None
        raise TargetImportError(f"importing {module_part} failed: {type(err).__name__}: {err}") from None
    except Exception as err:  # noqa: BLE001 - the user's module raised while importing: report it on one line
        raise TargetImportError(f"importing {module_part} failed: {type(err).__name__}: {err}") from None


def _import_file(path: Path) -> ModuleType:
    if not path.is_file():
        raise TargetError(f"no such file: {path}")
    path = path.resolve()
    name = path.stem if path.stem.isidentifier() else "_conductor_agents_target"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise TargetError(f"cannot import {path}: not a Python module")
    # The file's directory goes first on sys.path, so its sibling imports work as under `python FILE`.
    folder = str(path.parent)
    if folder not in sys.path:
        sys.path.insert(0, folder)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as err:  # noqa: BLE001 - the user's file raised while importing: report it on one line
        sys.modules.pop(name, None)
        raise TargetImportError(f"importing {path} failed: {type(err).__name__}: {err}") from None
    return module
