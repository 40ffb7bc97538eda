"""Raw token files: headerless little-endian uint16/uint32 `.bin`. Reader and writer.

Byte layout (the whole file is payload):

    offset  type                 field
    0       uint16|uint32 LE     tokens[file_size / itemsize]

Nothing in the file says which dtype it holds. KempnerForge guesses uint32 whenever the size is a
multiple of 4, which misreads every uint16 file with an even token count. We never guess: the dtype
comes from the caller, a `meta.json` of ours, or a tatm `metadata.yaml` (`tokenized_info.dtype`)
beside the files (see niels_gpt.formats.detect.detect_format), and a size that is not a multiple of
the itemsize is rejected. Our caches' shards are raw files of this layout.

Cost: reading is one memmap; writing streams through a temporary file (`<name>.tmp-<pid>`), renamed
into place when complete, so a crash never leaves a short file under the final name.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from niels_gpt.errors import FormatError
from niels_gpt.formats.base import TokenFile, check_fits, parse_dtype
from niels_gpt.formats.writers import HashingFile


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
    holding tokens of one dtype, range-checked before the cast. Header formats subclass it."""

    header_bytes = 0

    def __init__(self, path: str | os.PathLike, dtype):
        self.path = Path(path)
        self.dtype = parse_dtype(dtype)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = HashingFile(self.path)
        self.tmp = self._file.tmp
        self._f = self._file.f  # header formats seek in it to write their final header
        self.tokens = 0
        self._write_header()

    def _write_header(self) -> None:
        pass

    def _raw(self, data: bytes) -> None:
        self._file.write(np.frombuffer(data, dtype=np.uint8))

    def write(self, arr: np.ndarray) -> None:
        check_fits(arr, self.dtype, str(self.path))
        self._file.write(np.ascontiguousarray(arr, dtype=self.dtype))
        self.tokens += len(arr)

    def _finalize(self) -> None:
        """Hook for formats whose header can only be written once the count is final."""

    def close(self) -> dict:
        self._finalize()
        record = self._file.close()
        return {"path": str(self.path), "tokens": self.tokens, "bytes": self.path.stat().st_size,
                "sha256": record["sha256"]}

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
