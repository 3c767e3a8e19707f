"""The package's structure, as docs/architecture.rst describes it.

* Layers: each module imports only its own layer and those below it::

      exceptions, signals  <  config  <  backend  <  runtime  <  engine  <  web | ops  <  the glue

  web and ops do not import each other; ``contrib/`` imports only the public API
  (the package root, its shims, exceptions and signals) and the engine; nothing
  but the glue imports the glue or ``contrib/``.  Every import counts: module-level,
  inside functions, and under ``if TYPE_CHECKING:`` (a type-only import still says
  what a module knows), and so does a registry (``other.register_x(Thing)`` makes
  ``other`` reach ``Thing``: an edge from ``other`` back to the caller).
* No import cycles among the package's modules, counted the same way.
* The package root holds at most 15 modules: Django's (``__init__``, ``apps``,
  ``models``, ``admin``, ``checks``), the leaves everyone may import
  (``exceptions``, ``signals``) and the shims that keep public dotted paths, which
  only re-export.  Every folder of code has an ``__init__`` whose docstring says
  what it is for.
* No private name (``_name``) of one module is imported or reached by another:
  what modules share has a public name.
* tests/ mirrors the package: django_semaphore/X.py is tested in tests/test_X.py,
  django_semaphore/P/X.py in tests/P/test_X.py, a package's __init__.py in
  tests/test_P.py, and every test file outside tests/system/ (the scenarios
  that exercise many modules together) names a module that exists.
* What travels between functions has a name: no internal function takes more than
  6 parameters (self and cls not counted; ``*args`` and ``**kwargs`` one each), and no
  function is annotated to return a ``tuple[...]`` of more than 2 items
  (``tuple[X, ...]`` aside, and a union member counts): a small frozen dataclass does
  instead.  Internal means every function but the signatures the public API fixes: the
  functions exported by the modules the API is imported from (the root, its shims,
  exceptions, signals, contrib.celery) and the constructor and public methods of the
  classes exported there (see ``_public_signatures``).

They read the source with ``ast`` or look at file names; nothing is imported or run.
"""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "django_semaphore"
TESTS = Path(__file__).resolve().parents[1]
ROOT_PACKAGE = PACKAGE.name


def _module_name(path):
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


MODULES = {_module_name(path): path for path in PACKAGE.rglob("*.py")}


def _absolute(module, path, node):
    """The absolute module an ImportFrom names (relative imports resolved)."""
    if not node.level:
        return node.module or ""
    base = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _imports(module, path, modules=MODULES):
    """[(imported module, name or None, line)] of a module: every import statement, those
    inside functions and under ``if TYPE_CHECKING:`` included."""
    tree = ast.parse(path.read_text())
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            target = _absolute(module, path, node)
            for alias in node.names:
                submodule = f"{target}.{alias.name}"
                if submodule in modules:
                    found.append((submodule, None, node.lineno))
                else:
                    found.append((target, alias.name, node.lineno))
        elif isinstance(node, ast.Import):
            found.extend((alias.name, None, node.lineno) for alias in node.names)
    return found


def _bound_modules(module, path, tree, modules):
    """{local name: package module} for the package modules (and names of them) ``module`` imports."""
    bound = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            target = _absolute(module, path, node)
            for alias in node.names:
                submodule = f"{target}.{alias.name}"
                local = alias.asname or alias.name
                if submodule in modules:
                    bound[local] = submodule
                elif target in modules:
                    bound[local] = target  # a name imported from a module: calls reach that module
    return bound


def _registrations(module, path, modules=MODULES):
    """[(registry module, line)]: calls ``m.register_x(...)`` / ``register_x(...)`` into another
    module of the package that hand it something ``module`` defines (a class or a function)."""
    tree = ast.parse(path.read_text())
    defined = {
        node.name
        for node in tree.body
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
    }
    bound = _bound_modules(module, path, tree, modules)
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
            name, owner = func.attr, bound.get(func.value.id)
        elif isinstance(func, ast.Name):
            name, owner = func.id, bound.get(func.id)
        else:
            continue
        handed = {
            arg.id for arg in [*node.args, *(k.value for k in node.keywords)] if isinstance(arg, ast.Name)
        }
        if owner and owner != module and name.startswith("register") and handed & defined:
            found.append((owner, node.lineno))
    return found


def _graph(modules=MODULES):
    """module -> the package modules it depends on: its imports, and the registries it is reached from."""
    graph = {
        module: {
            target
            for target, _, _ in _imports(module, path, modules)
            if target in modules and target != module
        }
        for module, path in modules.items()
    }
    for module, path in modules.items():
        for registry, _ in _registrations(module, path, modules):
            graph[registry].add(module)  # the registry calls back into module
    return graph


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
    assert "django_semaphore.engine.semaphore" in MODULES
    graph = _graph()
    assert "django_semaphore.engine.semaphore" in graph["django_semaphore.web.needs"]
    # Imports inside functions and type-only imports count.
    assert "django_semaphore.engine.semaphore" in graph["django_semaphore"]


def test_cycles_are_found_when_present():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_cycles():
    assert _cycles(_graph()) == []


def test_a_registry_counts_as_an_edge_back(tmp_path):
    package = tmp_path / "django_semaphore"
    (package / "engine").mkdir(parents=True)
    for name in ("__init__.py", "engine/__init__.py", "engine/handoff.py"):
        (package / name).write_text('"""x."""\n')
    (package / "engine" / "core.py").write_text(
        "from . import handoff\n\n\nclass Semaphore: ...\n\n\nhandoff.register_semaphore_class(Semaphore)\n"
    )
    modules = {}
    for path in package.rglob("*.py"):
        parts = list(path.relative_to(tmp_path).with_suffix("").parts)
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph = _graph(modules)
    assert graph["django_semaphore.engine.handoff"] == {"django_semaphore.engine.core"}
    assert _cycles(graph) == [["django_semaphore.engine.core", "django_semaphore.engine.handoff"]]


# -- the layers ------------------------------------------------------------------------------

#: Folders (and root modules) of each layer, lowest first; a module's layer is its first match.
LAYERS = [
    ("leaves", ["exceptions", "signals"]),
    ("config", ["config"]),
    ("backend", ["backend"]),
    ("runtime", ["runtime"]),
    ("engine", ["engine"]),
    ("web", ["web"]),
    ("ops", ["ops"]),
    ("contrib", ["contrib"]),
    # Django's glue and the public shims: the package root, apps, models, admin, checks,
    # management/, migrations/, and the modules that keep public dotted paths.
    ("glue", [""]),
]
RANK = {"leaves": 0, "config": 1, "backend": 2, "runtime": 3, "engine": 4, "web": 5, "ops": 5, "glue": 6}

#: The root modules besides the shims: Django's, and the leaves everyone may import.
ROOT_MODULES = {"__init__", "apps", "models", "admin", "checks", "exceptions", "signals"}
#: The shims: public dotted paths kept at the root (shared/API.md and the docs name them). Each
#: only re-exports from the layer that holds the code.
SHIMS = {
    "middleware": "MIDDLEWARE names django_semaphore.middleware.SemaphoreMiddleware",
    "views": "SEMAPHORE_REJECT_VIEW's default is django_semaphore.views.rejected",
    "decorators": "the view decorator's module path (django_semaphore.semaphore is the same object)",
    "guards": "the docs import current_lease and FunctionGuard from django_semaphore.guards",
    "lease": "the docs import Lease from django_semaphore.lease",
    "handoff": "the docs name django_semaphore.handoff.HandoffError and AlreadyAdopted",
    "metrics/": 'the docs import metrics_view and track and include("django_semaphore.metrics.urls")',
}
#: What contrib/ may import: the public API (the root and its shims, exceptions, signals) and the engine.
CONTRIB_MAY_IMPORT = ("engine", "contrib")
PUBLIC = {ROOT_PACKAGE} | {f"{ROOT_PACKAGE}.{name.rstrip('/')}" for name in [*SHIMS, "exceptions", "signals"]}


def layer(module):
    """The layer of a module of the package (dotted name)."""
    relative = module.removeprefix(ROOT_PACKAGE).lstrip(".")
    for name, folders in LAYERS:
        for folder in folders:
            if folder and (relative == folder or relative.startswith(folder + ".")):
                return name
    return "glue"


def _shim(module):
    relative = module.removeprefix(ROOT_PACKAGE).lstrip(".")
    return relative in SHIMS or relative.split(".")[0] + "/" in SHIMS


def _allowed(module, target):
    """Why ``module`` may not import ``target``, or None if it may."""
    own, theirs = layer(module), layer(target)
    if own == "contrib":
        if target in PUBLIC or theirs in CONTRIB_MAY_IMPORT:
            return None
        return f"contrib/ uses the public API and the engine only, not {theirs}"
    if theirs == "contrib":
        return "nothing but contrib/ imports contrib/"
    if {own, theirs} == {"web", "ops"}:
        return "web and ops do not know each other"
    if RANK[theirs] > RANK[own]:
        return f"{own} is below {theirs}"
    return None


def test_every_module_has_a_layer():
    assert layer("django_semaphore.engine.algorithms.lua") == "engine"
    assert layer("django_semaphore.exceptions") == "leaves"
    assert layer("django_semaphore.middleware") == "glue"
    assert layer("django_semaphore") == "glue"
    assert layer("django_semaphore.contrib.celery.task") == "contrib"
    assert {layer(module) for module in MODULES} <= set(RANK) | {"contrib"}


def test_the_rules_catch_what_they_forbid():
    assert _allowed("django_semaphore.engine.guards", "django_semaphore.web.needs")
    assert _allowed("django_semaphore.web.needs", "django_semaphore.ops.monitor")
    assert _allowed("django_semaphore.ops.monitor", "django_semaphore.web.views")
    assert _allowed("django_semaphore.contrib.celery.store", "django_semaphore.backend.connection")
    assert _allowed("django_semaphore.engine.semaphore", "django_semaphore.middleware")
    assert _allowed("django_semaphore.admin", "django_semaphore.contrib.celery")
    assert _allowed("django_semaphore.web.needs", "django_semaphore.engine.semaphore") is None
    assert _allowed("django_semaphore.contrib.celery.task", "django_semaphore.guards") is None
    assert _allowed("django_semaphore.contrib.celery.task", "django_semaphore.engine.watchdog") is None


@pytest.mark.parametrize("module", sorted(MODULES))
def test_a_module_imports_its_own_layer_and_those_below(module):
    path = MODULES[module]
    offences = [
        f"line {line}: {target} ({why})"
        for target, _, line in _imports(module, path)
        if target in MODULES and target != module and (why := _allowed(module, target))
    ]
    offences += [
        f"line {line}: hands {registry} something of its own ({why})"
        for registry, line in _registrations(module, path)
        if (why := _allowed(registry, module))
    ]
    assert offences == []


def test_at_most_15_modules_at_the_root():
    root = sorted(path.stem for path in PACKAGE.glob("*.py"))
    assert len(root) <= 15, root
    unknown = [name for name in root if name not in ROOT_MODULES and name not in SHIMS]
    assert unknown == [], "a root module that is neither Django's glue, a leaf nor a listed shim"
    folders = {path.parent.name + "/" for path in PACKAGE.glob("*/__init__.py")}
    assert {name for name in SHIMS if name.endswith("/")} <= folders


def _only_re_exports(path):
    """What in ``path`` is more than a docstring, imports and ``__all__``."""
    tree = ast.parse(path.read_text())
    extra = []
    for index, node in enumerate(tree.body):
        if index == 0 and isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            continue  # the docstring
        if isinstance(node, ast.ImportFrom):
            continue
        if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == ["__all__"]:
            continue
        extra.append(f"line {node.lineno}: {ast.dump(node)[:60]}")
    return extra


@pytest.mark.parametrize("shim", sorted(SHIMS))
def test_a_shim_only_re_exports(shim):
    paths = sorted((PACKAGE / shim).rglob("*.py")) if shim.endswith("/") else [PACKAGE / f"{shim}.py"]
    assert paths
    for path in paths:
        assert ast.get_docstring(ast.parse(path.read_text())), f"{path.name}: say what path it keeps"
        assert _only_re_exports(path) == [], path


def _code_folders():
    return sorted({path.parent for path in PACKAGE.rglob("*.py") if path.parent != PACKAGE})


@pytest.mark.parametrize("folder", _code_folders(), ids=lambda p: p.relative_to(PACKAGE).as_posix())
def test_every_folder_says_what_it_is_for(folder):
    init = folder / "__init__.py"
    assert init.exists(), f"{folder.relative_to(PACKAGE)}/ has no __init__.py"
    docstring = ast.get_docstring(ast.parse(init.read_text()))
    assert docstring and len(docstring) >= 40, f"{folder.relative_to(PACKAGE)}/__init__.py: what is it for?"


# -- no private name crosses a module ---------------------------------------------------------


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
    "management/__init__.py": "a docstring only",
    "management/commands/__init__.py": "a docstring only",
    "config/__init__.py": "the layer's docstring only",
    "backend/__init__.py": "the layer's docstring only",
    "runtime/__init__.py": "the layer's docstring only",
    "engine/__init__.py": "the layer's docstring only",
    "web/__init__.py": "the layer's docstring only",
    "ops/__init__.py": "the layer's docstring only",
    "engine/algorithms/__init__.py": "the registry, tested with the Protocol in algorithms/test_base.py",
    "ops/metrics/urls.py": "one URL pattern, the scrape endpoint tests/ops/test_metrics.py requests",
    "contrib/__init__.py": "a docstring only: each integration is tested in tests/contrib/",
    **{
        (
            shim if shim.endswith("/") else f"{shim}.py"
        ): "a shim: tests/test_api.py checks its objects are its layer's"
        for shim in SHIMS
    },
}
#: Modules whose test file is not named after them.
RENAMED = {"__init__.py": "test_api.py"}  # the package's own __init__: its public API
#: Test files named after a class rather than the module that holds it.
ALSO = {
    "engine/test_lease.py": "engine/semaphore.py",  # Lease shares a module with Semaphore
    "engine/algorithms/test_quiet_release.py": "engine/algorithms/lua.py",  # one "lua" release of two
    "engine/algorithms/test_fast_acquire.py": "engine/algorithms/lua.py",  # one "lua" acquire of two
    "engine/algorithms/test_weighted_model.py": "engine/algorithms/lua.py",  # its weighted holders
    "engine/algorithms/test_total_common_case.py": "engine/algorithms/total.py",  # TOTAL's common case
}
#: Scenario tests that exercise many modules together: they name no one module.
SCENARIOS = "system"


def mirror(module):
    """The test file (relative to tests/) of ``module`` (a path relative to the package)."""
    module = Path(module)
    if module.as_posix() in RENAMED:
        return Path(RENAMED[module.as_posix()])
    if module.name == "__init__.py":  # a package as a module: ops/metrics/__init__.py -> ops/test_metrics.py
        return module.parent.parent / f"test_{module.parent.name}.py"
    return module.parent / f"test_{module.name}"


def _exempt(module):
    return any(
        module.as_posix() == entry or (entry.endswith("/") and module.as_posix().startswith(entry))
        for entry in EXEMPT
    )


def _test_files(tests):
    return sorted(path.relative_to(tests) for path in tests.rglob("test_*.py"))


def untested_modules(package, tests):
    """Modules of ``package`` (exemptions aside) without their test file under ``tests``."""
    modules = sorted(path.relative_to(package) for path in package.rglob("*.py"))
    found = set(_test_files(tests))
    return [
        f"{package.name}/{module.as_posix()} has no tests/{mirror(module).as_posix()}"
        for module in modules
        if not _exempt(module) and mirror(module) not in found
    ]


def orphan_tests(package, tests):
    """Test files under ``tests`` (scenarios aside) that name no module of ``package``."""
    mirrors = {mirror(path.relative_to(package)) for path in package.rglob("*.py")}
    mirrors |= {Path(test) for test, module in ALSO.items() if (package / module).exists()}
    return [
        f"tests/{test.as_posix()} names no module of {package.name}/"
        for test in _test_files(tests)
        if test.parts[0] != SCENARIOS and test not in mirrors
    ]


def test_the_test_file_of_a_module_is_named_after_it():
    assert mirror("engine/semaphore.py") == Path("engine/test_semaphore.py")
    assert mirror("engine/algorithms/lua.py") == Path("engine/algorithms/test_lua.py")
    assert mirror("management/commands/sema_cleanup.py") == Path("management/commands/test_sema_cleanup.py")
    assert mirror("ops/metrics/__init__.py") == Path("ops/test_metrics.py")
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


# -- one background scheduler, one fork-safety mechanism ---------------------------------------

#: The modules that may start a thread (``threading.Thread(``), and why. The process's periodic
#: jobs run on runtime/scheduler.py's thread; the lease watchdog is a Scheduler of its own.
THREAD_STARTERS = {
    "runtime/scheduler.py": "the background scheduler: one daemon thread per Scheduler",
    "engine/watchdog.py": (
        "the releaser blocks on a SimpleQueue that garbage-collection finalizers put on (a dropped"
        " response's give-back): waking a Scheduler takes a lock, which a finalizer must not, and a"
        " release stalled on a dead connection must not make a renewal on the watchdog's late"
    ),
    # contrib builds on the public API and the engine, as a third-party package would, and none
    # of its threads is a periodic job of the core:
    "contrib/celery/dispatcher.py": (
        "the dispatcher blocks on a Pub/Sub subscription, and its waiters block in acquire(wait=...)"
        " queueing for a slot (a scheduler job must not block); the lock keeper lives only while"
        " one of those blocking waits runs"
    ),
    "contrib/celery/runs.py": (
        "the heartbeat renews task-run claims in Celery pool processes only; like the lease"
        " watchdog it must not wait behind other jobs (a late heartbeat lets a redelivery run)"
    ),
}


def _calls(path, owner, attribute):
    """Lines of ``owner.attribute(...)`` calls (and of ``attribute`` imported from ``owner``)."""
    tree = ast.parse(path.read_text())
    lines = [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == attribute
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id == owner
    ]
    lines += [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom)
        and node.module == owner
        and any(alias.name == attribute for alias in node.names)
    ]
    return lines


def _modules_calling(owner, attribute):
    return sorted(
        path.relative_to(PACKAGE).as_posix()
        for path in PACKAGE.rglob("*.py")
        if _calls(path, owner, attribute)
    )


def test_one_module_registers_at_fork():
    assert _modules_calling("os", "register_at_fork") == ["backend/forks.py"]


def test_threads_are_started_by_the_scheduler_and_the_listed_exceptions_only():
    assert _modules_calling("threading", "Thread") == sorted(THREAD_STARTERS)


def test_no_module_checks_the_pid_for_fork_safety_by_itself():
    # A module that compares os.getpid() keeps fork safety of its own; forks.pid() is the one
    # check. contrib reads the pid to name its run claims and dispatcher locks, and to see
    # whether the process holding a claim is this one: data, not fork safety.
    assert _modules_calling("os", "getpid") == sorted(
        ["backend/forks.py", "contrib/celery/runs.py", "contrib/celery/dispatcher.py"]
    )


# -- what travels between functions has a name ---------------------------------------------------

#: The most parameters an internal function takes (self and cls not counted; ``*args`` and
#: ``**kwargs`` count one each): beyond, what travels is a small frozen dataclass.
MAX_PARAMETERS = 6
#: The most items of a tuple a function is annotated to return (``tuple[X, ...]`` aside).
MAX_TUPLE_ITEMS = 2
#: Where the public API is imported from: the root, its shims, exceptions and signals
#: (PUBLIC), and the optional integrations.
API_MODULES = sorted(PUBLIC | {f"{ROOT_PACKAGE}.contrib.celery"})


def _exported(module, path):
    """The names ``module`` exports: its ``__all__``, else its public top-level classes and functions."""
    tree = ast.parse(path.read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(target, ast.Name) and target.id == "__all__" for target in node.targets
        ):
            return tree, [element.value for element in node.value.elts]
    return tree, [
        node.name
        for node in tree.body
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and not node.name.startswith("_")
    ]


def _definition(module, name, seen=()):
    """(module, class or function node) that ``module``'s ``name`` is, following imports; None if
    it is no class or function of the package (a constant, an instance)."""
    path = MODULES.get(module)
    if path is None or (module, name) in seen:
        return None
    tree = ast.parse(path.read_text())
    for node in tree.body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
            return module, node
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            for alias in node.names:
                if (alias.asname or alias.name) == name:
                    target = _absolute(module, path, node)
                    return _definition(target, alias.name, (*seen, (module, name)))
    return None


def _public_signatures():
    """{(module path, qualified name)} of the signatures the public API fixes.

    Public: a function exported by a module the API is imported from (API_MODULES: the package
    root, its shims, exceptions, signals, contrib.celery), and the constructor and the methods
    without a leading underscore of a class exported there -- e.g. ``Semaphore.__init__`` (which
    takes every SEMAPHORES option as a keyword, as shared/API.md says), ``Semaphore.guard``,
    ``FunctionGuard.__init__`` (the options of ``guard()``), ``semaphore_task``.  Every other
    function is internal: private methods and helpers, the algorithms, the flows, the web
    layer's and the runtime's functions, whatever their name.
    """
    public = set()
    for module in API_MODULES:
        if module not in MODULES:
            continue
        _, names = _exported(module, MODULES[module])
        for name in names:
            found = _definition(module, name)
            if found is None:
                continue
            where, node = found
            path = MODULES[where].relative_to(PACKAGE).as_posix()
            if isinstance(node, ast.ClassDef):
                public |= {
                    (path, f"{node.name}.{item.name}")
                    for item in node.body
                    if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef))
                    and (item.name == "__init__" or not item.name.startswith("_"))
                }
            else:
                public.add((path, node.name))
    return public


def _functions(path):
    """[(qualified name, node)] of every function and method of a module, nested ones included."""
    found = []

    def visit(node, prefix):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                found.append((prefix + child.name, child))
                visit(child, f"{prefix}{child.name}.")
            elif isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")
            else:
                visit(child, prefix)

    visit(ast.parse(path.read_text()), "")
    return found


def _parameter_count(node):
    arguments = node.args
    names = [a.arg for a in (*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs)]
    count = len(names) + (arguments.vararg is not None) + (arguments.kwarg is not None)
    return count - 1 if names and names[0] in ("self", "cls") else count


def _tuple_items(annotation):
    """The most items of a ``tuple[...]`` that ``annotation`` is, or is one member of
    (``A | B``, ``Optional[...]``); 0 for none, and for ``tuple[X, ...]``."""
    if isinstance(annotation, ast.BinOp) and isinstance(annotation.op, ast.BitOr):
        return max(_tuple_items(annotation.left), _tuple_items(annotation.right))
    if isinstance(annotation, ast.Subscript):
        name = annotation.value
        name = name.attr if isinstance(name, ast.Attribute) else getattr(name, "id", "")
        items = annotation.slice.elts if isinstance(annotation.slice, ast.Tuple) else [annotation.slice]
        if name in ("tuple", "Tuple"):
            if len(items) == 2 and isinstance(items[1], ast.Constant) and items[1].value is Ellipsis:
                return 0
            return len(items)
        if name in ("Optional", "Union"):
            return max(_tuple_items(item) for item in items)
    if isinstance(annotation, ast.Constant) and isinstance(annotation.value, str):
        return _tuple_items(ast.parse(annotation.value, mode="eval").body)
    return 0


def _offenders(package=PACKAGE, public=frozenset()):
    """{(module path, qualified name): what offends} over the package's internal functions."""
    offenders = {}
    for path in sorted(package.rglob("*.py")):
        relative = path.relative_to(package).as_posix()
        for name, node in _functions(path):
            if (relative, name) in public:
                continue
            count = _parameter_count(node)
            if count > MAX_PARAMETERS:
                offenders[(relative, name)] = f"{count} parameters"
            items = _tuple_items(node.returns) if node.returns is not None else 0
            if items > MAX_TUPLE_ITEMS:
                offenders[(relative, name)] = f"returns a tuple of {items}"
    return offenders


def test_the_public_signatures_are_found():
    public = _public_signatures()
    assert {
        ("engine/semaphore.py", "Semaphore.__init__"),
        ("engine/semaphore.py", "Semaphore.try_acquire"),
        ("engine/semaphore.py", "Semaphore.guard"),
        ("engine/guards.py", "FunctionGuard.__init__"),
        ("web/decorators.py", "semaphore"),
        ("web/views.py", "rejected"),
    } <= public
    assert ("engine/semaphore.py", "Semaphore._acquiring") not in public
    assert not any(path.startswith("engine/algorithms/") for path, _ in public)


def test_the_signature_check_catches_what_it_forbids(tmp_path):
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "m.py").write_text(
        "class C:\n"
        "    def ok(self, a, b, c, d, e, f): ...\n"
        "    def many(self, a, b, c, d, e, f, *args): ...\n"
        "def triple() -> tuple[int, str, bytes]: ...\n"
        "def either() -> tuple[int, None] | tuple[None, str]: ...\n"
        "def maybe() -> 'tuple[int, int, int] | None': ...\n"
        "def any_length() -> tuple[int, ...]: ...\n"
        "def keywords(a, *, b, c, d, e, f, **kw): ...\n"
    )
    assert _offenders(package) == {
        ("m.py", "C.many"): "7 parameters",
        ("m.py", "triple"): "returns a tuple of 3",
        ("m.py", "maybe"): "returns a tuple of 3",
        ("m.py", "keywords"): "7 parameters",
    }


def test_no_internal_function_takes_more_than_6_parameters_or_returns_a_tuple_of_more_than_2():
    assert _offenders(public=_public_signatures()) == {}
