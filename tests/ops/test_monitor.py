"""Read-only overviews of the semaphores in Redis (django_semaphore.monitor), as the
admin and ``sema_status`` show them, and the cleanup they run."""

import threading

import pytest

from django_semaphore import Semaphore, semaphores
from django_semaphore.backend.keys import WHOLE_NAME, key_hash, name_hash
from django_semaphore.config import settings as conf
from django_semaphore.engine import discovery
from django_semaphore.ops import monitor
from django_semaphore.runtime import adhoc, stats
from django_semaphore.runtime.control import Effective
from tests.support.helpers import release_all, wait_until, wait_until_expired

SEMAPHORES = {
    "reports": {"LIMIT": 4, "TIMEOUT": 30},
    "per-ip": {"LIMIT": 2, "TIMEOUT": 30, "KEY": "ip"},
    "per-user": {"LIMIT": 1, "KEY": "user"},
    "per-tenant": {"LIMIT": 1, "KEY": "header:X-Tenant"},
    "per-function": {"LIMIT": 1, "KEY": "django_semaphore.config.key_functions.by_ip"},
    "per-lambda": {"LIMIT": 1, "KEY": lambda request: "k"},
    "broken": {"LIMIT": 0},
}


@pytest.fixture(autouse=True)
def configured(settings):
    settings.SEMAPHORES = SEMAPHORES


def test_describe_key_says_how_a_semaphore_is_partitioned():
    described = {name: monitor.describe_key(conf.get_config(name)) for name in SEMAPHORES if name != "broken"}
    assert described == {
        "reports": "",
        "per-ip": "per IP",
        "per-user": "per user",
        "per-tenant": "per X-Tenant header",
        "per-function": "per IP",  # the dotted path names the same function as "ip"
        "per-lambda": "per <lambda>",
    }


@pytest.mark.usefixtures("backend")
def test_partitions_are_listed_busiest_first_with_their_figures():
    per_ip = semaphores["per-ip"]
    held = [per_ip.acquire(key="10.0.0.1"), per_ip.acquire(key="10.0.0.2"), per_ip.acquire(key="10.0.0.2")]
    try:
        view = monitor.read_semaphore("per-ip")
    finally:
        for lease in held:
            lease.release()
    assert (view.name, view.partitioned_by, view.error) == ("per-ip", "per IP", "")
    assert [(p.label, p.in_use, p.free, p.utilisation, p.level) for p in view.partitions] == [
        ("10.0.0.2", 2, 0, 100, "full"),
        ("10.0.0.1", 1, 1, 50, "low"),
    ]
    assert view.in_use == 3
    busiest = view.partitions[0]
    assert [h.token for h in busiest.holders] == [held[1].token, held[2].token]  # token order
    for data in busiest.as_dict(holders=True)["holders"]:
        assert held[1].identifier not in str(data) and held[2].identifier not in str(data)


@pytest.mark.usefixtures("backend")
def test_a_paused_semaphore_with_holders_is_shown_full_not_idle():
    """Limit 0 in force (an operator's pause) while holders keep their slots: the bar and its
    percentage said 0 %, as for an idle semaphore; held beyond the limit is 100 %."""
    reports = semaphores["reports"]
    held = [reports.acquire(), reports.acquire()]
    reports.override(limit=0)
    try:
        (partition,) = monitor.read_semaphore("reports").partitions
        assert (partition.limit, partition.in_use, partition.free) == (0, 2, 0)
        assert (partition.utilisation, partition.level) == (100, "full")
        assert partition.as_dict()["utilisation"] == 100
        reports.clear_override()
        for lease in held:
            lease.release()
        (partition,) = monitor.read_semaphore("reports").partitions
        assert (partition.utilisation, partition.level) == (0, "idle")
    finally:
        reports.clear_override()
        for lease in held:
            lease.release()


def test_an_unpartitioned_semaphore_shows_its_one_partition_even_unused():
    (partition,) = monitor.read_semaphore("reports").partitions
    assert partition.unpartitioned and partition.label == ""
    assert (partition.limit, partition.in_use, partition.free, partition.level) == (4, 0, 4, "idle")


@pytest.mark.usefixtures("backend")
def test_partitions_beyond_the_maximum_are_counted_not_read():
    per_ip = semaphores["per-ip"]
    held = [per_ip.acquire(key=f"10.0.1.{n}") for n in range(5)]
    try:
        view = monitor.read_semaphore("per-ip", max_partitions=3)
    finally:
        for lease in held:
            lease.release()
    assert (len(view.partitions), view.hidden) == (3, 2)


def test_partitions_are_read_a_page_at_a_time_from_an_offset():
    per_ip = semaphores["per-ip"]  # LIMIT 2
    held = [per_ip.acquire(key=f"10.0.4.{n}") for n in range(5)]
    try:
        pages = [monitor.read_semaphore("per-ip", max_partitions=2, offset=offset) for offset in (0, 2, 4, 6)]
    finally:
        for lease in held:
            lease.release()
    listed = [[p.key_hash for p in view.partitions] for view in pages]
    assert [len(keys) for keys in listed] == [2, 2, 1, 0]
    assert sorted(sum(listed, [])) == sorted(key_hash(f"10.0.4.{n}") for n in range(5))  # each once
    assert [(view.offset, view.hidden, view.partition_count, view.in_use) for view in pages] == [
        (0, 3, 5, 5),
        (2, 3, 5, 5),
        (4, 4, 5, 5),
        (6, 5, 5, 5),
    ]
    with pytest.raises(ValueError, match="offset"):
        monitor.read_semaphore("per-ip", offset=-1)


def test_the_use_and_waiters_of_partitions_beyond_the_maximum_still_count():
    """A semaphore's in use and waiting (the admin's totals line and "Waiting now", the JSON)
    are every partition's, not only those listed: with 150 partitions of one holder each the
    list said 100 in use."""
    per_ip = semaphores["per-ip"]  # LIMIT 2
    held = [per_ip.acquire(key=f"10.0.2.{n}") for n in range(3) for _ in range(2)]
    held += [per_ip.acquire(key=f"10.0.3.{n}") for n in range(2)]
    got = []
    # Wants 2 permits where 1 is held: it waits, in a partition not listed (in use 1).
    waiter = threading.Thread(target=lambda: got.append(per_ip.acquire(key="10.0.3.0", permits=2, wait=20)))
    waiter.start()
    try:
        wait_until(lambda: per_ip.waiters(key="10.0.3.0"), message="a waiter in the queue")
        view = monitor.read_semaphore("per-ip", max_partitions=3)
        assert (len(view.partitions), view.hidden) == (3, 2)
        assert (view.in_use, view.waiting) == (8, 1)
        assert view.as_dict()["waiting"] == 1
        assert monitor.totals([view]).in_use == 8
    finally:
        release_all(held, waiter, got)


def test_a_semaphore_with_bad_settings_gets_its_error_instead_of_figures():
    view = monitor.read_semaphore("broken")
    assert "LIMIT" in view.error and "E003" in view.error
    assert view.partitions == []


@pytest.mark.usefixtures("backend")
def test_cleanup_removes_expired_entries_only(backend_redis):
    quick = Semaphore("reports", limit=4, timeout=0.2)  # leases that end at once, in a partition of their own
    assert quick.acquire(key="old") and quick.acquire(key="old")
    live = semaphores["reports"].acquire()
    wait_until_expired(backend_redis, quick.partition("old"))
    (found,) = discovery.find(["reports"])
    assert len(found.partitions) == 2
    assert monitor.cleanup(found, dry_run=True) == 2
    assert monitor.cleanup(found) == 2
    assert monitor.cleanup(found) == 0
    assert [h.token for h in semaphores["reports"].holders()] == [live.token]
    assert live.release() is True


@pytest.fixture
def fresh_process():
    """As in a process of its own: no ad-hoc name announced yet."""
    adhoc.forget()
    yield
    adhoc.forget()


@pytest.mark.usefixtures("backend", "fresh_process")
def test_ad_hoc_semaphores_with_live_partitions_are_listed_after_the_configured_ones():
    crawler = Semaphore("crawler", limit=3, timeout=10)
    held = [crawler.acquire(key="example.com"), crawler.acquire(key="example.com")]
    held.append(crawler.acquire(key="example.org"))
    Semaphore("idle-ad-hoc", limit=1, timeout=10).acquire().release()  # recorded, no live partition
    stats.flush()
    try:
        views = monitor.read_all()
        one = monitor.read_semaphore("crawler")
        by_partition = monitor.read_semaphore("crawler", key_hash("example.org"))
    finally:
        for lease in held:
            lease.release()
    assert [v.name for v in views] == [*SEMAPHORES, "crawler"]
    view = views[-1]
    assert view.ad_hoc and not any(v.ad_hoc for v in views[:-1])
    assert (view.limit, view.timeout, view.algorithm, view.error, view.mode) == (3, 10, "lua", "", "enforce")
    assert view.ident == "crawler" and view.as_dict()["ad_hoc"] is True
    figures = [(p.label, p.in_use, p.free) for p in view.partitions]
    assert figures == [("example.com", 2, 1), ("example.org", 1, 2)]
    assert one.ad_hoc and [h.token for h in one.partitions[0].holders] == [held[0].token, held[1].token]
    assert [p.label for p in by_partition.partitions] == ["example.org"]
    # Released: no live partition, no line (and the registry alone never makes one).
    assert [v.name for v in monitor.read_all()] == list(SEMAPHORES)
    after = monitor.read_semaphore("crawler")  # its own page: recorded, nothing held
    assert after.ad_hoc and after.partitions == [] and after.error == ""
    assert "nope" in monitor.read_semaphore("nope").error


@pytest.mark.usefixtures("backend", "fresh_process")
def test_an_ad_hoc_semaphore_whose_name_was_cut_is_read_by_its_digest():
    name = "x" * (adhoc.MAX_NAME_CHARS + 50)
    lease = Semaphore(name, limit=2, timeout=10).acquire()
    stats.flush()
    try:
        (view,) = [v for v in monitor.read_all() if v.ad_hoc]
        again = monitor.read_semaphore(view.ident)
    finally:
        lease.release()
    assert view.name == name[: adhoc.MAX_NAME_CHARS] and view.ident == name_hash(name)
    assert [p.in_use for p in view.partitions] == [1] and [p.in_use for p in again.partitions] == [1]


# -- TOTAL: a name-wide bound over the partitions ------------------------------------------

EXPORTS = {"LIMIT": 2, "KEY": "user", "TOTAL": 3, "TIMEOUT": 30, "WAIT": 30}


@pytest.fixture
def exports(settings):
    """ "exports": LIMIT 2 per user, TOTAL 3; alice holds 2, bob 1 (the total is reached),
    and carol waits for the total; everything released at the end."""
    settings.SEMAPHORES = {**SEMAPHORES, "exports": EXPORTS}
    sem = semaphores["exports"]
    held = [
        sem.acquire(key="alice", meta={"user": "alice"}),
        sem.acquire(key="alice", meta={"user": "alice"}),
        sem.acquire(key="bob", meta={"user": "bob"}),
    ]
    assert all(held)
    got = []
    waiter = threading.Thread(target=lambda: got.append(sem.acquire(key="carol", meta={"job": "q3"})))
    waiter.start()
    try:
        wait_until(lambda: len(sem.waiters("carol")) == 1, message="carol queued")
        yield sem, held
    finally:
        release_all(held, waiter, got)


@pytest.mark.usefixtures("backend")
def test_a_total_name_shows_its_whole_use_and_its_partitions_never_the_whole_keys(exports):
    sem, held = exports
    view = monitor.read_semaphore("exports")
    assert (view.total, view.settings_total, view.limit, view.error) == (3, 3, 2, "")
    whole = view.whole
    assert (whole.limit, whole.in_use, whole.free, whole.waiting, whole.utilisation) == (3, 3, 0, 1, 100)
    assert (view.in_use, view.waiting, view.rows) == (3, 1, 4)
    # The partitions inside the whole name's keys, each against LIMIT; never "+".
    rows = [(p.key_hash, p.label, p.limit, p.in_use, p.free, p.waiting, p.held_back) for p in view.partitions]
    assert rows == [
        (key_hash("alice"), "alice", 2, 2, 0, 0, False),
        (key_hash("bob"), "bob", 2, 1, 0, 0, True),  # room under LIMIT, none under TOTAL
        (key_hash("carol"), "carol", 2, 0, 0, 1, True),  # labelled by its waiter's partition value
    ]
    assert WHOLE_NAME not in [p.key_hash for p in view.partitions]
    alice = view.partitions[0]
    assert [h.token for h in alice.holders] == [held[0].token, held[1].token]
    (carol,) = view.partitions[2].waiters
    assert carol.meta["job"] == "q3"
    data = view.as_dict(holders=True)
    assert data["total"] == 3 and data["settings"] == {"limit": 2, "mode": "enforce", "total": 3}
    assert data["all_partitions"] == {"limit": 3, "in_use": 3, "free": 0, "waiting": 1, "utilisation": 100}
    assert [p["partition"] for p in data["partitions"]] == [key_hash(k) for k in ("alice", "bob", "carol")]
    assert all(lease.identifier not in str(data) for lease in held)

    # One partition's page: the partition inside the whole name's keys, and the whole name above it.
    (bob,) = monitor.read_semaphore("exports", key_hash("bob")).partitions
    assert (bob.label, bob.in_use, bob.limit) == ("bob", 1, 2)
    assert [h.token for h in bob.holders] == [held[2].token]
    with pytest.raises(ValueError):
        monitor.read_semaphore("exports", WHOLE_NAME)  # the whole name is no partition
    with pytest.raises(ValueError):
        monitor.read_semaphore("reports", WHOLE_NAME)

    # Every semaphore: the total's figures count once, in the cluster-wide totals too.
    listed = {v.name: v for v in monitor.read_all()}
    assert listed["exports"].whole.in_use == 3 and len(listed["exports"].partitions) == 3
    assert listed["reports"].whole is None and listed["reports"].total is None
    assert monitor.totals(listed.values()).in_use == 3
    assert monitor.totals(listed.values()).waiting == 1


@pytest.mark.usefixtures("backend")
def test_the_total_in_force_follows_an_override(exports):
    sem, _ = exports
    sem.override(total=5)
    try:
        wait_until(lambda: sem.effective().total == 5, message="the override applied")
        wait_until(lambda: sem.status().in_use == 4, message="carol served from the room made")
        view = monitor.read_semaphore("exports")
        assert (view.total, view.settings_total, view.source) == (5, 3, "override")
        assert (view.whole.limit, view.whole.in_use, view.whole.free, view.waiting) == (5, 4, 1, 0)
        assert sorted((p.label, p.free, p.held_back) for p in view.partitions) == [
            ("alice", 0, False),
            ("bob", 1, False),
            ("carol", 1, False),
        ]
    finally:
        sem.clear_override()


@pytest.mark.usefixtures("backend")
def test_an_idle_total_name_has_its_whole_figures_and_no_partition(settings):
    settings.SEMAPHORES = {**SEMAPHORES, "exports": EXPORTS}
    view = monitor.read_semaphore("exports")
    assert view.partitions == [] and view.rows == 1
    assert (view.whole.limit, view.whole.in_use, view.whole.free) == (3, 0, 3)
    lease = semaphores["exports"].acquire(key="dana")
    lease.release()  # the keys stay in Redis a while, holding nothing
    view = monitor.read_semaphore("exports")
    assert [p.key_hash for p in view.partitions] == [] and view.whole.in_use == 0


@pytest.mark.usefixtures("backend")
def test_partitions_of_a_total_name_beyond_the_maximum_still_count_in_its_use(settings):
    settings.SEMAPHORES = {**SEMAPHORES, "exports": {**EXPORTS, "TOTAL": 10}}
    sem = semaphores["exports"]
    held = [sem.acquire(key=f"user{n}") for n in range(4)]
    try:
        view = monitor.read_semaphore("exports", max_partitions=2)
    finally:
        for lease in held:
            lease.release()
    assert (len(view.partitions), view.hidden, view.in_use, view.whole.in_use) == (2, 2, 4, 4)


def test_partition_keys_of_a_total_name_are_inside_its_whole_keys(settings):
    settings.SEMAPHORES = {**SEMAPHORES, "exports": EXPORTS}
    sem = semaphores["exports"]
    keys = monitor.partition_keys(sem, key_hash("alice"))
    assert keys == sem.partition("alice") and keys.shared and keys.part == key_hash("alice")
    assert monitor.partition_keys(semaphores["per-ip"], key_hash("x")) == semaphores["per-ip"].partition("x")
    for bad in (WHOLE_NAME, "nope", "_\n"):
        with pytest.raises(ValueError):
            monitor.partition_keys(sem, bad)
    with pytest.raises(ValueError):
        monitor.partition_keys(semaphores["per-ip"], WHOLE_NAME)


def test_describe_change_names_the_total_of_a_total_name():
    assert monitor.describe_change(Effective(2, "enforce", "settings"), Effective(1, "off", "override")) == (
        "limit 2 -> 1, mode enforce -> off"
    )
    old, new = Effective(2, "enforce", "settings", 8), Effective(2, "enforce", "override", 4)
    assert monitor.describe_change(old, new) == "limit 2 -> 2, mode enforce -> enforce, total 8 -> 4"


@pytest.mark.usefixtures("backend")
def test_cleanup_of_a_total_name_purges_its_whole_keys_once(settings, backend_redis):
    settings.SEMAPHORES = {**SEMAPHORES, "quick": {**EXPORTS, "TIMEOUT": 0.2}}
    quick = semaphores["quick"]
    assert quick.acquire(key="a") and quick.acquire(key="a") and quick.acquire(key="b")
    wait_until_expired(backend_redis, quick.partition("a"))
    (found,) = discovery.find(["quick"])
    assert [k.key_digest for k in found.partitions] == [WHOLE_NAME]  # one set of keys
    assert monitor.cleanup(found, dry_run=True) == 3
    assert monitor.cleanup(found) == 3
    assert monitor.cleanup(found) == 0
    assert monitor.read_semaphore("quick").in_use == 0


@pytest.mark.usefixtures("backend")
def test_partition_statuses_are_read_in_pipelines_not_one_round_trip_each(monkeypatch):
    """The admin read every live partition's status with a script call of its own: a
    round trip each, slow with tens of thousands. Now BATCH per pipeline; only the
    partitions listed have their holders read."""
    from django_semaphore.engine import inspection
    from tests.support.helpers import count_round_trips

    monkeypatch.setattr(inspection, "BATCH", 4)
    per_ip = semaphores["per-ip"]
    held = [per_ip.acquire(key=f"10.0.0.{n}") for n in range(10)]
    try:
        found = per_ip.partitions()
        monitor.read_semaphore("per-ip", max_partitions=2, found=found)  # the scripts loaded everywhere
        sent = count_round_trips(monkeypatch)
        view = monitor.read_semaphore("per-ip", max_partitions=2, found=found)
        sent = list(sent)
    finally:
        for lease in held:
            lease.release()
    assert view.partition_count == 10 and view.in_use == 10
    assert sent.count("PIPELINE") == 3 + 1  # 10 statuses, 4 per pipeline; the recent stats
    assert sent.count("EVALSHA") == 2  # the holders of the two partitions listed
