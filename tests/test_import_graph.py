"""The package's import graph: no import circles between linearize's modules and no private
(underscore) name imported from another linearize module.

Every ``import``/``from ... import`` statement under ``linearize/`` counts, at module level and
inside functions alike (a function-level import closes a circle at run time just the same);
``if TYPE_CHECKING:`` blocks do not run and are skipped. The graph is built from the source
with :mod:`ast`, so nothing is imported.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = "linearize"
ROOT = Path(__file__).resolve().parent.parent / PACKAGE

# Known import edges (importer -> imported) that close a circle; the graph less these edges must
# have no circle. None left: the command modules import ``linearize.cli.common`` (the app, the
# shared options), never the package whose ``__init__`` imports them to register the commands.
ALLOWED_CYCLE_EDGES: set[tuple[str, str]] = set()

# Known private names imported from another linearize module, as (importer, imported module,
# name): none left (issue 33 made the benchmark's shared helpers public in ``linearize.bench``).
ALLOWED_PRIVATE_IMPORTS: set[tuple[str, str, str]] = set()


def module_name(path):
    """``linearize/a/b.py`` -> ``linearize.a.b``; ``linearize/a/__init__.py`` -> ``linearize.a``."""
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def all_modules():
    """``{module name: path}`` of every module of the package."""
    return {module_name(path): path for path in sorted(ROOT.rglob("*.py"))}


def resolve(importer, is_package, level, target):
    """The absolute module a ``from`` import names: ``level`` dots relative to ``importer``."""
    if level == 0:
        return target or ""
    base = importer.split(".")
    base = base if is_package else base[:-1]
    base = base[:len(base) - (level - 1)]
    return ".".join(base + ([target] if target else []))


def is_type_checking_block(node):
    test = getattr(node, "test", None)
    return isinstance(node, ast.If) and (
        (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
        or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"))


def import_statements(tree):
    """Every ``Import``/``ImportFrom`` node of ``tree`` that runs (those under ``if TYPE_CHECKING`` left out)."""
    found, stack = [], [tree]
    while stack:
        node = stack.pop()
        if is_type_checking_block(node):
            stack.extend(node.orelse)
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append(node)
        stack.extend(ast.iter_child_nodes(node))
    return found


def imports_of(name, path, modules):
    """``[(imported module, imported name or None, line)]`` of module ``name``, linearize's modules only."""
    found = []
    for node in import_statements(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            found += [(alias.name, None, node.lineno) for alias in node.names if alias.name in modules]
            continue
        source = resolve(name, path.name == "__init__.py", node.level, node.module)
        for alias in node.names:
            # ``from pkg import module`` imports that module; ``from pkg import name`` runs pkg
            if f"{source}.{alias.name}" in modules:
                found.append((f"{source}.{alias.name}", None, node.lineno))
            elif source in modules:
                found.append((source, alias.name, node.lineno))
    return found


def import_graph():
    """``({importer: {imported: [lines]}}, [(importer, imported, private name, line)])``."""
    modules = all_modules()
    graph, private = {name: {} for name in modules}, []
    for name, path in modules.items():
        for target, imported_name, line in imports_of(name, path, modules):
            if target != name:
                graph[name].setdefault(target, []).append(line)
            if imported_name and imported_name.startswith("_") and not imported_name.startswith("__"):
                private.append((name, target, imported_name, line))
    return graph, private


def strongly_connected(graph):
    """The strongly connected components of ``graph`` (Tarjan), each a sorted list of modules."""
    index, low, on_stack, stack, components = {}, {}, set(), [], []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for child in graph.get(node, ()):
            if child not in index:
                visit(child)
                low[node] = min(low[node], low[child])
            elif child in on_stack:
                low[node] = min(low[node], index[child])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            components.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return components


def cycles(graph):
    """Each import circle as the edges inside one strongly connected component: ``[[(importer,
    imported, lines)]]``."""
    found = []
    for component in strongly_connected(graph):
        if len(component) > 1:
            members = set(component)
            found.append([(a, b, lines) for a in component for b, lines in sorted(graph[a].items()) if b in members])
    return found


def location(module, line):
    path = all_modules()[module]
    return f"{path.relative_to(ROOT.parent)}:{line}"


def test_the_package_has_no_import_circle():
    graph, _ = import_graph()
    pruned = {a: {b: lines for b, lines in targets.items() if (a, b) not in ALLOWED_CYCLE_EDGES}
              for a, targets in graph.items()}
    found = cycles(pruned)
    described = "\n".join("circle:\n" + "\n".join(f"  {location(a, lines[0])}: {a} -> {b}" for a, b, lines in edges)
                          for edges in found)
    assert not found, f"import circles between linearize's modules:\n{described}"


def test_no_private_name_is_imported_from_another_module():
    _, private = import_graph()
    found = [(a, b, name, line) for a, b, name, line in private if (a, b, name) not in ALLOWED_PRIVATE_IMPORTS]
    described = "\n".join(f"  {location(a, line)}: {a} imports {name} from {b}" for a, b, name, line in found)
    assert not found, f"private names imported across linearize's modules:\n{described}"


def test_the_graph_sees_function_level_and_relative_imports(tmp_path):
    """The parser itself: a function-level relative import is an edge, ``TYPE_CHECKING`` ones are
    not; a circle is found."""
    path = tmp_path / "a.py"
    path.write_text("from typing import TYPE_CHECKING\nfrom . import b\n"
                    "if TYPE_CHECKING:\n    from .c import C\n"
                    "def f():\n    from ..d import _e\n")
    modules = {"linearize.x.a": path, "linearize.x.b": path, "linearize.x.c": path, "linearize.d": path}
    assert sorted(imports_of("linearize.x.a", path, modules)) == [("linearize.d", "_e", 6), ("linearize.x.b", None, 2)]
    assert sorted(strongly_connected({"a": {"b": [1]}, "b": {"a": [2]}, "c": {}})) == [["a", "b"], ["c"]]
