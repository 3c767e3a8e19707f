"""Sphinx configuration: ``make docs`` builds docs/_build/html with -W."""

import os
import sys

DOCS = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(DOCS))  # the project root: django_semaphore
sys.path.insert(0, DOCS)  # docs_settings
sys.path.insert(0, os.path.join(DOCS, "_ext"))  # djangocommands

# autodoc imports the package, which needs Django configured: a settings
# module of the docs' own (never the environment's: it may name a project
# whose settings want a database or a REDIS_URL).
os.environ["DJANGO_SETTINGS_MODULE"] = "docs_settings"

import django  # noqa: E402

django.setup()

import django_semaphore  # noqa: E402

project = "django-semaphore"
author = "the django-semaphore authors"
copyright = "the django-semaphore authors"
version = release = django_semaphore.__version__

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.viewcode",
    "djangocommands",  # docs/_ext: ``.. django-command::``, a command's options from its parser
]

# Offline and deterministic: no intersphinx (it would fetch inventories).
exclude_patterns = ["_build", "_ext"]
templates_path: list[str] = []
html_static_path: list[str] = []
html_theme = "furo"
html_title = f"django-semaphore {release}"
pygments_style = "sphinx"

autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_default_options = {"members": True}
# The package annotates with names it imports only for type checkers.
autodoc_type_aliases: dict[str, str] = {}
