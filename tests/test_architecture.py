"""The house rules of issue 33, checked on the source: one-way imports, public seams, small modules.

Every module of the installed package (`astraflow/`, `stores/` as `astraflow.stores`,
`policies/` as `astraflow.policies`) is parsed, not imported, so the checks are fast and
see lazy imports inside functions too; only `if TYPE_CHECKING:` blocks are exempt.
"""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCES = {"astraflow": "astraflow", "stores": "astraflow.stores", "policies": "astraflow.policies"}
MAX_LINES = 450
MAX_DOCSTRING_LINES = 15


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = [*SOURCES[rel.parts[0]].split("."), *rel.parts[1:]]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@cache
def _modules() -> dict[str, Path]:
    return {_module_name(f): f for top in SOURCES for f in sorted((ROOT / top).rglob("*.py"))}


def _owner(module: str, names: dict[str, Path]) -> str | None:
    """The longest prefix of a dotted name that is one of our modules (None: not ours)."""
    while module and module not in names:
        module = module.rpartition(".")[0]
    return module or None


def _type_checking_nodes(tree: ast.Module) -> set[int]:
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    return skip


@cache
def _imports() -> dict[str, list[tuple[str, str]]]:
    """Per module: (imported module, imported name or '') for every import of ours, lazy too."""
    names = _modules()
    out: dict[str, list[tuple[str, str]]] = {}
    for mod, path in names.items():
        tree = ast.parse(path.read_text())
        skip = _type_checking_nodes(tree)
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        found: list[tuple[str, str]] = []
        for node in ast.walk(tree):
            if id(node) in skip:
                continue
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    base = ".".join([*anchor, *([base] if base else [])])
                for alias in node.names:
                    full = f"{base}.{alias.name}"
                    if full in names:
                        found.append((full, ""))
                    elif (owner := _owner(base, names)) is not None:
                        found.append((owner, alias.name))
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if (owner := _owner(alias.name, names)) is not None:
                        found.append((owner, ""))
        out[mod] = found
    return out


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in edges:
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def _package(module: str) -> str:
    """The package a module belongs to: `astraflow.<folder>`, or `astraflow` for a top module."""
    folder = ".".join(module.split(".")[:2])
    path = _modules().get(folder)
    return folder if path is not None and path.name == "__init__.py" else "astraflow"


def test_no_import_cycles_lazy_imports_included():
    edges = {mod: {target for target, _ in found if target != mod}
             for mod, found in _imports().items()}
    assert _cycles(edges) == []


def test_the_cycle_check_sees_a_lazy_cycle():
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(edges) == [["a", "b", "c"]]


def test_no_private_name_imported_from_another_package():
    bad = []
    for mod, found in _imports().items():
        for target, name in found:
            private = name.startswith("_") or any(
                p.startswith("_") and p != "__init__" for p in target.split("."))
            if private and _package(target) != _package(mod):
                bad.append(f"{mod} imports {target}{'.' + name if name else ''}")
    assert bad == []


def test_no_module_over_450_lines():
    long = {str(p.relative_to(ROOT)): n for p in _modules().values()
            if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert long == {}


def test_module_docstrings_are_short():
    long = {}
    for path in _modules().values():
        doc = ast.get_docstring(ast.parse(path.read_text()), clean=False)
        if doc and (n := len(doc.strip().splitlines())) > MAX_DOCSTRING_LINES:
            long[str(path.relative_to(ROOT))] = n
    assert long == {}
