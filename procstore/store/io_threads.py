"""`IoThreads`: the threads a local store's file work runs in, and a light hand-off to them.

A durable write spends its time in fsync, which the disk serves several at once, so file
work runs in threads. With a thousand procedures stepping at once the hand-off, not the
disk, bounds the rate: `loop.run_in_executor` makes a `concurrent.futures.Future` (a lock
and a condition) per call, chains it to an asyncio future, and wakes the event loop once per
result, each a turn at the GIL for the loop's thread. Here a call is a queue entry and an
asyncio future; results coming back while the loop is busy are delivered together, by one
wake-up.

Cancellation never abandons a call: like `procstore._aio.run_blocking`, the caller waits
for its thread to finish before re-raising, so no write lands after a stop has returned.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import weakref
from collections import deque
from collections.abc import Callable, Coroutine
from queue import SimpleQueue
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class _Call(Generic[T]):
    """One call of `fn(*args)`, run in a thread, answered on the caller's loop."""

    __slots__ = ("answer", "args", "cleans_up", "finished", "fn", "on_finished", "raised", "returned")

    def __init__(
        self, fn: Callable[..., T], args: tuple[Any, ...], answer: asyncio.Future[T], cleans_up: bool = False
    ) -> None:
        self.fn = fn
        self.args = args
        self.answer = answer
        self.cleans_up = cleans_up
        """`fn` returns a cleanup (or None) for the worker to run after answering, and the caller gets None."""
        self.returned: T | None = None
        self.raised: BaseException | None = None
        self.finished = False
        """Set on the loop's thread once the thread is done with the call."""
        self.on_finished: asyncio.Future[None] | None = None
        """Made by a cancelled caller that waits for the thread."""

    def run(self) -> Callable[[], None] | None:
        """Call `fn`; the cleanup it returned, for a call that `cleans_up`."""
        try:
            self.returned = self.fn(*self.args)
            if self.cleans_up:
                cleanup, self.returned = self.returned, None
                return cleanup  # type: ignore[return-value]
        except StopIteration as e:
            # An asyncio future refuses it (`TypeError` in `deliver`, which would strand every
            # call of its batch): the caller gets it as a generator would (PEP 479).
            error = RuntimeError(f"{getattr(self.fn, '__qualname__', self.fn)!s} raised StopIteration")
            error.__cause__ = e
            self.raised = error
        except BaseException as e:  # passed to the caller, whatever it is
            self.raised = e
        return None

    def deliver(self) -> None:
        """On the loop's thread: answer the caller (unless it was cancelled), wake a waiter."""
        self.finished = True
        answer = self.answer
        if not answer.done():
            if self.raised is not None:
                answer.set_exception(self.raised)
            else:
                answer.set_result(self.returned)  # type: ignore[arg-type]
        if self.on_finished is not None and not self.on_finished.done():
            self.on_finished.set_result(None)
        self.raised = None  # no reference cycle through the traceback


class _Deliveries:
    """Finished calls of one event loop, delivered in batches: a worker wakes the loop only
    when no delivery is pending already.

    It holds its loop weakly: `IoThreads` keeps one of these per loop in a weak-keyed dict,
    and a value that held its key would keep every loop that ever ran (each `asyncio.run`)
    alive for good. A call in flight holds its loop through its future.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = weakref.ref(loop)
        self._finished: deque[_Call[Any]] = deque()
        self._pending = False
        self._lock = threading.Lock()

    def push(self, call: _Call[Any]) -> None:
        """From a worker thread."""
        with self._lock:
            self._finished.append(call)
            if self._pending:
                return
            self._pending = True
        loop = self._loop()  # alive: `call.answer` holds it
        if loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits any more
                loop.call_soon_threadsafe(self._deliver)

    def _deliver(self) -> None:
        with self._lock:
            finished, self._finished = self._finished, deque()
            self._pending = False
        for call in finished:
            call.deliver()


class IoThreads:
    """`size` worker threads (started at first use) serving calls from any event loop."""

    def __init__(self, size: int, name: str) -> None:
        self._size = size
        self._name = name
        self._queue: SimpleQueue[tuple[_Call[Any], _Deliveries] | None] = SimpleQueue()
        self._started = False
        self._start_lock = threading.Lock()
        self._deliveries: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Deliveries] = (
            weakref.WeakKeyDictionary()
        )

    def run(self, fn: Callable[..., T], *args: Any) -> Coroutine[Any, Any, T]:
        """`fn(*args)` in a worker thread. If cancelled, wait for the thread, then re-raise."""
        return self._run(fn, args, cleans_up=False)

    def run_then_clean_up(self, fn: Callable[..., Callable[[], None] | None], *args: Any) -> Coroutine[Any, Any, None]:
        """`run` for an `fn` that returns a cleanup (or None): the worker answers the caller,
        then runs the cleanup (its errors ignored). The cleanup must be work nobody waits for
        and that may be cut short by an exit: nothing reads what it touches."""
        return self._run(fn, args, cleans_up=True)  # type: ignore[arg-type]

    async def _run(self, fn: Callable[..., T], args: tuple[Any, ...], *, cleans_up: bool) -> T:
        loop = asyncio.get_running_loop()
        deliveries = self._deliveries.get(loop)
        if deliveries is None:
            deliveries = self._deliveries[loop] = _Deliveries(loop)
        if not self._started:
            self._start()
        call: _Call[T] = _Call(fn, args, loop.create_future(), cleans_up)
        self._queue.put((call, deliveries))
        try:
            return await call.answer
        except asyncio.CancelledError:
            # However many cancels arrive (a stop, then a lease loss), the thread is waited for.
            while not call.finished:
                if call.on_finished is None:
                    call.on_finished = loop.create_future()
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.shield(call.on_finished)
            raise

    def _start(self) -> None:
        with self._start_lock:
            if self._started:
                return
            for i in range(self._size):
                # Daemon threads: an idle worker must not keep the interpreter alive. A call
                # in flight at exit is one whose caller has stopped waiting (a kill's effect).
                threading.Thread(target=self._work, name=f"{self._name}_{i}", daemon=True).start()
            self._started = True

    def _work(self) -> None:
        while (item := self._queue.get()) is not None:
            call, deliveries = item
            cleanup = call.run()
            deliveries.push(call)
            del call, deliveries, item
            if cleanup is not None:
                with contextlib.suppress(Exception):
                    cleanup()
                del cleanup

    def after_fork_in_child(self) -> None:
        """The parent's workers do not exist in a forked child: start new ones at first use,
        and forget the cleanups they would have finished."""
        for cleanups in list(_all_cleanups):
            cleanups.after_fork_in_child()
        self._queue = SimpleQueue()
        self._started = False
        self._start_lock = threading.Lock()
        self._deliveries = weakref.WeakKeyDictionary()


class Cleanups:
    """Cleanups (see `IoThreads.run_then_clean_up`) handed to the workers and not finished
    yet: a store's `close()` waits for its own, so that nothing in its folder changes once a
    manager has stopped. Reset in a forked child, where no thread will finish them."""

    def __init__(self) -> None:
        self._pending = 0
        self._done = threading.Condition()
        _all_cleanups.add(self)

    def wrap(self, cleanup: Callable[[], None]) -> Callable[[], None]:
        """Count `cleanup` as pending now (before the call that returns it is answered)."""
        with self._done:
            self._pending += 1

        def run() -> None:
            try:
                cleanup()
            finally:
                with self._done:
                    self._pending -= 1
                    self._done.notify_all()

        return run

    def wait(self) -> None:
        with self._done:
            self._done.wait_for(lambda: self._pending == 0)

    def after_fork_in_child(self) -> None:
        """The threads that would finish them do not exist here."""
        self._pending = 0
        self._done = threading.Condition()


_all_cleanups: weakref.WeakSet[Cleanups] = weakref.WeakSet()
