"""The local store's worker threads: answers, errors, cancellation, several loops."""

from __future__ import annotations

import asyncio
import gc
import threading
import time
import weakref
from pathlib import Path

import pytest

from procstore.store.io_threads import IoThreads
from procstore.store.local import LocalDirStore


async def test_answers_and_errors_come_back_to_their_callers() -> None:
    threads = IoThreads(4, "test-io")

    def square(x: int) -> int:
        time.sleep(0.001 * (x % 3))
        return x * x

    def boom() -> None:
        raise OSError("disk on fire")

    assert await asyncio.gather(*(threads.run(square, i) for i in range(200))) == [i * i for i in range(200)]
    with pytest.raises(OSError, match="disk on fire"):
        await threads.run(boom)


def test_the_threads_serve_one_loop_after_another() -> None:
    threads = IoThreads(2, "test-io")
    for _ in range(3):
        assert asyncio.run(threads.run(lambda: threading.current_thread().name)).startswith("test-io")


def test_a_call_finishing_after_its_loop_closed_is_dropped_quietly() -> None:
    threads = IoThreads(1, "test-io")
    release = threading.Event()

    async def leave_one_behind() -> None:
        asyncio.get_running_loop().create_task(threads.run(release.wait))
        await asyncio.sleep(0.01)

    loop = asyncio.new_event_loop()
    loop.run_until_complete(leave_one_behind())
    loop.close()
    release.set()
    time.sleep(0.05)
    assert asyncio.run(threads.run(lambda: 7)) == 7  # the worker lived on


def test_a_loop_that_used_the_threads_is_not_kept_alive_by_them(tmp_path: Path) -> None:
    """Each `asyncio.run` is a new loop: the local store's threads must not keep every one
    (its selector, its futures) for the life of the process."""
    loops: list[weakref.ref[asyncio.AbstractEventLoop]] = []

    async def write(n: int) -> None:
        loops.append(weakref.ref(asyncio.get_running_loop()))
        await LocalDirStore(tmp_path).put(f"k{n}", b"v")

    for n in range(3):
        asyncio.run(write(n))
    gc.collect()
    assert [ref() for ref in loops] == [None, None, None]


def test_a_call_raising_stop_iteration_strands_no_other_call() -> None:
    """`StopIteration` cannot be set on an asyncio future: the calls delivered with it in
    one batch must still be answered, and its caller gets an error, not a hang."""
    threads = IoThreads(1, "test-io")
    answers: list[object] = []

    def stop() -> None:
        raise StopIteration

    async def both() -> None:
        bad = asyncio.ensure_future(threads.run(stop))
        good = asyncio.ensure_future(threads.run(lambda: 7))
        await asyncio.sleep(0)
        time.sleep(0.2)  # noqa: ASYNC251 # both finish while the loop is busy: one batch
        answers.extend(await asyncio.gather(bad, good, return_exceptions=True))

    # In a thread of its own: a stranded call never returns, even once cancelled.
    threading.Thread(target=asyncio.run, args=(both(),), daemon=True).start()
    deadline = time.monotonic() + 5
    while not answers and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(answers) == 2, "a call of the batch was never answered"
    assert isinstance(answers[0], RuntimeError) and "StopIteration" in str(answers[0])
    assert answers[1] == 7


async def test_a_cleanup_runs_after_the_answer_and_its_error_is_dropped() -> None:
    threads = IoThreads(1, "test-io")
    answered = threading.Event()
    ran: list[bool] = []

    def clean() -> None:
        ran.append(answered.wait(5))  # the caller has its answer before this runs
        raise OSError("ignored: nobody waits for a cleanup")

    await threads.run_then_clean_up(lambda: clean)  # answered (with None) before the cleanup runs
    answered.set()
    assert await threads.run(lambda: 7) == 7  # the one worker lived on, past the cleanup's error
    assert ran == [True]
