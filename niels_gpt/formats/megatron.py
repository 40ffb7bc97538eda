"""Megatron-LM indexed dataset (`MMapIndexedDataset` / `IndexedDataset`): `.bin` + `.idx`. Reader, writer.

Byte layout of `<prefix>.idx` (all little-endian):

    offset           type        field
    0                9 bytes     magic b"MMIDIDX\\x00\\x00"
    9                uint64      version = 1
    17               uint8       dtype code: 1 uint8, 2 int8, 3 int16, 4 int32, 5 int64, 6 float64,
                                 7 float32, 8 uint16
    18               uint64      N = sequence count
    26               uint64      D = document count + 1 (length of document_indices)
    34               int32[N]    sequence_lengths (tokens)
    34+4N            int64[N]    sequence_pointers (byte offsets into .bin: cumulative len * itemsize)
    34+12N           int64[D]    document_indices: sequence-index boundaries [0, ..., N]
    34+12N+8D        int8[N]     sequence_modes (multimodal datasets only; accepted, not written)

`<prefix>.bin` is the tokens of every sequence, concatenated, in that dtype, no header.

We write one sequence per document (document_indices = arange(N + 1)): its tokens then its EOT, as Megatron's
`preprocess_data.py --append-eod`; code 8 (uint16) for uint16 corpora, else code 4 (int32, range-checked:
there is no uint32 code). The reader accepts the integer codes 1, 3, 4, 5, 8 and checks every count, pointer
and size. The writer spills lengths to a temporary file (memory: one block); `.bin` lands first, `.idx` last.
"""

from __future__ import annotations

import contextlib
import os
import struct
from pathlib import Path
from typing import NamedTuple

import numpy as np

from niels_gpt.atomic import atomic_path, tmp_name
from niels_gpt.errors import FormatError
from niels_gpt.formats.base import TokenFile, check_fits
from niels_gpt.formats.raw import RawSink

MAGIC = b"MMIDIDX\x00\x00"
VERSION = 1
HEADER_BYTES = 34
DTYPE_CODES = {1: np.dtype("u1"), 2: np.dtype("i1"), 3: np.dtype("<i2"), 4: np.dtype("<i4"),
               5: np.dtype("<i8"), 6: np.dtype("<f8"), 7: np.dtype("<f4"), 8: np.dtype("<u2")}
TOKEN_CODES = (1, 3, 4, 5, 8)
_BLOCK = 1 << 20


class MegatronIndex(NamedTuple):
    prefix: str
    dtype: np.dtype
    lengths: np.ndarray  # int32[N] memmap
    doc_indices: np.ndarray  # int64[D] memmap

    @property
    def num_tokens(self) -> int:
        return int(self.lengths.sum(dtype=np.int64))

    def token_file(self) -> TokenFile:
        return TokenFile(self.prefix + ".bin", self.dtype, 0, self.num_tokens)

    def document_bounds(self) -> np.ndarray:
        """Token offsets [0, ..., num_tokens] where documents start and end (len D)."""
        seq_starts = np.concatenate([[0], np.cumsum(self.lengths, dtype=np.int64)])
        return seq_starts[np.asarray(self.doc_indices)]


def prefix_of(path: str | os.PathLike) -> str:
    p = str(path)
    return p[:-4] if p.endswith((".bin", ".idx")) else p


def is_megatron(path: str | os.PathLike) -> bool:
    idx = prefix_of(path) + ".idx"
    try:
        with open(idx, "rb") as f:
            return f.read(9) == MAGIC
    except OSError:
        return False


def read_index(path: str | os.PathLike) -> MegatronIndex:
    """Open `<prefix>.idx` and check it against itself and `<prefix>.bin`."""
    prefix = prefix_of(path)
    idx = prefix + ".idx"
    size = os.path.getsize(idx)
    with open(idx, "rb") as f:
        head = f.read(HEADER_BYTES)
    if len(head) < HEADER_BYTES:
        raise FormatError(f"{idx}: truncated header: {len(head)} of {HEADER_BYTES} bytes")
    if head[:9] != MAGIC:
        raise FormatError(f"{idx}: magic {head[:9]!r}, expected {MAGIC!r}; not a Megatron index")
    (version,) = struct.unpack("<Q", head[9:17])
    if version != VERSION:
        raise FormatError(f"{idx}: version {version}, expected {VERSION}")
    code = head[17]
    if code not in TOKEN_CODES:
        raise FormatError(f"{idx}: dtype code {code} is not an integer token type "
                          f"(expected one of {TOKEN_CODES}); not a token dataset")
    n, d = struct.unpack("<QQ", head[18:34])
    want = HEADER_BYTES + 12 * n + 8 * d
    if size not in (want, want + n):
        raise FormatError(f"{idx}: {size} bytes, but N={n} sequences and D={d} document indices need "
                          f"{want} (or {want + n} with modes): the index is truncated or its counts lie")
    lengths = np.memmap(idx, "<i4", "r", HEADER_BYTES, (n,)) if n else np.empty(0, "<i4")
    pointers = np.memmap(idx, "<i8", "r", HEADER_BYTES + 4 * n, (n,)) if n else np.empty(0, "<i8")
    docs = np.memmap(idx, "<i8", "r", HEADER_BYTES + 12 * n, (d,)) if d else np.empty(0, "<i8")
    dtype = DTYPE_CODES[code]
    if n and int(lengths.min()) < 0:
        raise FormatError(f"{idx}: negative sequence length; the index is corrupt")
    lens = np.asarray(lengths, dtype=np.int64)
    expect = (np.cumsum(lens) - lens) * dtype.itemsize  # exclusive prefix sum: [3, 1] -> [0, 3]
    if not np.array_equal(np.asarray(pointers), expect):
        raise FormatError(f"{idx}: sequence_pointers are not the cumulative byte offsets of "
                          "sequence_lengths; the index is corrupt")
    if d < 1 or docs[0] != 0 or docs[-1] != n or np.any(np.diff(docs) < 0):
        raise FormatError(f"{idx}: document_indices must rise from 0 to N={n}; the index is corrupt")
    total = int(lengths.sum(dtype=np.int64)) * dtype.itemsize
    bin_path = prefix + ".bin"
    if not os.path.isfile(bin_path):
        raise FormatError(f"{bin_path}: missing (its index {idx} exists); copy both files")
    bsize = os.path.getsize(bin_path)
    if bsize != total:
        raise FormatError(f"{bin_path}: {bsize} bytes, but {idx} lists {total} bytes of tokens: "
                          "truncated or mismatched pair")
    return MegatronIndex(prefix, dtype, lengths, docs)


def iter_documents(index: MegatronIndex, block: int = _BLOCK):
    """Yield (tokens, ends) pieces, one document at a time (large documents in blocks)."""
    tokens = index.token_file().open()
    bounds = index.document_bounds()
    for a, b in zip(bounds[:-1].tolist(), bounds[1:].tolist(), strict=True):
        for s in range(a, max(b, a + 1), block):
            part = np.array(tokens[s:min(b, s + block)])
            if part.size and part.min() < 0:
                raise FormatError(f"{index.prefix}.bin: negative token id at document starting {a}")
            yield part, s + block >= b


class MegatronWriter:
    """Streams documents into `<prefix>.bin`; `end_document()` closes a sequence; `close()` writes .idx."""

    def __init__(self, prefix: str | os.PathLike, token_dtype):
        self.prefix = str(prefix)
        self.code = 8 if np.dtype(token_dtype).itemsize == 2 else 4
        self.dtype = DTYPE_CODES[self.code]
        Path(self.prefix).parent.mkdir(parents=True, exist_ok=True)
        self._bin = RawSink(self.prefix + ".bin", "uint16" if self.code == 8 else "uint32")
        self._lengths_path = tmp_name(self.prefix + ".lengths")
        self._lengths = open(self._lengths_path, "wb")
        self._pending: list[int] = []
        self._current = 0
        self.sequences = 0

    def write(self, arr: np.ndarray) -> None:
        check_fits(arr, self.dtype, self.prefix + ".bin")
        self._bin.write(arr)
        self._current += len(arr)

    def end_document(self) -> None:
        if self._current > 2**31 - 1:
            raise FormatError(f"{self.prefix}: a document of {self._current} tokens exceeds int32 lengths")
        self._pending.append(self._current)
        self._current = 0
        self.sequences += 1
        if len(self._pending) >= _BLOCK:
            self._flush_lengths()

    def _flush_lengths(self) -> None:
        self._lengths.write(np.asarray(self._pending, dtype="<i4").tobytes())
        self._pending.clear()

    def close(self) -> dict:
        if self._current:
            self.end_document()  # an unterminated tail is still a sequence
        self._flush_lengths()
        self._lengths.close()
        n = self.sequences
        rec = self._bin.close()
        try:
            with atomic_path(self.prefix + ".idx") as tmp, open(tmp, "wb") as f:
                f.write(MAGIC + struct.pack("<Q", VERSION) + bytes([self.code]) + struct.pack("<QQ", n, n + 1))
                lengths = np.memmap(self._lengths_path, "<i4", "r", shape=(n,)) if n else np.empty(0, "<i4")
                for s in range(0, n, _BLOCK):
                    f.write(np.asarray(lengths[s:s + _BLOCK]).tobytes())
                start = 0
                for s in range(0, n, _BLOCK):
                    part = np.asarray(lengths[s:s + _BLOCK], dtype=np.int64) * self.dtype.itemsize
                    ptr = np.cumsum(part) - part + start
                    start = int(ptr[-1] + part[-1])
                    f.write(ptr.astype("<i8").tobytes())
                for s in range(0, n + 1, _BLOCK):
                    f.write(np.arange(s, min(n + 1, s + _BLOCK), dtype="<i8").tobytes())
                del lengths
        finally:
            os.unlink(self._lengths_path)
        rec.update(sequences=n, idx=self.prefix + ".idx")
        return rec

    def abort(self) -> None:
        self._bin.abort()
        self._lengths.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._lengths_path)
