"""NumPy `.npy` token files (KempnerForge's preferred shard format). Reader and streaming writer.

Byte layout (NPY format version 1.0, as `np.save` writes it for a 1-D array):

    offset  size  field
    0       6     magic b"\\x93NUMPY"
    6       1     major version (1)
    7       1     minor version (0)
    8       2     uint16 LE header length H
    10      H     ASCII dict "{'descr': '<u2', 'fortran_order': False, 'shape': (N,), }",
                  space-padded and ending in "\\n" so that 10 + H is a multiple of 64
    10+H    ...   uint16|uint32 LE tokens[N]

Only 1-D, C-order, little-endian uint16/uint32 arrays are tokens; objects are never unpickled. The writer
writes the header for shape (0,), appends tokens, then rewrites the header with the final N (padded to
HEADER_BYTES, so the same length): up to N = 10**19 the bytes equal `np.save`'s.
"""

from __future__ import annotations

import os

import numpy as np

from niels_gpt.errors import FormatError
from niels_gpt.formats.base import TokenFile, check_payload_size, parse_dtype
from niels_gpt.formats.raw import RawSink

MAGIC = b"\x93NUMPY"
HEADER_BYTES = 128  # preamble + dict + padding: what np.save writes for a 1-D array


def npy_header(dtype, count: int) -> bytes:
    dtype = parse_dtype(dtype)
    text = f"{{'descr': '{dtype.str}', 'fortran_order': False, 'shape': ({count},), }}"
    pad = HEADER_BYTES - 10 - len(text) - 1
    if pad < 0:
        raise FormatError(f".npy header for {count} tokens does not fit {HEADER_BYTES} bytes")
    body = (text + " " * pad + "\n").encode("latin1")
    return MAGIC + bytes([1, 0]) + len(body).to_bytes(2, "little") + body


def read_npy_header(path: str | os.PathLike, fix: str) -> tuple[tuple, bool, np.dtype, int]:
    """(shape, fortran_order, dtype, payload offset) of a .npy file, parsed by numpy; `fix` ends each error."""
    with open(path, "rb") as f:
        if f.read(6) != MAGIC:
            raise FormatError(f"{path}: not a .npy file (no \\x93NUMPY magic); {fix}")
        f.seek(0)
        try:
            version = np.lib.format.read_magic(f)
            read = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}
            if version not in read:
                raise FormatError(f"{path}: .npy version {version} is not supported (1.0 or 2.0)")
            shape, fortran, dtype = read[version](f)
        except FormatError:
            raise
        except Exception as exc:  # numpy raises ValueError, SyntaxError or TokenError on garbage
            raise FormatError(f"{path}: corrupt .npy header ({exc}); {fix}") from exc
        return shape, fortran, dtype, f.tell()


def open_npy(path: str | os.PathLike) -> TokenFile:
    """Describe a token `.npy`: header parsed by numpy, every field and the size checked."""
    path = str(path)
    shape, _, dtype, offset = read_npy_header(path, "re-write the file (is it a raw .bin?)")
    if dtype.hasobject:
        raise FormatError(f"{path}: object array; token files must be numeric (uint16/uint32)")
    if len(shape) != 1:
        raise FormatError(f"{path}: shape {shape}; token files must be 1-D (flatten it)")
    if dtype.kind != "u" or dtype.itemsize not in (2, 4) or dtype.byteorder == ">":
        raise FormatError(f"{path}: dtype {dtype.str}; token files must be '<u2' or '<u4' "
                          "(re-save with arr.astype('<u4') after checking the ids fit)")
    check_payload_size(path, offset, shape[0], dtype.itemsize, "the .npy header")
    return TokenFile(path, parse_dtype(dtype), offset, int(shape[0]))


class NpySink(RawSink):
    """A `.npy` token file being written: count-0 header first, the real header last."""

    def _header(self, count: int) -> bytes:
        return npy_header(self.dtype, count)
