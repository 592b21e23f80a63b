"""Two house rules of ``conductor_agents`` that ruff does not check: ``python tests/house_checks.py``.

- No ``except`` clause names a class beside one of its own bases (``except (ConductorAgentsError,
  ServerUnavailableError)``): the subclass adds nothing and hides what the clause means. The names are
  resolved by importing each module (its globals, and the imports its functions make lazily), so
  builtins, the package's own errors and third-party ones (``requests.exceptions.Timeout``) all count.
- No private name (``_x``, not ``__x__``) is imported from a module of another package of
  ``conductor_agents``, nor read as an attribute of such a module (``_schema._hint_name``); a top-level
  module belongs to the package root. Inside one package private names are shared freely. A name another
  package needs is public in its (private) module.

Exit status 0 when both hold; otherwise 1, each breach on a line. ``make lint`` runs it beside
``tests/layering.py`` (which reads the same imports for the floors).
"""

from __future__ import annotations

import ast
import builtins
import importlib
import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

# This checkout's conductor_agents, and tests/layering.py beside this file (also when imported as tests.house_checks).
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from layering import PACKAGE, _modules, absolute, package_of, report

#: Modules that run something when imported (``python -m conductor_agents``): read, never imported.
NOT_IMPORTED = {"conductor_agents.__main__"}


def _bindings(tree: ast.AST, package: str) -> Iterator[tuple[str, str, str | None]]:
    """``(local name, module, attribute or None)`` for every import anywhere in the module."""
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            source = absolute(node, package)
            for alias in node.names:
                yield alias.asname or alias.name, source, alias.name
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    yield alias.asname, alias.name, None
                else:  # ``import a.b`` binds ``a``
                    yield alias.name.split(".")[0], alias.name.split(".")[0], None


# --- an except clause naming a subclass beside its base ---------------------------------


def _namespace(module: str, tree: ast.AST, package: str) -> dict[str, Any]:
    names: dict[str, Any] = dict(vars(builtins))
    for local, source, attribute in _bindings(tree, package):
        try:
            value: Any = importlib.import_module(source)
            if attribute is not None:
                value = getattr(value, attribute) if hasattr(value, attribute) else \
                    importlib.import_module(f"{source}.{attribute}")
        except ImportError:  # an optional dependency missing here: its names stay unresolved
            continue
        names[local] = value
    if module not in NOT_IMPORTED and importlib.util.find_spec(module) is not None:  # (a test's made-up module)
        names.update(vars(importlib.import_module(module)))
    return names


def _resolve(node: ast.expr, names: dict[str, Any]) -> Any:
    if isinstance(node, ast.Name):
        return names.get(node.id)
    if isinstance(node, ast.Attribute):
        owner = _resolve(node.value, names)
        return getattr(owner, node.attr, None) if owner is not None else None
    return None


def redundant_excepts(module: str, path: Path, tree: ast.AST) -> Iterator[str]:
    names = _namespace(module, tree, package_of(module, path))
    for node in ast.walk(tree):
        if not isinstance(node, ast.ExceptHandler) or not isinstance(node.type, ast.Tuple):
            continue
        classes = [(ast.unparse(element), _resolve(element, names)) for element in node.type.elts]
        for name, cls in classes:
            if not isinstance(cls, type):
                yield f"{path.relative_to(PACKAGE.parent)}:{node.lineno}: cannot resolve {name} in this except clause"
                continue
            bases = [other for other, base in classes if isinstance(base, type) and base is not cls
                     and issubclass(cls, base)]
            if bases:
                yield (f"{path.relative_to(PACKAGE.parent)}:{node.lineno}: except names {name} beside its base "
                       f"{', '.join(bases)}")


# --- a private name imported across packages --------------------------------------------


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def private_imports(module: str, path: Path, tree: ast.AST, modules: dict[str, Path]) -> Iterator[str]:
    package = package_of(module, path)
    where = path.relative_to(PACKAGE.parent)
    imported_modules: dict[str, str] = {}  # local name -> a module of the package it names
    for node in ast.walk(tree):
        if not isinstance(node, ast.ImportFrom):
            continue
        source = absolute(node, package)
        for alias in node.names:
            if f"{source}.{alias.name}" in modules:  # a submodule: private modules are fine
                imported_modules[alias.asname or alias.name] = f"{source}.{alias.name}"
            elif source in modules and _private(alias.name) and package_of(source, modules[source]) != package:
                yield f"{where}:{node.lineno}: imports {alias.name} from {source}, a module of another package"
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and _private(node.attr):
            owner = imported_modules.get(node.value.id)
            if owner is not None and package_of(owner, modules[owner]) != package:
                yield (f"{where}:{node.lineno}: reads {node.value.id}.{node.attr} of {owner}, "
                       "a module of another package")


def breaches() -> list[str]:
    """Every broken rule, one line each."""
    modules = dict(_modules())
    out: list[str] = []
    for module, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        out.extend(redundant_excepts(module, path, tree))
        out.extend(private_imports(module, path, tree, modules))
    return out


def main() -> int:
    return report(breaches(), "house checks")


if __name__ == "__main__":
    sys.exit(main())
