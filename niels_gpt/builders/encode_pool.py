"""Where the cache builder's encode workers run: threads, or forked processes for an encoder that does not
scale on threads.

Every backend's encoder releases the GIL, so threads are the default: they share the tokenizer and start at
once. tiktoken's own encoder does not scale on threads (two threads encode 1.2-1.4x one's rate, two processes
1.9x; cl100k_base on debian-docs, bench/bench_tokenizers.py), so a tokenizer says `encode_in_processes = True`
and its workers are processes forked from the builder before it starts any thread, inheriting the open
tokenizer (only the documents and the uint32 arrays are pickled). Threads all the same: off Linux (macOS
cannot fork safely, Windows not at all), with NIELS_GPT_ENCODE_THREADS=1, or where the fast encoder
(niels_gpt/tokenizer/fast.py) encodes for it. A forked worker dies with its parent (Linux: PR_SET_PDEATHSIG)
and leaves Ctrl-C to it (one message, not a traceback per worker). The ids are the same either way: every
document is encoded alone by `encode_documents`, and the caller joins the runs in order.
"""

from __future__ import annotations

import ctypes
import multiprocessing
import os
import signal
import sys
from collections.abc import Sequence
from concurrent.futures import Future, ProcessPoolExecutor, ThreadPoolExecutor

from niels_gpt.long_documents import encode_documents
from niels_gpt.tokenizer.fast import fast_encoder

THREADS_ENV = "NIELS_GPT_ENCODE_THREADS"  # set to 1: encode on threads whatever the tokenizer prefers
PR_SET_PDEATHSIG = 1

_TOKENIZER = None  # a forked worker's tokenizer, inherited from the builder (never pickled)


def die_with_parent(parent: int) -> None:
    """Ask the kernel to end this process when `parent` ends (Linux), and end now if it already has."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):  # no prctl in this libc: the worker then outlives a killed parent
            pass
    if os.getppid() != parent:  # the parent died before the request took effect
        os._exit(1)


def worker_init(parent: int) -> None:
    """A worker process's start: it dies with `parent`, and leaves Ctrl-C to it (the parent stops the pool
    and reports the interrupt once, instead of every worker printing a KeyboardInterrupt traceback)."""
    die_with_parent(parent)
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
    # the fast encoder spreads each batch over every core itself and releases the GIL: threads
    return fast_encoder(tokenizer) is None


class EncodePool:
    """`workers` encoders for runs of documents: `encode(docs)` gives a Future of their ids (as
    `encode_documents(tokenizer, docs, 1, arrays=True)` would)."""

    def __init__(self, tokenizer, workers: int):
        self.tokenizer = tokenizer
        self.processes = uses_processes(tokenizer)
        if self.processes:
            self.pool = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork"),
                                            initializer=_adopt, initargs=(tokenizer, os.getpid()))
            # A fork context forks every worker at the first submit, on this thread and before the pool's
            # own manager thread starts: do it now, while the builder has no thread of its own (its writer
            # and progress threads start after this)
            self.pool.submit(int)
        else:
            self.pool = ThreadPoolExecutor(workers, thread_name_prefix="cache-encode")

    def encode(self, docs: Sequence[str]) -> Future:
        if self.processes:
            return self.pool.submit(_encode_inherited, list(docs))
        return self.pool.submit(encode_documents, self.tokenizer, docs, 1, None, True)

    def shutdown(self, wait: bool = True) -> None:
        """Drop the work not started; `wait=False` (every result taken): idle workers exit in the background."""
        self.pool.shutdown(wait=wait, cancel_futures=True)
