"""What every algorithm offers the engine (django_semaphore.algorithms.base): the
registry, the Algorithm Protocol's outcomes, and the helpers they share."""

import time

from django_semaphore.engine.algorithms import ALGORITHMS, Refused
from django_semaphore.engine.algorithms.base import as_int, as_str, client_ms, record, retry_after_seconds


def test_the_registry_holds_every_algorithm_the_settings_accept():
    from django_semaphore.config.validation import ALGORITHM_NAMES

    assert sorted(ALGORITHMS) == sorted(ALGORITHM_NAMES)
    assert all(algorithm.name == name for name, algorithm in ALGORITHMS.items())
    assert [name for name, algorithm in ALGORITHMS.items() if algorithm.queues] == ["lua"]


def test_retry_after_is_whole_seconds_from_one_to_the_callers_timeout():
    assert retry_after_seconds(0, 60) == 1  # never 0: a client would retry at once
    assert retry_after_seconds(1, 60) == 1
    assert retry_after_seconds(1000, 60) == 1
    assert retry_after_seconds(1001, 60) == 2  # rounded up
    assert retry_after_seconds(90_000, 60) == 60  # at most the caller's TIMEOUT
    assert retry_after_seconds(90_000, 0.2) == 1
    assert Refused(2500.0).retry_after(60) == 3


def test_reply_items_read_as_text_and_numbers():
    assert as_str(b"w1") == as_str("w1") == "w1"
    assert as_int(b"42") == as_int("42") == as_int(42) == 42
    assert record(7, 1000, '{"n":1}') == '7:1000:{"n":1}'


def test_the_client_clock_is_time_time_in_milliseconds():
    before = time.time() * 1000
    now = client_ms()
    assert before <= now <= time.time() * 1000
    assert any(client_ms() % 1 for _ in range(10))  # below the millisecond: acquires do not tie
