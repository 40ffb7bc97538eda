"""The C allocator while a command, a build or a CPU run works: glibc's malloc keeps freed memory for reuse.

By default glibc maps a block above its mmap threshold (128 KiB, rising to 32 MiB as such blocks are freed) on
its own and unmaps it when it is freed, so a loop that frees and allocates large buffers again and again (a CPU
step's logits and gradients, a build's byte ranges and token arrays) has the kernel map and zero their pages
every time. Inside `kept()` every block comes from the heap and up to KEPT_FREE_BYTES freed at its top stay for
the next use; on leaving, glibc's defaults are back (its threshold then stays at 128 KiB) and the free memory is
returned (malloc_trim). Figures: docs/training.md ("Train") and docs/performance.md. NIELS_GPT_MALLOC=system
leaves the allocator alone; only glibc has these settings.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import sys
import threading
from collections.abc import Iterator

from niels_gpt.errors import ConfigError

ENV = "NIELS_GPT_MALLOC"  # "keep" (the default) or "system"
M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4  # mallopt's parameters (glibc's malloc.h)
KEPT_FREE_BYTES = 1 << 30
DEFAULTS = ((M_MMAP_MAX, 65536), (M_TRIM_THRESHOLD, 128 << 10))  # glibc's own values
_LOCK = threading.Lock()
_depth = 0  # kept() blocks open: the outermost one restores the defaults


def setting() -> str:
    """NIELS_GPT_MALLOC: "keep" (also when unset or empty) or "system"; ConfigError for anything else."""
    value = os.environ.get(ENV, "").strip().lower() or "keep"
    if value not in ("keep", "system"):
        raise ConfigError(f"{ENV}={os.environ[ENV]!r} in the environment: expected 'system' (leave the C "
                          "allocator as it is) or 'keep' (the default: keep freed memory for the next use); fix "
                          "the value or unset it")
    return value


def _mallopt():
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # a C library without mallopt
        return None


@contextlib.contextmanager
def kept() -> Iterator[bool]:
    """Keep freed memory meanwhile; yields whether that is in effect (glibc, NIELS_GPT_MALLOC not "system")."""
    global _depth
    mallopt = _mallopt() if setting() == "keep" else None
    with _LOCK:
        on = mallopt is not None and (_depth > 0 or (
            mallopt(M_MMAP_MAX, 0) == 1 and mallopt(M_TRIM_THRESHOLD, KEPT_FREE_BYTES) == 1))
        if mallopt is not None and not on:  # musl's mallopt does nothing and says so; glibc's never refuses these
            for param, value in DEFAULTS:
                mallopt(param, value)
        _depth += on
    try:
        yield on
    finally:
        with _LOCK:
            _depth -= on
            if on and not _depth:
                for param, value in DEFAULTS:
                    mallopt(param, value)
                ctypes.CDLL(None).malloc_trim(0)  # what is kept and free goes back to the system


def keeping(fn):
    """`fn`, run inside `kept()` (the builders' entries)."""
    @functools.wraps(fn)
    def run(*args, **kwargs):
        with kept():
            return fn(*args, **kwargs)
    return run
