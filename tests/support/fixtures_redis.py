"""Redis topologies for the tests: a single server, a Cluster, a Sentinel set.

* ``redis_cluster``: a three-primary Redis Cluster on loopback, started once
  per session (skipped when no redis-server binary exists);
* ``backend``: parametrised over ``"single"`` (the session server through the
  django-redis alias) and ``"cluster"`` (SEMAPHORE_REDIS = {"URL": ...,
  "CLUSTER": True}); a test requesting it runs once on each.  ``backend_redis``
  is a plain client for the same topology, for assertions;
* ``own_redis``: a redis-server of the test's own (restart, pause, memory);
* ``redis_sentinel``: one primary, one replica and one sentinel.

A test module runs every test on both topologies with one line,
``pytestmark = pytest.mark.usefixtures("backend")``, without copying a test.
"""

import itertools
import os

import pytest
import redis
import redis.cluster

from django_semaphore.backend import connection
from tests.support.servers import (
    RedisClusterServers,
    RedisSentinelServers,
    RedisServer,
    redis_server_binary,
)

BACKENDS = ("single", "cluster")
_services = itertools.count(os.getpid() * 1000)


# A test that uses one of these (itself or through its fixtures) talks to the
# session's single server directly, so it runs on that backend only.
SINGLE_SERVER_FIXTURES = frozenset({"raw_redis", "prefix_keys", "redis_url", "subprocess_env"})
# key_prefix (autouse) only cleans up the session server; the backend fixture
# cleans the cluster itself.
_BACKEND_NEUTRAL = frozenset({"key_prefix"})


def _uses_single_server(metafunc):
    defs = metafunc._arg2fixturedefs
    seen = set()

    def uses(name):
        if name in SINGLE_SERVER_FIXTURES:
            return True
        if name in seen or name in _BACKEND_NEUTRAL:
            return False
        seen.add(name)
        return any(uses(arg) for fixturedef in defs.get(name, ()) for arg in fixturedef.argnames)

    return any(uses(name) for name in metafunc.definition._fixtureinfo.initialnames)


def pytest_generate_tests(metafunc):
    """Parametrise ``backend``; tests that talk to the single server directly get "single" only."""
    if "backend" in metafunc.fixturenames:
        for mark in metafunc.definition.iter_markers("parametrize"):
            if "backend" in str(mark.args[0]):
                return  # the test chose its backends itself
        params = ("single",) if _uses_single_server(metafunc) else BACKENDS
        metafunc.parametrize("backend", params, indirect=True)


def _need_binary():
    if not redis_server_binary():
        pytest.skip("no redis-server binary")


@pytest.fixture(scope="session")
def redis_cluster():
    """A three-primary Redis Cluster on 127.0.0.1 for the session."""
    _need_binary()
    if os.environ.get("SEMAPHORE_TEST_NO_CLUSTER"):
        pytest.skip("SEMAPHORE_TEST_NO_CLUSTER is set")
    with RedisClusterServers(primaries=3) as cluster:
        yield cluster


@pytest.fixture(scope="session")
def cluster_client(redis_cluster):
    """A plain RedisCluster client to the session cluster."""
    client = redis.cluster.RedisCluster(host="127.0.0.1", port=redis_cluster.nodes[0].port)
    yield client
    client.close()


def delete_prefix(client, prefix):
    """Delete every key under ``prefix`` (on every primary of a cluster)."""
    keys = list(connection.scan_iter(client, prefix + ":*"))
    for key in keys:  # one by one: keys of different slots cannot share a DEL on a cluster
        client.delete(key)
    return len(keys)


def _close_async_clients():
    """Close the asyncio clients of loops still open (an unclosed cluster client logs an error)."""
    for loop, client in list(connection._async_clients.items()):
        if not loop.is_closed() and not loop.is_running():
            loop.run_until_complete(client.aclose())
    connection.reset()


@pytest.fixture
def backend(request, settings, key_prefix):
    """The Redis topology of this run: "single" or "cluster" (SEMAPHORE_REDIS set accordingly)."""
    if request.param == "cluster":
        cluster = request.getfixturevalue("redis_cluster")
        client = request.getfixturevalue("cluster_client")
        settings.SEMAPHORE_REDIS = {"URL": cluster.url, "CLUSTER": True}
        yield "cluster"
        _close_async_clients()
        delete_prefix(client, key_prefix)
    else:
        yield "single"


@pytest.fixture
def backend_redis(backend, request):
    """A plain client (Redis or RedisCluster) to the topology of ``backend``."""
    if backend == "cluster":
        return request.getfixturevalue("cluster_client")
    return request.getfixturevalue("raw_redis")


@pytest.fixture
def own_redis(settings):
    """A redis-server of this test's own, used through SEMAPHORE_REDIS = {"URL": ...}."""
    _need_binary()
    server = RedisServer().start()
    settings.SEMAPHORE_REDIS = {"URL": server.url, "OPTIONS": {"socket_timeout": 2.0}}
    try:
        yield server
    finally:
        connection.reset()
        server.cleanup()


def sentinel_service():
    """A service name not used before in this process."""
    return f"mymaster-{next(_services)}"


@pytest.fixture
def redis_sentinel():
    """One primary, one replica and one sentinel watching them as "mymaster-<n>".

    The service name differs per test because django-redis keeps its
    connection pools in a process-global dict keyed by URL
    (``redis://<service>/0``): a reused name would reach the previous test's
    sentinel.
    """
    _need_binary()
    service = sentinel_service()
    with RedisSentinelServers(service=service, replicas=1, sentinels=1) as servers:
        yield servers
