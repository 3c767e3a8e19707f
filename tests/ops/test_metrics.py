"""Prometheus metrics: scrape the endpoint with the test client, parse the text format."""

import subprocess
import sys
import threading

import pytest
from django.urls import include, path
from prometheus_client.parser import text_string_to_metric_families

from django_semaphore import Semaphore, SemaphoreBackendError, SemaphoreFull, semaphores
from django_semaphore.ops import metrics
from django_semaphore.ops.metrics import track
from django_semaphore.runtime import tally

# This module is also the URLconf of its tests (pytest.mark.urls below).
urlpatterns = [path("metrics/", include("django_semaphore.metrics.urls"))]

pytestmark = pytest.mark.urls(__name__)


@pytest.fixture(autouse=True)
def forget_ad_hoc_semaphores():
    """Other tests use hundreds of ad-hoc names: start each test with none tracked,
    and none in the tally (whose names are labelled in the order they were first counted,
    each row under the label it was first reported with)."""
    saved, counted = dict(metrics._tracked), dict(tally._counts)
    labelled = dict(metrics._counted_as)
    metrics._tracked.clear()
    tally._counts.clear()
    metrics._counted_as.clear()
    yield
    metrics._tracked.clear()
    metrics._tracked.update(saved)
    tally._counts.clear()
    tally._counts.update(counted)
    metrics._counted_as.clear()
    metrics._counted_as.update(labelled)


def scrape(client, accept=None):
    headers = {"HTTP_ACCEPT": accept} if accept else {}
    response = client.get("/metrics/", **headers)
    assert response.status_code == 200, response.content
    samples = {}
    for family in text_string_to_metric_families(response.content.decode()):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def value(samples, name, **labels):
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def delta(before, after, name, **labels):
    return value(after, name, **labels) - value(before, name, **labels)


@pytest.fixture
def configured(settings):
    settings.SEMAPHORES = {
        "reports": {"LIMIT": 2, "TIMEOUT": 5},
        "per-user": {"LIMIT": 3, "TIMEOUT": 5, "KEY": "user"},
    }


def test_gauges_read_from_redis_and_partitions_aggregated(client, configured):
    reports, per_user = semaphores["reports"], semaphores["per-user"]
    before = scrape(client)
    assert value(before, "django_semaphore_limit", semaphore="reports") == 2
    assert value(before, "django_semaphore_holders", semaphore="reports") == 0
    assert value(before, "django_semaphore_up") == 1

    held = [
        reports.acquire(),
        per_user.acquire("user:1"),
        per_user.acquire("user:1"),
        per_user.acquire("user:2"),
    ]
    assert all(held)
    after = scrape(client)
    assert value(after, "django_semaphore_limit", semaphore="per-user") == 3
    assert value(after, "django_semaphore_holders", semaphore="reports") == 1
    assert value(after, "django_semaphore_holders", semaphore="per-user") == 3
    assert value(after, "django_semaphore_partition_holders_max", semaphore="per-user") == 2
    assert value(after, "django_semaphore_partitions", semaphore="per-user") == 2
    assert value(after, "django_semaphore_waiting", semaphore="per-user") == 0
    for lease in held:
        lease.release()
    assert value(scrape(client), "django_semaphore_holders", semaphore="per-user") == 0


def test_counters_follow_the_signals(client, configured):
    reports = semaphores["reports"]
    before = scrape(client)
    a, b = reports.acquire(), reports.acquire()
    assert reports.acquire() is None  # refused
    a.release()
    reports.force_release(b.identifier)  # an operator takes b's slot away
    assert b.refresh() is False
    after = scrape(client)
    assert delta(before, after, "django_semaphore_acquisitions_total", semaphore="reports") == 2
    assert delta(before, after, "django_semaphore_refusals_total", semaphore="reports") == 1
    assert delta(before, after, "django_semaphore_releases_total", semaphore="reports") == 1
    assert delta(before, after, "django_semaphore_lost_leases_total", semaphore="reports") == 1
    assert (
        delta(before, after, "django_semaphore_wait_seconds_count", semaphore="reports", outcome="acquired")
        == 2
    )
    assert (
        delta(before, after, "django_semaphore_wait_seconds_count", semaphore="reports", outcome="refused")
        == 1
    )


def test_wait_histogram_buckets(client, configured):
    reports = semaphores["reports"]
    held = [reports.acquire(), reports.acquire()]
    before = scrape(client)
    assert reports.acquire(wait=0.3) is None  # queued 0.3 s, then refused

    # A waiter served when a holder releases: it waited until the release.
    result = {}

    def waiter():
        result["lease"] = reports.acquire(wait=10)

    thread = threading.Thread(target=waiter)
    thread.start()
    while reports.status().waiting != 1:
        pass
    held.pop().release()
    thread.join(10)
    lease = result["lease"]
    assert lease is not None
    after = scrape(client)

    def bucket(le, outcome):
        name = "django_semaphore_wait_seconds_bucket"
        return delta(before, after, name, semaphore="reports", outcome=outcome, le=le)

    assert bucket("0.25", "refused") == 0 and bucket("0.5", "refused") == 1
    assert bucket("+Inf", "acquired") == 1
    assert (
        delta(before, after, "django_semaphore_wait_seconds_sum", semaphore="reports", outcome="refused")
        >= 0.3
    )
    lease.release()
    held[0].release()


def test_ad_hoc_semaphores_are_reported_once_used_or_tracked(client, configured):
    crawler = Semaphore("crawler", limit=3, timeout=5)
    assert value(scrape(client), "django_semaphore_limit", semaphore="crawler") == 0
    with crawler.hold():
        samples = scrape(client)
    assert value(samples, "django_semaphore_limit", semaphore="crawler") == 3
    assert value(samples, "django_semaphore_holders", semaphore="crawler") == 1

    other = Semaphore("used-elsewhere", limit=4, timeout=5)
    track(other)
    assert value(scrape(client), "django_semaphore_limit", semaphore="used-elsewhere") == 4


def test_backend_failures_are_counted_and_scrape_still_answers(client, configured, settings):
    before = scrape(client)
    settings.SEMAPHORE_REDIS = {"URL": "redis://127.0.0.1:1/0", "OPTIONS": {"socket_connect_timeout": 0.5}}
    with pytest.raises(SemaphoreBackendError):
        semaphores["reports"].acquire()
    samples = scrape(client)  # the gauges cannot be read: up 0, no 500
    assert value(samples, "django_semaphore_up") == 0
    assert value(samples, "django_semaphore_holders", semaphore="reports") == 0
    failures = delta(before, samples, "django_semaphore_backend_failures_total", server="127.0.0.1:1")
    assert failures == 2  # the acquire, then the scrape's own SCAN


def test_unusable_settings_do_not_break_the_scrape(client, configured, settings):
    settings.SEMAPHORE_KEY_PREFIX = "bad prefix{}"  # system check E014
    samples = scrape(client)
    assert value(samples, "django_semaphore_up") == 0


def test_openmetrics_when_asked(client, configured):
    response = client.get("/metrics/", HTTP_ACCEPT="application/openmetrics-text; version=1.0.0")
    assert response["Content-Type"].startswith("application/openmetrics-text")
    assert b"# EOF" in response.content
    assert "no-cache" in response["Cache-Control"] or "max-age=0" in response["Cache-Control"]


def test_ad_hoc_names_are_bounded_and_labels_always_valid(client, configured, monkeypatch):
    monkeypatch.setattr(metrics, "MAX_AD_HOC", 2)
    odd = Semaphore("odd-\ud800-name", limit=1, timeout=5)  # a lone surrogate: not UTF-8
    first, extra = Semaphore("first", limit=1, timeout=5), Semaphore("extra", limit=1, timeout=5)
    before = scrape(client)
    for sem in (odd, first, extra):
        sem.acquire().release()
    samples = scrape(client)
    assert delta(before, samples, "django_semaphore_acquisitions_total", semaphore="odd-\\ud800-name") == 1
    assert delta(before, samples, "django_semaphore_acquisitions_total", semaphore="first") == 1
    assert delta(before, samples, "django_semaphore_acquisitions_total", semaphore="_other") == 1
    assert value(samples, "django_semaphore_limit", semaphore="odd-\\ud800-name") == 1
    assert value(samples, "django_semaphore_limit", semaphore="extra") == 0  # beyond the bound


_CHILD = """
import os, sys
import django
django.setup()
from django.test import RequestFactory, override_settings
from django_semaphore import semaphores
from django_semaphore.metrics import metrics_view
override_settings(SEMAPHORES={"reports": {"LIMIT": 2, "TIMEOUT": 300}}).enable()
if sys.argv[1] == "hold":  # exits holding the slot (it expires after TIMEOUT)
    assert semaphores["reports"].acquire() is not None
elif sys.argv[1] == "refused":
    assert semaphores["reports"].acquire() is None
else:
    sys.stdout.write(metrics_view(RequestFactory().get("/metrics/")).content.decode())
"""


def _scrape_in_a_process(child, env):
    """The metrics page as a new process of ``child`` (its "scrape" role) renders it."""
    command = [sys.executable, "-c", child, "scrape"]
    return subprocess.run(command, env=env, check=True, timeout=60, capture_output=True, text=True).stdout


def test_multiprocess_mode_adds_up_every_process(subprocess_env, tmp_path):
    """Under PROMETHEUS_MULTIPROC_DIR the scrape counts what other processes did."""

    env = {**subprocess_env, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    for role in ("hold", "hold", "refused"):  # three worker processes, one after the other
        subprocess.run([sys.executable, "-c", _CHILD, role], env=env, check=True, timeout=60)
    out = _scrape_in_a_process(_CHILD, env)
    samples = {}
    for family in text_string_to_metric_families(out):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    assert value(samples, "django_semaphore_acquisitions_total", semaphore="reports") == 2
    assert value(samples, "django_semaphore_refusals_total", semaphore="reports") == 1
    assert value(samples, "django_semaphore_holders", semaphore="reports") == 2
    assert value(samples, "django_semaphore_up") == 1


@pytest.fixture
def with_total(settings):
    settings.SEMAPHORES = {
        "reports": {"LIMIT": 2, "TIMEOUT": 5},
        "exports": {"LIMIT": 2, "TIMEOUT": 5, "KEY": "user", "TOTAL": 3},
    }


def test_a_total_name_has_effective_total_and_its_partitions_counted_one_by_one(client, with_total):
    exports = semaphores["exports"]
    before = scrape(client)
    assert value(before, "django_semaphore_effective_total", semaphore="exports") == 3
    assert ("django_semaphore_effective_total", (("semaphore", "reports"),)) not in before  # no TOTAL
    assert value(before, "django_semaphore_partitions", semaphore="exports") == 0
    held = [exports.acquire("alice"), exports.acquire("alice"), exports.acquire("bob")]
    assert all(held)
    try:
        samples = scrape(client)
        with pytest.raises(SemaphoreFull) as refused, exports.hold(key="carol"):
            pass
        assert refused.value.reason == "total"
        after = scrape(client)
    finally:
        for lease in held:
            lease.release()
    assert value(samples, "django_semaphore_limit", semaphore="exports") == 2
    assert value(samples, "django_semaphore_effective_limit", semaphore="exports") == 2
    assert value(samples, "django_semaphore_holders", semaphore="exports") == 3
    assert value(samples, "django_semaphore_partition_holders_max", semaphore="exports") == 2  # alice
    assert value(samples, "django_semaphore_partitions", semaphore="exports") == 2  # alice, bob: not "+"
    assert value(samples, "django_semaphore_waiting", semaphore="exports") == 0
    # A refusal for want of the total counts as any other.
    assert delta(samples, after, "django_semaphore_refusals_total", semaphore="exports") == 1
    assert (
        delta(samples, after, "django_semaphore_wait_seconds_count", semaphore="exports", outcome="refused")
        == 1
    )
    assert value(scrape(client), "django_semaphore_holders", semaphore="exports") == 0


def test_an_ad_hoc_total_semaphore_is_reported_too(client, configured):
    sem = Semaphore("ad-hoc-total", limit=1, total=2, timeout=5)
    with sem.hold(key="a"), sem.hold(key="b"):
        samples = scrape(client)
    assert value(samples, "django_semaphore_effective_total", semaphore="ad-hoc-total") == 2
    assert value(samples, "django_semaphore_holders", semaphore="ad-hoc-total") == 2
    assert value(samples, "django_semaphore_partition_holders_max", semaphore="ad-hoc-total") == 1
    assert value(samples, "django_semaphore_partitions", semaphore="ad-hoc-total") == 2


def test_names_sharing_the_other_label_are_added_up(client, configured, monkeypatch):
    monkeypatch.setattr(metrics, "MAX_AD_HOC", 1)
    names = [Semaphore(f"shared-{n}", limit=1, timeout=5) for n in range(3)]
    before = scrape(client)
    for sem in names:
        sem.acquire().release()
    samples = scrape(client)
    assert delta(before, samples, "django_semaphore_acquisitions_total", semaphore="shared-0") == 1
    assert delta(before, samples, "django_semaphore_acquisitions_total", semaphore="_other") == 2
    assert delta(before, samples, "django_semaphore_releases_total", semaphore="_other") == 2
    count = "django_semaphore_wait_seconds_count"
    assert delta(before, samples, count, semaphore="_other", outcome="acquired") == 2
    inf = "django_semaphore_wait_seconds_bucket"
    assert delta(before, samples, inf, semaphore="_other", outcome="acquired", le="+Inf") == 2


def test_a_name_tracked_after_counting_under_other_never_makes_a_counter_go_down(
    client, configured, monkeypatch
):
    """The counts of a name beyond MAX_AD_HOC are reported under "_other"; track() of that
    name afterwards (for its gauges) moved its counts to its own label at the next scrape,
    so "_other"'s counters went down, which Prometheus takes for a restart (a rate spike)."""
    monkeypatch.setattr(metrics, "MAX_AD_HOC", 1)
    names = [Semaphore(f"late-{n}", limit=1, timeout=5) for n in range(3)]
    for sem in names:
        sem.acquire().release()
    before = scrape(client)
    assert value(before, "django_semaphore_acquisitions_total", semaphore="_other") == 2
    track(names[1])
    after = scrape(client)
    for counter in ("django_semaphore_acquisitions_total", "django_semaphore_releases_total"):
        assert value(after, counter, semaphore="_other") == 2, counter  # not down to 1
    names[1].acquire().release()
    names[2].acquire().release()
    assert value(scrape(client), "django_semaphore_acquisitions_total", semaphore="_other") == 4
    assert value(after, "django_semaphore_limit", semaphore="late-1") == 1  # its gauges, from now on


def test_a_clusters_backend_failures_are_labelled_by_its_configuration_not_its_nodes(
    client, configured, settings, redis_cluster, cluster_client, key_prefix
):
    """The label was the error's server description, the nodes the client knew at the
    time ("cluster a:1,b:2,c:3"): each failover or resharding started new series. Now a
    cluster is labelled by its configured startup URL (no password), whatever the nodes."""
    from django_semaphore.backend import connection

    settings.SEMAPHORE_REDIS = {"URL": redis_cluster.url, "CLUSTER": True}
    port = redis_cluster.nodes[0].port
    keys = semaphores["reports"].partition(None)
    cluster_client.set(keys.main[0], "not a semaphore")  # every call on it: WRONGTYPE
    try:
        before = scrape(client)
        with pytest.raises(SemaphoreBackendError) as raised:
            semaphores["reports"].acquire()
        after = scrape(client)
    finally:
        cluster_client.delete(keys.main[0])
        connection.reset()
    assert raised.value.server.count(":") == 3  # the error names the three nodes it knew of
    labels = {labels for (name, labels) in after if name == "django_semaphore_backend_failures_total"}
    assert (("server", f"cluster 127.0.0.1:{port}"),) in labels
    assert not any("," in dict(label)["server"] for label in labels)
    # The acquire, and the scrape's own status read of that partition: one series.
    assert (
        delta(before, after, "django_semaphore_backend_failures_total", server=f"cluster 127.0.0.1:{port}")
        == 2
    )


def test_the_server_label_of_each_topology():
    from django_semaphore.ops.metrics import server_label

    assert server_label("10.0.0.5:6379") == "10.0.0.5:6379"
    assert server_label("unix:/run/redis.sock") == "unix:/run/redis.sock"
    assert server_label("sentinel service mymaster") == "sentinel service mymaster"
    assert server_label(None) == "redis"


def test_a_cluster_is_labelled_by_its_startup_url_without_password_or_by_its_alias(settings):
    from django_semaphore.ops.metrics import server_label

    settings.SEMAPHORE_REDIS = {"URL": "redis://:secret@node-a.example:7000/0", "CLUSTER": True}
    assert server_label("cluster 10.0.0.5:7000,10.0.0.6:7001") == "cluster node-a.example:7000"
    assert server_label("cluster 10.0.0.9:7002") == "cluster node-a.example:7000"
    settings.SEMAPHORE_REDIS = "semaphores"
    assert server_label("cluster 10.0.0.5:7000") == "cache alias 'semaphores'"


@pytest.mark.usefixtures("backend")
def test_the_gauges_read_partition_statuses_in_pipelines(configured, monkeypatch):
    """A scrape read every live partition's status with a script call of its own (a round
    trip each); now BATCH per pipeline, with the same figures."""
    from django_semaphore.engine import inspection
    from tests.support.helpers import count_round_trips

    monkeypatch.setattr(inspection, "BATCH", 4)
    per_user = semaphores["per-user"]
    held = [per_user.acquire(f"user:{n}") for n in range(7) for _ in range(1 + n % 2)]
    try:
        metrics.read_partitions([per_user])  # the script loaded on every node (NOSCRIPT: a round trip more)
        sent = count_round_trips(monkeypatch)
        ((semaphore, _, statuses),) = metrics.read_partitions([per_user])
        sent = list(sent)
        single = [per_user.status(keys=per_user.partition(None))]
        single += [per_user.status(f"user:{n}") for n in range(7)]
    finally:
        for lease in held:
            lease.release()
    assert "EVALSHA" not in sent and sent.count("PIPELINE") == 2  # 8 partitions, 4 per pipeline
    by_hash = {s.key_hash: s.in_use for s in statuses}
    assert by_hash == {s.key_hash: s.in_use for s in single}


# -- ad-hoc labels under the multi-process mode ---------------------------------------------


def test_shared_choices_fed_in_different_orders_choose_the_same_names(tmp_path):
    """Two selectors (two processes' SharedChoice) on one PROMETHEUS_MULTIPROC_DIR, asked
    about names in different orders, interleaved: the names labelled are the same for both,
    and at most the cap of them altogether."""
    from django_semaphore.ops.metrics import SharedChoice

    names = [f"job-{n}" for n in range(10)] + ["odd-\ud800-name", "new\nline"]
    first, second = SharedChoice(), SharedChoice()
    answers = {}
    for a, b in zip(names, reversed(names), strict=True):
        answers.setdefault(a, set()).add(first.choose(str(tmp_path), a, 4))
        answers.setdefault(b, set()).add(second.choose(str(tmp_path), b, 4))
    assert all(len(given) == 1 for given in answers.values())  # never two answers for one name
    chosen = {name for name, given in answers.items() if given == {True}}
    assert chosen == {"job-0", "new\nline", "job-1", "odd-\ud800-name"}  # the first four asked
    for name in names:  # asked again, either one, in any order: the same answer
        again = {first.choose(str(tmp_path), name, 4), second.choose(str(tmp_path), name, 4)}
        assert again == {name in chosen}
    assert first.final == second.final == frozenset(chosen)


_AD_HOC_CHILD = """
import sys
import django
django.setup()
from django.test import RequestFactory
from django_semaphore import Semaphore
from django_semaphore.metrics import metrics_view
from django_semaphore.ops import metrics
metrics.MAX_AD_HOC = 3
if sys.argv[1] == "scrape":
    sys.stdout.write(metrics_view(RequestFactory().get("/metrics/")).content.decode())
else:
    for name in sys.argv[1].split(","):  # (LIMIT 2: the two workers may meet on one name)
        Semaphore(name, limit=2, timeout=5).acquire().release()
"""


def test_processes_label_the_same_ad_hoc_names_and_no_more_than_the_cap(subprocess_env, tmp_path):
    """Each process labelled the first MAX_AD_HOC ad-hoc names it used itself, and the scrape
    adds up every process's series: two workers using the same names in other orders made
    MAX_AD_HOC x 2 series. Now the names of the whole server's first MAX_AD_HOC, in both."""

    env = {**subprocess_env, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    names = [f"crawl-{n}" for n in range(8)]
    workers = [
        subprocess.Popen([sys.executable, "-c", _AD_HOC_CHILD, ",".join(order)], env=env)
        for order in (names, names[::-1])
    ]
    assert [worker.wait(timeout=60) for worker in workers] == [0, 0]
    out = _scrape_in_a_process(_AD_HOC_CHILD, env)
    counted = {}
    for family in text_string_to_metric_families(out):
        for sample in family.samples:
            if sample.name == "django_semaphore_acquisitions_total":
                counted[sample.labels["semaphore"]] = sample.value
    labelled = set(counted) - {"_other"}
    assert len(labelled) == 3 and labelled <= set(names)
    assert all(counted[name] == 2 for name in labelled)  # each worker's use of it, under its name
    assert counted["_other"] == 2 * 8 - 2 * 3  # and every other use under "_other"
