"""The house rules of ``conductor_agents``, checked from its imports: ``python tests/layering.py``.

- Imports point down: each part (a top-level module, or a package with everything in it) imports only
  parts on a lower floor of :data:`FLOORS` (``docs/architecture.md`` draws the same floors).
- No import cycle between any two modules, lazy imports included (``TYPE_CHECKING`` imports excepted:
  they never run).
- At most :data:`MAX_TOP_LEVEL` modules at the package's top level, none over :data:`MAX_LINES` lines.

Exit status 0 when the rules hold; otherwise 1, each breach on a line. ``make test`` runs it first. It reads the
source as text (``ast``) and imports nothing.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path
from typing import Dict, Iterator, List, Set, Tuple

PACKAGE = Path(__file__).resolve().parent.parent / "conductor_agents"

#: Bottom floor first. A part may import the parts of any floor below its own, never its own floor or above.
FLOORS: "List[Set[str]]" = [
    {"errors", "_version"},
    {"_common", "_tracing", "stats"},
    {"continuation"},
    {"_wire", "settings", "result", "local_server"},
    {"_tooldefs", "_people", "_liveness"},
    {"events", "tools", "_answers"},
    {"_teams"},
    {"agent", "_events"},
    {"_listener", "_scheduling"},
    {"_worker"},
    {"_serving"},
    {"handle"},
    {"_runs"},
    {"runtime"},
    {"testing", "cli", "aio"},
    {"__init__", "__main__"},
]
MAX_TOP_LEVEL = 15
MAX_LINES = 550


def _modules() -> "Iterator[Tuple[str, Path]]":
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        yield ".".join(parts), path


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def package_of(module: str, path: Path) -> str:
    """The package ``module`` (at ``path``) is in: itself for a package's ``__init__.py``."""
    return module if path.name == "__init__.py" else module.rsplit(".", 1)[0]


def absolute(node: ast.ImportFrom, package: str) -> str:
    """The module an ``ImportFrom`` in ``package`` reads from, as an absolute name."""
    if not node.level:
        return node.module or ""
    base = package.split(".")
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _imports(module: str, path: Path) -> "Set[str]":
    """The modules of the package that ``module`` imports, at any depth of its code."""
    package = package_of(module, path)
    found: "Set[str]" = set()
    names = {m for m, _ in _modules()}

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child):
                for other in child.orelse:
                    visit(other)
                continue
            if isinstance(child, ast.ImportFrom):
                target = absolute(child, package)
                for alias in child.names:
                    candidate = f"{target}.{alias.name}"
                    found.add(candidate if candidate in names else target)
            elif isinstance(child, ast.Import):
                found.update(a.name for a in child.names)
            visit(child)

    visit(ast.parse(path.read_text(encoding="utf-8")))
    return {m for m in found if m in names and m != module}


def _part(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _cycles(graph: "Dict[str, Set[str]]") -> "List[List[str]]":
    """Strongly connected components of more than one module (Tarjan)."""
    index: "Dict[str, int]" = {}
    low: "Dict[str, int]" = {}
    stack: "List[str]" = []
    on_stack: "Set[str]" = set()
    out: "List[List[str]]" = []

    def strong(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                strong(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            strong(node)
    return out


def breaches() -> "List[str]":
    """Every broken rule, one line each."""
    floor_of = {part: number for number, floor in enumerate(FLOORS) for part in floor}
    graph = {module: _imports(module, path) for module, path in _modules()}
    out: "List[str]" = []
    for module, targets in sorted(graph.items()):
        here = _part(module)
        if here not in floor_of:
            out.append(f"{module}: its part {here!r} is on no floor of FLOORS")
            continue
        for target in sorted(targets):
            there = _part(target)
            if there == here:
                continue
            if there not in floor_of:
                out.append(f"{module}: imports {target}, whose part {there!r} is on no floor")
            elif floor_of[there] >= floor_of[here]:
                out.append(f"{module} (floor {floor_of[here]}) imports {target} (floor {floor_of[there]}): "
                           "imports must point down")
    for component in _cycles(graph):
        out.append("import cycle: " + " -> ".join(component))
    top = sorted(p.name for p in PACKAGE.glob("*.py"))
    if len(top) > MAX_TOP_LEVEL:
        out.append(f"{len(top)} modules at the top level (at most {MAX_TOP_LEVEL}): {', '.join(top)}")
    for module, path in _modules():
        lines = len(path.read_text(encoding="utf-8").splitlines())
        if lines > MAX_LINES:
            out.append(f"{module}: {lines} lines (at most {MAX_LINES})")
    return out


def report(found: "List[str]", title: str) -> int:
    """Print each breach and a closing line; the exit status (1 when anything was found)."""
    for line in found:
        print(line)
    print(f"{title}: {'ok' if not found else f'{len(found)} breaches'}")
    return 1 if found else 0


def main() -> int:
    return report(breaches(), "house rules")


if __name__ == "__main__":
    sys.exit(main())
