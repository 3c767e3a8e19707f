"""Handoff (django_semaphore.handoff): a held slot handed to another holder by a signed ticket.

The "other process" is played by Lease.adopt in the same process (the ticket
is all it gets); tests/system/test_celery_worker.py does it across processes
with a real Celery worker.
"""

import asyncio
import time

import pytest
from django.core import signing

from django_semaphore import Semaphore, SemaphoreError, semaphores
from django_semaphore.engine import watchdog
from django_semaphore.engine.handoff import AlreadyAdopted, HandoffError
from django_semaphore.engine.semaphore import Lease, adopt_ticket
from tests.support import handoff_site
from tests.support.helpers import names_of, wait_until

pytestmark = pytest.mark.usefixtures("backend")


def test_adopt_gives_the_same_holder_and_token():
    sem = Semaphore("ho", limit=2, timeout=30)
    lease = sem.acquire(meta={"who": "view"})
    ticket = lease.handoff()
    assert isinstance(ticket, str) and lease.handed_off
    adopted = Lease.adopt(ticket)
    assert (adopted.identifier, adopted.token, adopted.key) == (lease.identifier, lease.token, None)
    assert adopted.name == "ho" and adopted.semaphore == sem  # ad-hoc: rebuilt from the ticket
    assert adopted.keys == lease.keys and adopted.acquired_ms == lease.acquired_ms
    assert [h.identifier for h in sem.holders()] == [lease.identifier]
    assert adopted.refresh() is True
    assert adopted.release() is True
    assert sem.holders() == [] and sem.available() == 2


def test_the_handing_process_neither_refreshes_nor_releases(received):
    sem = Semaphore("ho-gone", limit=1, timeout=30)
    lease = sem.acquire()
    ticket = lease.handoff()
    assert lease.refresh() is False
    assert lease.release() is False
    assert not lease.lost and not lease.released
    assert [h.token for h in sem.holders()] == [lease.token]  # still held, for the adopter
    assert names_of(received, "released") == []
    with pytest.raises(ValueError, match="cannot be handed off"):
        lease.handoff()  # twice
    assert Lease.adopt(ticket).release() is True
    assert len(names_of(received, "released")) == 1


def test_a_partitioned_configured_semaphore(settings):
    settings.SEMAPHORES = {"exports": {"LIMIT": 1, "TIMEOUT": 20, "KEY": "user"}}
    lease = semaphores["exports"].acquire(key="tenant-7")
    adopted = Lease.adopt(lease.handoff())
    assert adopted.key == "tenant-7" and adopted.semaphore == semaphores["exports"]
    assert adopted.config.timeout == 20
    assert semaphores["exports"].available("tenant-7") == 0
    assert adopted.release() is True
    assert semaphores["exports"].available("tenant-7") == 1


def test_adopting_refreshes_the_slot():
    sem = Semaphore("ho-refresh", limit=1, timeout=30)
    lease = sem.acquire()
    before = sem.holders()[0].expires_at
    time.sleep(0.01)  # let the server clock move on
    adopted = Lease.adopt(lease.handoff())
    assert sem.holders()[0].expires_at > before
    assert adopted.expires_at == sem.holders()[0].expires_at
    adopted.release()


@pytest.mark.parametrize(
    "tamper",
    [
        lambda t: t[:-1] + ("A" if t[-1] != "A" else "B"),  # the signature
        lambda t: "x" + t,  # the payload
        lambda t: signing.dumps({"v": 1, "n": "ho"}, salt="another salt"),
        lambda t: "",
    ],
)
def test_a_tampered_ticket_is_refused(tamper):
    lease = Semaphore("ho-tamper", limit=1, timeout=30).acquire()
    ticket = lease.handoff()
    with pytest.raises(HandoffError, match="not genuine|non-empty"):
        Lease.adopt(tamper(ticket))
    assert isinstance(HandoffError("x"), SemaphoreError)
    Lease.adopt(ticket).release()


def test_a_ticket_signed_with_another_secret_key_is_refused(settings):
    ticket = Semaphore("ho-key", limit=1, timeout=30).acquire().handoff()
    settings.SECRET_KEY = "another-secret"
    with pytest.raises(HandoffError, match="not genuine"):
        Lease.adopt(ticket)


def test_an_expired_ticket_is_refused(monkeypatch):
    monkeypatch.setattr("django_semaphore.engine.handoff.MARGIN", 0.1)
    sem = Semaphore("ho-expired", limit=1, timeout=0.5)
    ticket = sem.acquire().handoff()

    def refused():
        try:
            Lease.adopt(ticket, verify=False)
        except AlreadyAdopted:  # the first call adopted it: single-use
            return None
        except HandoffError as exc:
            return str(exc)
        return None

    message = wait_until(refused, timeout=5, message="ticket expiry")
    assert "has expired with its lease" in message and "'ho-expired'" in message


def test_a_slot_lost_before_adoption_is_refused(received):
    sem = Semaphore("ho-lost", limit=1, timeout=30)
    lease = sem.acquire()
    ticket = lease.handoff()
    assert sem.force_release(lease.identifier)  # an operator, or expiry
    with pytest.raises(HandoffError, match="no longer held"):
        Lease.adopt(ticket)
    lost = Lease.adopt(ticket, verify=False)  # no round trip: it cannot know
    assert lost.refresh() is False and lost.lost


def test_an_unknown_semaphore_is_refused(settings):
    settings.SEMAPHORES = {"exports": {"LIMIT": 1, "TIMEOUT": 20}}
    ticket = semaphores["exports"].acquire().handoff()
    settings.SEMAPHORES = {"other": {"LIMIT": 1}}
    with pytest.raises(HandoffError, match="'exports', which is not configured"):
        Lease.adopt(ticket)


def test_another_key_prefix_is_refused(settings):
    ticket = Semaphore("ho-prefix", limit=1, timeout=30).acquire().handoff()
    settings.SEMAPHORE_KEY_PREFIX = "elsewhere"
    with pytest.raises(HandoffError, match="SEMAPHORE_KEY_PREFIX"):
        Lease.adopt(ticket)


@pytest.mark.parametrize("algorithm", ["lua", "fair_locked", "fair", "basic"])
def test_every_algorithm(algorithm):
    sem = Semaphore("ho-alg", limit=1, timeout=30, algorithm=algorithm)
    adopted = Lease.adopt(sem.acquire().handoff())
    assert adopted.config.algorithm == algorithm
    assert sem.acquire() is None
    assert adopted.release() is True
    assert sem.available() == 1


@pytest.mark.asyncio
async def test_aadopt():
    sem = Semaphore("ho-async", limit=1, timeout=30)
    lease = await sem.aacquire()
    ticket = lease.handoff()
    assert await lease.arelease() is False and await lease.arefresh() is False
    adopted = await Lease.aadopt(ticket)
    assert adopted.token == lease.token
    assert await adopted.arefresh() is True
    assert await adopted.arelease() is True
    assert await sem.aavailable() == 1
    sem2 = Semaphore("ho-async2", limit=1, timeout=30)
    lease2 = await sem2.aacquire()
    ticket2 = lease2.handoff()
    await sem2.aforce_release(lease2.identifier)
    with pytest.raises(HandoffError, match="no longer held"):
        await Lease.aadopt(ticket2)


# -- the watchdog ----------------------------------------------------------------------


def test_the_watchdog_stops_renewing_a_handed_off_lease():
    sem = Semaphore("ho-watch", limit=1, timeout=0.6)  # renewed every 0.2 s
    lease = sem.acquire()
    watch = watchdog.watch(lease)
    wait_until(lambda: lease.expires_ms > sem.holders()[0].acquired_at.timestamp() * 1000 + 600, 5)
    ticket = lease.handoff()
    # Dropped at its next due time, without a renewal: the slot then runs out unless adopted.
    wait_until(lambda: watch not in watchdog.watchdog()._watches, 5, message="watch dropped")
    wait_until(lambda: sem.available() == 1, 5, message="expiry of the handed-off lease")
    assert not lease.lost
    with pytest.raises(HandoffError):
        Lease.adopt(ticket)


@pytest.mark.asyncio
async def test_the_async_watch_stops_renewing_a_handed_off_lease():
    sem = Semaphore("ho-awatch", limit=1, timeout=0.6)
    lease = await sem.aacquire()
    async with watchdog.awatching(lease) as watch:
        lease.handoff()
        started = time.monotonic()
        while await sem.aavailable() == 0:  # not renewed: it expires
            assert time.monotonic() - started < 5
            await asyncio.sleep(0.02)
        assert not watch._task.done() or watch._task.exception() is None


# -- a guarded view ----------------------------------------------------------------------


@pytest.mark.urls("tests.support.handoff_site")
def test_a_guarded_view_that_hands_off_keeps_its_slot_after_the_response(client, settings, received):
    settings.SEMAPHORES = {"reports": {"LIMIT": 1, "TIMEOUT": 30}}
    handoff_site.TICKETS.clear()
    response = client.get("/handoff/keep/")
    # The test client closed the response, as a server does once it is sent: the guard's
    # release ran. (A second close() would send request_finished again, outside the client.)
    assert response.status_code == 200
    holders = semaphores["reports"].holders()
    assert [h.identifier for h in holders] == [response.json()["identifier"]]
    assert client.get("/handoff/plain/").status_code == 429  # still held
    assert names_of(received, "released") == []
    adopted = Lease.adopt(handoff_site.TICKETS.pop())
    assert adopted.release() is True
    response = client.get("/handoff/plain/")
    assert response.status_code == 200
    assert semaphores["reports"].available() == 1  # a view that did not hand off released at the end


def test_adopt_adds_meta_for_the_admin():
    sem = Semaphore("ho-meta", limit=1, timeout=30)
    lease = sem.acquire(meta={"path": "/export/"})
    adopted = Lease.adopt(lease.handoff(), meta={"task_id": "t-1", "task": "export"})
    (holder,) = sem.holders()
    assert holder.meta["path"] == "/export/" and holder.meta["task_id"] == "t-1"
    assert holder.meta["task"] == "export" and holder.token == lease.token
    adopted.release()


@pytest.mark.asyncio
async def test_aadopt_adds_meta():
    sem = Semaphore("ho-ameta", limit=1, timeout=30)
    lease = await sem.aacquire()
    adopted = await Lease.aadopt(lease.handoff(), meta={"task_id": "t-2"})
    assert (await sem.aholders())[0].meta["task_id"] == "t-2"
    await adopted.arelease()


def test_the_slot_numbers_go_with_the_ticket():
    sem = Semaphore("ho-slots", limit=3, timeout=30, slots=True)
    first, second = sem.acquire(), sem.acquire(permits=2)
    adopted = Lease.adopt(second.handoff())
    assert adopted.slots == second.slots and adopted.permits == second.permits
    adopted.release()
    first.release()


def test_a_ticket_is_single_use(backend_redis):
    sem = Semaphore("ho-once", limit=1, timeout=30)
    lease = sem.acquire()
    ticket = lease.handoff()
    first = Lease.adopt(ticket)
    with pytest.raises(AlreadyAdopted, match="single-use"):
        Lease.adopt(ticket)  # while the first adopter holds it
    with pytest.raises(AlreadyAdopted):
        Lease.adopt(ticket, verify=False)
    assert isinstance(AlreadyAdopted("x"), SemaphoreError)
    # The mark lives as long as the ticket can be read, in the partition's slot.
    mark = lease.keys.adopted(lease.identifier)
    assert 30_000 < backend_redis.pttl(mark) <= (30 + 5 + 1) * 1000
    assert first.release() is True
    with pytest.raises(HandoffError):
        Lease.adopt(ticket)  # released: no longer held, and adopted already


def test_the_same_adopter_may_adopt_again():
    # A Celery task redelivered after its run died adopts its message's ticket again.
    sem = Semaphore("ho-again", limit=1, timeout=30)
    ticket = sem.acquire().handoff()
    first = adopt_ticket(Lease, ticket, adopter="task-1")
    again = adopt_ticket(Lease, ticket, adopter="task-1")
    assert again.identifier == first.identifier
    with pytest.raises(AlreadyAdopted):
        adopt_ticket(Lease, ticket, adopter="task-2")
    assert again.release() is True


@pytest.mark.asyncio
async def test_aadopt_is_single_use_too():
    sem = Semaphore("ho-aonce", limit=1, timeout=30)
    ticket = (await sem.aacquire()).handoff()
    adopted = await Lease.aadopt(ticket)
    with pytest.raises(AlreadyAdopted):
        await Lease.aadopt(ticket)
    assert await adopted.arelease() is True
