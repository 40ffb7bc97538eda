"""Batches assembled on a background thread, a few ahead of the loop that takes them.

Without DataLoader workers, a batch is gathered in the training loop's own thread, between two steps:
~0.3-0.5 ms of a 32 x 1024 IndexedWindowDataset batch here, the whole of the loop's data wait. A thread
that assembles the next batches while the step runs (a GPU step leaves the CPU free; numpy's gathers
and casts release the GIL) leaves the loop one queue get (~20 us). Worker processes do the same at the
price of a copy through shared memory and a file descriptor per tensor (~1-2 ms a batch here).

- order and contents are the iterable's own: one thread, one queue, delivered in order;
- an exception in the thread is raised in the loop, at the batch where it happened;
- closing the generator (the loop leaves early, the loader is restarted) stops the thread.
"""

from __future__ import annotations

import queue
import threading

_END = object()


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
                while not stop.is_set():
                    try:
                        q.put((item, None), timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if stop.is_set():
                    return
            q.put((_END, None))
        except BaseException as exc:  # handed to the loop, raised there
            q.put((_END, exc))

    t = threading.Thread(target=produce, name="niels-gpt-batches", daemon=True)
    t.start()
    try:
        while True:
            item, exc = q.get()
            if item is _END:
                if exc is not None:
                    raise exc
                return
            yield item
    finally:
        stop.set()
        while t.is_alive():  # let a producer blocked on a full queue see the stop
            try:
                q.get_nowait()
            except queue.Empty:
                t.join(0.05)
