"""contrib.celery.store: the keys of semaphore_task, bounded and in their partition's slot."""

import pytest

pytest.importorskip("celery")

from django_semaphore import Semaphore
from django_semaphore.contrib.celery import store


@pytest.mark.parametrize("task_id", ["0b1f-uuid", "x" * 100_000, "{}\n\x00*?[]", ""])
def test_a_run_key_is_bounded_and_in_the_partitions_slot_whatever_the_task_id(task_id):
    keys = Semaphore("cel-store", limit=1, timeout=30).partition("tenant")
    key = store.run_key(keys, task_id)
    assert key.startswith(keys.base + store.RUN_SUFFIX) and len(key) <= 300
    assert key != store.run_key(keys, task_id + "-")


def test_the_keys_of_a_partition_share_its_hash_tag():
    keys = Semaphore("cel-store", limit=1, timeout=30).partition(None)
    tag = keys.base[keys.base.index("{") : keys.base.index("}") + 1]
    for key in (store.queue_key(keys), store.lock_key(keys), store.run_key(keys, "id")):
        assert key.count("{") == 1 and tag in key
    assert store.registry_key().endswith(":" + store.REGISTRY_SUFFIX)


def test_replies_are_text_whether_or_not_the_client_decodes():
    assert store.text(b"done") == store.text("done") == "done"
    assert store.text(1) == "1"
