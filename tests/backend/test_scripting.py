"""The drivers (scripting.run / arun): every Redis failure becomes one SemaphoreBackendError
and one ``backend_failed`` signal, sent by the driver itself; a flushed script cache
(NOSCRIPT) is loaded again."""

import threading
import time

import pytest
import redis
import redis.asyncio

from django_semaphore import Semaphore, SemaphoreBackendError, signals
from django_semaphore.backend.scripting import Command, Pipe, aexecute, execute
from tests.support.servers import free_port


@pytest.fixture
def failures(settings):
    """Redis unreachable; the (sender, kwargs) of every backend_failed sent."""
    settings.SEMAPHORE_REDIS = {"URL": f"redis://127.0.0.1:{free_port()}/0"}
    sent = []

    def failed(sender, **kwargs):
        sent.append((sender, kwargs))

    signals.backend_failed.connect(failed, weak=False)
    yield sent
    signals.backend_failed.disconnect(failed)


def test_backend_failed_is_sent_by_the_driver_with_the_error_class_as_sender(failures):
    with pytest.raises(SemaphoreBackendError) as info:
        Semaphore("driver", limit=1).acquire()
    assert [(sender, kwargs["error"], kwargs["server"]) for sender, kwargs in failures] == [
        (SemaphoreBackendError, info.value, info.value.server)
    ]
    assert "semaphore" not in failures[0][1]  # below any one semaphore


@pytest.mark.asyncio
async def test_the_async_driver_sends_the_same_signal(failures):
    with pytest.raises(SemaphoreBackendError) as info:
        await Semaphore("driver", limit=1).aacquire()
    assert [(sender, kwargs["error"]) for sender, kwargs in failures] == [(SemaphoreBackendError, info.value)]


# -- NOSCRIPT ---------------------------------------------------------------------------


def test_script_flush_is_recovered(raw_redis):
    sem = Semaphore("flushed", limit=2, timeout=30)
    first = sem.acquire()
    raw_redis.script_flush()
    second = sem.acquire()
    assert second is not None and second.token > first.token
    raw_redis.script_flush()
    assert first.refresh() is True
    raw_redis.script_flush()
    assert [h.identifier for h in sem.holders()] == [first.identifier, second.identifier]
    raw_redis.script_flush()
    assert first.release() is True
    raw_redis.script_flush()
    assert sem.available() == 1


@pytest.mark.asyncio
async def test_script_flush_is_recovered_async(raw_redis):
    sem = Semaphore("aflushed", limit=2, timeout=30)
    first = await sem.aacquire()
    raw_redis.script_flush()
    assert await sem.aacquire() is not None
    raw_redis.script_flush()
    assert await first.arefresh() is True
    raw_redis.script_flush()
    assert await first.arelease() is True


def test_each_script_carries_only_the_prelude_definitions_it_uses():
    """Redis runs a script's whole source per call: unused prelude functions would cost
    a closure each.  The split keeps every line of _lib.lua, and the definitions a script
    uses only through another one (release -> wake -> grant_first) come along, in order."""
    from django_semaphore.backend.scripting import REST, LuaScript, _read, split_prelude

    lib = _read("_lib.lua")
    header, definitions = split_prelude(lib)
    assert header + "".join(text for _, text in definitions) == lib
    defined = {name for names, _ in definitions for name in names}
    assert {"server_ms", "wake", "grant_first", "next_watermark", "keep_until", "HOLD_SCALE"} <= defined

    release = LuaScript("release").source
    for needed in ("local function wake(", "local function grant_first(", "local function record_hold("):
        assert needed in release
    assert release.index("local function grant_first(") < release.index("local function wake(")
    assert "local function hold_estimate(" not in release
    # The common release (nobody waiting) returns before the definitions only the
    # direct grant needs: it creates no closure for them.
    common, rest = release.split(REST)
    for later in ("local function grant_first(", "local function hold(", "local function next_watermark("):
        assert later not in common and later in rest
    acquire_common = LuaScript("acquire").source.split(REST)[0]
    assert "local function purge_waiters(" not in acquire_common and "local function hold(" in acquire_common
    # A script using nothing of the prelude gets its header only.
    assert LuaScript("unlock").source.startswith(header)
    assert "local function" not in LuaScript("unlock").source[len(header) :].split("\n", 1)[0]


def test_trimmed_scripts_run(raw_redis):
    """Every script still compiles and runs after the trim (a definition it needs but
    lost would be a nil global: 'attempt to call a nil value')."""
    sem = Semaphore("trim-run", limit=2, timeout=5)
    lease = sem.acquire(meta={"a": 1})
    assert lease is not None and lease.refresh()
    assert [h.identifier for h in sem.holders()] == [lease.identifier]
    assert sem.waiters() == []
    assert sem.purge_expired() == 0
    assert lease.release()


@pytest.mark.asyncio
async def test_raw_requests_read_bytes_from_a_client_that_decodes(redis_url, raw_redis, key_prefix):
    decoding = redis.Redis.from_url(redis_url, decode_responses=True)
    adecoding = redis.asyncio.Redis.from_url(redis_url, decode_responses=True)
    key = f"{key_prefix}:raw"
    raw_redis.hset(key, b"\xffnot utf-8", b"v")
    try:
        get = Command(("HGETALL", key), raw=True)
        pipe = Pipe((("HGETALL", key),), transaction=False, raw=True)
        assert execute(decoding, get) == {b"\xffnot utf-8": b"v"}
        assert execute(decoding, pipe) == [{b"\xffnot utf-8": b"v"}]
        assert await aexecute(adecoding, get) == {b"\xffnot utf-8": b"v"}
        assert await aexecute(adecoding, pipe) == [{b"\xffnot utf-8": b"v"}]
        with pytest.raises(TypeError, match="transaction"):  # EXEC's replies take no options
            execute(decoding, Pipe((("HGETALL", key),), raw=True))
    finally:
        decoding.close()
        await adecoding.aclose()


# -- flows: drive and adrive carry out the same flow alike ---------------------------------------------


def _flow(log, condition, state):
    """A flow with every kind of step, and an exception thrown in and caught."""
    from django_semaphore.backend.scripting import Call, Sleep, WaitFor

    def double(value):
        return 2 * value

    async def adouble(value):
        return 2 * value

    def fail():
        raise ValueError("refused")

    async def afail():
        raise ValueError("refused")

    def pause():  # an operation: run by run() / arun(), here without Redis
        yield Sleep(0.01)
        return "paused"

    log.append(("called", (yield Call(double, adouble, (21,)))))
    try:
        yield Call(fail, afail)
    except ValueError as exc:
        log.append(("caught", str(exc)))
    log.append(("operation", (yield pause())))
    started = time.monotonic()
    ready = yield WaitFor(condition, lambda: state["ready"], 0.1)
    log.append(("timed out", ready, time.monotonic() - started >= 0.09))

    def notify():
        time.sleep(0.1)
        with condition:
            state["ready"] = True
            condition.notify_all()

    threading.Thread(target=notify).start()
    started = time.monotonic()
    ready = yield WaitFor(condition, lambda: state["ready"], 5)
    log.append(("woken", ready, time.monotonic() - started < 1))
    ready = yield WaitFor(condition, lambda: state["ready"], 5)
    log.append(("ready already", ready))
    try:
        yield Call(fail, afail)
    finally:
        log.append("clean-up")
    log.append("never")  # the second failure is not caught: it ends the flow


@pytest.mark.asyncio
async def test_drive_and_adrive_carry_out_a_flow_alike():
    from django_semaphore.backend.scripting import adrive, drive

    seen = {}
    for twin in ("sync", "async"):
        log, condition, state = [], threading.Condition(), {"ready": False}
        flow = _flow(log, condition, state)
        with pytest.raises(ValueError, match="refused"):
            if twin == "sync":
                drive(None, flow)
            else:
                await adrive(None, flow)
        seen[twin] = log
    assert (
        seen["sync"]
        == seen["async"]
        == [
            ("called", 42),
            ("caught", "refused"),
            ("operation", "paused"),
            ("timed out", False, True),
            ("woken", True, True),
            ("ready already", True),
            "clean-up",
        ]
    )


def test_a_flow_returns_its_result():
    from django_semaphore.backend.scripting import Call, drive

    def flow():
        value = yield Call(lambda: 1, None)
        return value + 1

    assert drive(None, flow()) == 2


# -- a Redis error is thrown into the operation -------------------------------------------------


def _catching(key, caught):
    """An operation that catches the error of its first request and goes on with a second."""
    try:
        yield Command(("INCR", key))  # the key holds no integer: Redis answers an error
    except redis.ResponseError as exc:
        caught.append(exc)
    return (yield Command(("GET", key)))


def _not_catching(key, after):
    yield Command(("INCR", key))
    after.append("went on")  # never: the error is not caught here


def test_run_throws_a_redis_error_into_the_operation(raw_redis, key_prefix, failures_seen):
    # What lets a waiter ride out a Sentinel failover (engine/waiting.py): before, the
    # driver dropped the operation at the failed request and raised at once.
    from django_semaphore.backend.connection import get_client
    from django_semaphore.backend.scripting import run

    key = f"{key_prefix}:not-a-number"
    raw_redis.set(key, "x")
    caught = []
    assert run(get_client(), _catching(key, caught)) == b"x"
    assert [type(e) for e in caught] == [redis.ResponseError]
    assert failures_seen == []  # caught: no failure of the call
    after = []
    with pytest.raises(SemaphoreBackendError, match="ResponseError"):
        run(get_client(), _not_catching(key, after))
    assert after == [] and len(failures_seen) == 1


@pytest.mark.asyncio
async def test_arun_throws_a_redis_error_into_the_operation(raw_redis, key_prefix, failures_seen):
    from django_semaphore.backend.connection import get_async_client
    from django_semaphore.backend.scripting import arun

    key = f"{key_prefix}:not-a-number"
    raw_redis.set(key, "x")
    caught = []
    assert await arun(get_async_client(), _catching(key, caught)) == b"x"
    assert [type(e) for e in caught] == [redis.ResponseError]
    assert failures_seen == []
    after = []
    with pytest.raises(SemaphoreBackendError, match="ResponseError"):
        await arun(get_async_client(), _not_catching(key, after))
    assert after == [] and len(failures_seen) == 1


@pytest.fixture
def failures_seen():
    """Every backend_failed sent during the test (Redis reachable)."""
    sent = []

    def failed(sender, **kwargs):
        sent.append(kwargs["error"])

    signals.backend_failed.connect(failed, weak=False)
    yield sent
    signals.backend_failed.disconnect(failed)
