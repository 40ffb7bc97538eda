"""Read-only memory maps of token files, opened the way random-window training wants them.

`open_tokens` maps a whole file with mmap(2) and tells the kernel the access pattern:
- "random" (default for random-window sampling): MADV_RANDOM turns off read-ahead, so a batch on a
  cold page cache reads the pages it touches and not ~128 KiB around each of them (a plain memmap
  read ~325x the bytes a random batch needs here).
- "sequential": MADV_SEQUENTIAL, for readers that stream a file front to back.
- "normal": leave the kernel's default.
Nothing is read at open time; pages fault in as the arrays are indexed and stay in the shared page
cache, so every DataLoader worker and rank on a machine shares one copy.

Arrays returned here are read-only views over the mapping; they keep the mapping alive.
"""

from __future__ import annotations

import mmap
import os
from pathlib import Path

import numpy as np

from niels_gpt.errors import CacheError, ConfigError

ADVICE = {
    "random": getattr(mmap, "MADV_RANDOM", None),
    "sequential": getattr(mmap, "MADV_SEQUENTIAL", None),
    "normal": getattr(mmap, "MADV_NORMAL", None),
}
NUMPY_DTYPES = {"uint16-le": np.dtype("<u2"), "uint32-le": np.dtype("<u4")}


def numpy_dtype(token_dtype: str) -> np.dtype:
    """meta.json's "uint16-le" / "uint32-le" -> numpy dtype."""
    try:
        return NUMPY_DTYPES[token_dtype]
    except KeyError:
        raise CacheError(f"unknown token_dtype {token_dtype!r}; expected one of {sorted(NUMPY_DTYPES)}") from None


def meta_token_dtype(dtype: np.dtype) -> str:
    dtype = np.dtype(dtype)
    for name, dt in NUMPY_DTYPES.items():
        if dt == dtype:
            return name
    raise ConfigError(f"token dtype {dtype} is not supported; use uint16 or uint32")


def open_tokens(path: str | os.PathLike, dtype: np.dtype, *, offset: int = 0,
                advice: str = "random") -> np.ndarray:
    """Map `path` (from byte `offset`) as a read-only 1-D array of `dtype`."""
    path = Path(path)
    dtype = np.dtype(dtype)
    if advice not in ADVICE:
        raise ConfigError(f"advice must be one of {sorted(ADVICE)}, got {advice!r}")
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        raise CacheError(f"{path}: token file missing") from None
    payload = size - offset
    if payload < 0 or payload % dtype.itemsize:
        raise CacheError(f"{path}: {payload} payload bytes is not a whole number of "
                         f"{dtype.itemsize}-byte tokens: the file is truncated or not {dtype}")
    if payload == 0:
        return np.zeros(0, dtype=dtype)
    with open(path, "rb") as f:
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    flag = ADVICE[advice]
    if flag is not None and hasattr(mm, "madvise"):
        mm.madvise(flag)
    return np.frombuffer(mm, dtype=dtype, count=payload // dtype.itemsize, offset=offset)


def window_view(tokens: np.ndarray, width: int) -> np.ndarray:
    """(n - width + 1, width) view of every window of `width` tokens, without copying.

    Row s is tokens[s : s + width]; indexing rows with an index array copies each row with one
    contiguous memcpy, which is what makes a batch one gather.
    """
    return np.lib.stride_tricks.sliding_window_view(tokens, width)
