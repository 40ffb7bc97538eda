"""Raw token files: headerless little-endian uint16/uint32 `.bin`. Reader and writer.

Byte layout (the whole file is payload):

    offset  type                 field
    0       uint16|uint32 LE     tokens[file_size / itemsize]

Nothing in the file says its dtype, and we never guess it from the size (KempnerForge's uint32-if-divisible-by-4
misreads every uint16 file with an even token count): it comes from the caller, our `meta.json`, or a tatm
`metadata.yaml` (formats/detect.py). Our caches' shards are raw files of this layout.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from niels_gpt.errors import FormatError
from niels_gpt.formats.base import TokenFile, check_fits, parse_dtype
from niels_gpt.formats.writers import HashingFile
from niels_gpt.meta import sha256_file


def kempnerforge_note(counts: dict[str, int], dtype, where) -> str | None:
    """The note on uint16 raw files ({path: token count}) with an even token count, which KempnerForge misreads
    (it ignores metadata.yaml and takes uint32 when a size divides by 4); None if there are none."""
    even = [(path, n) for path, n in counts.items() if n % 2 == 0]
    if np.dtype(dtype).itemsize != 2 or not even:
        return None
    return (f"{where}: uint16 .bin files with an even token count ({Path(even[0][0]).name}: {even[0][1]} tokens), "
            "which KempnerForge's MemoryMappedDataset reads as uint32 (it ignores metadata.yaml: KempnerForge infers "
            "uint32 from sizes divisible by 4): for KempnerForge use --to kempner-npy (convert writes .npy, which "
            "records its dtype); readers told the dtype read them right")


def open_raw(path: str | os.PathLike, dtype) -> TokenFile:
    """Describe a raw `.bin` of a known dtype; rejects sizes that are not whole tokens."""
    dtype = parse_dtype(dtype)
    size = os.path.getsize(path)
    if size % dtype.itemsize:
        raise FormatError(f"{path}: {size} bytes is not a whole number of {dtype.itemsize}-byte tokens: "
                          "the file is truncated or is not a raw token file of this dtype")
    return TokenFile(str(path), dtype, 0, size // dtype.itemsize)


class RawSink:
    """One raw token file being written: a `HashingFile` (temp name, streamed sha256, rename on close)
    holding tokens of one dtype, range-checked before the cast. Header formats override `_header`."""

    def __init__(self, path: str | os.PathLike, dtype):
        self.path = Path(path)
        self.dtype = parse_dtype(dtype)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = HashingFile(self.path)
        self.tokens = 0
        self._file.f.write(self._header(0))

    def _header(self, count: int) -> bytes:
        """The header for `count` tokens: written with 0 first, rewritten in place with the final count."""
        return b""

    def write(self, arr: np.ndarray) -> None:
        check_fits(arr, self.dtype, str(self.path))
        self._file.write(np.ascontiguousarray(arr, dtype=self.dtype))
        self.tokens += len(arr)

    def close(self) -> dict:
        header = self._header(self.tokens)
        if header:  # in place of the count-0 one (seek flushes what is buffered)
            self._file.f.seek(0)
            self._file.f.write(header)
        record = self._file.close()
        if header:  # a rewritten header is not in the streamed hash: a file record hashes the bytes on disk
            record.update(bytes=self.path.stat().st_size, sha256=sha256_file(self.path))
        return {"path": str(self.path), "tokens": self.tokens, **record}

    def abort(self) -> None:
        self._file.abort()


def write_raw(path: str | os.PathLike, tokens, dtype) -> dict:
    """Write a whole raw file at once (tests, small files)."""
    sink = RawSink(path, dtype)
    try:
        sink.write(np.asarray(tokens))
    except BaseException:
        sink.abort()
        raise
    return sink.close()
