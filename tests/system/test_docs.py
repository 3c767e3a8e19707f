"""The README (PyPI's front page) and the Sphinx site under docs/.

``make docs`` builds the site with ``-W``, so a broken reference or docstring
fails there; these tests cover what Sphinx does not see: the README's size,
that docutils alone renders it (PyPI has no Sphinx), the commands and links
it must keep, and that the docs say what the code does:

* every ``.. code-block:: python`` runs, page by page, against the session's
  Redis (or is marked ``.. skip: <why>`` and only compiled), and names nothing
  it does not define (see "every Python example runs" below);
* every signature shown for a public callable is the code's (``inspect``);
* the checks' sample output is what the code prints, and the reference pages
  list every setting and option (with its default), check id, metric and
  module the code has, and none it lacks.

The management commands' options are not listed by hand: docs/_ext renders
them from each command's parser when the docs are built.
"""

import ast
import json
import os
import re
import subprocess
import sys
import textwrap

import pytest

from django_semaphore.config import settings as conf
from django_semaphore.config import validation
from tests.support.helpers import ROOT

README = os.path.join(ROOT, "README.rst")
DOCS = os.path.join(ROOT, "docs")
README_MAX_BYTES = 25 * 1024


def _read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


def _doc_files():
    found = []
    for directory, dirs, files in os.walk(DOCS):
        dirs[:] = [d for d in dirs if not d.startswith(("_", "."))]
        found += [os.path.join(directory, name) for name in files if name.endswith(".rst")]
    return sorted(found)


def _rst_files():
    return [README, *_doc_files()]


def code_blocks(text, language):
    """The bodies of the ``.. code-block:: <language>`` directives in ``text``, dedented."""
    lines = text.splitlines()
    blocks = []
    i = 0
    while i < len(lines):
        match = re.match(r"^(\s*)\.\. code-block:: *(\S+)\s*$", lines[i])
        i += 1
        if not match or match.group(2) != language:
            continue
        indent = len(match.group(1))
        while i < len(lines) and re.match(r"^\s+:\w[\w-]*:", lines[i]):  # directive options
            i += 1
        body = []
        while i < len(lines) and (not lines[i].strip() or len(lines[i]) - len(lines[i].lstrip()) > indent):
            body.append(lines[i])
            i += 1
        blocks.append(textwrap.dedent("\n".join(body)).strip("\n"))
    return blocks


# -- the README ------------------------------------------------------------------------


def test_readme_is_a_front_door_of_at_most_25_kb():
    size = os.path.getsize(README)
    print(f"README.rst: {size:,} bytes (limit {README_MAX_BYTES:,})")
    assert size <= README_MAX_BYTES


def test_readme_renders_with_docutils_alone_without_a_warning():
    # PyPI renders long_description with docutils, not Sphinx: a Sphinx-only
    # role or directive (:doc:, :ref:, toctree...) is an error there.
    from docutils.core import publish_string
    from docutils.utils import SystemMessage
    from docutils.writers.html5_polyglot import Writer

    text = _read(README)
    sphinx_roles = re.findall(r":(?:doc|ref|class|func|meth|mod|attr|exc|data|setting):`", text)
    assert sphinx_roles == [], f"Sphinx-only roles in README.rst: {sphinx_roles}"
    try:
        publish_string(
            text,
            writer=Writer(),
            settings_overrides={"halt_level": 2, "report_level": 2, "warning_stream": False},
        )
    except SystemMessage as exc:  # halt_level 2: the first warning raises
        pytest.fail(f"README.rst does not render cleanly with docutils: {exc}")


def test_readme_gives_the_test_and_demo_commands():
    # CI runs the README's test command; the demo is the other of the two commands.
    text = _read(README)
    console = "\n".join(code_blocks(text, "console"))
    assert re.search(r"^\$ make test\b", console, re.M), (
        "README.rst must give `make test` as the test command"
    )
    assert re.search(r"^\$ make demo\b", console, re.M), "README.rst must give `make demo`"


def test_readme_links_lead_somewhere():
    text = _read(README)
    targets = re.findall(r"^\.\. _[^:]+: (\S+)$", text, re.M)
    images = re.findall(r"^\.\. image:: (\S+)$", text, re.M)
    relative = [t for t in targets + images if "://" not in t]
    missing = [t for t in relative if not os.path.exists(os.path.join(ROOT, t))]
    assert missing == [], f"README.rst links to missing files: {missing}"
    linked = {os.path.basename(t)[: -len(".rst")] for t in targets if t.startswith("docs/")}
    for page in ("tutorial", "settings", "api", "deployment", "guarantees", "architecture", "changelog"):
        assert page in linked, f"README.rst does not link to docs/{page}.rst"


# -- the site --------------------------------------------------------------------------


def test_every_image_the_docs_show_exists():
    missing = []
    for path in _doc_files():
        for image in re.findall(r"\.\. image:: (\S+)", _read(path)):
            if not os.path.exists(os.path.join(os.path.dirname(path), image)):
                missing.append((os.path.relpath(path, ROOT), image))
    assert missing == []
    # The writers of the pictures put them where the docs look.
    assert "SEMAPHORE_SCREENSHOTS=docs/images " in _read(os.path.join(ROOT, "Makefile"))
    assert '"docs", "images", "bench-cycles.png"' in _read(os.path.join(ROOT, "benchmarks", "__main__.py"))


def _documented_default(value):
    return f'"{value}"' if isinstance(value, str) else repr(value)


def test_settings_reference_lists_every_setting_with_its_default():
    text = _read(os.path.join(DOCS, "settings.rst"))
    # Split at every section title (a line underlined with - or =): title -> body.
    parts = re.split(r"^(\S[^\n]*)\n[-=]{3,}\n", text, flags=re.M)
    sections = {title.strip("`"): body for title, body in zip(parts[1::2], parts[2::2], strict=True)}
    settings = {**conf.DEFAULTS, **validation.ENTRY_DEFAULTS}
    for name in sorted(set(settings) | set(validation.ENTRY_OPTIONS)):
        assert name in sections, f"docs/settings.rst has no section for {name}"
        if name in settings:
            expected = f"Default: ``{_documented_default(settings[name])}``."
            assert expected in sections[name], f"docs/settings.rst: {name} should say {expected}"
    assert "Required" in sections["LIMIT"]


def test_python_examples_are_valid_python():
    failures = []
    for path in _rst_files():
        for block in code_blocks(_read(path), "python"):
            try:
                ast.parse(block)
            except SyntaxError as exc:
                failures.append(f"{os.path.relpath(path, ROOT)}: {exc}\n{block}")
    assert failures == [], "\n\n".join(failures)


# -- the logging example ------------------------------------------------------------------

# Django applies its own logging configuration and then settings.LOGGING with
# dictConfig; gunicorn has configured its loggers before it loads the app.
LOGGING_PROBE = r"""
import json, logging, sys
import django
from django.conf import settings

namespace = {}
exec(sys.stdin.read(), namespace)
for name in ("gunicorn.error", "gunicorn.access"):
    logging.getLogger(name)
settings.configure(LOGGING=namespace["LOGGING"], INSTALLED_APPS=[])
django.setup()
watched = ["django", "django.request", "django.server", "gunicorn.error", "gunicorn.access"]
print(json.dumps([name for name in watched if logging.getLogger(name).disabled]))
"""


def logging_examples(paths):
    """Every Python example in ``paths`` that defines LOGGING."""
    return [
        (path, block)
        for path in paths
        for block in code_blocks(_read(path), "python")
        if re.search(r"^LOGGING = ", block, re.M)
    ]


def silenced_loggers(example):
    """The loggers that applying ``example`` in a fresh Django process disables."""
    result = subprocess.run(
        [sys.executable, "-c", LOGGING_PROBE],
        input=example,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return json.loads(result.stdout)


def test_logging_example_keeps_django_and_gunicorn_loggers():
    examples = logging_examples(_rst_files())
    assert examples, "the docs have no LOGGING example"
    for path, example in examples:
        silenced = silenced_loggers(example)
        print(f"{os.path.relpath(path, ROOT)}: loggers silenced by the LOGGING example: {silenced}")
        assert '"disable_existing_loggers": False' in example
        assert silenced == [], f"{path}: the LOGGING example silences {silenced}"


# -- every Python example runs -------------------------------------------------------------
#
# Each ``.. code-block:: python`` of README.rst and docs/ runs, doctest-style: the blocks of
# one page in order, in one namespace, against the session's Redis (the test's own key
# prefix), so an example that imports a name the package lacks, calls an API with an
# argument it does not take, or configures a SEMAPHORES entry the checks refuse fails here.
#
# * A block that assigns ``SEMAPHORES`` at its top level is a settings fragment: its entries
#   are added to the test's settings (``settings`` fixture) for the blocks after it, and, at
#   the end of the page, every entry the page configured must pass the system checks.
# * A block preceded by an RST comment ``.. skip: <why>`` is only compiled: one that needs a
#   server, a worker or a newer Django than the test's. Use it sparingly.
# * The names an example leaves to the reader (``do_the_work()``, ``build_report()``, a
#   model...) come from DOC_STUBS below; everything else must be defined by the page itself.

SKIP_MARK = re.compile(r"^\s*\.\. skip: *(?P<why>\S.*)$")

#: The SEMAPHORES entries the examples use without configuring them (as a reader's project would).
DOC_SEMAPHORES = {
    "reports": {"LIMIT": 2, "TIMEOUT": 60},
    "exports": {"LIMIT": 2, "TIMEOUT": 60, "KEY": "user"},
    "crawler": {"LIMIT": 3, "TIMEOUT": 30, "WAIT": 1},
    "pdf-renderer": {"LIMIT": 4, "TIMEOUT": 120},
}


class _Anything:
    """A stand-in for the reader's own objects: any attribute, call, item or iteration works."""

    def __init__(self, name="stub"):
        self._name = name

    def __getattr__(self, name):
        return _Anything(f"{self._name}.{name}")

    def __call__(self, *args, **kwargs):
        return _Anything(f"{self._name}()")

    def __getitem__(self, key):
        return _Anything(f"{self._name}[{key!r}]")

    def __iter__(self):
        return iter(())

    def __repr__(self):
        return f"<{self._name}>"


def _stubs():
    """The names the examples leave to the reader."""

    async def build_report():
        return {"rows": 0}

    class TemporaryError(Exception):
        pass

    def reveal_type(value):  # what mypy shows; at run time, the value itself
        return value

    names = {
        name: _Anything(name)
        for name in (
            "do_the_work",
            "build_export",
            "storage",
            "statsd",
            "sentry_sdk",
            "huge_queryset",
            "to_csv_line",
            "Export",
            "ops_site",
            "make_csv",
            "jobs",
            "orders_of",
        )
    }
    return {
        **names,
        "build_report": build_report,
        "TemporaryError": TemporaryError,
        "reveal_type": reveal_type,
    }


def python_examples(text):
    """``[(line, code, skip reason or None)]`` for every ``.. code-block:: python`` in ``text``."""
    lines = text.splitlines()
    found = []
    for number, line in enumerate(lines):
        match = re.match(r"^(\s*)\.\. code-block:: *python\s*$", line)
        if not match:
            continue
        previous = lines[number - 1] if number else ""
        skip = SKIP_MARK.match(previous)
        indent = len(match.group(1))
        i = number + 1
        while i < len(lines) and re.match(r"^\s+:\w[\w-]*:", lines[i]):
            i += 1
        body = []
        while i < len(lines) and (not lines[i].strip() or len(lines[i]) - len(lines[i].lstrip()) > indent):
            body.append(lines[i])
            i += 1
        code = textwrap.dedent("\n".join(body)).strip("\n")
        found.append((number + 1, code, skip.group("why") if skip else None))
    return found


def _pages_with_examples():
    return [os.path.relpath(path, ROOT) for path in _rst_files() if python_examples(_read(path))]


def _assigns(code, name):
    return any(
        isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets)
        for node in ast.parse(code).body
    )


class _ReadersModules:
    """Modules the examples' dotted paths name (``"myproject.semaphores.tenant_key"``), whose
    attributes are the page's own definitions: a dotted path that Python cannot import is looked
    up in the page's namespace, as if the reader had put the block in that module."""

    def __init__(self, namespace):
        self.namespace = namespace
        self.added = []

    def provide(self, entries):
        import importlib
        import types

        for entry in entries.values():
            for value in entry.values():
                if not isinstance(value, str) or value.count(".") < 2 or " " in value:
                    continue
                module_path = value.rsplit(".", 1)[0]
                try:
                    importlib.import_module(module_path)
                    continue
                except ImportError:
                    pass
                parts = module_path.split(".")
                for depth in range(1, len(parts) + 1):
                    name = ".".join(parts[:depth])
                    if name in sys.modules:
                        continue
                    module = types.ModuleType(name)
                    module.__path__ = []
                    module.__getattr__ = self._lookup
                    sys.modules[name] = module
                    self.added.append(name)

    def _lookup(self, attribute):
        try:
            return self.namespace[attribute]
        except KeyError:
            raise AttributeError(attribute) from None

    def remove(self):
        for name in self.added:
            sys.modules.pop(name, None)


@pytest.fixture
def restored_globals():
    """Put back what examples change globally: signal receivers, the admin site's registry."""
    from django.contrib import admin

    from django_semaphore import signals

    all_signals = [
        getattr(signals, name) for name in dir(signals) if isinstance(getattr(signals, name), signals.Signal)
    ]
    receivers = {signal: list(signal.receivers) for signal in all_signals}
    registry = dict(admin.site._registry)
    yield
    for signal, before in receivers.items():
        with signal.lock:
            signal.receivers[:] = before
            signal.sender_receivers_cache.clear()
    admin.site._registry.clear()
    admin.site._registry.update(registry)
    # An example that touched the database (the admin's LogEntry) leaves its connection
    # open: closed here, while this test may still use it, so that a later test without
    # database access does not meet it in request_finished's close_old_connections.
    from django.db import connections

    connections.close_all()


@pytest.mark.django_db
@pytest.mark.parametrize("page", _pages_with_examples())
def test_python_examples_run_in_order(page, settings, restored_globals):
    import asyncio
    import inspect

    from django_semaphore.config import settings as conf

    settings.SEMAPHORES = dict(DOC_SEMAPHORES)
    namespace = {"__name__": "docs_example"}
    namespace.update(_stubs())
    readers = _ReadersModules(namespace)
    configured = {}
    ran = skipped = 0
    try:
        for line, code, skip in python_examples(_read(os.path.join(ROOT, page))):
            where = f"{page}:{line}"
            compiled = compile(code, where, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
            if skip:
                skipped += 1
                continue
            try:
                result = eval(compiled, namespace)
                if inspect.iscoroutine(result):
                    asyncio.run(result)
            except Exception as exc:
                pytest.fail(f"the example at {where} raised {exc!r}:\n{code}")
            ran += 1
            if _assigns(code, "SEMAPHORES"):
                entries = namespace["SEMAPHORES"]
                configured.update(entries)
                readers.provide(entries)
                settings.SEMAPHORES = {**settings.SEMAPHORES, **entries}
        if configured:
            problems = [p for p in conf.validated().all_problems() if not p.warning]
            assert problems == [], f"{page}: SEMAPHORES entries the checks refuse: {problems}"
    finally:
        readers.remove()
    print(f"{page}: {ran} examples ran, {skipped} only compiled")


def _ruff():
    ruff = os.path.join(os.path.dirname(sys.executable), "ruff")
    return ruff if os.path.exists(ruff) else None


@pytest.mark.parametrize("page", _pages_with_examples())
def test_python_examples_name_only_what_they_define(page):
    """Inside functions too (running a block only defines them): every name an example uses is
    imported or defined on its page, or is one DOC_STUBS leaves to the reader (pyflakes' F821,
    through ruff, on the page's blocks in order, the skipped ones included)."""
    ruff = _ruff()
    if ruff is None:
        pytest.skip("ruff is not installed beside this Python (the test extra has it)")
    source, origin = [], []  # the page's blocks one after the other; line -> the .rst line
    for line, code, _ in python_examples(_read(os.path.join(ROOT, page))):
        for offset, text in enumerate(code.splitlines()):
            source.append(text)
            origin.append(line + 2 + offset)  # the directive, a blank line, then the code
        source.append("")
        origin.append(None)
    stubs = sorted(_stubs())
    done = subprocess.run(
        [
            ruff,
            "check",
            "--no-cache",
            "--isolated",
            "--select",
            "F821",
            "--output-format",
            "concise",
            "--config",
            f"builtins={stubs!r}",
            "--stdin-filename",
            "page.py",
            "-",
        ],
        input="\n".join(source) + "\n",
        capture_output=True,
        text=True,
        timeout=60,
    )
    found = [
        f"{page}:{origin[int(m.group(1)) - 1]}: {m.group(2)}"
        for m in re.finditer(r"^page\.py:(\d+):\d+: (F821 .*)$", done.stdout, re.M)
    ]
    assert done.returncode in (0, 1), f"ruff failed: {done.stderr}"  # 1: it found something
    assert found == [], "names the examples use but never define:\n" + "\n".join(found)


# -- every signature shown is the code's ---------------------------------------------------
#
# An inline literal such as ``semaphore_task(name, key=None, *, ticket_arg=None, wait=None,
# meta=None)`` whose name is a public callable is read as a parameter list. When it shows a
# default equal to the code's, or a ``*``, it claims to be the signature: it must then list
# every parameter, in order, with the code's defaults and kinds. Otherwise it is a call
# (``acquire(wait=30)``, ``@semaphore(name, permits=...)``): every keyword it passes must be
# a parameter of the callable. A record (``Holder(identifier, token, ...)``) shown with bare
# names must list its fields, in order.

SIGNATURE_LITERAL = re.compile(r"``(?:@|await )?(?:[\w\.\[\]\"']+\.)?(?P<name>\w+)\((?P<params>[^`]*)\)``")


def _public_callables():
    from django_semaphore import Lease, Semaphore, semaphore
    from django_semaphore.engine.guards import FunctionGuard, current_lease
    from django_semaphore.engine.inspection import Holder, PartitionStatus, Waiter
    from django_semaphore.ops.metrics import metrics_view, track
    from django_semaphore.runtime.control import Effective
    from django_semaphore.runtime.stats import Recent

    callables = {
        "Semaphore": Semaphore,
        "semaphore": semaphore,
        "FunctionGuard": FunctionGuard,
        "current_lease": current_lease,
        "metrics_view": metrics_view,
        "track": track,
    }
    for name in (
        "acquire", "aacquire", "try_acquire", "atry_acquire", "hold", "ahold", "holders", "aholders",
        "available", "aavailable", "status", "astatus", "waiters", "awaiters", "purge_expired",
        "apurge_expired", "force_release", "aforce_release", "override", "aoverride", "clear_override",
        "aclear_override", "effective", "aeffective", "guard", "partitions", "partition",
    ):  # fmt: skip
        callables[name] = getattr(Semaphore, name)
    for name in ("refresh", "arefresh", "release", "arelease", "handoff", "adopt", "aadopt"):
        callables[name] = getattr(Lease, name)
    records = {
        "Holder": Holder,
        "Waiter": Waiter,
        "PartitionStatus": PartitionStatus,
        "Effective": Effective,
        "Recent": Recent,
    }
    try:
        from django_semaphore.contrib.celery import semaphore_task

        callables["semaphore_task"] = semaphore_task
    except ImportError:  # the celery extra is not installed
        pass
    return callables, records


def _parameters(target):
    import inspect

    parameters = list(inspect.signature(target).parameters.values())
    if parameters and parameters[0].name in ("self", "cls"):
        parameters = parameters[1:]
    return parameters


def _literal_value(node):
    if isinstance(node, ast.Constant):
        return node.value
    if (
        isinstance(node, ast.UnaryOp)
        and isinstance(node.op, ast.USub)
        and isinstance(node.operand, ast.Constant)
    ):
        return -node.operand.value
    raise ValueError("not a constant")


def _shown_parameters(params):
    """``[(name, kind, default or Ellipsis or NO_DEFAULT)]`` of a parameter list as the docs show
    it, or None when it is not one (a call with an expression, a string...)."""
    import inspect

    try:
        tree = ast.parse(f"def _({params}): pass")
    except SyntaxError:
        return None
    args = tree.body[0].args
    if args.vararg or args.kwarg or args.posonlyargs:
        return None
    shown = []
    positional = args.args
    first_default = len(positional) - len(args.defaults)
    try:
        for i, arg in enumerate(positional):
            default = (
                _literal_value(args.defaults[i - first_default])
                if i >= first_default
                else inspect.Parameter.empty
            )
            shown.append((arg.arg, inspect.Parameter.POSITIONAL_OR_KEYWORD, default))
        for arg, default in zip(args.kwonlyargs, args.kw_defaults, strict=True):
            value = inspect.Parameter.empty if default is None else _literal_value(default)
            shown.append((arg.arg, inspect.Parameter.KEYWORD_ONLY, value))
    except ValueError:
        return None
    return shown, bool(args.kwonlyargs) or "*" in params


def _plain(parameters):
    """A parameter list as the docs write it: names and defaults, no annotations."""
    import inspect

    out, starred = [], False
    for p in parameters:
        if p.kind is inspect.Parameter.KEYWORD_ONLY and not starred:
            out.append("*")
            starred = True
        out.append(p.name if p.default is inspect.Parameter.empty else f"{p.name}={p.default!r}")
    return ", ".join(out)


def signature_problems(text, callables, records):
    """What is wrong with the signatures and calls of public callables shown in ``text``."""
    import inspect

    problems = []
    for match in SIGNATURE_LITERAL.finditer(text):
        name, params = match.group("name"), " ".join(match.group("params").split())
        literal = " ".join(match.group(0).split())
        if name in records:
            fields = list(records[name]._fields)
            names = [p.strip() for p in params.split(",")]
            if params and all(re.fullmatch(r"\w+", n) for n in names) and names != fields:
                problems.append(f"{literal}: {name}'s fields are ({', '.join(fields)})")
            continue
        if name not in callables or not params.strip():
            continue
        parsed = _shown_parameters(params)
        if parsed is None:
            continue
        shown, starred = parsed
        real = {p.name: p for p in _parameters(callables[name])}
        keywords = [(n, k, d) for n, k, d in shown if d is not inspect.Parameter.empty]
        unknown = [n for n, _, _ in keywords if n not in real]
        if unknown:
            problems.append(f"{literal}: {name}() has no parameter {', '.join(unknown)}")
            continue
        same = [n for n, _, d in keywords if d is not Ellipsis and d == real[n].default]
        differ = [n for n, _, d in keywords if d is not Ellipsis and d != real[n].default]
        if not (starred or same) or differ:
            continue  # a call, not a signature
        expected = [(p.name, p.kind, p.default) for p in real.values()]
        got = [(n, k, real[n].default if d is Ellipsis and n in real else d) for n, k, d in shown]
        if got != expected:
            problems.append(f"{literal}: the code's signature is {name}({_plain(real.values())})")
    return problems


def test_signature_checker_tells_signatures_from_calls():
    callables, records = _public_callables()
    good = "``semaphore.guard(key=None, wait=None, meta=None, refresh=None, permits=1, priority=0)``"
    calls = (
        "``acquire(wait=30)`` ``@semaphore(name, permits=...)`` ``Lease.adopt(ticket)`` ``hold(key=str(x))``"
    )
    assert signature_problems(good + calls, callables, records) == []
    assert signature_problems("``guard(key=None, wait=None, meta=None, refresh=None)``", callables, records)
    assert signature_problems(
        "``Semaphore(name, limit=..., timeout=60, wait=0, algorithm='lua')``", callables, records
    )
    assert signature_problems("``acquire(ttl=5)``", callables, records)
    assert signature_problems("``Holder(identifier, token, meta)``", callables, records)


def test_every_signature_shown_is_the_codes():
    callables, records = _public_callables()
    problems = []
    for path in _rst_files():
        problems += [
            f"{os.path.relpath(path, ROOT)}: {p}" for p in signature_problems(_read(path), callables, records)
        ]
    assert problems == [], "\n".join(problems)


# -- the checks' sample output, the options, the modules -------------------------------------

#: The settings of docs/checks.rst's two samples.
BOOT_SAMPLE_SEMAPHORES = {"reports": {"LIMT": 2, "TIMEOUT": 60}}
CHECK_SAMPLE_SEMAPHORES = {"reports": {"LIMIT": 2, "ALGORITHM": "fair"}}


def _normalised(text):
    """``text`` with object addresses and runs of blank space made comparable."""
    text = re.sub(r"0x[0-9a-f]+", "0x…", text)
    return "\n".join(" ".join(line.split()) for line in text.strip().splitlines())


def _text_blocks(path):
    return [_normalised(block) for block in code_blocks(_read(path), "text")]


def boot_sample(settings):
    """What every server and command prints when a SEMAPHORES entry fails a check at start."""
    from django.core.exceptions import ImproperlyConfigured

    from django_semaphore.apps import refuse_bad_settings

    settings.SEMAPHORES = BOOT_SAMPLE_SEMAPHORES
    with pytest.raises(ImproperlyConfigured) as info:
        refuse_bad_settings()
    return f"django.core.exceptions.ImproperlyConfigured: {info.value}"


def check_sample(settings):
    """What ``manage.py check`` prints for a warning and a mistyped ``@semaphore`` name (E027)."""
    import types
    from io import StringIO
    from unittest import mock

    from django.core import checks
    from django.core.management.base import BaseCommand, SystemCheckError
    from django.http import HttpResponse
    from django.urls import path

    from django_semaphore import semaphore

    views = types.ModuleType("myproject.views")
    urls = types.ModuleType("myproject.urls")

    def export(request):
        return HttpResponse("ok")

    export.__module__, export.__qualname__ = "myproject.views", "export"
    views.export = semaphore("report")(export)
    urls.urlpatterns = [path("exports/", views.export)]
    saved = {name: sys.modules.get(name) for name in ("myproject", "myproject.views", "myproject.urls")}
    sys.modules.update(
        {"myproject": types.ModuleType("myproject"), "myproject.views": views, "myproject.urls": urls}
    )
    try:
        settings.SEMAPHORES = CHECK_SAMPLE_SEMAPHORES
        settings.ROOT_URLCONF = "myproject.urls"
        ours = [m for m in checks.run_checks() if (m.id or "").startswith("django_semaphore.")]
        command = BaseCommand(stdout=StringIO(), stderr=StringIO())
        with (
            mock.patch("django.core.management.base.checks.run_checks", return_value=ours),
            pytest.raises(SystemCheckError) as info,
        ):
            command.check(display_num_errors=True)
    finally:
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module
    return str(info.value)  # "SystemCheckError: System check identified some issues: ..."


def test_the_checks_samples_are_what_the_code_prints(settings):
    blocks = _text_blocks(os.path.join(DOCS, "checks.rst"))
    for sample in (boot_sample(settings), check_sample(settings)):
        print(sample, end="\n\n")
        assert _normalised(sample) in blocks, (
            f"docs/checks.rst should show, in a ``.. code-block:: text``, what the code prints:\n{sample}"
        )


def test_the_settings_at_a_glance_list_every_option_with_its_default():
    glance = next(
        b for b in code_blocks(_read(os.path.join(DOCS, "settings.rst")), "python") if "SEMAPHORES = {" in b
    )
    namespace = {}
    exec(glance, namespace)
    (entry,) = namespace["SEMAPHORES"].values()
    assert sorted(entry) == sorted(validation.ENTRY_OPTIONS)
    shown = {option: value for option, value in entry.items() if option != "LIMIT"}
    assert shown == validation.ENTRY_DEFAULTS, "docs/settings.rst's first SEMAPHORES shows other defaults"


def test_checks_reference_lists_every_check_id_and_no_other():
    source = ""
    for directory, _, files in os.walk(os.path.join(ROOT, "django_semaphore")):
        source += "".join(_read(os.path.join(directory, f)) for f in files if f.endswith(".py"))
    ids = set(re.findall(r"django_semaphore\.([EWI]\d{3})\b", source))
    table = set(re.findall(r"^([EWI]\d{3}) ", _read(os.path.join(DOCS, "checks.rst")), re.M))
    assert sorted(table - ids) == [], "docs/checks.rst lists ids the code does not have"
    assert sorted(ids - table) == [], "docs/checks.rst lacks these ids"


def _architecture_map():
    """The paths (relative to django_semaphore/) docs/architecture.rst's module map names."""
    text = _read(os.path.join(DOCS, "architecture.rst"))
    table = text[text.index("\nLayers\n") : text.index("One engine, two drivers")]
    return set(re.findall(r"``([\w/]+(?:\.py|/))``", table))


def _package_modules(package):
    """What the map must name: every module of ``package`` by its path, a folder of code (whose
    ``__init__.py`` it stands for) by its path and a trailing slash, migrations/ as a whole."""
    wanted = set()
    for path in package.rglob("*.py"):
        relative = path.relative_to(package).as_posix()
        if relative.startswith("migrations/"):
            wanted.add("migrations/")
        elif path.name == "__init__.py" and path.parent != package:
            wanted.add(path.parent.relative_to(package).as_posix() + "/")
        else:
            wanted.add(relative)
    return wanted


def test_the_architecture_map_is_the_tree():
    from pathlib import Path

    package = Path(ROOT) / "django_semaphore"
    named, wanted = _architecture_map(), _package_modules(package)
    assert sorted(wanted - named) == [], "docs/architecture.rst's module map lacks these"
    gone = sorted(name for name in named - wanted if not (package / name).exists())
    assert gone == [], "docs/architecture.rst's module map names modules the package lacks"
    data = ("templates/", "static/", "scripts/")
    others = sorted(name for name in named - wanted if not name.startswith(data))
    assert others == [], "named in the map, but neither a module nor a data folder"


def test_the_map_stands_a_folder_for_its_init_and_migrations_for_all(tmp_path):
    files = ("__init__.py", "apps.py", "engine/__init__.py", "engine/semaphore.py", "migrations/0001_x.py")
    for name in files:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).touch()
    wanted = {"__init__.py", "apps.py", "engine/", "engine/semaphore.py", "migrations/"}
    assert _package_modules(tmp_path) == wanted


def test_the_metrics_reference_lists_every_metric_the_code_exports():
    source = _read(os.path.join(ROOT, "django_semaphore", "ops", "metrics", "__init__.py"))
    code = set(re.findall(r"[\"'](django_semaphore_\w+)[\"']", source))
    code = {name.removesuffix("_total") for name in code}  # prometheus-client adds _total to counters
    table = {
        name.removesuffix("_total")
        for name in re.findall(r"^``(django_semaphore_\w+)", _read(os.path.join(DOCS, "metrics.rst")), re.M)
    }
    assert code, "no metric names found in django_semaphore/metrics"
    assert sorted(code - table) == [], "docs/metrics.rst lacks these metrics"
    assert sorted(table - code) == [], "docs/metrics.rst lists metrics the code does not export"
