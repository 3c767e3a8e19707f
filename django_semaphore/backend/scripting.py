"""Redis requests and the sync/async drivers that execute them.

The algorithms (:mod:`django_semaphore.engine.algorithms`) are written once, as
generators that yield requests — a :class:`Script` call, a :class:`Pipe` of
commands, one :class:`Command` or a :class:`Sleep` — and receive the replies.  :func:`run` executes
them on a sync client and :func:`arun` on an asyncio client, so the sync and
async APIs share every script, key and decision.

The control flow around operations is written once the same way: a :data:`Flow`
(taking a slot with its recovery and clean-up, a request's semaphores all or
none, giving back remembered work) is a generator that yields whole operations,
each run by :func:`run` or :func:`arun` with its result sent back or its
exception thrown in, and steps: a :class:`Call` of a function that has a sync
and an async twin, or a :class:`WaitFor` a condition.  :func:`drive` carries a
flow out in sync code and :func:`adrive` in a coroutine; neither knows what the
flow does.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
import threading
import time
from collections.abc import Awaitable, Callable, Generator
from dataclasses import dataclass
from importlib import resources
from typing import Any, TypeVar

from redis.client import NEVER_DECODE
from redis.exceptions import NoScriptError

from . import lanes
from .connection import REDIS_ERRORS, is_cluster
from .connection import backend_error as backend_error


class LuaScript:
    """A Lua source from ``scripts/``, run with EVALSHA and loaded on NOSCRIPT.

    The source is the script after the definitions of ``_lib.lua`` that it
    uses (directly or through another definition), in the prelude's order:
    Redis runs the whole source on every call, so a definition the script
    never uses would cost a closure per call for nothing.  A script whose
    common case returns early marks where it ends with a :data:`REST` line:
    the definitions only the rest uses go there, so that the common case does
    not pay for them either.
    """

    _prelude: tuple[str, tuple[tuple[frozenset[str], str], ...]] | None = None

    def __init__(self, name: str) -> None:
        if LuaScript._prelude is None:
            LuaScript._prelude = split_prelude(_read("_lib.lua"))
        header, definitions = LuaScript._prelude
        body = _read(f"{name}.lua")
        self.name = name
        common, marker, rest = body.partition(REST)
        first = used_definitions(definitions, common)
        later = [text for text in used_definitions(definitions, body) if text not in first] if marker else []
        self.source = header + "".join(first) + common + marker + "".join(later) + rest
        self.sha = hashlib.sha1(self.source.encode()).hexdigest()

    def __repr__(self) -> str:
        return f"<LuaScript {self.name} {self.sha[:8]}>"


#: The line of a script after which come the definitions only the rest of it uses.
REST = "-- (the rest of the script)\n"


def _read(filename: str) -> str:
    return resources.files("django_semaphore").joinpath("scripts").joinpath(filename).read_text("utf-8")


_DEFINES = re.compile(r"^local (?:function )?([A-Za-z_]\w*)", re.MULTILINE)
_WORD = re.compile(r"[A-Za-z_]\w*")


def split_prelude(lib: str) -> tuple[str, tuple[tuple[frozenset[str], str], ...]]:
    """``_lib.lua`` as (its header comment, its definitions): each definition is
    the names it defines and its text (the comment above it included).

    A definition is a top-level ``local NAME = ...`` line or a ``local
    function NAME(...)`` block up to its ``end`` at the start of a line;
    consecutive lines of one group (no blank line between them) stay together.
    """
    header: list[str] = []
    definitions: list[tuple[frozenset[str], str]] = []
    chunk: list[str] = []
    in_function = False
    for line in lib.splitlines(keepends=True):
        chunk.append(line)
        if line.startswith("local function "):
            in_function = True
        if in_function:
            if line.rstrip() == "end":
                in_function = False
            continue
        if line.strip():
            continue
        # A blank line outside a function ends a group.
        text = "".join(chunk)
        names = frozenset(_DEFINES.findall(text))
        if names:
            definitions.append((names, text))
        elif not definitions:
            header.append(text)
        chunk = []
    text = "".join(chunk)
    names = frozenset(_DEFINES.findall(text))
    if names:
        definitions.append((names, text))
    return "".join(header), tuple(definitions)


def _words(text: str) -> set[str]:
    """The identifiers of Lua ``text``, comments left out."""
    code = "\n".join(line.split("--", 1)[0] for line in text.splitlines())
    return set(_WORD.findall(code))


def used_definitions(definitions: tuple[tuple[frozenset[str], str], ...], body: str) -> list[str]:
    """The texts of the ``definitions`` that ``body`` uses, directly or through one another,
    in their order."""
    needed = _words(body)
    used = [False] * len(definitions)
    changed = True
    while changed:
        changed = False
        for i, (names, text) in enumerate(definitions):
            if not used[i] and names & needed:
                used[i] = True
                needed |= _words(text)
                changed = True
    return [text for (_, text), keep in zip(definitions, used, strict=True) if keep]


# The requests are plain slotted dataclasses, not frozen ones: one is built
# per Redis call, and a frozen dataclass's __init__ (object.__setattr__ per
# field) costs four times as much.  Nothing mutates them.


@dataclass(slots=True)
class Script:
    """Run ``script`` with ``keys`` and ``args``."""

    script: LuaScript
    keys: tuple[str, ...]
    args: tuple[Any, ...]


@dataclass(slots=True)
class Pipe:
    """Send ``commands`` (tuples) in one round trip, as MULTI/EXEC if ``transaction``.

    ``raise_on_error=False``: a command's error is its reply (the others' replies
    are still read), instead of raising once every reply is in.  ``raw``: as
    for :class:`Command` (only without ``transaction``).

    ``unparsed`` (only without ``transaction``): the reader takes the replies
    as Redis sends them as well as parsed by redis-py (``TIME`` as two
    strings or as two ints, a score as a string or a float, a missing one as
    None or False), so that a lane can send the commands on a connection in
    hand (one write, replies read as they come: no pipeline object), and a
    cluster client run them as one script on the node of their slot (a
    command without a key, such as ``TIME``, then runs there too).
    """

    commands: tuple[tuple[Any, ...], ...]
    transaction: bool = True
    raise_on_error: bool = True
    raw: bool = False
    unparsed: bool = False


@dataclass(slots=True)
class Command:
    """Send one command (a tuple of its words) and return its reply.

    ``raw``: the reply's strings as bytes even from a client made with
    ``decode_responses=True``, for replies that may hold bytes that are not
    UTF-8 (the control HASH's adaptive fields).

    ``unparsed`` (not with ``raw``): the reader takes the reply as Redis sends
    it as well as parsed by redis-py (``BLPOP``: a list or a tuple), so that a
    lane can send the command on a connection in hand.
    """

    args: tuple[Any, ...]
    raw: bool = False
    unparsed: bool = False


@dataclass(slots=True)
class Sleep:
    """Pause for ``seconds`` (time.sleep or asyncio.sleep, as the driver is)."""

    seconds: float


#: One request an operation yields; the driver sends back Redis's reply.
Request = Script | Pipe | Command | Sleep
T = TypeVar("T")
#: An operation: a generator of requests returning its result.
Operation = Generator[Request, Any, T]
#: A redis-py client: Redis or RedisCluster, or their asyncio twins.
Client = Any

#: Give every KEY a TTL of at least ARGV[1] ms: one on a key that has none (PTTL -1: just
#: created), a longer one on a key whose TTL is shorter, and never a shorter one.
LENGTHEN_SOURCE = (
    "local ttl = tonumber(ARGV[1]) "
    "for _, key in ipairs(KEYS) do "
    "if redis.call('PTTL', key) < ttl then redis.call('PEXPIRE', key, ttl) end "
    "end"
)


def lengthen(ttl_ms: int, *keys: str) -> tuple[Any, ...]:
    """The command, for a :class:`Pipe`, that gives each of ``keys`` a TTL of at least
    ``ttl_ms`` and never shortens one (its reply is None).

    ``PEXPIRE ... NX`` then ``PEXPIRE ... GT`` would do it in plain commands, but
    those options are Redis 7.0's, and the package supports 6.2: a MULTI cannot
    choose between two commands by a reply, so a few lines of Lua do, sent with
    EVAL (a source this short costs less than a NOSCRIPT round trip could: in a
    MULTI, EVALSHA's NOSCRIPT would come back after the other commands had run,
    leaving a key they created without a TTL).
    """
    return ("EVAL", LENGTHEN_SOURCE, len(keys), *keys, ttl_ms)


def one(request: Request) -> Operation[Any]:
    """The operation of a single request: its result is Redis's reply."""
    reply = yield request
    return reply


_MULTI: LuaScript | None = None


def _as_script(pipe: Pipe) -> Script:
    """A MULTI/EXEC pipe, or an unparsed one on a cluster, as one script call:
    just as atomic (or more), one slot.

    redis-py's asyncio RedisCluster runs a transactional pipeline's commands
    through ``asyncio.run`` in threads (a new event loop each), which breaks
    on the caller's loop; a script runs the same commands atomically on the
    node that owns the slot.  That node also runs a command without a key
    (``TIME``), which a cluster pipeline would send to any node.
    """
    global _MULTI
    if _MULTI is None:
        _MULTI = LuaScript("multi")
    keys: list[str] = []
    args: list[Any] = []
    for command in pipe.commands:
        if len(command) == 1:  # no key (TIME): runs on the slot's node with the rest
            pass
        elif command[0] == "EVAL":
            # A script cannot send EVAL: multi.lua runs lengthen()'s itself.
            if command[1] != LENGTHEN_SOURCE:
                raise TypeError("a transaction on the asyncio cluster client can EVAL only lengthen()")
            names = command[3 : 3 + command[2]]
            command = ("LENGTHEN", command[3 + command[2]], *names)
            keys.extend(names)
        else:
            keys.append(command[1])
        args.append(len(command))
        args.extend(command)
    return Script(_MULTI, tuple(dict.fromkeys(keys)), tuple(args))


#: What a failing Redis raises on an asyncio client: asyncio connections can raise OSError unwrapped.
ASYNC_ERRORS: tuple[type[Exception], ...] = (*REDIS_ERRORS, OSError)

_RAW = {NEVER_DECODE: True}  # redis-py's option: read this reply without decoding it
_NONE: dict[str, Any] = {}


def _options(request: Command | Pipe) -> dict[str, Any]:
    """redis-py's options for the commands of ``request``."""
    if not request.raw:
        return _NONE
    if type(request) is Pipe and request.transaction:
        # MULTI/EXEC's replies come back in EXEC's, which takes no options.
        raise TypeError("a raw Pipe cannot be a transaction")
    return _RAW


def execute(client: Client, request: Request) -> Any:
    """Execute one request on a sync client."""
    if type(request) is Script:
        try:
            lane = lanes.lane(client)
            if lane is not None:
                return lane.evalsha(request.script.sha, request.keys, request.args)
            return client.evalsha(request.script.sha, len(request.keys), *request.keys, *request.args)
        except NoScriptError:
            # After a restart, failover or SCRIPT FLUSH: EVAL also caches it again.
            return client.eval(request.script.source, len(request.keys), *request.keys, *request.args)
    if type(request) is Pipe:
        if request.unparsed:
            lane = lanes.lane(client)
            if lane is not None:
                return lane.pipeline(request.commands, request.raise_on_error)
            if is_cluster(client):
                return execute(client, _as_script(request))
        pipe = client.pipeline(transaction=request.transaction)
        options = _options(request)
        for command in request.commands:
            pipe.execute_command(*command, **options)
        return pipe.execute(raise_on_error=request.raise_on_error)
    if type(request) is Command:
        if request.unparsed and not request.raw:
            lane = lanes.lane(client)
            if lane is not None:
                return lane.command(request.args)
        return client.execute_command(*request.args, **_options(request))
    if type(request) is Sleep:
        time.sleep(request.seconds)
        return None
    raise TypeError(f"not a request: {request!r}")


async def aexecute(client: Client, request: Request) -> Any:
    """Execute one request on an asyncio client."""
    if type(request) is Script:
        try:
            lane = lanes.async_lane(client)
            if lane is not None:
                return await lane.evalsha(request.script.sha, request.keys, request.args)
            return await client.evalsha(request.script.sha, len(request.keys), *request.keys, *request.args)
        except NoScriptError:
            return await client.eval(request.script.source, len(request.keys), *request.keys, *request.args)
    if type(request) is Pipe:
        if request.unparsed:
            lane = lanes.async_lane(client)
            if lane is not None:
                return await lane.pipeline(request.commands, request.raise_on_error)
        if (request.transaction or request.unparsed) and is_cluster(client):
            return await aexecute(client, _as_script(request))
        pipe = client.pipeline(transaction=request.transaction)
        options = _options(request)
        for command in request.commands:
            pipe.execute_command(*command, **options)
        return await pipe.execute(raise_on_error=request.raise_on_error)
    if type(request) is Command:
        if request.unparsed and not request.raw:
            lane = lanes.async_lane(client)
            if lane is not None:
                return await lane.command(request.args)
        return await client.execute_command(*request.args, **_options(request))
    if type(request) is Sleep:
        await asyncio.sleep(request.seconds)
        return None
    raise TypeError(f"not a request: {request!r}")


def run(client: Client, operation: Operation[T]) -> T:
    """Drive an operation generator on a sync client; return its result.

    A Redis failure is thrown into the operation at the ``yield`` of the request that
    failed: one that catches it goes on (a waiter riding out a Sentinel failover,
    :mod:`~django_semaphore.engine.waiting`), one that does not fails the call with a
    :class:`~django_semaphore.SemaphoreBackendError`."""
    try:
        request = next(operation)
        while True:
            try:
                reply = execute(client, request)
            except REDIS_ERRORS as exc:
                request = operation.throw(exc)
            else:
                request = operation.send(reply)
    except StopIteration as done:
        result: T = done.value
        return result
    except REDIS_ERRORS as exc:
        raise backend_error(client, exc) from exc


def _cancel_counter() -> Callable[[], int]:
    """The running task's count of cancel requests (Python 3.11+), as a callable."""
    task = asyncio.current_task()
    counter: Callable[[], int] = getattr(task, "cancelling", None) or (lambda: 0)
    return counter


async def arun(client: Client, operation: Operation[T]) -> T:
    """Drive an operation generator on an asyncio client; return its result.

    A cancellation is honoured even when redis-py loses it: its read path
    catches the CancelledError, awaits a disconnect that can raise a
    ConnectionError in its place, and its retry then sends the command again
    (a cancelled waiter kept waiting for its whole WAIT). The task's count of
    cancel requests survives that, so a count that grew during this call
    means a cancel arrived and was not delivered. Clean-up run by a task
    already cancelled before the call (releasing its slot) is not affected.
    A Redis failure is thrown into the operation, as by :func:`run`.
    """
    cancelling = _cancel_counter()
    before = cancelling()
    try:
        request = next(operation)
        while True:
            try:
                reply = await aexecute(client, request)
            except ASYNC_ERRORS as exc:
                if cancelling() > before:
                    raise asyncio.CancelledError from exc
                request = operation.throw(exc)  # as in run()
                continue
            if cancelling() > before:
                raise asyncio.CancelledError
            request = operation.send(reply)
    except StopIteration as done:
        result: T = done.value
        return result
    except ASYNC_ERRORS as exc:
        if cancelling() > before:
            raise asyncio.CancelledError from exc
        raise backend_error(client, exc) from exc


# -- flows: control flow written once, carried out sync or async --------------------------


@dataclass(slots=True)
class Call:
    """A step of a flow: call ``sync(*args)``, or await ``asynchronous(*args)``, as the driver is.

    For the one place where a flow's sync and async twins differ: which of two
    twin functions it calls.  The result is sent back into the flow, an
    exception thrown in.
    """

    sync: Callable[..., Any]
    asynchronous: Callable[..., Awaitable[Any]]
    args: tuple[Any, ...] = ()


@dataclass(slots=True)
class WaitFor:
    """A step of a flow: wait until ``ready()``, at most ``timeout`` seconds.

    ``ready`` is checked holding ``condition``, which whoever changes its answer
    notifies, so the wait ends as soon as it is true.  The sync driver blocks on
    the condition; the async driver, which must not block its event loop, waits
    on it in a worker thread (only when ``ready()`` is not true already).
    """

    condition: threading.Condition
    ready: Callable[[], bool]
    timeout: float

    def wait(self) -> bool:
        """Block until ``ready()`` or the timeout; ``ready()``'s last answer."""
        with self.condition:
            return self.condition.wait_for(self.ready, self.timeout)


#: Control flow written once for the sync and async APIs: a generator that yields
#: operations (each run whole by :func:`run` or :func:`arun` on the driver's
#: client) and steps (:class:`Call`, :class:`WaitFor`), and returns its result.
Flow = Generator[Any, Any, T]


def drive(client: Client, flow: Flow[T]) -> T:
    """Carry out ``flow`` in sync code, running its operations on ``client`` (which may be
    None for a flow that yields none); return its result.

    Each step's result is sent back into the flow, and its exception (a
    :class:`~django_semaphore.SemaphoreBackendError`, an interrupt) thrown in
    at the ``yield``, as if the flow had made the call itself.
    """
    try:
        step = next(flow)
        while True:
            try:
                if type(step) is Call:
                    reply = step.sync(*step.args)
                elif type(step) is WaitFor:
                    reply = step.wait()
                else:
                    reply = run(client, step)
            except BaseException as exc:
                step = flow.throw(exc)
            else:
                step = flow.send(reply)
    except StopIteration as done:
        result: T = done.value
        return result


async def adrive(client: Client, flow: Flow[T]) -> T:
    """Carry out ``flow`` in a coroutine, running its operations on ``client`` (an asyncio
    client, or None for a flow that yields none); return its result.

    As :func:`drive`: a cancellation arrives in the flow at the ``yield`` it is
    waiting at, and the flow decides what to give back before it ends.
    """
    try:
        step = next(flow)
        while True:
            try:
                if type(step) is Call:
                    reply = await step.asynchronous(*step.args)
                elif type(step) is WaitFor:
                    reply = step.ready() or await asyncio.to_thread(step.wait)
                else:
                    reply = await arun(client, step)
            except BaseException as exc:
                step = flow.throw(exc)
            else:
                step = flow.send(reply)
    except StopIteration as done:
        result: T = done.value
        return result
