"""``.. django-command:: NAME``: a management command's usage and options, read from its parser.

The reference of the commands (docs/commands.rst) is generated from the code, so an option
added, renamed or given another default shows up in the docs at the next build: the usage
line, then each of the command's own options with its ``help=`` (which names its default).
Django's common options (``--verbosity``, ``--settings``...) are left out.
"""

from __future__ import annotations

import argparse

from django.core.management import load_command_class
from docutils import nodes
from docutils.statemachine import StringList
from sphinx.util.docutils import SphinxDirective

#: Options every management command has (BaseCommand.create_parser), listed once in prose.
COMMON = {
    "help", "version", "verbosity", "settings", "pythonpath", "traceback", "no_color", "force_color",
    "skip_checks",
}  # fmt: skip


def _invocation(action: argparse.Action) -> str:
    if not action.option_strings:
        return action.metavar or action.dest.upper()
    names = ", ".join(action.option_strings)
    if action.nargs == 0:
        return names
    return f"{names} {action.metavar or action.dest.upper()}"


def _usage(action: argparse.Action) -> str:
    if not action.option_strings:
        shown = str(action.metavar or action.dest.upper())
        return f"[{shown}]" if action.nargs in ("?", "*") else shown
    shown = f"[{_invocation(action).split(', ')[-1]}]"
    return shown + "..." if isinstance(action, argparse._AppendAction) else shown


class DjangoCommand(SphinxDirective):
    required_arguments = 1
    has_content = False

    def run(self) -> list[nodes.Node]:
        name = self.arguments[0]
        command = load_command_class("django_semaphore", name)
        parser = command.create_parser("manage.py", name)
        own = [a for a in parser._actions if a.dest not in COMMON]
        usage = " ".join(_usage(action) for action in own)
        lines = [".. code-block:: text", "", f"    python manage.py {name} {usage}".rstrip(), ""]
        lines += [" ".join((command.help or "").split()), ""]
        for action in own:
            lines += [f"``{_invocation(action)}``", f"    {' '.join((action.help or '').split())}", ""]
        container = nodes.container()
        generated = StringList(lines, source=f"{name} (generated)")
        self.state.nested_parse(generated, self.content_offset, container)
        return container.children


def setup(app):  # type: ignore[no-untyped-def]
    app.add_directive("django-command", DjangoCommand)
    return {"parallel_read_safe": True, "version": "1"}
