"""Giving back under cancellation (django_semaphore.cancellation): a give-back that
cancelling its caller cannot cut short."""

import asyncio

import pytest

from django_semaphore.engine import cancellation
from tests.support.helpers import until


@pytest.mark.asyncio
async def test_run_to_completion_finishes_even_if_the_caller_is_cancelled_again():
    started, proceed, finished = asyncio.Event(), asyncio.Event(), []

    async def give_back():
        started.set()
        await proceed.wait()
        finished.append(True)

    async def caller():
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            await cancellation.run_to_completion(give_back())
            raise

    task = asyncio.create_task(caller())
    await asyncio.sleep(0)
    task.cancel()
    await asyncio.wait_for(started.wait(), 10)
    task.cancel()  # again, while it gives back
    with pytest.raises(asyncio.CancelledError):
        await task
    assert finished == []
    proceed.set()

    async def done():
        return finished == [True]

    await until(done, message="the give-back finished", interval=0.005)
    assert not cancellation._finishing  # and nothing is kept once done


@pytest.mark.asyncio
async def test_finish_soon_keeps_the_give_back_referenced_until_it_ends():
    proceed, finished = asyncio.Event(), []

    async def give_back():
        await proceed.wait()
        finished.append(True)

    task = cancellation.finish_soon(give_back())
    assert task in cancellation._finishing  # the loop itself keeps only a weak reference
    proceed.set()
    await asyncio.wait_for(task, 10)
    assert finished == [True]
    assert task not in cancellation._finishing
