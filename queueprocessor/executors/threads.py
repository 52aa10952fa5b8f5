"""Worker threads for plain Python jobs, handed calls from the node's event loop.

run_in_executor makes two futures per call (a concurrent one with its own lock and condition, and the asyncio
one chained to it); with no-op jobs that bookkeeping was a third of the loop thread's time (py-spy --gil), and
the loop thread is what a node running plain functions waits on. Here a call is one queue put there, and its
result one append to a list that the loop takes whole: one call_soon_threadsafe (a wake-up of the loop, a write
to its pipe) for all the calls that ended meanwhile, not one per call. As with a thread pool, a thread is added
whenever more calls are under way than there are threads, up to a limit: a call that blocks never holds up
another.
"""

import asyncio
import queue
import threading
from collections.abc import Callable


class Call:
    """A call handed to a thread. `done` holds its result; `over` once the thread is finished with it,
    even if whoever awaited `done` gave up (see Threads.finished)."""

    __slots__ = ("done", "over", "_ended")

    def __init__(self, done: asyncio.Future[object]):
        self.done = done
        self.over = False
        self._ended: asyncio.Future[None] | None = None


class Threads:
    def __init__(self, loop: asyncio.AbstractEventLoop, limit: int, name: str):
        self.loop = loop
        self.limit = limit
        self.name = name
        self._calls: queue.SimpleQueue[tuple[Call, Callable[..., object], tuple[object, ...]] | None] = (
            queue.SimpleQueue()
        )
        self._threads = 0
        self._under_way = 0  # calls handed over and not yet back (changed on the loop only)
        self._ended: list[tuple[Call, object, BaseException | None]] = []  # back from the threads, not yet seen
        self._ended_lock = threading.Lock()

    def call(self, function: Callable[..., object], *args: object) -> Call:
        """Run `function(*args)` in a thread; call only on the loop."""
        call = Call(self.loop.create_future())
        self._under_way += 1
        if self._under_way > self._threads and self._threads < self.limit:
            self._threads += 1
            threading.Thread(target=self._serve, name=f"{self.name}-{self._threads}", daemon=True).start()
        self._calls.put((call, function, args))
        return call

    async def finished(self, call: Call, timeout: float | None) -> bool:
        """Wait up to `timeout` seconds (None: for ever) for the thread to be done with `call` (its `done` may be
        cancelled). Whether it is."""
        if not call.over:
            if call._ended is None:
                call._ended = self.loop.create_future()
            try:
                await asyncio.wait_for(asyncio.shield(call._ended), timeout)
            except TimeoutError:
                pass
        return call.over

    def close(self) -> None:
        """Drop the calls not started yet and let every thread end (a call under way runs to its end, alone)."""
        try:
            while True:
                self._calls.get_nowait()
        except queue.Empty:
            pass
        for _ in range(self._threads):
            self._calls.put(None)
        self._threads = 0

    def _serve(self) -> None:
        while (item := self._calls.get()) is not None:
            call, function, args = item
            outcome: tuple[object, BaseException | None]
            try:
                outcome = function(*args), None
            except BaseException as error:  # handed back to the awaiting job, as run_in_executor would
                outcome = None, error
            with self._ended_lock:
                self._ended.append((call, *outcome))
                first = len(self._ended) == 1  # the loop has not been told yet
            if first:
                try:
                    self.loop.call_soon_threadsafe(self._back)
                except RuntimeError:  # the loop is closed: the node is gone, nobody waits for this
                    return

    def _back(self) -> None:
        with self._ended_lock:
            ended, self._ended = self._ended, []
        self._under_way -= len(ended)
        for call, result, error in ended:
            call.over = True
            if not call.done.done():
                if error is None:
                    call.done.set_result(result)
                else:
                    call.done.set_exception(error)
            if call._ended is not None and not call._ended.done():
                call._ended.set_result(None)
