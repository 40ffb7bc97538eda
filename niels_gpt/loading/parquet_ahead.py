"""Run a resumable batch producer ahead of the training loop, in a thread or a worker process.

- the producer (a loader's own batch function) runs in the background and fills a bounded queue of
  ready batches, each with the loader's state right after it was made;
- the loop takes batches from the queue; the state it sees (`delivered_state`) is the one that came
  with the last batch it took, so a checkpoint records the position of the batches handed out, never
  of those prefetched, and resuming is exact whatever the depth of the queue;
- a thread when the tokenizer releases the GIL while it encodes (sentencepiece, `tokenizers`,
  tiktoken: the native encoders), else one worker process, which runs the whole producer (a Python
  encoder would otherwise hold the GIL against the training loop); the process dies with its parent
  and leaves Ctrl-C to it;
- an error in the producer is raised by the next `get()`, in the loop's thread.

Cost: a thread adds one queue hand-off per batch (microseconds); a process adds pickling the batch
through a pipe (B=32, T=1024: 0.5 MB, well under a millisecond). Figures: bench/bench_loading.py.
"""

from __future__ import annotations

import multiprocessing
import os
import queue
import sys
import threading
from collections.abc import Callable

from niels_gpt.errors import ConfigError, NielsGPTError
from niels_gpt.loading.ahead import put_until_stopped, start_producer, stop_producer

MODES = ("auto", "thread", "process")
POLL_S = 0.1  # how often a blocked producer or consumer looks at the stop flag / the worker's pulse


def encoder_releases_gil(tokenizer) -> bool:
    """Whether `tokenizer.encode_batch` is a native batch call (it releases the GIL while it encodes).

    The base class's encode_batch is a Python loop over encode(); the library's backends replace it
    with their native batch encoders, which release the GIL."""
    from niels_gpt.tokenizer.base import Tokenizer  # lazy: the tokenizer layer is only asked here, once

    own = getattr(type(tokenizer), "encode_batch", None)
    return own is not None and own is not Tokenizer.encode_batch


def resolve_mode(mode: str, tokenizer) -> str:
    if mode not in MODES:
        raise ConfigError(f"prefetch mode {mode!r}: expected one of {', '.join(MODES)}")
    if mode != "auto":
        return mode
    return "thread" if encoder_releases_gil(tokenizer) else "process"


class Prefetcher:
    """`get()` -> (item, state after it) from `produce()` run ahead by up to `depth` items.

    Thread mode runs `produce` and `state` (callables of the caller's own loader) in a thread: the
    caller must not touch that loader until `stop()`. Process mode builds a fresh loader in a worker
    from `spec()` (a picklable (factory, args, kwargs)) and starts it at `start_state`.
    """

    def __init__(self, *, depth: int, mode: str, produce: Callable | None = None, state: Callable | None = None,
                 spec: tuple | None = None, start_state: dict | None = None):
        if depth < 1:
            raise ConfigError(f"prefetch depth {depth}: must be >= 1 (0 means no prefetching)")
        self.depth, self.mode = depth, mode
        self._produce, self._state, self._spec, self._start_state = produce, state, spec, start_state
        self._stop = threading.Event()
        self._worker = None
        self._queue = None

    # -- the loop's side ---------------------------------------------------------------------------
    def get(self):
        if self._worker is None:
            self._start()
        while True:
            try:
                kind, payload = self._queue.get(timeout=POLL_S)
            except queue.Empty:
                if not self._alive():
                    code = getattr(self._worker, "exitcode", None)
                    self.stop()
                    raise NielsGPTError(f"the batch prefetch {self.mode} stopped without an error "
                                        f"(exit code {code}); it was killed from outside (out of memory?): "
                                        "rerun, or train with --prefetch 0") from None
                continue
            if kind == "error":
                self.stop()
                raise payload
            return payload

    def stop(self) -> None:
        """Stop the producer and drop what it prefetched (the loop's state is unaffected)."""
        if self._worker is None:
            return
        self._stop.set()
        if self.mode == "process":
            self._worker.terminate()
            self._worker.join()
            self._queue.close()
            self._queue.join_thread()
        else:  # a producer blocked on a full queue wakes up, sees the flag and ends
            stop_producer(self._worker)
        self._worker, self._queue = None, None
        self._stop = threading.Event()

    def restart_at(self, state: dict | None) -> None:
        self.stop()
        self._start_state = state

    # -- the producer's side -----------------------------------------------------------------------
    def _start(self) -> None:
        if self.mode == "thread":
            self._queue = queue.Queue(maxsize=self.depth)
            self._worker = start_producer(_run, (self._produce, self._state, self._queue, self._stop),
                                          stop=self._stop, q=self._queue, name="batch-prefetch")
        else:
            ctx = multiprocessing.get_context("fork" if sys.platform.startswith("linux") else "spawn")
            self._queue = ctx.Queue(maxsize=self.depth)
            self._stop = ctx.Event()
            self._worker = ctx.Process(target=_run_in_process, name="batch-prefetch", daemon=True,
                                       args=(self._spec, self._start_state, self._queue, self._stop, os.getpid()))
            self._worker.start()

    def _alive(self) -> bool:
        return self._worker is not None and self._worker.is_alive()

    def __del__(self):
        try:
            self.stop()
        except Exception:  # noqa: BLE001 - interpreter shutdown: the worker is a daemon and ends with us
            pass


def _run(produce, state, q, stop) -> None:
    try:
        while not stop.is_set():
            item = produce()
            if not put_until_stopped(q, ("item", (item, state())), stop):
                return
    except BaseException as exc:  # noqa: BLE001 - handed to the loop, which raises it
        put_until_stopped(q, ("error", exc), stop)


def _run_in_process(spec, start_state, q, stop, parent: int) -> None:
    from niels_gpt.builders.encode_pool import worker_init  # lazy: only a worker process needs it

    worker_init(parent)
    try:
        factory, args, kwargs = spec
        loader = factory(*args, **kwargs)
        if start_state is not None:
            loader.load_state_dict(start_state)
    except BaseException as exc:  # noqa: BLE001
        put_until_stopped(q, ("error", _picklable(exc)), stop)
        return
    produce, state = loader.produce, loader.state_now
    try:
        while not stop.is_set():
            item = produce()
            if not put_until_stopped(q, ("item", (item, state())), stop):
                return
    except BaseException as exc:  # noqa: BLE001
        put_until_stopped(q, ("error", _picklable(exc)), stop)


def _picklable(exc: BaseException) -> BaseException:
    import pickle  # NOTE: only to test that the exception survives the queue

    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:  # noqa: BLE001
        return NielsGPTError(f"{type(exc).__name__}: {exc}")
