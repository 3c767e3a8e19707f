"""``manage.py sema_status [NAME]``: the semaphores' figures (and with NAME, its holders).

The terminal twin of the admin pages: the configured semaphores, then the
ad-hoc ones in use (LIMIT FROM "ad hoc").  A semaphore with TOTAL has a line
``(total)`` first: the total in force in the LIMIT column and every partition's
use together, then one line per partition that holds permits or has waiters.  Exit codes: 0 done, 1 Redis
failed, 2 NAME is neither in SEMAPHORES nor an ad-hoc semaphore in use (or ``--max-partitions``
is below 1).
"""

from __future__ import annotations

from argparse import ArgumentParser
from collections.abc import Collection, Sequence
from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from ... import semaphores
from ...exceptions import SemaphoreBackendError
from ...ops import monitor


def format_table(headers: Sequence[str], rows: Sequence[Sequence[Any]], right: Collection[int] = ()) -> str:
    """Plain-text columns; indexes in ``right`` are right-aligned."""
    rows = [[str(cell) for cell in row] for row in rows]
    widths = [max([len(h), *(len(r[i]) for r in rows)]) for i, h in enumerate(headers)]

    def line(cells: Sequence[str]) -> str:
        out = [
            c.rjust(w) if i in right else c.ljust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ]
        return "  ".join(out).rstrip()

    return "\n".join([line(headers), line(["-" * w for w in widths]), *map(line, rows)])


META_COLUMNS = ("user", "method", "path", "remote_addr", "host", "pid")
#: The PARTITION cell of a TOTAL semaphore's line for the whole name.
TOTAL_ROW = "(total)"


class Command(BaseCommand):
    help = (
        "Show every semaphore with its live partitions: limit, in use, free, waiting, the mode "
        "in force and where the limit comes from (settings, override, adaptive; 'ad hoc' for a "
        "semaphore made in code without a SEMAPHORES entry, listed while it has live partitions). "
        "A semaphore with TOTAL has a '(total)' line first: the total in force and the use of all "
        "its partitions together. "
        "With NAME, also that semaphore's holders in token order (token, acquired, expires in, meta)."
    )

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument(
            "name",
            nargs="?",
            metavar="NAME",
            help="A semaphore from SEMAPHORES (or an ad-hoc one in use) whose holders to list. "
            "Default: none (the table only).",
        )
        parser.add_argument(
            "--max-partitions",
            type=int,
            default=monitor.MAX_PARTITIONS,
            help="Partitions listed per semaphore, busiest first (an int >= 1). "
            f"Default: {monitor.MAX_PARTITIONS}.",
        )

    def handle(
        self,
        *args: Any,
        name: str | None = None,
        max_partitions: int = monitor.MAX_PARTITIONS,
        **options: Any,
    ) -> None:
        try:
            monitor.checked_max_partitions(max_partitions)
        except ValueError as exc:
            raise CommandError(f"--max-partitions: {exc}", returncode=2)
        try:
            if name is not None and name not in semaphores and monitor.find_ad_hoc(name) is None:
                raise CommandError(
                    f"Unknown semaphore {name!r}: not in SEMAPHORES (which has: "
                    f"{', '.join(map(repr, semaphores)) or 'none'}), nor an ad-hoc semaphore in use.",
                    returncode=2,
                )
            if name is None:
                views = monitor.read_all(max_partitions)
            else:
                views = [monitor.read_semaphore(name, None, max_partitions, with_holders=True)]
        except SemaphoreBackendError as exc:
            raise CommandError(str(exc), returncode=1)
        self.stdout.write(self.summary(views))
        if name is not None:
            self.stdout.write("")
            self.stdout.write(self.holders(views[0]))

    def summary(self, views: list[monitor.SemaphoreSummary]) -> str:
        rows: list[list[object]] = []
        for view in views:
            name = self.shown_name(view)
            if view.error:
                rows.append([name, f"error: {view.error}", "", "", "", "", "", ""])
                continue
            in_force = [view.mode, self.source(view)]
            whole = view.whole
            if whole is not None:
                rows.append(
                    [name, TOTAL_ROW, whole.limit, whole.in_use, whole.free, whole.waiting, *in_force]
                )
            elif not view.partitions:
                rows.append([name, "(no live partition)", view.limit, 0, view.limit, 0, *in_force])
            for partition in view.partitions:
                label = "-" if partition.unpartitioned else partition.label[:40]
                figures = [partition.limit, partition.in_use, partition.free, partition.waiting]
                rows.append([name, label, *figures, *in_force])
            if view.hidden:
                rows.append([name, f"(+{view.hidden} more partitions)", "", "", "", "", "", ""])
        headers = ["SEMAPHORE", "PARTITION", "LIMIT", "IN USE", "FREE", "WAITING", "MODE", "LIMIT FROM"]
        return format_table(headers, rows, right={2, 3, 4, 5})

    @staticmethod
    def shown_name(view: monitor.SemaphoreSummary) -> str:
        """The name for a table cell: an ad-hoc semaphore's (made in code, perhaps from
        data) on one line, and cut."""
        if not view.ad_hoc:
            return view.name
        name = view.name if view.name.isprintable() else repr(view.name)[1:-1]
        return name if len(name) <= 60 else name[:59] + "…"

    @staticmethod
    def source(view: monitor.SemaphoreSummary) -> str:
        """Where the limit in force comes from, with what settings say when they are overridden."""
        if view.ad_hoc:
            return "ad hoc"
        if view.source == "override":
            total = "" if view.settings_total is None else f" total {view.settings_total}"
            return f"override (settings: {view.settings_limit} {view.settings_mode}{total})"
        if view.source == "adaptive" and view.adaptive_bounds is not None:
            low, high = view.adaptive_bounds
            probing = ", probing" if view.adaptive is not None and view.adaptive.probing else ""
            return f"adaptive [{low}, {high}]{probing}"
        return view.source

    def holders(self, view: monitor.SemaphoreSummary) -> str:
        now = timezone.now()
        blocks = []
        whole = view.whole
        if whole is not None:
            blocks.append(
                f"All partitions: {whole.in_use} of {whole.limit} (TOTAL) in use, {whole.waiting} waiting"
            )
        for partition in view.partitions:
            title = "Holders" if partition.unpartitioned else f"Partition {partition.label}"
            rows = [
                [
                    holder.token,
                    holder.acquired_at.strftime("%Y-%m-%d %H:%M:%S") if holder.acquired_at else "",
                    f"{monitor.expires_in(holder, now)} s",
                    *(str(holder.meta.get(field) or "") for field in META_COLUMNS),
                ]
                for holder in partition.holders
            ]
            headers = [
                "TOKEN",
                "ACQUIRED (UTC)",
                "EXPIRES IN",
                "USER",
                "METHOD",
                "PATH",
                "REMOTE",
                "HOST",
                "PID",
            ]
            body = format_table(headers, rows, right={0, 2, 8}) if rows else "(no holders)"
            figures = f"{partition.in_use} of {partition.limit} in use, {partition.waiting} waiting"
            blocks.append(f"{title}: {figures}\n{body}")
        if not view.partitions:
            blocks.append("(no live partition)")
        return "\n\n".join(blocks)
