"""Items made in the background, a few ahead of the loop that takes them: one producer for every loader.

A thread (or one worker process for a tokenizer that holds the GIL) fills a bounded queue and the loop takes
the items in order, so a state that came with the last item taken is exact at any depth. A producer's error
is raised by the next `get()`. Every producer thread stops before the interpreter finalises: a thread left
inside torch while torch is torn down aborts the process. Figures: bench/bench_loading.py.
"""

from __future__ import annotations

import atexit
import multiprocessing
import os
import queue
import sys
import threading
import time
import weakref

from niels_gpt.errors import ConfigError, NielsGPTError

MODES = ("auto", "thread", "process")
POLL_S = 0.1  # how often a blocked producer or consumer looks at the stop flag / the worker's pulse
EXIT_WAIT_S = 30.0  # at exit, how long to wait for a producer inside one long item (a download) to stop
END = object()  # what get() returns once the producer's items are exhausted

_threads: weakref.WeakSet[Prefetcher] = weakref.WeakSet()  # prefetchers whose producer thread runs
_lock = threading.Lock()
_hooked = False


def resolve_mode(mode: str, tokenizer) -> str:
    """`mode`, or for "auto": a thread when `tokenizer.encode_batch` is a native batch call (it releases the
    GIL), a process when it is the base class's Python loop."""
    from niels_gpt.tokenizer.base import Tokenizer  # lazy: the tokenizer layer is only asked here, once

    if mode not in MODES:
        raise ConfigError(f"prefetch mode {mode!r}: expected one of {', '.join(MODES)}")
    if mode != "auto":
        return mode
    own = getattr(type(tokenizer), "encode_batch", None)
    return "thread" if own is not None and own is not Tokenizer.encode_batch else "process"


class Prefetcher:
    """`get()` -> the next item of `make_iter()` run ahead by up to `depth` items (END after the last).

    Thread mode iterates `make_iter()` (on the caller's loader: untouched until `stop()`). Process mode builds
    a loader from `spec` ((factory, args, kwargs)) at `start_state` and yields (produce(), state_now()).
    """

    def __init__(self, *, depth: int, mode: str = "thread", make_iter=None, spec: tuple | None = None,
                 start_state: dict | None = None):
        if depth < 1:
            raise ConfigError(f"prefetch depth {depth}: must be >= 1 (0 means no prefetching)")
        self.depth, self.mode = depth, mode
        self._make_iter, self._spec, self._start_state = make_iter, spec, start_state
        self._stop = threading.Event()
        self._worker = None
        self._queue = None

    def get(self):
        if self._worker is None:
            self._start()
        while True:
            try:
                kind, payload = self._queue.get(timeout=POLL_S)
            except queue.Empty:
                if not self._worker.is_alive():
                    code = getattr(self._worker, "exitcode", None)
                    self.stop()
                    raise NielsGPTError(f"the batch prefetch {self.mode} stopped without an error "
                                        f"(exit code {code}); it was killed from outside (out of memory?): "
                                        "rerun, or train with --prefetch 0") from None
                continue
            if kind == "error":
                self.stop()
                raise payload
            if kind == "end":
                self.stop()
                return END
            return payload

    def stop(self, timeout: float | None = None) -> None:
        """Stop the producer and drop what it made ahead (the loop's state is unaffected)."""
        if self._worker is None:
            return
        self._stop.set()
        if self.mode == "process":
            self._worker.terminate()
            self._worker.join()
            self._queue.close()
            self._queue.join_thread()
        else:  # a producer blocked on a full queue wakes up when it is emptied, sees the flag and ends
            deadline = None if timeout is None else time.monotonic() + timeout
            while self._worker.is_alive() and (deadline is None or time.monotonic() < deadline):
                try:
                    self._queue.get_nowait()
                except queue.Empty:
                    self._worker.join(POLL_S)
            if self._worker.is_alive():  # a wait cut short at exit
                return
            _threads.discard(self)
        self._worker, self._queue = None, None
        self._stop = threading.Event()

    def restart_at(self, state: dict | None) -> None:
        self.stop()
        self._start_state = state

    def _start(self) -> None:
        global _hooked
        if self.mode == "thread":
            self._queue = queue.Queue(maxsize=self.depth)
            self._worker = threading.Thread(target=_feed, args=(self._make_iter, self._queue, self._stop),
                                            name="batch-prefetch", daemon=True)
            with _lock:
                if not _hooked:
                    # NOTE: registered after torch's exit hooks (torch is imported by then): it runs first
                    atexit.register(_stop_all)
                    _hooked = True
                _threads.add(self)
        else:
            ctx = multiprocessing.get_context("fork" if sys.platform.startswith("linux") else "spawn")
            self._queue = ctx.Queue(maxsize=self.depth)
            self._stop = ctx.Event()
            self._worker = ctx.Process(target=_feed_in_process, name="batch-prefetch", daemon=True,
                                       args=(self._spec, self._start_state, self._queue, self._stop, os.getpid()))
        self._worker.start()

    def __del__(self):
        try:
            self.stop()
        except Exception:  # noqa: BLE001 - interpreter shutdown: the worker is a daemon and ends with us
            pass


def assembled_ahead(make_iter, n: int):
    """Iterate `make_iter()` on a background thread, at most `n` items ahead; n=0: in this thread."""
    if n < 1:
        yield from make_iter()
        return
    ahead = Prefetcher(depth=n, make_iter=make_iter)
    try:
        while (item := ahead.get()) is not END:
            yield item
    finally:
        ahead.stop()


def _stop_all() -> None:
    """At exit: a thread left inside torch while torch is torn down aborts the process."""
    with _lock:
        live = list(_threads)
    for p in live:
        p._stop.set()
    for p in live:
        p.stop(EXIT_WAIT_S)


def put_until_stopped(q, item, stop) -> bool:
    """Put, waiting while the queue is full; False once asked to stop."""
    while not stop.is_set():
        try:
            q.put(item, timeout=POLL_S)
            return True
        except queue.Full:
            continue
    return False


def _feed(make_iter, q, stop, convert=lambda exc: exc) -> None:
    try:
        for item in make_iter():
            if stop.is_set() or not put_until_stopped(q, ("item", item), stop):
                return
        put_until_stopped(q, ("end", None), stop)
    except BaseException as exc:  # noqa: BLE001 - handed to the loop, which raises it
        put_until_stopped(q, ("error", convert(exc)), stop)


def _feed_in_process(spec, start_state, q, stop, parent: int) -> None:
    from niels_gpt.builders.encode_pool import worker_init  # lazy: only a worker process needs it

    worker_init(parent)

    def items():
        factory, args, kwargs = spec
        loader = factory(*args, **kwargs)
        if start_state is not None:
            loader.load_state_dict(start_state)
        while True:
            yield loader.produce(), loader.state_now()

    _feed(items, q, stop, _picklable)


def _picklable(exc: BaseException) -> BaseException:
    import pickle  # NOTE: only to test that the exception survives the queue

    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:  # noqa: BLE001
        return NielsGPTError(f"{type(exc).__name__}: {exc}")
