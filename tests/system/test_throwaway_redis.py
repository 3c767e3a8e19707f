"""The throwaway redis-servers every test session, benchmark and demo starts
(tests/support/servers.py): a port picked free can be taken before the server
binds it, and the rig must neither fail nor take another process's server for
its own.
"""

import socket

import pytest
import redis

from tests.support.servers import RedisSentinelServers, RedisServer, free_cluster_port, free_port

CLUSTER_ARGS = ("--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf")


@pytest.fixture
def listening():
    """A function binding a listening socket on 127.0.0.1:port; all closed at teardown."""
    sockets = []

    def listen(port):
        sock = socket.socket()
        sock.bind(("127.0.0.1", port))
        sock.listen()
        sockets.append(sock)
        return port

    yield listen
    for sock in sockets:
        sock.close()


def picks(*ports):
    """A pick_port giving ``ports`` in turn, then free ones; records each pick."""
    queue = list(ports)
    picked = []

    def pick():
        port = queue.pop(0) if queue else free_port()
        picked.append(port)
        return port

    pick.picked = picked
    return pick


def pid_of(server):
    with redis.Redis(port=server.port) as client:
        return client.info("server")["process_id"]


def test_a_picked_port_taken_before_the_server_binds_it_is_picked_again(listening):
    taken = listening(free_port())
    pick = picks(taken)
    with RedisServer(pick_port=pick) as server:
        assert server.port != taken
        assert pick.picked[0] == taken and len(pick.picked) == 2
        assert pid_of(server) == server.process.pid


def test_a_port_another_redis_server_holds_is_not_taken_for_ours():
    # A PING on the port answers PONG from the other server while ours exits
    # on "Address already in use": the rig must check the answer is its own.
    with RedisServer() as other:
        pick = picks(other.port)
        with RedisServer(pick_port=pick) as server:
            assert server.port != other.port
            assert pid_of(server) == server.process.pid != pid_of(other)


def test_a_cluster_node_whose_bus_port_is_taken_is_moved(listening):
    port = free_cluster_port()
    listening(port + 10000)  # the node's cluster bus port
    pick = picks(port)
    with RedisServer(args=CLUSTER_ARGS, pick_port=pick) as node:
        assert node.port != port
        with redis.Redis(port=node.port) as client:
            assert client.cluster("myid")  # a cluster node, not stuck on the old nodes.conf


def test_a_fixed_port_that_is_taken_fails_with_the_servers_own_words(listening):
    taken = listening(free_port())
    server = RedisServer(port=taken)
    try:
        with pytest.raises(RuntimeError, match="Address already in use"):
            server.start()
        assert server.port == taken
    finally:
        server.cleanup()


def test_a_restart_comes_back_on_the_same_port():
    with RedisServer() as server:
        port = server.port
        server.restart()
        assert server.port == port
        assert pid_of(server) == server.process.pid


def test_every_attempt_failing_gives_up_with_the_last_servers_log(listening):
    taken = listening(free_port())
    pick = picks(*[taken] * RedisServer.PORT_ATTEMPTS)
    server = RedisServer(pick_port=pick)
    try:
        with pytest.raises(RuntimeError, match=f"{taken}.*Address already in use"):
            server.start()
        assert len(pick.picked) == RedisServer.PORT_ATTEMPTS
    finally:
        server.cleanup()


def test_a_sentinel_whose_port_is_taken_is_moved(listening):
    rig = RedisSentinelServers(replicas=0)
    taken = rig.sentinel_ports[0] = listening(free_port())
    with rig:
        assert rig.sentinel_ports[0] != taken
        assert rig.master_address() == ("127.0.0.1", rig.primary.port)
