"""Read-only memory maps of token files.

- `open_tokens` maps one file with MADV_RANDOM: no read-ahead, so a random batch on a cold page cache reads
  the pages it touches, not ~128 KiB around each; pages stay in the shared page cache (one copy per host);
- `open_concatenated` maps a split's shards back to back into ONE address range, each at a page boundary,
  so a batch whose windows fall in different shards is still one gather (POSIX; None elsewhere);
- every file is sized through its open descriptor and checked against meta.json's size, so a cache
  replaced by a rebuild is refused instead of mapped past its end (SIGBUS).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import mmap
import os
import sys
import weakref
from pathlib import Path

import numpy as np

from niels_gpt.errors import CacheError, CacheMismatchError

MADV_RANDOM = getattr(mmap, "MADV_RANDOM", None)
# Linux, macOS and the BSDs share MAP_FIXED's value; only there is open_concatenated attempted.
_MAP_FIXED = 0x10
_CONCAT_PLATFORMS = ("linux", "darwin", "freebsd")


def open_tokens(path: str | os.PathLike, dtype: np.dtype, *, expected_bytes: int | None = None) -> np.ndarray:
    """Map `path` as a read-only 1-D array of `dtype`; `expected_bytes`: what meta.json recorded."""
    path = Path(path)
    dtype = np.dtype(dtype)
    try:
        f = open(path, "rb")
    except FileNotFoundError:
        raise CacheError(f"{path}: token file missing") from None
    with f:
        size = _checked_size(f, path, expected_bytes)
        if size % dtype.itemsize:
            raise CacheError(f"{path}: {size} payload bytes is not a whole number of "
                             f"{dtype.itemsize}-byte tokens: the file is truncated or not {dtype}")
        if size == 0:
            return np.zeros(0, dtype=dtype)
        mm = mmap.mmap(f.fileno(), size, access=mmap.ACCESS_READ)
    if MADV_RANDOM is not None and hasattr(mm, "madvise"):
        mm.madvise(MADV_RANDOM)
    return np.frombuffer(mm, dtype=dtype)


def _checked_size(f, path: Path, expected_bytes: int | None) -> int:
    """The size of the open file `f`, which must be `expected_bytes` where that is given."""
    size = os.fstat(f.fileno()).st_size
    if expected_bytes is not None and size != expected_bytes:
        raise CacheMismatchError(f"{path}: {size} bytes now, {expected_bytes} when the dataset was opened: the "
                                 "cache was replaced (a rebuild?) or changed in place; open the dataset again")
    return size


def window_view(tokens: np.ndarray, width: int) -> np.ndarray:
    """(n - width + 1, width) read-only view of every window of `width` tokens, without copying: indexing
    its rows with an index array is one memcpy per row, so a batch is one gather."""
    # NOTE: as_strided (~2 us), not numpy's checked sliding_window_view (~60 us), for maps read once
    n = len(tokens) - width + 1
    s = tokens.strides[0]
    return np.lib.stride_tricks.as_strided(tokens, shape=(max(n, 0), width), strides=(s, s), writeable=False)


@functools.cache
def _libc():
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    return libc


def open_concatenated(paths: list[str | os.PathLike], dtype: np.dtype, *,
                      expected_bytes: list[int] | None = None) -> tuple[np.ndarray, np.ndarray] | None:
    """Map `paths` back to back into one read-only array; returns (tokens, first token of each file), or None
    where the platform has no mmap(MAP_FIXED) or a call fails.

    Starts are page-aligned; the bytes between a file's end and the next page read as zeros. Worked example
    (4 KiB pages, uint16): files of 5,000 and 300 tokens -> starts [0, 6144], len(tokens) == 6,444.
    """
    # NOTE: one gather instead of one per shard touched: 32x1024 batches over 3 shards ~70 -> ~35 us
    # (bench/bench_cache_readers.py); the reservation costs address space, not memory.
    if not sys.platform.startswith(_CONCAT_PLATFORMS) or not paths:
        return None
    dtype = np.dtype(dtype)
    page = mmap.PAGESIZE
    with contextlib.ExitStack() as stack:
        files = [stack.enter_context(open(p, "rb")) for p in paths]  # a missing file: the caller names it
        sizes = [_checked_size(f, Path(p), None if expected_bytes is None else expected_bytes[k])
                 for k, (f, p) in enumerate(zip(files, paths, strict=True))]
        if any(s == 0 or s % dtype.itemsize for s in sizes):
            return None  # open_tokens reports these with the file's name
        spans = [-(-s // page) * page for s in sizes]
        total = sum(spans)
        try:
            libc = _libc()
        except (OSError, AttributeError):
            return None
        base = libc.mmap(None, total, mmap.PROT_READ, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1, 0)
        if base in (None, ctypes.c_void_p(-1).value):
            return None
        offset = 0
        for f, span in zip(files, spans, strict=True):
            addr = libc.mmap(base + offset, span, mmap.PROT_READ, mmap.MAP_SHARED | _MAP_FIXED, f.fileno(), 0)
            if addr != base + offset:
                libc.munmap(base, total)
                return None
            offset += span
    if MADV_RANDOM is not None:
        libc.madvise(base, total, MADV_RANDOM)
    buf = (ctypes.c_char * total).from_address(base)
    weakref.finalize(buf, libc.munmap, base, total)  # unmapped when the last array over it is gone
    tokens = np.frombuffer(buf, dtype=dtype)
    tokens.flags.writeable = False
    starts = np.concatenate([[0], np.cumsum(spans)[:-1]]).astype(np.int64) // dtype.itemsize
    return tokens, starts


def prefetch_windows(base_addr: int, itemsize: int, starts: np.ndarray, width: int) -> None:
    """MADV_WILLNEED the windows [starts[i], starts[i] + width) of a range from `open_concatenated` at
    `base_addr`, so a cold batch waits for B reads in flight at once, not B page faults in turn."""
    libc, page = _libc(), mmap.PAGESIZE
    lo = base_addr + np.asarray(starts, dtype=np.int64) * itemsize
    aligned = lo & ~(page - 1)
    lengths = lo + width * itemsize - aligned
    for addr, length in zip(aligned.tolist(), lengths.tolist(), strict=True):
        libc.madvise(addr, length, mmap.MADV_WILLNEED)
