"""Lanes: the app's scripts, sent on connections kept between calls.

Every acquire, release and refresh is one ``EVALSHA`` (and so is every other
operation of the app's, from the wake-ups to the admin's reads).  Sent
through redis-py's ``execute_command``, a call costs a sync client about
30 µs of CPU beyond writing the command and reading the reply (redis-py 8.1
with hiredis: 44 µs for a ``PING`` against 14 µs on a connection already in
hand): the pool lends a connection and takes it back (a lock, a ``poll()`` of
the socket to check that nothing is left to read, four metric hooks and an
event), the retry and observability wrappers run, and each argument is
looked at twice while packing.  That is more than the scripts' own work in
Redis.

A :class:`Lane` borrows connections from the client's own pool once and keeps
them between calls: one per caller running at the same moment, at most
:data:`IDLE` of them idle (fewer from a small pool).  A call takes one,
checked as the pool checks the connections it lends (one the server closed,
or with anything left to read, is opened again before it is used: see
``_Watch`` for how a sync lane checks it cheaply), sends the script with the connection's
own ``send_packed_command`` and ``read_response`` under the client's own
``Retry``, and puts it back.  What the connection does stays as configured:
its encoder (``decode_responses``), AUTH, TLS, timeouts, health checks, a
Sentinel-managed connection's lookup of the master, and its disconnect on an
error.  A connection that failed, or whose reply a caller stopped reading,
is closed and given back to the pool, so no caller ever reads another's
reply; one the pool would not take back (the master moved under Sentinel)
goes back to the pool too, as redis-py's release would do with it.

An asyncio client (one per event loop) has an :class:`AsyncLane`, the same
design with ``await``: there, redis-py costs 113 µs of CPU for a ``PING``
against 67 µs on a connection in hand.

What a lane skips is redis-py's per-command hooks: its observability metrics
(OpenTelemetry) do not count the scripts a lane sends.  Clients a lane cannot
serve as they expect run every call through redis-py: a cluster, a client
holding a single connection, one with client-side caching, one with a
command packer of its own, and an asyncio Sentinel client.  A lane also
sends the plain commands of a quiet release (:meth:`Lane.pipeline`: one
write, the replies read as they come, unparsed) and a waiter's ``BLPOP``
(:meth:`Lane.command`: through redis-py, a blocking call that a release
wakes costs the waiter about 94 µs of CPU, against 38 µs on a connection in
hand); the other requests (commands that need redis-py's parsing of their
reply, other pipelines) go through redis-py.

A lane belongs to the process that made it: in a forked child (checked with
:func:`~django_semaphore.backend.forks.pid` at each call, which also catches a
fork that ran no Python hook), it drops its parent's connections without
closing them, and borrows its own.
"""

from __future__ import annotations

import select
import threading
import weakref
from collections.abc import Awaitable, Callable
from typing import Any

import redis
import redis.asyncio
from redis.exceptions import ConnectionError, ResponseError, TimeoutError
from redis.utils import HIREDIS_AVAILABLE

from . import forks

# The reader shortcut of :func:`_read_all`: hiredis's reader and redis-py's
# parser around it.  Without either, a pipeline's replies are read one by one
# as redis-py reads a reply.
_HiredisReader: Any = None
_PUSH: Any = None  # what the reader gives for a RESP3 push (hiredis >= 3.0)
_NOT_BUFFERED: Any = False  # what it gives when no whole reply is buffered
try:
    import hiredis
    from redis._parsers import hiredis as _parser_module
except ImportError:  # pragma: no cover - hiredis is optional
    pass
else:
    _HiredisReader = hiredis.Reader
    _PUSH = getattr(hiredis, "PushNotification", None)
    # An object of redis-py's own since 5.1; hiredis's default, False, before.
    _NOT_BUFFERED = getattr(_parser_module, "NOT_ENOUGH_DATA", False)

__all__ = ["IDLE", "AsyncLane", "Lane", "async_lane", "lane"]

_POLL: Any = getattr(select, "poll", None)  # not on Windows: redis-py's check there

#: Idle connections a lane keeps at most; one more returns to the pool.  A pool
#: with a bound (``max_connections``, which a django-redis cache may share with
#: the app) lends a lane at most an eighth of it to keep idle, and at least one,
#: but none from a pool of one connection: the others using it would never get it.
IDLE = 8

#: Packs a command (a tuple of its words) into what ``send_packed_command`` sends: a list of bytes.
Packer = Callable[[tuple[Any, ...]], list[bytes]]

_lanes: weakref.WeakKeyDictionary[Any, Lane | AsyncLane | None] = weakref.WeakKeyDictionary()
_making = threading.Lock()


class _Kept:
    """What a lane keeps: its client's pool, how to pack a command, the idle connections
    and how many of them it may keep (:data:`IDLE`, fewer from a bounded pool)."""

    __slots__ = ("_idle", "_keep", "_pack", "pool")

    def __init__(self, pool: Any, pack: Packer) -> None:
        self.pool = pool
        self._pack = pack
        self._idle: list[Any] = []  # a sync lane's: (connection, its _Watch or None)
        bound = getattr(pool, "max_connections", None)
        if not isinstance(bound, int):
            self._keep = IDLE
        elif bound > 1:
            self._keep = max(1, min(IDLE, bound // 8))
        else:  # a pool of one connection: the others using it would never get it
            self._keep = 0


class Lane(_Kept):
    """Connections of one client's pool, kept between calls (:meth:`evalsha`, :meth:`command`,
    :meth:`pipeline`)."""

    __slots__ = ("_pid",)

    def __init__(self, pool: Any, pack: Packer) -> None:
        super().__init__(pool, pack)
        self._pid = forks.pid()

    def evalsha(self, sha: str, keys: tuple[str, ...], args: tuple[Any, ...]) -> Any:
        """``EVALSHA sha`` with ``keys`` and ``args``: Redis's reply, or its error raised
        (:class:`~redis.exceptions.NoScriptError` when the script is not loaded)."""
        return self.command(("EVALSHA", sha, len(keys), *keys, *args))

    def command(self, words: tuple[Any, ...]) -> Any:
        """One command (a tuple of its words): Redis's reply as the connection reads it
        (no redis-py callback: ``BLPOP`` gives a list), or its error raised.  A blocking
        command waits under the connection's read timeout, as through redis-py."""
        command = self._pack(words)

        def call(connection: Any) -> Any:
            connection.send_packed_command(command)
            return connection.read_response()

        return self._call(call)

    def pipeline(self, commands: tuple[tuple[Any, ...], ...], raise_on_error: bool = True) -> list[Any]:
        """Send ``commands`` in one write and read their replies, as Redis sends them
        (no redis-py parsing: ``TIME`` is two strings).  An error reply is raised
        once every reply is read (``raise_on_error``), or is its command's reply."""
        pack = self._pack
        packed = [b"".join([chunk for command in commands for chunk in pack(command)])]

        def call(connection: Any) -> list[Any]:
            connection.send_packed_command(packed)
            return _read_all(connection, len(commands))

        replies: list[Any] = self._call(call)
        return _checked(replies, raise_on_error)

    def _call(self, call: Callable[[Any], Any]) -> Any:
        """``call(connection)`` on a connection of the lane, under the client's Retry."""
        connection, watch = self._take()
        try:
            reply = connection.retry.call_with_retry(
                lambda: call(connection), lambda error: connection.disconnect()
            )
        except ResponseError:
            self._give(connection, watch)  # an error reply was read whole: the connection is clean
            raise
        except BaseException:
            # Failed, or interrupted between writing and reading: a reply may
            # still be on its way, and the next caller must not read it.  Closed,
            # it goes back to the pool, which connects it again when it lends it
            # (a check here would connect it too, and a server that does not
            # answer would cost the next caller two timeouts instead of one).
            connection.disconnect()
            self.pool.release(connection)
            raise
        self._give(connection, watch)
        return reply

    def _take(self) -> tuple[Any, _Watch | None]:
        """A connection to send on, and the watch it was kept with (None: none yet)."""
        if self._pid != forks.pid():
            # Forked: these sockets are the parent's too; closing or using one
            # here would break the parent's.  Drop them, and borrow our own.
            self._idle = []
            self._pid = forks.pid()
        try:
            connection, watch = self._idle.pop()
        except IndexError:
            return self.pool.get_connection(), None  # connected and checked by the pool
        # As the pool checks a connection it lends: one with something to read
        # was closed by the server (a restart, an idle timeout) or holds a
        # stray reply.  Reconnect it before sending: a command written to a
        # closed connection fails, and the client's Retry may allow no second try.
        try:
            if watch is not None and watch.watches(connection):
                stale = watch.readable()
            else:
                stale = connection.can_read()
        except (ConnectionError, TimeoutError, OSError):
            stale = True  # it read the end of the stream
        if stale:
            connection.disconnect()  # the send connects again
        return connection, watch

    def _give(self, connection: Any, watch: _Watch | None) -> None:
        if len(self._idle) < self._keep and self.pool.owns_connection(connection):
            self._idle.append((connection, _Watch.of(connection, watch)))
        else:
            self.pool.release(connection)


class _Watch:
    """What a sync lane keeps beside an idle connection to check it cheaply when it
    takes it again: its socket, its hiredis reader and a ``poll`` object
    registered for that socket once.

    The check is redis-py's (``Connection.can_read()``, which the pool runs on
    every connection it lends): anything buffered in the reader or readable on
    the socket (a stray reply, or the end of a stream the server closed) makes
    the connection stale.  redis-py makes a poll object and registers the
    socket at each check, and wraps it in three calls: 2 µs of client CPU a
    check in a cycle, two checks a cycle, against about 0.5 µs for the poll
    itself.  A watch is for one socket and one reader: a connection opened again
    gets a new one, and one redis-py's check must serve (a TLS socket, which
    may hold decrypted bytes above the OS's; a parser without hiredis; no
    ``poll()``) gets none.
    """

    __slots__ = ("_poll", "reader", "sock")

    def __init__(self, sock: Any, reader: Any) -> None:
        self.sock = sock
        self.reader = reader
        self._poll = _POLL()
        self._poll.register(sock, select.POLLIN)

    @classmethod
    def of(cls, connection: Any, kept: _Watch | None) -> _Watch | None:
        """The watch of ``connection`` as it is now: ``kept`` if it still fits, a new
        one, or None where redis-py's check must run."""
        if kept is not None and kept.watches(connection):
            return kept
        sock = getattr(connection, "_sock", None)
        if sock is None or _POLL is None or hasattr(sock, "pending"):
            return None
        parser, gets = _buffered(connection)
        if gets is None:  # not read by hiredis's reader
            return None
        try:
            return cls(sock, parser._reader)
        except (ValueError, OSError):  # closed meanwhile (a disconnect in another thread)
            return None

    def watches(self, connection: Any) -> bool:
        """Whether this watch is of ``connection``'s socket and reader as they are now
        (a disconnect drops both, a connect makes new ones)."""
        return connection._sock is self.sock and connection._parser._reader is self.reader

    def readable(self) -> bool:
        """Whether anything is left to read: buffered, or on the socket (a closed
        socket reads as its end)."""
        return bool(self.reader.has_data() or self._poll.poll(0))


class AsyncLane(_Kept):
    """The asyncio twin of :class:`Lane`: connections of an asyncio client's pool (one
    event loop's), kept between calls of :meth:`evalsha`."""

    __slots__ = ()

    async def evalsha(self, sha: str, keys: tuple[str, ...], args: tuple[Any, ...]) -> Any:
        """As :meth:`Lane.evalsha`.  A call cancelled between writing and reading closes
        its connection, as one that failed does."""
        return await self.command(("EVALSHA", sha, len(keys), *keys, *args))

    async def command(self, words: tuple[Any, ...]) -> Any:
        """As :meth:`Lane.command`."""
        command = self._pack(words)

        async def call(connection: Any) -> Any:
            await connection.send_packed_command(command)
            return await connection.read_response()

        return await self._call(call)

    async def pipeline(self, commands: tuple[tuple[Any, ...], ...], raise_on_error: bool = True) -> list[Any]:
        """As :meth:`Lane.pipeline`."""
        pack = self._pack
        packed = [b"".join([chunk for command in commands for chunk in pack(command)])]

        async def call(connection: Any) -> list[Any]:
            await connection.send_packed_command(packed)
            return await _aread_all(connection, len(commands))

        replies: list[Any] = await self._call(call)
        return _checked(replies, raise_on_error)

    async def _call(self, call: Callable[[Any], Awaitable[Any]]) -> Any:
        """As :meth:`Lane._call`."""
        connection = await self._take()

        async def fail(error: BaseException) -> None:
            await connection.disconnect()

        try:
            reply = await connection.retry.call_with_retry(lambda: call(connection), fail)
        except ResponseError:
            await self._give(connection)
            raise
        except BaseException:
            try:
                await connection.disconnect(nowait=True)
            finally:
                await self.pool.release(connection)
            raise
        await self._give(connection)
        return reply

    async def _take(self) -> Any:
        try:
            connection = self._idle.pop()
        except IndexError:
            return await self.pool.get_connection()
        # can_read() since redis-py 8 (which deprecates can_read_destructive()).
        check = getattr(connection, "can_read", None) or connection.can_read_destructive
        try:
            stale = await check()
        except (ConnectionError, TimeoutError, OSError):
            stale = True
        if stale:
            await connection.disconnect()
        return connection

    async def _give(self, connection: Any) -> None:
        if len(self._idle) < self._keep:
            self._idle.append(connection)
        else:
            await self.pool.release(connection)


def _buffered(connection: Any) -> tuple[Any, Callable[[], Any] | None]:
    """(redis-py's hiredis parser of ``connection``, its reader's ``gets``), or (None, None)
    when it reads otherwise (no hiredis)."""
    parser = getattr(connection, "_parser", None)
    reader: Any = getattr(parser, "_reader", None)
    if _HiredisReader is None or type(reader) is not _HiredisReader:
        return None, None
    return parser, reader.gets


def _read_all(connection: Any, count: int) -> list[Any]:
    """``count`` replies of a sync ``connection``, an error reply as its exception (the
    rest still read).

    The first is read as redis-py reads one; the replies that came with it
    are taken straight from its hiredis reader: redis-py's ``read_response``
    costs about 3 µs of CPU per reply around the reader's own ``gets()``,
    more than the pipeline saves the server per command.
    """
    replies = [_read_one(connection)]
    parser, gets = _buffered(connection)
    for _ in range(count - 1):
        reply = gets() if gets is not None else _NOT_BUFFERED
        if reply is _NOT_BUFFERED:
            reply = _read_one(connection)
        elif type(reply) is _PUSH:  # RESP3 push (an invalidation): handled as redis-py does
            parser.handle_push_response(reply)
            reply = _read_one(connection)
        elif isinstance(reply, Exception) and not isinstance(reply, ResponseError):
            raise reply  # the connection failed: the lane closes it
        replies.append(reply)
    return replies


async def _aread_all(connection: Any, count: int) -> list[Any]:
    """The asyncio twin of :func:`_read_all`."""
    replies = [await _aread_one(connection)]
    parser, gets = _buffered(connection)
    for _ in range(count - 1):
        reply = gets() if gets is not None else _NOT_BUFFERED
        if reply is _NOT_BUFFERED:
            reply = await _aread_one(connection)
        elif type(reply) is _PUSH:
            await parser.handle_push_response(reply)
            reply = await _aread_one(connection)
        elif isinstance(reply, Exception) and not isinstance(reply, ResponseError):
            raise reply
        replies.append(reply)
    return replies


def _read_one(connection: Any) -> Any:
    try:
        return connection.read_response()
    except ResponseError as error:
        return error


async def _aread_one(connection: Any) -> Any:
    try:
        return await connection.read_response()
    except ResponseError as error:
        return error


def _checked(replies: list[Any], raise_on_error: bool) -> list[Any]:
    """``replies``, or the first error among them raised (``raise_on_error``)."""
    if raise_on_error:
        for reply in replies:
            if isinstance(reply, ResponseError):
                raise reply
    return replies


def _packer(pool: Any) -> Packer:
    """Pack as the pool's connections do.

    With UTF-8, strict (redis-py's default), every redis-py release gives the
    bytes that hiredis's ``pack_command`` gives, called here directly, the
    fastest. With any other encoding the releases differ: before 8.2 a sync
    connection packed with hiredis and sent text as UTF-8 whatever the
    encoding, an asyncio one with the pool's encoder; from 8.2 on both encode
    with the pool's encoder first. So a connection of the pool's class, built
    but never connected, packs those: its own packer, whatever the release.
    """
    kwargs = pool.connection_kwargs
    utf8 = (
        kwargs.get("encoding", "utf-8") in ("utf-8", "utf8")
        and kwargs.get("encoding_errors", "strict") == "strict"
    )
    if HIREDIS_AVAILABLE and utf8:
        from hiredis import pack_command

        def pack(command: tuple[Any, ...]) -> list[bytes]:
            return [pack_command(command)]

        return pack
    connection = pool.connection_class(**kwargs)

    def pack_as_redis_py(command: tuple[Any, ...]) -> list[bytes]:
        chunks: list[bytes] = connection.pack_command(*command)
        return chunks

    return pack_as_redis_py


def _make(client: Any) -> Lane | AsyncLane | None:
    asynchronous = isinstance(client, redis.asyncio.Redis)
    if not asynchronous and not isinstance(client, redis.Redis):
        return None  # a cluster
    if getattr(client, "connection", None) is not None or getattr(client, "single_connection_client", False):
        return None  # single_connection_client: its one connection, under its lock
    pool = client.connection_pool
    if getattr(pool, "cache", None) is not None:
        return None  # client-side caching wraps the connections
    if "command_packer" in pool.connection_kwargs:
        return None  # a packer of the user's own
    if asynchronous:
        if getattr(pool, "sentinel_manager", None) is not None:
            # redis-py's asyncio Sentinel pool cannot say whether a connection
            # still points at the master (its owns_connection() fails).
            return None
        return AsyncLane(pool, _packer(pool))
    return Lane(pool, _packer(pool))


def _lane_of(client: Any) -> Lane | AsyncLane | None:
    try:
        return _lanes[client]
    except KeyError:
        with _making:  # one lane per client, even when its first calls race
            if client not in _lanes:
                _lanes[client] = _make(client)
            return _lanes[client]
    except TypeError:  # not weakly referenceable
        return None


def lane(client: Any) -> Lane | None:
    """The lane of a sync client, or None when its calls must go through redis-py."""
    found = _lane_of(client)
    return found if type(found) is Lane else None


def async_lane(client: Any) -> AsyncLane | None:
    """The lane of an asyncio client, or None when its calls must go through redis-py."""
    found = _lane_of(client)
    return found if type(found) is AsyncLane else None


@forks.in_child
def _forget() -> None:
    # The parent's lanes hold the parent's sockets; a lock held at the fork stays held.
    global _making
    _making = threading.Lock()
    _lanes.clear()
