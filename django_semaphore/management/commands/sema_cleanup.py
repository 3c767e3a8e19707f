"""``manage.py sema_cleanup``: remove expired entries from every semaphore partition.

A semaphore with TOTAL keeps all its partitions in one set of keys: they are
cleaned at once, with one script.

Exit codes: 0 done (whether or not anything was removed), 1 Redis failed,
2 a ``--semaphore`` name is neither in SEMAPHORES nor an ad-hoc semaphore in
use (or the arguments are wrong).
"""

from __future__ import annotations

from argparse import ArgumentParser
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from ... import semaphores
from ...backend.keys import name_hash
from ...engine import discovery
from ...exceptions import SemaphoreBackendError
from ...ops import monitor
from ...runtime import adhoc


class Command(BaseCommand):
    help = (
        "Remove expired holder entries from every semaphore and partition in Redis (found with SCAN "
        "on every primary, never KEYS). Live holders are never touched, so it is safe to run while "
        "traffic flows: an entry is expired on the clock that wrote it (Redis's for ALGORITHM 'lua', "
        "this machine's for the Redis in Action variants). Ad-hoc semaphores (made in code without a "
        "SEMAPHORES entry) are cleaned with their recorded algorithm, and the records of those no "
        "longer in use are removed. Semaphores found under SEMAPHORE_KEY_PREFIX that are no longer in "
        "SEMAPHORES are cleaned too, removing only entries that have ended on both clocks. The last "
        "line, 'Removed N expired entries from M semaphores.', counts as M every semaphore examined, "
        "whether or not it had keys in Redis."
    )

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument(
            "--semaphore",
            action="append",
            dest="names",
            metavar="NAME",
            help="Clean only this semaphore from SEMAPHORES (or ad-hoc semaphore in use); repeat for "
            "several. Default: every configured semaphore and every semaphore found under "
            "SEMAPHORE_KEY_PREFIX.",
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
        verb = "would remove" if dry_run else "removed"
        total = examined = 0
        try:
            if names:
                names = list(dict.fromkeys(names))
                unknown = [name for name in names if name not in semaphores and not self.in_use(name)]
                if unknown:
                    raise CommandError(
                        f"Unknown semaphore(s): {', '.join(map(repr, unknown))}: not in SEMAPHORES "
                        f"(which has: {', '.join(map(repr, semaphores)) or 'none'}), nor ad-hoc "
                        "semaphores in use.",
                        returncode=2,
                    )
            groups = discovery.find(names or None)
            unconfigured = [group for group in groups if not group.configured]
            recorded = monitor.ad_hoc_entries() if unconfigured else {}
            for found in groups:
                entry = None if found.configured else recorded.get(self.digest(found))
                algorithm = entry.algorithm if entry is not None else None
                removed = monitor.cleanup(found, dry_run=dry_run, algorithm_name=algorithm)
                total += removed
                examined += 1
                if verbosity >= 2:
                    self.stdout.write(
                        f"{self.label(found, entry)}: {verb} {removed} expired entries {self.where(found)}."
                    )
            if not names:  # a full sweep: the records of ad-hoc semaphores no longer in use go
                live = {self.digest(found) for found in groups if found.partitions}
                pruned = monitor.prune_ad_hoc(live, dry_run=dry_run)
                if pruned and verbosity >= 2:
                    self.stdout.write(f"{verb.capitalize()} {pruned} unused ad-hoc semaphore records.")
        except SemaphoreBackendError as exc:
            raise CommandError(f"{exc} (after {examined} semaphores, {total} entries).", returncode=1)
        # Always this exact form (no singulars), so scripts can parse it.
        self.stdout.write(f"{verb.capitalize()} {total} expired entries from {examined} semaphores.")

    @staticmethod
    def in_use(name: str) -> bool:
        """Whether ``name`` is an ad-hoc semaphore recorded in use (by its whole name)."""
        entry = monitor.find_ad_hoc(name)
        return entry is not None and entry.name == name

    @staticmethod
    def digest(found: discovery.Found) -> str:
        return found.partitions[0].name_digest if found.partitions else name_hash(found.name)

    @staticmethod
    def where(found: discovery.Found) -> str:
        """From which keys: ``"from 3 partitions"``; a TOTAL name's partitions share
        one set of keys, cleaned at once: ``"from all partitions (TOTAL)"``."""
        shared = sum(1 for keys in found.partitions if keys.shared)
        own = len(found.partitions) - shared
        if shared and not own:
            return "from all partitions (TOTAL)"
        if shared:
            return f"from {own} partitions and all partitions under TOTAL"
        return f"from {own} partitions"

    @staticmethod
    def label(found: discovery.Found, entry: adhoc.Entry | None) -> str:
        if found.configured:
            return found.name
        if entry is not None:
            return f"{Command.shown(entry.name)} (ad hoc)"
        return f"{found.name} (not in SEMAPHORES)"

    @staticmethod
    def shown(name: str) -> str:
        """An ad-hoc semaphore's name on one line, cut (it is made in code, perhaps from data)."""
        name = name if name.isprintable() else repr(name)[1:-1]
        return name if len(name) <= 60 else name[:59] + "…"
