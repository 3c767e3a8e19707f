"""Semaphores as decorators on plain functions and tasks (django_semaphore.guards)."""

import asyncio
import queue
import threading
import time
from urllib.parse import urlsplit

import pytest
from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from django.template import Context, Template

from django_semaphore import Semaphore, SemaphoreFull, semaphores
from django_semaphore.engine import cancellation
from django_semaphore.engine.guards import FunctionGuard, current_lease


def wait_for(predicate, timeout=10.0, message="condition"):
    """Poll a condition (Redis state or a thread's progress) until true."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"{message} not reached within {timeout}s")
        time.sleep(0.01)


@pytest.fixture
def crawler(settings):
    settings.SEMAPHORES = {**settings.SEMAPHORES, "crawler": {"LIMIT": 2, "TIMEOUT": 5}}
    return semaphores["crawler"]


class Gate:
    """Callers block inside the guarded function until the test opens the gate."""

    def __init__(self):
        self.inside = 0
        self.peak = 0
        self.lock = threading.Lock()
        self.open = threading.Event()

    def enter(self):
        with self.lock:
            self.inside += 1
            self.peak = max(self.peak, self.inside)

    def leave(self):
        with self.lock:
            self.inside -= 1


def test_semaphore_is_a_decorator_holding_a_slot_per_call(crawler):
    seen = {}

    @crawler
    def work(x):
        lease = current_lease()
        seen["lease"] = lease
        seen["holders"] = crawler.holders()
        return x * 2

    assert work(21) == 42
    assert work.__name__ == "work" and isinstance(work.guard, FunctionGuard)
    lease = seen["lease"]
    assert lease.name == "crawler" and lease.released and not lease.lost
    [holder] = seen["holders"]
    assert holder.identifier == lease.identifier
    assert holder.meta["function"].endswith(".<locals>.work")
    assert crawler.available() == 2
    assert current_lease() is None


def test_exception_releases_the_slot(crawler):
    @crawler
    def boom():
        raise KeyError("x")

    with pytest.raises(KeyError):
        boom()
    assert crawler.available() == 2


def test_refused_call_raises_semaphore_full_and_limit_holds(crawler):
    gate = Gate()

    @crawler
    def work():
        gate.enter()
        try:
            gate.open.wait(10)
        finally:
            gate.leave()

    threads = [threading.Thread(target=work) for _ in range(2)]
    for t in threads:
        t.start()
    wait_for(lambda: gate.inside == 2, message="two holders inside")
    assert crawler.available() == 0
    with pytest.raises(SemaphoreFull) as info:
        work()
    assert info.value.name == "crawler" and 1 <= info.value.retry_after <= 5
    gate.open.set()
    for t in threads:
        t.join(10)
    assert gate.peak == 2
    work()  # free again
    assert crawler.available() == 2


def test_wait_queues_for_a_slot(crawler):
    gate = Gate()
    entered = threading.Event()

    @crawler.guard(wait=10)
    def work():
        gate.enter()
        entered.set()
        try:
            gate.open.wait(10)
        finally:
            gate.leave()

    holders = [threading.Thread(target=work) for _ in range(2)]
    for t in holders:
        t.start()
    wait_for(lambda: gate.inside == 2, message="two holders inside")
    result = {}

    @crawler.guard(wait=10)
    def third():
        result["lease"] = current_lease()
        return "third"

    waiter = threading.Thread(target=lambda: result.setdefault("value", third()))
    waiter.start()
    wait_for(lambda: crawler.status().waiting == 1, message="the third call queued")
    assert "value" not in result
    gate.open.set()
    waiter.join(10)
    for t in holders:
        t.join(10)
    assert result["value"] == "third"
    assert result["lease"].waited > 0


def test_wait_zero_overrides_the_configured_wait(settings):
    settings.SEMAPHORES = {**settings.SEMAPHORES, "q": {"LIMIT": 1, "TIMEOUT": 5, "WAIT": 30}}
    sem = semaphores["q"]
    lease = sem.acquire(wait=0)

    @sem.guard(wait=0)
    def work():
        return 1

    started = time.monotonic()
    with pytest.raises(SemaphoreFull):
        work()
    assert time.monotonic() - started < 2
    lease.release()
    assert work() == 1


def test_key_function_partitions_per_server():
    sem = Semaphore("downloads", limit=1, timeout=5)
    hosts = {}

    @sem.guard(key=lambda url: urlsplit(url).hostname)
    def download(url):
        lease = current_lease("downloads")
        hosts[url] = lease.key
        # The same host is busy; another host is a different partition.
        with pytest.raises(SemaphoreFull) as info:
            download(url.replace("/a", "/b"))
        assert info.value.key == urlsplit(url).hostname
        return download_other(url.replace("one.example", "two.example"))

    @sem.guard(key=lambda url: urlsplit(url).hostname)
    def download_other(url):
        return current_lease().key

    assert download("https://one.example/a") == "two.example"
    assert hosts == {"https://one.example/a": "one.example"}
    assert sem.available("one.example") == 1 and sem.available("two.example") == 1


def test_ad_hoc_semaphore_decorator_and_method():
    class Client:
        @Semaphore("adhoc-methods", limit=1, timeout=5)
        def get(self, path):
            return current_lease().semaphore.name, path

    assert Client().get("/x") == ("adhoc-methods", "/x")


def test_generator_functions_are_refused(crawler):
    with pytest.raises(TypeError, match="generator"):

        @crawler
        def gen():
            yield 1


def test_bad_options_are_refused(crawler):
    with pytest.raises(ValueError, match="wait"):
        crawler.guard(wait=-1)
    with pytest.raises(ValueError, match="refresh"):
        crawler.guard(refresh="yes")
    # An int the scripts could not order exactly: refused here, not at every call.
    for priority in (2**53, -(2**53), 10**400):
        with pytest.raises(ValueError, match="9,007,199,254,740,991"):
            crawler.guard(priority=priority)


def test_semaphore_in_a_template_is_not_called(crawler):
    assert Template("{{ sem.name }}/{{ sem.limit }}").render(Context({"sem": crawler})) == "crawler/2"


@pytest.mark.asyncio
async def test_async_function_guard(crawler):
    started = asyncio.Event()
    release = asyncio.Event()
    inside = []

    @crawler
    async def work(i):
        inside.append(i)
        if len(inside) == 2:
            started.set()
        await release.wait()
        return current_lease().token

    tasks = [asyncio.create_task(work(i)) for i in range(2)]
    await asyncio.wait_for(started.wait(), 10)
    assert await crawler.aavailable() == 0
    with pytest.raises(SemaphoreFull) as info:
        await work(3)
    assert info.value.retry_after >= 1
    release.set()
    tokens = await asyncio.gather(*tasks)
    assert len(set(tokens)) == 2
    assert await crawler.aavailable() == 2
    assert asyncio.iscoroutinefunction(work)


@pytest.mark.asyncio
async def test_a_function_marked_as_a_coroutine_function_runs_its_coroutine_under_the_guard(crawler):
    # What Django does for async middleware and views: a plain function (or
    # callable) returning a coroutine, marked with asgiref's
    # markcoroutinefunction, which inspect.iscoroutinefunction does not see on
    # Python < 3.12.  The guard must await it while holding the slot.
    seen = {}

    async def body():
        seen["lease"] = current_lease()
        seen["available"] = await crawler.aavailable()
        return "done"

    def view():
        return body()

    work = crawler(markcoroutinefunction(view))
    assert iscoroutinefunction(work)
    assert await work() == "done"
    assert seen["lease"] is not None and seen["lease"].name == "crawler"
    assert seen["available"] == 1
    assert await crawler.aavailable() == 2


@pytest.mark.asyncio
async def test_async_wait_is_served_when_a_holder_returns(crawler):
    release = asyncio.Event()

    @crawler.guard(wait=10)
    async def work():
        await release.wait()
        return current_lease().waited

    holders = [asyncio.create_task(work()) for _ in range(2)]
    while await crawler.aavailable() != 0:
        await asyncio.sleep(0.01)
    waiter = asyncio.create_task(work())
    while crawler.status().waiting != 1:
        await asyncio.sleep(0.01)
    release.set()
    waited = await asyncio.wait_for(waiter, 10)
    await asyncio.gather(*holders)
    assert waited > 0


def test_without_refresh_a_long_run_loses_its_slot():
    sem = Semaphore("short-lease", limit=1, timeout=0.3)
    done = {}

    @sem.guard(refresh=False)
    def slow():
        lease = current_lease()
        wait_for(lambda: not sem.holders(), message="the lease expiring")
        done["lease"] = lease

    slow()
    assert done["lease"].lost  # release() found the slot gone


def test_watchdog_keeps_the_slot_for_the_whole_run():
    sem = Semaphore("long-run", limit=1, timeout=1)

    @sem
    def slow():
        lease = current_lease()
        first_expiry = lease.expires_ms
        # Run for three lease lengths, checking Redis still lists us.
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            assert [h.identifier for h in sem.holders()] == [lease.identifier]
            assert sem.acquire() is None
            time.sleep(0.1)
        return lease, first_expiry

    lease, first_expiry = slow()
    assert not lease.lost and lease.released
    assert lease.expires_ms > first_expiry  # renewed by the watchdog


@pytest.mark.asyncio
async def test_watchdog_keeps_the_slot_of_an_async_function():
    sem = Semaphore("long-async-run", limit=1, timeout=1)

    @sem
    async def slow():
        lease = current_lease()
        first_expiry = lease.expires_ms
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            assert [h.identifier for h in await sem.aholders()] == [lease.identifier]
            await asyncio.sleep(0.1)
        return lease, first_expiry

    lease, first_expiry = await slow()
    assert not lease.lost and lease.released
    assert lease.expires_ms > first_expiry


# -- cancellation ------------------------------------------------------------------


async def _poll(predicate, timeout=10.0, message="condition"):
    deadline = time.monotonic() + timeout
    while not await predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"{message} not reached within {timeout}s")
        await asyncio.sleep(0.005)


@pytest.mark.asyncio
async def test_a_cancelled_async_function_releases_its_slot_even_if_cancelled_again():
    sem = Semaphore("cancel-twice", limit=1, timeout=30)
    entered = asyncio.Event()

    @sem
    async def work():
        entered.set()
        await asyncio.sleep(60)

    task = asyncio.create_task(work())
    await asyncio.wait_for(entered.wait(), 10)
    assert await sem.aavailable() == 0
    task.cancel()
    for _ in range(10_000):  # until the release is under way (a few loop turns)
        if cancellation._finishing:
            break
        await asyncio.sleep(0)
    assert cancellation._finishing
    task.cancel()  # cancelled again while releasing
    with pytest.raises(asyncio.CancelledError):
        await task

    async def free():
        return await sem.aavailable() == 1

    started = time.monotonic()
    await _poll(free, message="the slot given back")
    print(f"slot back {time.monotonic() - started:.3f}s after the second cancel (TIMEOUT 30 s)")


# -- a Celery-style task, run by a plain worker loop ------------------------------


class Worker:
    """A tiny task queue: what Celery's ``self.retry(countdown=...)`` does, in threads."""

    def __init__(self, task, threads=4):
        self.task = task
        self.jobs = queue.PriorityQueue()
        self.results = {}
        self.retries = []
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self.loop) for _ in range(threads)]

    def delay(self, arg, countdown=0):
        self.jobs.put((time.monotonic() + countdown, arg))

    def loop(self):
        while True:
            eta, arg = self.jobs.get()
            if arg is None:
                return
            pause = eta - time.monotonic()
            if pause > 0:  # not due yet: wait for its ETA, as a broker would
                time.sleep(min(pause, 0.05))
                self.jobs.put((eta, arg))
                continue
            try:
                result = self.task(arg)
            except SemaphoreFull as full:
                with self.lock:
                    self.retries.append(full.retry_after)
                self.delay(arg, countdown=full.retry_after)
                continue
            with self.lock:
                self.results[arg] = result

    def run(self, args, timeout=30):
        for arg in args:
            self.delay(arg)
        for t in self.threads:
            t.start()
        wait_for(lambda: len(self.results) == len(args), timeout, "every task done")
        for _ in self.threads:
            self.jobs.put((float("inf"), None))
        for t in self.threads:
            t.join(10)


def test_celery_style_task_retries_after_retry_after(settings):
    settings.SEMAPHORES = {**settings.SEMAPHORES, "api": {"LIMIT": 2, "TIMEOUT": 1}}
    gate = Gate()

    @semaphores["api"]
    def call_api(n):
        gate.enter()
        try:
            time.sleep(0.2)  # the work
            return n * n
        finally:
            gate.leave()

    def task(n):  # in Celery: @shared_task(bind=True) ... except SemaphoreFull: raise self.retry(...)
        return call_api(n)

    worker = Worker(task, threads=4)
    worker.run(range(6))
    assert worker.results == {n: n * n for n in range(6)}
    assert gate.peak == 2
    assert worker.retries and all(r == 1 for r in worker.retries)
    assert semaphores["api"].available() == 2


# -- permits and priority per use ------------------------------------------------------------


def test_a_guard_takes_its_permits_for_each_call():
    gpus = Semaphore("guard-gpus", limit=4, timeout=30, slots=True)

    @gpus.guard(permits=3, priority=2)
    def train():
        lease = current_lease("guard-gpus")
        return lease.permits, lease.slots, gpus.available()

    assert train() == (3, (0, 1, 2), 1)
    held = gpus.acquire(permits=2)
    with pytest.raises(SemaphoreFull):
        train()  # 3 > 2 free
    held.release()
    for bad in ({"permits": 0}, {"permits": 1.5}, {"priority": "high"}):
        with pytest.raises(ValueError):
            FunctionGuard(gpus, **bad)
