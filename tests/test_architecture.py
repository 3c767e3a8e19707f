"""The package's structure, as the docs' architecture page describes it.

* No import cycles among django_semaphore's modules, function-level imports
  included (imports under ``if TYPE_CHECKING:`` are for type checkers only).
* No private name (``_name``) of one module is imported or reached by another:
  what modules share has a public name.

Both read the source with ``ast``; nothing is imported or run.
"""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "django_semaphore"


def _module_name(path):
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


MODULES = {_module_name(path): path for path in PACKAGE.rglob("*.py")}


def _type_checking_nodes(tree):
    """ids of every node inside an ``if TYPE_CHECKING:`` block."""
    skip = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If):
            test = node.test
            if getattr(test, "id", None) == "TYPE_CHECKING" or getattr(test, "attr", None) == "TYPE_CHECKING":
                for child in node.body:
                    skip.update(id(sub) for sub in ast.walk(child))
    return skip


def _absolute(module, path, node):
    """The absolute module an ImportFrom names (relative imports resolved)."""
    if not node.level:
        return node.module or ""
    base = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _imports(module, path):
    """[(imported module, name or None, line)] of a module, TYPE_CHECKING blocks left out."""
    tree = ast.parse(path.read_text())
    skip = _type_checking_nodes(tree)
    found = []
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.ImportFrom):
            target = _absolute(module, path, node)
            for alias in node.names:
                submodule = f"{target}.{alias.name}"
                if submodule in MODULES:
                    found.append((submodule, None, node.lineno))
                else:
                    found.append((target, alias.name, node.lineno))
        elif isinstance(node, ast.Import):
            found.extend((alias.name, None, node.lineno) for alias in node.names)
    return found


def _graph():
    return {
        module: {target for target, _, _ in _imports(module, path) if target in MODULES and target != module}
        for module, path in MODULES.items()
    }


def _cycles(graph):
    """The strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on_stack, result = {}, {}, [], set(), []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
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
                result.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return result


def test_the_checker_sees_the_package():
    assert "django_semaphore.core" in MODULES
    assert any("django_semaphore.core" in targets for targets in _graph().values())


def test_cycles_are_found_when_present():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_cycles():
    assert _cycles(_graph()) == []


def _private(name):
    return name.startswith("_") and not name.startswith("__")


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_private_name_crosses_a_module(module):
    path = MODULES[module]
    offences = [
        f"line {line}: from {target} import {name}"
        for target, name, line in _imports(module, path)
        if name and _private(name) and target.startswith("django_semaphore") and target != module
    ]
    # ``module._name`` on a module of the package imported as a name.
    tree = ast.parse(path.read_text())
    imported_modules = {
        alias.asname or alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
        if f"{_absolute(module, path, node)}.{alias.name}" in MODULES
    }
    offences += [
        f"line {node.lineno}: {node.value.id}.{node.attr}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id in imported_modules
        and _private(node.attr)
    ]
    assert offences == []
