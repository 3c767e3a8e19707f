"""``manage.py sema_cleanup``: remove expired entries from every semaphore partition.

Exit codes: 0 done (whether or not anything was removed), 1 Redis failed,
2 a ``--semaphore`` name is not in SEMAPHORES (or the arguments are wrong).
"""

from __future__ import annotations

from argparse import ArgumentParser
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from django_semaphore import discovery, monitor, semaphores
from django_semaphore.exceptions import SemaphoreBackendError


class Command(BaseCommand):
    help = (
        "Remove expired holder entries from every semaphore and partition in Redis (found with SCAN "
        "on every primary, never KEYS). Live holders are never touched, so it is safe to run while "
        "traffic flows: an entry is expired on the clock that wrote it (Redis's for ALGORITHM 'lua', "
        "this machine's for the Redis in Action variants). Semaphores found under SEMAPHORE_KEY_PREFIX "
        "that are no longer in SEMAPHORES are cleaned too, removing only entries that have ended on "
        "both clocks. The last line, 'Removed N expired entries from M semaphores.', counts as M "
        "every semaphore examined, whether or not it had keys in Redis."
    )

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument(
            "--semaphore",
            action="append",
            dest="names",
            metavar="NAME",
            help="Clean only this semaphore from SEMAPHORES; repeat for several. Default: every "
            "configured semaphore and every semaphore found under SEMAPHORE_KEY_PREFIX.",
        )
        parser.add_argument(
            "--dry-run",
            action="store_true",
            help="Count the expired entries without removing them. Default: off (remove them).",
        )

    def handle(
        self,
        *args: Any,
        names: list[str] | None = None,
        dry_run: bool = False,
        verbosity: int = 1,
        **options: Any,
    ) -> None:
        if names:
            names = list(dict.fromkeys(names))
            unknown = [name for name in names if name not in semaphores]
            if unknown:
                raise CommandError(
                    f"Unknown semaphore(s): {', '.join(map(repr, unknown))}. "
                    f"SEMAPHORES has: {', '.join(map(repr, semaphores)) or 'none'}.",
                    returncode=2,
                )
        verb = "would remove" if dry_run else "removed"
        total = examined = 0
        try:
            for found in discovery.find(names or None):
                removed = monitor.cleanup(found, dry_run=dry_run)
                total += removed
                examined += 1
                if verbosity >= 2:
                    label = found.name if found.configured else f"{found.name} (not in SEMAPHORES)"
                    partitions = len(found.partitions)
                    self.stdout.write(
                        f"{label}: {verb} {removed} expired entries from {partitions} partitions."
                    )
        except SemaphoreBackendError as exc:
            raise CommandError(f"{exc} (after {examined} semaphores, {total} entries).", returncode=1)
        # Always this exact form (no singulars), so scripts can parse it.
        self.stdout.write(f"{verb.capitalize()} {total} expired entries from {examined} semaphores.")
