"""The README (PyPI's front page) and the Sphinx site under docs/.

``make docs`` builds the site with ``-W``, so a broken reference or docstring
fails there; these tests cover what Sphinx does not see: the README's size,
that docutils alone renders it (PyPI has no Sphinx), the commands and links
it must keep, that the reference pages list every setting and check the code
has, and that the examples are valid Python and do what they say.
"""

import ast
import json
import os
import re
import subprocess
import sys
import textwrap

import pytest

from django_semaphore import conf, validation
from tests.helpers import ROOT

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


def test_checks_reference_lists_every_check_id():
    source = ""
    for directory, _, files in os.walk(os.path.join(ROOT, "django_semaphore")):
        source += "".join(_read(os.path.join(directory, f)) for f in files if f.endswith(".py"))
    ids = set(re.findall(r"django_semaphore\.([EW]\d{3})\b", source))
    assert ids, "no check ids found in the package"
    table = set(re.findall(r"^([EW]\d{3}) ", _read(os.path.join(DOCS, "checks.rst")), re.M))
    assert sorted(ids - table) == [], "docs/checks.rst lacks these check ids"


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
