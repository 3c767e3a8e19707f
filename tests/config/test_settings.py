"""Reading the settings (django_semaphore.conf): lazily, so that ``override_settings``
and pytest-django's ``settings`` fixture take effect at the next call."""

import pytest
from django.core.exceptions import ImproperlyConfigured

from django_semaphore import Semaphore, semaphores
from django_semaphore.config import settings as conf


def test_unknown_semaphore_raises_improperly_configured():
    with pytest.raises(ImproperlyConfigured, match="unknown.*reports"):
        semaphores["unknown"]
    with pytest.raises(ImproperlyConfigured):
        Semaphore("unknown").acquire()
    assert "reports" in semaphores and "unknown" not in semaphores
    assert list(semaphores) == ["reports"]


def test_settings_changes_take_effect_at_the_next_call(settings):
    sem = semaphores["reports"]
    settings.SEMAPHORES = {"reports": {"LIMIT": 1, "TIMEOUT": 7}}
    assert (sem.limit, sem.timeout) == (1, 7)
    held = sem.acquire()
    assert sem.acquire() is None
    settings.SEMAPHORES = {"reports": {"LIMIT": 2, "TIMEOUT": 7}}
    assert sem.acquire() is not None  # the same object, the new LIMIT
    settings.SEMAPHORES = {"reports": {"LIMIT": 0}}
    with pytest.raises(ImproperlyConfigured, match="LIMIT"):
        sem.acquire()
    settings.SEMAPHORES = {"reports": {"LIMIT": 2}}
    assert held.release() is True


def test_prefix_changes_take_effect_at_the_next_call(settings):
    sem = Semaphore("moving", limit=1)
    before = sem.partition().base
    settings.SEMAPHORE_KEY_PREFIX = settings.SEMAPHORE_KEY_PREFIX + "-other"
    after = sem.partition().base
    assert before != after and after.startswith(settings.SEMAPHORE_KEY_PREFIX + ":")


def test_a_setting_not_in_settings_reads_its_default(settings):
    assert not hasattr(settings, "SEMAPHORE_FAIL_OPEN")  # tests/support/settings.py leaves it out
    assert conf.setting("SEMAPHORE_FAIL_OPEN") is conf.DEFAULTS["SEMAPHORE_FAIL_OPEN"] is False
    settings.SEMAPHORE_FAIL_OPEN = True
    assert conf.setting("SEMAPHORE_FAIL_OPEN") is True


def test_names_follow_the_settings_order(settings):
    settings.SEMAPHORES = {"b": {"LIMIT": 1}, "a": {"LIMIT": 1}, "c": {"LIMIT": 0}}
    assert conf.names() == ["b", "a", "c"]  # the bad entry too: checks report it
    settings.SEMAPHORES = ["not", "a", "dict"]
    assert conf.names() == []


def test_the_verdict_is_cached_until_a_setting_changes(settings):
    first = conf.validated()
    assert conf.validated() is first  # not validated again per call
    settings.SEMAPHORES = {"reports": {"LIMIT": 3}}
    assert conf.validated() is not first
    assert conf.get_config("reports").limit == 3
