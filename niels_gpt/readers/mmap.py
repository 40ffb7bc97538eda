"""Read-only memory maps of token files, opened the way random-window training wants them.

`open_tokens` maps a whole file with mmap(2) and tells the kernel the access pattern:
- "random" (default for random-window sampling): MADV_RANDOM turns off read-ahead, so a batch on a
  cold page cache reads the pages it touches and not ~128 KiB around each of them (a plain memmap
  read ~325x the bytes a random batch needs here).
- "sequential": MADV_SEQUENTIAL, for readers that stream a file front to back.
- "normal": leave the kernel's default.
Nothing is read at open time; pages fault in as the arrays are indexed and stay in the shared page
cache, so every DataLoader worker and rank on a machine shares one copy.

`open_concatenated` maps several files (a split's shards) back to back into ONE address range, each
at a page boundary, so a batch whose windows fall in different shards is still one numpy gather
(POSIX only; None elsewhere, and callers fall back to one mapping per file).

Arrays returned here are read-only views over the mapping; they keep the mapping alive.
"""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import os
import sys
import weakref
from pathlib import Path

import numpy as np

from niels_gpt.errors import CacheError, CacheMismatchError, ConfigError

ADVICE = {
    "random": getattr(mmap, "MADV_RANDOM", None),
    "sequential": getattr(mmap, "MADV_SEQUENTIAL", None),
    "normal": getattr(mmap, "MADV_NORMAL", None),
}


def open_tokens(path: str | os.PathLike, dtype: np.dtype, *, offset: int = 0,
                advice: str = "random", expected_bytes: int | None = None) -> np.ndarray:
    """Map `path` (from byte `offset`) as a read-only 1-D array of `dtype`.

    The size is read from the open file itself and, with `expected_bytes` (what meta.json recorded
    when the dataset was opened), must equal it: a cache swapped in by a rebuild between opening the
    dataset and its first batch is refused here instead of mapped past its end (SIGBUS on access).
    """
    path = Path(path)
    dtype = np.dtype(dtype)
    if advice not in ADVICE:
        raise ConfigError(f"advice must be one of {sorted(ADVICE)}, got {advice!r}")
    try:
        f = open(path, "rb")
    except FileNotFoundError:
        raise CacheError(f"{path}: token file missing") from None
    with f:
        size = _checked_size(f, path, expected_bytes)
        payload = size - offset
        if payload < 0 or payload % dtype.itemsize:
            raise CacheError(f"{path}: {payload} payload bytes is not a whole number of "
                             f"{dtype.itemsize}-byte tokens: the file is truncated or not {dtype}")
        if payload == 0:
            return np.zeros(0, dtype=dtype)
        mm = mmap.mmap(f.fileno(), size, access=mmap.ACCESS_READ)
    flag = ADVICE[advice]
    if flag is not None and hasattr(mm, "madvise"):
        mm.madvise(flag)
    return np.frombuffer(mm, dtype=dtype, count=payload // dtype.itemsize, offset=offset)


def _checked_size(f, path: Path, expected_bytes: int | None) -> int:
    """The size of the open file `f`, which must be `expected_bytes` where that is given."""
    size = os.fstat(f.fileno()).st_size
    if expected_bytes is not None and size != expected_bytes:
        raise CacheMismatchError(f"{path}: {size} bytes now, {expected_bytes} when the dataset was opened: the "
                                 "cache was replaced (a rebuild?) or changed in place; open the dataset again")
    return size


def window_view(tokens: np.ndarray, width: int) -> np.ndarray:
    """(n - width + 1, width) read-only view of every window of `width` tokens, without copying.

    Row s is tokens[s : s + width]; indexing rows with an index array copies each row with one
    contiguous memcpy, which is what makes a batch one gather. (Built with as_strided: ~2 us, where
    numpy's checked sliding_window_view takes ~60, which a map read once and let go cannot afford.)
    """
    n = len(tokens) - width + 1
    s = tokens.strides[0]
    return np.lib.stride_tricks.as_strided(tokens, shape=(max(n, 0), width), strides=(s, s), writeable=False)


# Linux, macOS and the BSDs share MAP_FIXED's value; only there is open_concatenated attempted.
_MAP_FIXED = 0x10
_CONCAT_PLATFORMS = ("linux", "darwin", "freebsd")


def _libc():
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                          ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    return libc


def open_concatenated(paths: list[str | os.PathLike], dtype: np.dtype, *, advice: str = "random",
                      expected_bytes: list[int] | None = None) -> tuple[np.ndarray, np.ndarray] | None:
    """Map `paths` back to back into one read-only array; returns (tokens, first token of each file).

    File k occupies tokens[starts[k] : starts[k] + size_k / itemsize]; starts are page-aligned, and
    the bytes between the end of one file and the next page boundary read as zeros. A window that
    stays inside one file is therefore a plain slice of `tokens`, and a batch of windows spread over
    many files is one fancy index. Worked example (4 KiB pages, uint16): files of 5,000 and 300
    tokens -> starts [0, 6144] (10,000 bytes round up to 12,288), len(tokens) == 6,444.

    Returns None where the platform has no mmap(MAP_FIXED) or a call fails; nothing is read here.
    Each file is sized and mapped through one open descriptor, checked against `expected_bytes` as in
    `open_tokens`, so a file replaced after the dataset was opened is refused, never mapped past its end.
    """
    # NOTE: one gather instead of one per shard touched: 32x1024 batches over 3 shards went from
    # ~70 to ~35 us (bench/bench_cache_readers.py); the reservation costs address space, not memory.
    if not sys.platform.startswith(_CONCAT_PLATFORMS) or not paths or advice not in ADVICE:
        return None
    dtype = np.dtype(dtype)
    page = mmap.PAGESIZE
    with contextlib.ExitStack() as stack:
        files = []
        for path in paths:
            files.append(stack.enter_context(open(path, "rb")))  # a missing file: the caller names it
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
        failed = ctypes.c_void_p(-1).value
        base = libc.mmap(None, total, mmap.PROT_READ, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1, 0)
        if base in (None, failed):
            return None
        offset = 0
        for f, span in zip(files, spans, strict=True):
            addr = libc.mmap(base + offset, span, mmap.PROT_READ, mmap.MAP_SHARED | _MAP_FIXED, f.fileno(), 0)
            if addr != base + offset:
                libc.munmap(base, total)
                return None
            offset += span
    flag = ADVICE[advice]
    if flag is not None:
        libc.madvise(base, total, flag)
    buf = (ctypes.c_char * total).from_address(base)
    weakref.finalize(buf, libc.munmap, base, total)  # unmapped when the last array over it is gone
    tokens = np.frombuffer(buf, dtype=dtype)
    tokens.flags.writeable = False
    starts = np.concatenate([[0], np.cumsum(spans)[:-1]]).astype(np.int64) // dtype.itemsize
    return tokens, starts


_LIBC = None


def prefetch_windows(base_addr: int, itemsize: int, starts: np.ndarray, width: int) -> None:
    """Start reading the pages of every window now (MADV_WILLNEED), so a cold batch waits for B
    reads in flight at once instead of B page faults one after another.

    `base_addr` is the address of token 0 of a mapping from `open_concatenated`; window i is tokens
    [starts[i], starts[i] + width). One madvise call per window (~1.4 us each on a warm cache, which
    is why the reader only does this while its batches are waiting on the disk).
    """
    global _LIBC
    if _LIBC is None:
        _LIBC = _libc()
    page = mmap.PAGESIZE
    lo = base_addr + np.asarray(starts, dtype=np.int64) * itemsize
    aligned = lo & ~(page - 1)
    lengths = lo + width * itemsize - aligned
    for addr, length in zip(aligned.tolist(), lengths.tolist(), strict=True):
        _LIBC.madvise(addr, length, mmap.MADV_WILLNEED)



def gather_remote(remote, rels: list[str], dtype: np.dtype, expected_bytes: list[int], shard: np.ndarray,
                  starts: np.ndarray, width: int) -> np.ndarray:
    """(B, width) windows, row i the `width` tokens at `starts[i]` of file `rels[shard[i]]` of a remote cache
    (storage/mirror.py RemoteCache), each file fetched, mapped, read and let go before the next one.

    No map outlives the call, so a shard the download cache's bound evicts later frees its disk at once.
    Files already mirrored are read first (a download for this batch could evict them otherwise); while a
    file downloads, the batch's files not read yet are kept."""
    out = np.empty((len(shard), width), dtype=dtype)
    ks = list(dict.fromkeys(np.asarray(shard).tolist()))
    ks.sort(key=lambda k: not remote.has(rels[k]))
    unread = {rels[k] for k in ks}
    for k in ks:
        path = remote.fetch(rels[k], keep=unread)
        rows = np.flatnonzero(shard == k)
        out[rows] = window_view(open_tokens(path, dtype, expected_bytes=expected_bytes[k]), width)[starts[rows]]
        unread.discard(rels[k])
    return out
