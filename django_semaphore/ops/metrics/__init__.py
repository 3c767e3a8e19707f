"""Prometheus metrics: ``pip install "django-semaphore[prometheus]"``.

Once prometheus-client is installed, the app's ``ready()`` calls
:func:`install`, which connects receivers to the signals of
:mod:`django_semaphore.signals` (the only coupling to the rest of the app) and
registers, in prometheus-client's default registry:

=========================================== ========= =================================================
metric                                      type      labels and meaning
=========================================== ========= =================================================
``django_semaphore_limit``                  gauge     ``semaphore``: LIMIT per partition, from settings
``django_semaphore_effective_limit``        gauge     ``semaphore``: the limit in force (a runtime override's,
                                                      else LIMIT); 0 while paused
``django_semaphore_effective_total``        gauge     ``semaphore``: the total in force (a runtime override's,
                                                      else TOTAL), for semaphores with TOTAL only
``django_semaphore_mode``                   gauge     ``semaphore``, ``mode``: 1 for the mode in force
                                                      (enforce, dry_run, off), 0 for the others
``django_semaphore_override``               gauge     ``semaphore``: 1 while a runtime override is in force
``django_semaphore_holders``                gauge     ``semaphore``: permits held, all partitions
``django_semaphore_partition_holders_max``  gauge     ``semaphore``: permits held in the busiest partition
``django_semaphore_waiting``                gauge     ``semaphore``: callers queueing for a slot
``django_semaphore_partitions``             gauge     ``semaphore``: partitions with a holder or waiter
``django_semaphore_up``                     gauge     1 if Redis answered this scrape, else 0
``django_semaphore_acquisitions_total``     counter   ``semaphore``: slots granted
``django_semaphore_refusals_total``         counter   ``semaphore``: callers refused (SemaphoreFull)
``django_semaphore_dry_run_refusals_total`` counter   ``semaphore``: would-be refusals admitted in MODE
                                                      "dry_run" (or "off", for a direct acquire)
``django_semaphore_releases_total``         counter   ``semaphore``: leases released
``django_semaphore_lost_leases_total``      counter   ``semaphore``: leases found lost
``django_semaphore_backend_failures_total`` counter   ``server``: Redis failures (a cluster: as configured,
                                                      :func:`server_label`)
``django_semaphore_wait_seconds``           histogram ``semaphore``, ``outcome`` (acquired/refused)
=========================================== ========= =================================================

The gauges are read from Redis at scrape time (one SCAN for every
semaphore's partitions, then one status script per partition, sent in
pipelines of :data:`~django_semaphore.engine.inspection.BATCH`), so every
process reports the same figures.  A semaphore with TOTAL keeps all its
partitions in one set of keys: the partitions its gauges count are those
inside them that hold permits or have waiters (one more script per such
semaphore), and ``holders`` is then the use that its total bounds.  Refusals
for want of the total (reason "total") count in ``refusals_total`` like any
other (reasons are no label); the mode and effective limit come from the
runtime control every process applies (:meth:`~django_semaphore.Semaphore.effective`).
Counters and the histogram count what this process did.  Grants, refusals,
releases and waits are counted by the engine in this process's tally
(:mod:`django_semaphore.runtime.tally`, an integer added under a lock), which
:class:`TallyCollector` reads at scrape time: no receiver of ours listens to
``acquired`` or ``released``, whose sends then cost nothing, and an acquire
and release pay about a microsecond for their metrics instead of about ten
(updating prometheus-client's labelled counters and histogram from signal
receivers).  The rarer counters (dry-run refusals, lost leases, backend
failures) are prometheus-client counters fed by signals.  Under a
multi-process server set PROMETHEUS_MULTIPROC_DIR as prometheus-client
documents: each process then writes every counter to its own files
(prometheus-client's objects, fed by signal receivers, the tally off), and
:func:`metrics_view` aggregates them.

Dry-run refusals are a counter fed by the ``refused`` signal (``dry_run=True``),
like ``refusals_total``: Prometheus takes ``rate()`` / ``increase()`` over any
window it likes, and compares the two series directly; the admin's
five-minute figures (from :mod:`django_semaphore.runtime.stats`) would be a window
inside a window.  A dry-run refusal does not count in ``refusals_total`` nor
observe the wait histogram: the caller was admitted at once.

Partition values are never labels (one per IP or user would explode the
series); partitions are aggregated per semaphore.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Callable, Iterable, Iterator
from operator import attrgetter
from typing import TYPE_CHECKING, Any, cast

try:
    import prometheus_client
except ImportError as exc:  # pragma: no cover - the message is the point
    raise ImportError(
        'django_semaphore.metrics needs prometheus-client: pip install "django-semaphore[prometheus]"'
    ) from exc

from django.core.exceptions import ImproperlyConfigured
from django.http import HttpRequest, HttpResponse
from django.views.decorators.cache import never_cache
from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from ... import signals
from ...backend import connection
from ...config import settings
from ...config.validation import MODES
from ...engine import discovery
from ...engine.semaphore import semaphores as configured_semaphores
from ...exceptions import SemaphoreError
from ...runtime import tally
from ...runtime.tally import WAIT_BUCKETS

if TYPE_CHECKING:
    from ...engine.inspection import PartitionStatus
    from ...engine.semaphore import Lease, Semaphore
    from ...runtime.control import Effective

__all__ = ["SemaphoreCollector", "TallyCollector", "install", "metrics_view", "track"]

logger = logging.getLogger("django_semaphore")

_lock = threading.Lock()
_tracked: dict[str, Semaphore] = {}  # ad-hoc semaphores seen in this process, by name
MAX_AD_HOC = 100  # ad-hoc semaphore names reported one by one; the rest as OTHER
OTHER = "_other"


class _Metrics:
    """The counters of rare events, created once per process in one registry."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.dry_run_refusals = Counter(
            "django_semaphore_dry_run_refusals",
            'Would-be refusals admitted because the semaphore runs in MODE "dry_run".',
            ["semaphore"],
            registry=registry,
        )
        self.lost = Counter(
            "django_semaphore_lost_leases",
            "Leases found lost (expired, purged or force-released) by a refresh or release.",
            ["semaphore"],
            registry=registry,
        )
        self.backend_failures = Counter(
            "django_semaphore_backend_failures",
            "Redis failures (SemaphoreBackendError), by server.",
            ["server"],
            registry=registry,
        )


_ACQUISITIONS = ("django_semaphore_acquisitions", "Slots granted.")
_REFUSALS = ("django_semaphore_refusals", "Callers refused because no slot was free (SemaphoreFull).")
_RELEASES = ("django_semaphore_releases", "Leases released.")
_WAIT = ("django_semaphore_wait_seconds", "Seconds from asking for a slot to being granted or refused.")


class _Shared:
    """The counters and histogram of every acquire and release, as prometheus-client
    objects: under its multi-process mode only, where each process writes them to
    its own files (otherwise :class:`TallyCollector` reports the tally)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.acquisitions = Counter(*_ACQUISITIONS, ["semaphore"], registry=registry)
        self.refusals = Counter(*_REFUSALS, ["semaphore"], registry=registry)
        self.releases = Counter(*_RELEASES, ["semaphore"], registry=registry)
        self.wait = Histogram(*_WAIT, ["semaphore", "outcome"], buckets=WAIT_BUCKETS, registry=registry)


_metrics: _Metrics | None = None
_shared: _Shared | None = None


def _label(semaphore: Semaphore) -> str:
    """The ``semaphore`` label: the name, for configured and tracked semaphores.

    Ad-hoc semaphores beyond the first MAX_AD_HOC names (names made up at run
    time, say one per user) share the label OTHER, so the series stay bounded.
    Under prometheus-client's multi-process mode the first MAX_AD_HOC names of
    the whole server, the same in every process (:class:`SharedChoice`): the
    scrape adds up every process's series, and each process choosing its own
    first names made up to MAX_AD_HOC x processes of them.
    """
    name = semaphore.name
    if semaphore.ad_hoc and name not in _tracked:
        with _lock:
            if name not in _tracked:
                if not _chosen(name):
                    return OTHER
                # Remembered for the gauges too: ad-hoc semaphores are in no settings.
                _tracked[name] = semaphore
    return _printable(name)


def _chosen(name: str) -> bool:
    """Whether ad-hoc ``name`` (not tracked yet) gets a label of its own.  Under ``_lock``."""
    directory = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if directory:
        chosen = _shared_choice.choose(directory, name, MAX_AD_HOC)
        if chosen is not None:
            return chosen
    return len(_tracked) < MAX_AD_HOC


class SharedChoice:
    """The ad-hoc names labelled one by one under prometheus-client's multi-process mode:
    the first ``cap`` names that any process of the server used, the same in every process.

    They are kept in :data:`FILENAME` in PROMETHEUS_MULTIPROC_DIR (wiped with the
    counters' files at each start, as prometheus-client asks), one JSON string a
    line, read and appended to under an exclusive ``flock``: a process asks at the
    first use of each name (its answer for a chosen one is then remembered by the
    caller), and once the file holds ``cap`` names it never changes, so the process
    remembers them and asks no more.  None (the caller's per-process rule) where
    the file cannot be used: no ``fcntl`` (Windows), or an OSError.
    """

    FILENAME = "django_semaphore_ad_hoc_labels.jsonl"  # not *.db: no counter file of prometheus-client's

    def __init__(self) -> None:
        self.final: frozenset[str] | None = None  # the names, once there are ``cap`` of them

    def choose(self, directory: str, name: str, cap: int) -> bool | None:
        """Whether ``name`` is one of the first ``cap`` names (recorded now if there is room)."""
        if self.final is not None:
            return name in self.final
        try:
            import fcntl
        except ImportError:  # pragma: no cover - Windows
            return None
        try:
            with open(os.path.join(directory, self.FILENAME), "a+", encoding="utf-8") as file:
                fcntl.flock(file.fileno(), fcntl.LOCK_EX)  # released as the file closes
                file.seek(0)
                names = [json.loads(line) for line in file if line.strip()]
                if name in names:
                    return True
                if len(names) < cap:
                    file.write(json.dumps(name) + "\n")
                    file.flush()
                    return True
        except (OSError, ValueError):
            return None
        self.final = frozenset(names)
        return False


_shared_choice = SharedChoice()


_printables: dict[str, str] = {}


def _printable(name: str) -> str:
    # A label must be valid UTF-8: escape lone surrogates and the like.
    try:
        return _printables[name]
    except KeyError:
        label = name.encode("utf-8", "backslashreplace").decode("utf-8")
        if len(_printables) < 10 * MAX_AD_HOC:  # bounded: ad-hoc names are made up at run time
            _printables[name] = label
        return label


def _on_acquired(sender: Any, semaphore: Semaphore, lease: Lease, waited: float, **kwargs: Any) -> None:
    assert _shared is not None
    label = _label(semaphore)
    _shared.acquisitions.labels(label).inc()
    _shared.wait.labels(label, "acquired").observe(waited)


def _on_refused(
    sender: Any, semaphore: Semaphore, waited: float, dry_run: bool = False, **kwargs: Any
) -> None:
    assert _metrics is not None
    label = _label(semaphore)
    if dry_run:
        _metrics.dry_run_refusals.labels(label).inc()
        return
    if _shared is not None:  # else the tally counted it
        _shared.refusals.labels(label).inc()
        _shared.wait.labels(label, "refused").observe(waited)


def _on_released(sender: Any, semaphore: Semaphore, **kwargs: Any) -> None:
    assert _shared is not None
    _shared.releases.labels(_label(semaphore)).inc()


def _on_lease_lost(sender: Any, semaphore: Semaphore, **kwargs: Any) -> None:
    assert _metrics is not None
    _metrics.lost.labels(_label(semaphore)).inc()


def _on_backend_failed(sender: Any, server: str | None = None, **kwargs: Any) -> None:
    assert _metrics is not None
    _metrics.backend_failures.labels(server_label(server)).inc()


def server_label(server: str | None) -> str:
    """The ``server`` label of a backend failure at ``server`` (the error's description).

    A Redis Cluster is described by the nodes the client knows at the moment
    (``cluster 10.0.0.5:6379,10.0.0.6:6379,...``), which change with a failover
    or a resharding: as a label, every topology would start series of its own.
    A cluster is labelled by what SEMAPHORE_REDIS configures instead (the startup
    URL's ``cluster host:port``, never its password, or ``cache alias 'name'``),
    the same whatever the topology.  Other servers keep their description, already
    the configuration's: ``host:port``, ``unix:/path`` or ``sentinel service name``.
    """
    if not server:
        return "redis"
    if server.startswith("cluster "):
        try:
            return connection.configured_server(settings.setting("SEMAPHORE_REDIS"))
        except Exception:  # unusable settings: the failure is still counted
            return "cluster"
    return server


def track(*semaphores: Semaphore) -> None:
    """Report the gauges of these ad-hoc semaphores too.

    Configured semaphores (SEMAPHORES) are always reported, and an ad-hoc one
    as soon as this process has used it (the first MAX_AD_HOC names); call
    this for ad-hoc semaphores used only by other processes (e.g. Celery
    workers), or beyond that bound.
    """
    with _lock:
        for semaphore in semaphores:
            _tracked[semaphore.name] = semaphore


class SemaphoreCollector(Collector):
    """Gauges read from Redis at scrape time: limits, mode, holders, waiting, partitions."""

    def describe(self) -> Iterable[Metric]:
        # Declared without samples, so that registering never talks to Redis.
        return list(self._families())

    def _families(self) -> Iterator[GaugeMetricFamily]:
        yield GaugeMetricFamily(
            "django_semaphore_limit", "Slots per partition (LIMIT).", labels=["semaphore"]
        )
        yield GaugeMetricFamily(
            "django_semaphore_effective_limit",
            "Slots per partition in force: a runtime override's limit, else LIMIT (0: paused).",
            labels=["semaphore"],
        )
        yield GaugeMetricFamily(
            "django_semaphore_effective_total",
            "Permits across all partitions in force: a runtime override's total, else TOTAL "
            "(semaphores with TOTAL only).",
            labels=["semaphore"],
        )
        yield GaugeMetricFamily(
            "django_semaphore_mode",
            "1 for the mode in force (enforce, dry_run, off), 0 for the others.",
            labels=["semaphore", "mode"],
        )
        yield GaugeMetricFamily(
            "django_semaphore_override",
            "1 while a runtime override (sema_set, the admin, override()) is in force, else 0.",
            labels=["semaphore"],
        )
        yield GaugeMetricFamily(
            "django_semaphore_holders", "Permits held, summed over partitions.", labels=["semaphore"]
        )
        yield GaugeMetricFamily(
            "django_semaphore_partition_holders_max",
            "Permits held in the busiest partition (compare with the limit).",
            labels=["semaphore"],
        )
        yield GaugeMetricFamily(
            "django_semaphore_waiting",
            "Callers queueing for a slot, summed over partitions.",
            labels=["semaphore"],
        )
        yield GaugeMetricFamily(
            "django_semaphore_partitions", "Partitions with a holder or a waiter.", labels=["semaphore"]
        )
        yield GaugeMetricFamily("django_semaphore_up", "1 if Redis answered this scrape, else 0.")

    def semaphores(self) -> list[Semaphore]:
        """The semaphores reported: every configured one, then tracked ad-hoc ones."""
        _tally_by_label()  # the ad-hoc semaphores the tally counted are tracked from now on
        found: dict[str, Semaphore] = {}
        for semaphore in configured_semaphores.all():
            try:
                semaphore.config  # noqa: B018 - skip entries the checks report as broken
            except Exception:
                continue
            found[semaphore.name] = semaphore
        with _lock:
            for name, semaphore in _tracked.items():
                found.setdefault(name, semaphore)
        return list(found.values())

    def collect(self) -> Iterable[Metric]:
        families = list(self._families())
        limit, effective_limit, effective_total, mode, override, holders, busiest, waiting, partitions, up = (
            families
        )
        try:
            rows = read_partitions(self.semaphores())
        except (SemaphoreError, ImproperlyConfigured) as exc:
            # The scrape still answers (with up 0): the counters stay visible.
            logger.warning("Semaphore gauges not read from Redis: %s", exc)
            rows = None
        for semaphore, effective, statuses in rows or ():
            name = [_printable(semaphore.name)]
            limit.add_metric(name, semaphore.config.limit)
            effective_limit.add_metric(name, effective.limit)
            if effective.total is not None:
                effective_total.add_metric(name, effective.total)
            for each in MODES:
                mode.add_metric([*name, each], 1 if effective.mode == each else 0)
            override.add_metric(name, 1 if effective.source == "override" else 0)
            holders.add_metric(name, sum(s.in_use for s in statuses))
            busiest.add_metric(name, max((s.in_use for s in statuses), default=0))
            waiting.add_metric(name, sum(s.waiting for s in statuses))
            partitions.add_metric(name, sum(1 for s in statuses if s.in_use or s.waiting))
        up.add_metric([], 0 if rows is None else 1)
        return families


#: The label each tally row's counts were first reported under (by name; at most
#: tally.MAX_NAMES + 1 rows): a counter must never go down, so a name counted under
#: OTHER stays there when track() later gives it a label of its own (for its gauges).
_counted_as: dict[str | None, str] = {}


def _tally_by_label() -> dict[str, list[tally.Row]]:
    """This process's tally rows, by ``semaphore`` label (names beyond the bounds: OTHER,
    which several rows may share)."""
    rows: dict[str, list[tally.Row]] = {}
    for row in tally.rows():
        label = _counted_as.get(row.name)
        if label is None:
            label = OTHER if row.owner is None else _label(cast("Semaphore", row.owner))
            with _lock:
                _counted_as.setdefault(row.name, label)
        rows.setdefault(label, []).append(row)
    return rows


def _waits(rows: list[tally.Row], waits: Callable[[tally.Row], tuple[int, ...]]) -> list[tuple[str, float]]:
    """The histogram buckets of ``rows`` added up, cumulative as Prometheus counts them."""
    return _cumulative([sum(counts) for counts in zip(*map(waits, rows), strict=True)])


def _cumulative(counts: list[int]) -> list[tuple[str, float]]:
    total = 0
    buckets: list[tuple[str, float]] = []
    for bound, n in zip(WAIT_BUCKETS, counts, strict=True):
        total += n
        buckets.append((floatToGoString(bound), total))  # type: ignore[no-untyped-call]
    return buckets


class TallyCollector(Collector):
    """The acquisitions, refusals, releases and wait histogram of this process, read
    from its tally (:mod:`django_semaphore.runtime.tally`) at scrape time."""

    def describe(self) -> Iterable[Metric]:
        return self._families({})

    def collect(self) -> Iterable[Metric]:
        return self._families(_tally_by_label())

    @staticmethod
    def _families(by_label: dict[str, list[tally.Row]]) -> list[Metric]:
        acquisitions = CounterMetricFamily(*_ACQUISITIONS, labels=["semaphore"])
        refusals = CounterMetricFamily(*_REFUSALS, labels=["semaphore"])
        releases = CounterMetricFamily(*_RELEASES, labels=["semaphore"])
        wait = HistogramMetricFamily(*_WAIT, labels=["semaphore", "outcome"])
        for label, rows in by_label.items():
            acquisitions.add_metric([label], sum(row.acquired for row in rows))
            refused = sum(row.refused for row in rows)
            refusals.add_metric([label], refused)
            releases.add_metric([label], sum(row.released for row in rows))
            acquired_sum = sum(row.acquired_sum for row in rows)
            wait.add_metric([label, "acquired"], _waits(rows, attrgetter("acquired_waits")), acquired_sum)
            if refused:  # as a labelled histogram would: a series once observed
                refused_sum = sum(row.refused_sum for row in rows)
                wait.add_metric([label, "refused"], _waits(rows, attrgetter("refused_waits")), refused_sum)
        return [acquisitions, refusals, releases, wait]


def read_partitions(
    semaphores: list[Semaphore],
) -> list[tuple[Semaphore, Effective, list[PartitionStatus]]]:
    """``(semaphore, effective, [PartitionStatus, ...])`` for each semaphore, with one SCAN for all.

    The unpartitioned semaphore is always read (but for one with TOTAL); the
    partitions are those whose keys Redis holds, and for a semaphore with
    TOTAL those inside its keys that hold permits or have waiters.
    ``effective`` is the limit, mode and total in force.  Raises
    SemaphoreBackendError if Redis fails.
    """
    found = {group.name: group.partitions for group in discovery.find(s.name for s in semaphores)}
    rows = []
    for semaphore in semaphores:
        keys = discovery.expand(found.get(semaphore.name, ()))
        if semaphore.config.total is None:
            unpartitioned = semaphore.partition(None)
            keys = [unpartitioned, *(k for k in keys if k.base != unpartitioned.base)]
        rows.append((semaphore, semaphore.effective(), semaphore.statuses(keys)))
    return rows


def install(registry: CollectorRegistry | None = None) -> None:
    """Create the metrics in ``registry`` (default: prometheus-client's) and connect the signals.

    Called by the app's ``ready()`` when prometheus-client is installed; a
    second call does nothing.
    """
    global _metrics, _shared
    with _lock:
        if _metrics is not None:
            return
        registry = registry or prometheus_client.REGISTRY
        # The collector first: a scrape that fails to read Redis counts that
        # failure in the counters it reports.
        registry.register(SemaphoreCollector())
        _metrics = _Metrics(registry)
        if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
            # Each process writes its counts to its own files: prometheus-client's objects.
            _shared = _Shared(registry)
        else:
            registry.register(TallyCollector())
            tally.start()
    if _shared is not None:
        signals.acquired.connect(_on_acquired, dispatch_uid="django_semaphore.metrics.acquired")
        signals.released.connect(_on_released, dispatch_uid="django_semaphore.metrics.released")
    signals.refused.connect(_on_refused, dispatch_uid="django_semaphore.metrics.refused")
    signals.lease_lost.connect(_on_lease_lost, dispatch_uid="django_semaphore.metrics.lease_lost")
    signals.backend_failed.connect(_on_backend_failed, dispatch_uid="django_semaphore.metrics.backend_failed")


def scrape_registry() -> CollectorRegistry:
    """The registry the scrape view serves.

    The default registry, or, under prometheus-client's multi-process mode
    (PROMETHEUS_MULTIPROC_DIR), a fresh one aggregating every process's
    counters plus the Redis gauges.
    """
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess

        registry = CollectorRegistry()
        registry.register(SemaphoreCollector())
        multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
        return registry
    install()
    assert _metrics is not None
    return _metrics.registry


@never_cache
def metrics_view(request: HttpRequest) -> HttpResponse:
    """The Prometheus scrape endpoint (text format, or OpenMetrics if asked for).

    Not protected: route it where only your Prometheus can reach it, or wrap
    it, e.g. ``path("metrics/", staff_member_required(metrics_view))``.
    """
    encoder, content_type = choose_encoder(request.headers.get("Accept", ""))
    return HttpResponse(encoder(scrape_registry()), content_type=content_type)
