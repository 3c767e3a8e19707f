"""``manage.py sema_set NAME [--limit N] [--mode MODE] [--total N] [--clear]``: a runtime override.

Sets (or with ``--clear`` removes) the override of a semaphore's LIMIT,
MODE and TOTAL kept in Redis, which every process applies within a second (see
:meth:`django_semaphore.Semaphore.override`), and prints the effective values
before and after (the total too, for a semaphore with TOTAL)::

    $ python manage.py sema_set reports --limit 0
    reports: limit 2 -> 0, mode enforce -> enforce (source settings -> override).
    $ python manage.py sema_set exports --total 4
    exports: limit 2 -> 2, mode enforce -> enforce, total 8 -> 4 (source settings -> override).

Every argument is checked before anything is written: a bad one changes
nothing.  Exit codes: 0 done, 1 Redis failed, 2 bad arguments (an unknown
NAME, a limit or total that is not ASCII digits for a number from 0 to
1,000,000, a total for a semaphore without TOTAL, an unknown mode, no option,
or ``--clear`` with ``--limit`` / ``--mode`` / ``--total``).
"""

from __future__ import annotations

from argparse import ArgumentParser
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from ... import semaphores
from ...config.validation import MAX_LIMIT, MODES, limit_from_text
from ...exceptions import SemaphoreBackendError
from ...ops import monitor
from ...runtime.control import Effective


def parse_limit(text: str, what: str = "--limit") -> int:
    """``text`` as a limit (or total): ASCII digits for a number from 0 (0 pauses) to
    MAX_LIMIT; CommandError (exit code 2, naming the option ``what``) otherwise."""
    try:
        return limit_from_text(text, what=what)
    except ValueError as exc:
        raise CommandError(str(exc), returncode=2) from None


def describe(old: Effective, new: Effective) -> str:
    """The change from ``old`` to ``new``: limit and mode, and the total of a semaphore with TOTAL."""
    text = monitor.describe_change(old, new)
    if (old.total is not None or new.total is not None) and "total" not in text:
        text += f", total {old.total} -> {new.total}"
    return text


class Command(BaseCommand):
    help = (
        "Override a semaphore's LIMIT, MODE and/or TOTAL at run time, for every process (applied within a "
        "second, kept in Redis until cleared), or remove the override with --clear. Prints the "
        "effective values before and after. Nothing is written if an argument is wrong."
    )

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("name", metavar="NAME", help="A semaphore from SEMAPHORES.")
        parser.add_argument(
            "--limit",
            metavar="N",
            help=f"Slots per partition from now on: a whole number from 0 to {MAX_LIMIT:,} (digits "
            "0-9 only); 0 pauses the semaphore (new callers are refused with reason 'paused', "
            "holders keep their slots). Default: unchanged.",
        )
        parser.add_argument(
            "--mode",
            metavar="MODE",
            help=f"One of {', '.join(MODES)}. Default: unchanged.",
        )
        parser.add_argument(
            "--total",
            metavar="N",
            help=f"Permits across all partitions from now on, for a semaphore with TOTAL: a whole "
            f"number from 0 to {MAX_LIMIT:,} (digits 0-9 only); 0 pauses every partition. "
            "Default: unchanged.",
        )
        parser.add_argument(
            "--clear",
            action="store_true",
            help="Remove the override: LIMIT, MODE and TOTAL come from settings again. Default: off.",
        )

    def handle(self, *args: Any, name: str, clear: bool = False, **options: Any) -> None:
        limit: str | None = options.get("limit")
        mode: str | None = options.get("mode")
        total: str | None = options.get("total")
        if name not in semaphores:
            raise CommandError(
                f"Unknown semaphore {name!r}. SEMAPHORES has: {', '.join(map(repr, semaphores)) or 'none'}.",
                returncode=2,
            )
        if clear and (limit is not None or mode is not None or total is not None):
            raise CommandError(
                "--clear removes the whole override: give it without --limit, --mode and --total.",
                returncode=2,
            )
        if not clear and limit is None and mode is None and total is None:
            raise CommandError(
                "Nothing to do: give --limit N, --mode MODE, --total N, or --clear.", returncode=2
            )
        new_limit = None if limit is None else parse_limit(limit)
        new_total = None if total is None else parse_limit(total, what="--total")
        if mode is not None and mode not in MODES:
            raise CommandError(f"--mode must be one of {', '.join(MODES)}, not {mode!r}.", returncode=2)
        sem = semaphores[name]
        if new_total is not None and sem.config.total is None:
            raise CommandError(
                f"--total: semaphore {name!r} has no TOTAL (set TOTAL, with KEY, in its SEMAPHORES "
                "entry to bound all its partitions together).",
                returncode=2,
            )
        try:
            old = sem.effective()
            new = sem.clear_override() if clear else sem.override(limit=new_limit, mode=mode, total=new_total)
        except ValueError as exc:  # the engine's own validation: nothing was written
            raise CommandError(str(exc), returncode=2) from exc
        except SemaphoreBackendError as exc:
            raise CommandError(str(exc), returncode=1) from exc
        self.stdout.write(f"{name}: {describe(old, new)} (source {old.source} -> {new.source}).")
