"""The wheel as users get it: built by ``pip wheel`` from a copy of this source tree.

The build runs in pip's isolated build environment (the setuptools that
pyproject.toml asks for, from the package index or pip's cache), as
``pip install django-semaphore`` from an sdist or a checkout would.  It
must print no setuptools warning about packages it would ignore, and the
wheel must hold every file of ``django_semaphore/`` (the Lua scripts,
templates, static files, migrations and ``py.typed`` included) and nothing
else: no tests, testproject or benchmarks.
"""

import ast
import email
import os
import re
import shutil
import subprocess
import sys
import zipfile

import pytest

from tests.support.helpers import ROOT

PACKAGE = "django_semaphore"


def _matrix():
    """noxfile.py's DJANGO table: Django version -> (pins, Pythons), read without importing nox."""
    with open(os.path.join(ROOT, "noxfile.py")) as f:
        tree = ast.parse(f.read())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "DJANGO" for t in node.targets):
            return ast.literal_eval(node.value)
    raise AssertionError("noxfile.py has no DJANGO table")


# What `make matrix` runs: setup.cfg's classifiers and python_requires must say
# the same (ruff's and mypy's target version follow the oldest Python).
TESTED_DJANGOS = set(_matrix())
TESTED_PYTHONS = {python for _, pythons in _matrix().values() for python in pythons}

# Never copied: local state, caches, other builds (copytree matches these against base names).
IGNORED = shutil.ignore_patterns(
    ".git",
    ".venv",
    ".nox",
    "build",
    "dist",
    "_build",
    "*.egg-info",
    "__pycache__",
    "*.pyc",
    ".hypothesis",
    ".mypy_cache",
    ".ruff_cache",
    ".pytest_cache",
    "*.sqlite3",
)
# Setuptools' words for a directory it finds importable but is told not to package
# (the current message, and the one of setuptools 62-68).
IGNORED_PACKAGE_WARNINGS = (
    "Package would be ignored",
    "absent from the `packages` configuration",
    "as data is deprecated",
)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """(wheel path, pip's verbose output) for a wheel built from a copy of the tree."""
    tmp = tmp_path_factory.mktemp("packaging")
    source = tmp / "source"
    # A copy: the build writes build/ and *.egg-info/ next to setup.cfg, and others use this tree.
    shutil.copytree(ROOT, source, ignore=IGNORED)
    env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_INPUT": "1"}
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "-v",
            "--wheel-dir",
            str(tmp / "dist"),
            str(source),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    (wheel,) = (tmp / "dist").glob("*.whl")
    return wheel, output


def _source_files():
    """Every file of the package in the source tree, as paths inside the wheel."""
    found = set()
    for folder, dirs, files in os.walk(os.path.join(ROOT, PACKAGE)):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        for name in files:
            if not name.endswith((".pyc", ".pyo")):
                found.add(os.path.relpath(os.path.join(folder, name), ROOT).replace(os.sep, "/"))
    return found


def test_build_prints_no_ignored_package_warning(built):
    _, output = built
    warnings = [
        line.strip() for line in output.splitlines() if any(w in line for w in IGNORED_PACKAGE_WARNINGS)
    ]
    packages = sorted(set(re.findall(r"Package '([\w.]+)' is absent", output)))
    print(f"{len(warnings)} warning lines; packages named: {packages}")
    assert warnings == [], packages


def test_wheel_holds_the_whole_package_and_nothing_else(built):
    wheel, _ = built
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
    dist_info = {n for n in names if n.split("/")[0].endswith(".dist-info")}
    files = names - dist_info
    print(f"{len(files)} package files in {wheel.name}")
    assert {n.split("/")[0] for n in files} == {PACKAGE}  # no tests, testproject, benchmarks
    assert files == _source_files()
    for required in (
        f"{PACKAGE}/py.typed",
        f"{PACKAGE}/scripts/acquire.lua",
        f"{PACKAGE}/scripts/_lib.lua",
        f"{PACKAGE}/templates/{PACKAGE}/429.html",
        f"{PACKAGE}/templates/{PACKAGE}/admin/semaphore_detail.html",
        f"{PACKAGE}/static/{PACKAGE}/admin.css",
        f"{PACKAGE}/static/{PACKAGE}/refresh.js",
        f"{PACKAGE}/migrations/0001_initial.py",
        f"{PACKAGE}/migrations/__init__.py",
    ):
        assert required in files


# Modules that start or manage processes: the library itself never does, only test rigs do.
PROCESS_MODULES = {"subprocess", "multiprocessing", "pty"}


def _process_imports(source):
    """The process-starting modules that ``source`` imports (at any depth)."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module.split(".")[0])
    return found & PROCESS_MODULES


def test_wheel_ships_no_test_rigs(built):
    """The redis-server / Cluster / Sentinel launchers live in tests/, not in users' installs."""
    wheel, _ = built
    with zipfile.ZipFile(wheel) as archive:
        modules = {n: archive.read(n).decode() for n in archive.namelist() if n.endswith(".py")}
    rigs = {name: sorted(found) for name, source in modules.items() if (found := _process_imports(source))}
    lines = sum(modules[name].count("\n") for name in rigs)
    print(f"{len(modules)} modules in {wheel.name}; {len(rigs)} start processes ({lines} lines): {rigs}")
    assert rigs == {}
    assert not any(name.startswith(f"{PACKAGE}/testing/") for name in modules)


def test_metadata_claims_only_the_tested_versions(built):
    wheel, _ = built
    with zipfile.ZipFile(wheel) as archive:
        (name,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        metadata = email.message_from_bytes(archive.read(name))
    classifiers = metadata.get_all("Classifier")
    pythons = {
        c.rsplit(" :: ", 1)[1]
        for c in classifiers
        if re.fullmatch(r"Programming Language :: Python :: 3\.\d+", c)
    }
    djangos = {
        c.rsplit(" :: ", 1)[1] for c in classifiers if re.fullmatch(r"Framework :: Django :: \d+\.\d+", c)
    }
    print(
        f"Requires-Python {metadata['Requires-Python']}; Python {sorted(pythons)}; Django {sorted(djangos)}"
    )
    assert pythons == TESTED_PYTHONS
    assert djangos == TESTED_DJANGOS
    assert metadata["Requires-Python"] == ">=" + min(
        TESTED_PYTHONS, key=lambda v: tuple(map(int, v.split(".")))
    )
