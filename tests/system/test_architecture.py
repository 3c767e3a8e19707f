"""The package's structure, as the docs' architecture page describes it.

* No import cycles among django_semaphore's modules, function-level imports
  included (imports under ``if TYPE_CHECKING:`` are for type checkers only).
* No private name (``_name``) of one module is imported or reached by another:
  what modules share has a public name.
* tests/ mirrors the package: django_semaphore/X.py is tested in tests/test_X.py,
  django_semaphore/P/X.py in tests/P/test_X.py, a package's __init__.py in
  tests/test_P.py, and every test file outside tests/system/ (the scenarios
  that exercise many modules together) names a module that exists.

They read the source with ``ast`` or look at file names; nothing is imported or run.
"""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "django_semaphore"
TESTS = Path(__file__).resolve().parents[1]


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


# -- tests/ mirrors the package ------------------------------------------------------------

#: Modules (or folders, ending in "/") without a test file of their own, and why.
EXEMPT = {
    "migrations/": "the migration is checked against the model in tests/test_models.py",
    "management/__init__.py": "an empty package marker",
    "management/commands/__init__.py": "an empty package marker",
    "algorithms/__init__.py": "the registry only, tested with the Protocol in tests/algorithms/test_base.py",
    "metrics/urls.py": "one URL pattern, the scrape endpoint tests/test_metrics.py requests",
    "contrib/__init__.py": "an empty package marker: each integration is tested in tests/contrib/",
}
#: Modules whose test file is not named after them.
RENAMED = {"__init__.py": "test_api.py"}  # the package's own __init__: its public API
#: Scenario tests that exercise many modules together: they name no one module.
SCENARIOS = "system"


def mirror(module):
    """The test file (relative to tests/) of ``module`` (a path relative to the package)."""
    module = Path(module)
    if module.as_posix() in RENAMED:
        return Path(RENAMED[module.as_posix()])
    if module.name == "__init__.py":  # a package as a module: metrics/__init__.py -> test_metrics.py
        return module.parent.parent / f"test_{module.parent.name}.py"
    return module.parent / f"test_{module.name}"


def _exempt(module):
    return any(
        module.as_posix() == entry or (entry.endswith("/") and module.as_posix().startswith(entry))
        for entry in EXEMPT
    )


def untested_modules(package, tests):
    """Modules of ``package`` (exemptions aside) without their test file under ``tests``."""
    modules = sorted(path.relative_to(package) for path in package.rglob("*.py"))
    return [
        f"{package.name}/{module.as_posix()} has no tests/{mirror(module).as_posix()}"
        for module in modules
        if not _exempt(module) and not (tests / mirror(module)).exists()
    ]


def orphan_tests(package, tests):
    """Test files under ``tests`` (scenarios aside) that name no module of ``package``."""
    mirrors = {mirror(path.relative_to(package)) for path in package.rglob("*.py")}
    found = sorted(path.relative_to(tests) for path in tests.rglob("test_*.py"))
    return [
        f"tests/{test.as_posix()} names no module of {package.name}/"
        for test in found
        if test.parts[0] != SCENARIOS and test not in mirrors
    ]


def test_the_test_file_of_a_module_is_named_after_it():
    assert mirror("core.py") == Path("test_core.py")
    assert mirror("algorithms/lua.py") == Path("algorithms/test_lua.py")
    assert mirror("management/commands/sema_cleanup.py") == Path("management/commands/test_sema_cleanup.py")
    assert mirror("metrics/__init__.py") == Path("test_metrics.py")
    assert mirror("__init__.py") == Path("test_api.py")


def test_the_mirror_check_finds_a_module_without_tests_and_a_test_without_module(tmp_path):
    package, tests = tmp_path / "pkg", tmp_path / "tests"
    for path in ("__init__.py", "core.py", "foo.py", "sub/__init__.py", "sub/bar.py", "migrations/0001_x.py"):
        (package / path).parent.mkdir(parents=True, exist_ok=True)
        (package / path).touch()
    test_files = ["test_api.py", "test_core.py", "test_sub.py", "sub/test_bar.py"]
    for path in [*test_files, "test_gone.py", "system/test_x.py"]:
        (tests / path).parent.mkdir(parents=True, exist_ok=True)
        (tests / path).touch()
    assert untested_modules(package, tests) == ["pkg/foo.py has no tests/test_foo.py"]
    assert orphan_tests(package, tests) == ["tests/test_gone.py names no module of pkg/"]


def test_tests_mirror_the_modules():
    assert untested_modules(PACKAGE, TESTS) == []
    assert orphan_tests(PACKAGE, TESTS) == []
    assert all((PACKAGE / entry).exists() for entry in EXEMPT), "an exemption for a module that is gone"
