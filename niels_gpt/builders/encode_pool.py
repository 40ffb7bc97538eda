"""Where the cache builder's encode workers run: threads, or forked processes for tiktoken's own encoder.

The libraries' own encoders release the GIL, so threads are the default (they share the tokenizer). tiktoken's
own encoder does not scale on threads (two threads 1.2-1.4x one's rate, two processes 1.9x; docs/performance.md),
so a tokenizer with `encode_in_processes = True` gets workers forked before the builder starts any thread,
inheriting the open tokenizer. Threads all the same off Linux, with NIELS_GPT_ENCODE_THREADS=1, or where the
fast encoder (niels_gpt/tokenizer/fast.py) encodes. The ids are the same either way: every document is encoded
alone by `encode_documents`, and the caller joins the runs in order.

With the fast encoder, the threads encode runs of documents in GIL-free calls (FastEncoder.encode_arrays with
`batch`) while the builder's thread reads the next, each on a gigatoken model of its own: threads sharing one
model take turns (docs/performance.md).
"""

from __future__ import annotations

import ctypes
import multiprocessing
import os
import signal
import sys
import threading
from collections.abc import Sequence
from concurrent.futures import Future, ProcessPoolExecutor, ThreadPoolExecutor

from niels_gpt.long_documents import encode_documents
from niels_gpt.tokenizer.fast import fast_encoder

THREADS_ENV = "NIELS_GPT_ENCODE_THREADS"  # set to 1: encode on threads whatever the tokenizer prefers
PR_SET_PDEATHSIG = 1
# the fast encoder's threads, a model each (~35 MB for a 100k vocabulary): one thread reads about twice as fast
MAX_MODELS = 4  # as one model encodes, so more would only hold memory (docs/performance.md)
# while the fast encoder's threads run: how long the reading thread may hold the GIL when one of them, back from
# a GIL-free call, asks for it (Python's default 5 ms leaves a core idle; docs/performance.md)
SWITCH_INTERVAL_S = 0.0005

_TOKENIZER = None  # a forked worker's tokenizer, inherited from the builder (never pickled)
_SWITCHING = {"pools": 0, "interval": None}  # pools running fast encoder threads; the interval before the first
_SWITCHING_LOCK = threading.Lock()


def worker_init(parent: int) -> None:
    """A worker process's start: it dies with `parent` (Linux) and leaves Ctrl-C to it (one message, not a
    traceback per worker)."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):  # no prctl in this libc: the worker then outlives a killed parent
            pass
    if os.getppid() != parent:  # the parent died before the request took effect
        os._exit(1)
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _adopt(tokenizer, parent: int) -> None:
    global _TOKENIZER
    worker_init(parent)
    _TOKENIZER = tokenizer


def _encode_inherited(docs: list[str]) -> list:
    return encode_documents(_TOKENIZER, docs, 1, None, True)


def uses_processes(tokenizer) -> bool:
    """Whether the builder encodes for `tokenizer` on forked processes (see the module docstring)."""
    if not (getattr(tokenizer, "encode_in_processes", False) and sys.platform.startswith("linux")
            and os.environ.get(THREADS_ENV, "") in ("", "0")):
        return False
    # the fast encoder: threads. NOTE: its `encode` holds the GIL, but processes cost more in sending texts
    # and ids than they gain (docs/scale.md)
    return fast_encoder(tokenizer) is None


class EncodePool:
    """`workers` encoders for runs of documents: `encode(docs)` gives a Future of their ids (as
    `encode_documents(tokenizer, docs, 1, arrays=True)` would). `batch`: the fast encoder's GIL-free calls
    (module docstring)."""

    def __init__(self, tokenizer, workers: int):
        self.tokenizer = tokenizer
        self.processes = uses_processes(tokenizer)
        self.batch = not self.processes and getattr(fast_encoder(tokenizer), "batches", False)
        if self.processes:
            self.pool = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork"),
                                            initializer=_adopt, initargs=(tokenizer, os.getpid()))
            # NOTE: every worker is forked at the first submit: now, before the builder starts any thread
            self.pool.submit(int)
        else:
            self.pool = ThreadPoolExecutor(min(workers, MAX_MODELS) if self.batch else workers,
                                           thread_name_prefix="cache-encode")
        self._switching = self.batch
        if self._switching:
            _switch(+1)

    def encode(self, docs: Sequence[str]) -> Future:
        if self.processes:
            return self.pool.submit(_encode_inherited, list(docs))
        return self.pool.submit(encode_documents, self.tokenizer, docs, 1, None, True, self.batch)

    def shutdown(self, wait: bool = True) -> None:
        """Drop the work not started; `wait=False` (every result taken): idle workers exit in the background."""
        self.pool.shutdown(wait=wait, cancel_futures=True)
        if self._switching:
            self._switching = False
            _switch(-1)


def _switch(change: int) -> None:
    """A pool of fast encoder threads starts (+1: the switch interval is SWITCH_INTERVAL_S, if shorter, while any
    runs) or ends (-1: the last one gives back the interval there was before the first)."""
    with _SWITCHING_LOCK:
        _SWITCHING["pools"] += change
        if change > 0 and _SWITCHING["pools"] == 1:
            _SWITCHING["interval"] = sys.getswitchinterval()
            sys.setswitchinterval(min(SWITCH_INTERVAL_S, _SWITCHING["interval"]))
        elif change < 0 and _SWITCHING["pools"] == 0:
            sys.setswitchinterval(_SWITCHING["interval"])
