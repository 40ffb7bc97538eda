"""Batches assembled on a background thread, a few ahead of the loop that takes them.

Without DataLoader workers, a batch is gathered in the training loop's own thread, between two steps:
~0.3-0.5 ms of a 32 x 1024 IndexedWindowDataset batch here, the whole of the loop's data wait. A thread
that assembles the next batches while the step runs (a GPU step leaves the CPU free; numpy's gathers
and casts release the GIL) leaves the loop one queue get (~20 us). Worker processes do the same at the
price of a copy through shared memory and a file descriptor per tensor (~1-2 ms a batch here).

- order and contents are the iterable's own: one thread, one queue, delivered in order;
- an exception in the thread is raised in the loop, at the batch where it happened;
- closing the generator (the loop leaves early, the loader is restarted) stops the thread;
- every producer thread stops before the interpreter finalises (an exit hook signals and joins it), so a
  script that takes one batch and ends never leaves a thread inside torch while torch is torn down
  (that aborts the process: "terminate called without an active exception", exit code 134).
"""

from __future__ import annotations

import atexit
import queue
import threading
import time

POLL_S = 0.1  # how often a blocked producer looks at its stop flag
EXIT_WAIT_S = 30.0  # at exit, how long to wait for a producer inside one long item (a download) to stop

_END = object()
_running: dict[threading.Thread, tuple[threading.Event, queue.Queue]] = {}
_lock = threading.Lock()
_hooked = False


def start_producer(target, args: tuple, *, stop: threading.Event, q: queue.Queue, name: str) -> threading.Thread:
    """Start `target(*args)` on a thread that `stop_producer` (or the interpreter's exit) stops and joins."""
    global _hooked
    t = threading.Thread(target=target, args=args, name=name, daemon=True)
    with _lock:
        if not _hooked:
            # NOTE: registered after torch's own exit hooks (torch is imported by then), so it runs before them
            atexit.register(_stop_all)
            _hooked = True
        _running[t] = (stop, q)
    t.start()
    return t


def stop_producer(t: threading.Thread, timeout: float | None = None) -> None:
    """Signal the producer to stop and wait for it, emptying its queue so that a blocked put wakes up."""
    with _lock:
        stop, q = _running.pop(t, (None, None))
    if stop is None:
        return
    stop.set()
    deadline = None if timeout is None else time.monotonic() + timeout
    while t.is_alive() and (deadline is None or time.monotonic() < deadline):
        try:
            q.get_nowait()
        except queue.Empty:
            t.join(POLL_S)


def _stop_all() -> None:
    with _lock:
        threads = list(_running)
    for t in threads:
        with _lock:
            entry = _running.get(t)
        if entry is not None:
            entry[0].set()
    for t in threads:
        stop_producer(t, EXIT_WAIT_S)


def put_until_stopped(q: queue.Queue, item, stop: threading.Event) -> bool:
    """Put, waiting while the queue is full; False once asked to stop."""
    while not stop.is_set():
        try:
            q.put(item, timeout=POLL_S)
            return True
        except queue.Full:
            continue
    return False


def assembled_ahead(make_iter, n: int):
    """Iterate `make_iter()` on a background thread, at most `n` batches ahead; n=0: in this thread."""
    if n < 1:
        yield from make_iter()
        return
    q: queue.Queue = queue.Queue(maxsize=n)
    stop = threading.Event()

    def produce():
        try:
            for item in make_iter():
                if not put_until_stopped(q, (item, None), stop):
                    return
            put_until_stopped(q, (_END, None), stop)
        except BaseException as exc:  # handed to the loop, raised there
            put_until_stopped(q, (_END, exc), stop)

    t = start_producer(produce, (), stop=stop, q=q, name="niels-gpt-batches")
    try:
        while True:
            item, exc = q.get()
            if item is _END:
                if exc is not None:
                    raise exc
                return
            yield item
    finally:
        stop_producer(t)
