"""nanoGPT header shards (modded-nanogpt legacy and NeMo AutoModel new). Reader and writer.

Byte layout (all little-endian):

    offset     type         field
    0          int32        magic: 20240520 (legacy, modded-nanogpt data/fineweb.py)
                                   278895051 (new, NeMo AutoModel tools/nanogpt_data_processor.py)
    4          int32        version = 1
    8          int32        num_tokens: tokens in the payload, 0 <= num_tokens <= 2**31 - 1
    12         int32        bytes per token: new: 2 (uint16) or 4 (uint32); legacy: 0 (or 2), uint16
    16..1023   int32[252]   zeros
    1024       uint16|uint32 tokens[num_tokens]
    sidecar    <stem>.bos.idx: int32 token indices of every BOS (see niels_gpt.formats.bos_index)

The reader checks every field and that the file holds exactly 1024 + num_tokens * itemsize bytes; num_tokens
is an int32, so the writer rolls over to the next file before 2**31 - 1 tokens (MAX_TOKENS_PER_FILE).
A file is written under a temporary name with num_tokens = 0, its header rewritten with the final count,
fsynced and renamed: no file under a final name claims tokens it lacks. Its `.bos.idx` lands after it.
"""

from __future__ import annotations

import os
from typing import NamedTuple

import numpy as np

from niels_gpt.errors import ConfigError, FormatError
from niels_gpt.formats.base import TokenFile, check_payload_size
from niels_gpt.formats.bos_index import write_bos_index
from niels_gpt.formats.raw import RawSink

HEADER_INTS = 256
HEADER_BYTES = HEADER_INTS * 4
LEGACY_MAGIC = 20240520
MAGIC = 278895051
VERSION = 1
MAX_TOKENS_PER_FILE = 2**31 - 1


class NanogptHeader(NamedTuple):
    magic: int
    version: int
    num_tokens: int
    itemsize: int

    @property
    def legacy(self) -> bool:
        return self.magic == LEGACY_MAGIC

    @property
    def dtype(self) -> np.dtype:
        return np.dtype("<u2") if self.itemsize == 2 else np.dtype("<u4")


def make_header(num_tokens: int, dtype, *, legacy: bool = False) -> bytes:
    itemsize = np.dtype(dtype).itemsize
    if legacy and itemsize != 2:
        raise ConfigError("the legacy nanoGPT format (magic 20240520) holds only uint16 tokens; "
                          "use --to nanogpt (magic 278895051, uint32 allowed) for this corpus")
    if not 0 <= num_tokens <= MAX_TOKENS_PER_FILE:
        raise ConfigError(f"a nanoGPT file holds 0..{MAX_TOKENS_PER_FILE} tokens, not {num_tokens}")
    header = np.zeros(HEADER_INTS, dtype="<i4")
    header[0] = LEGACY_MAGIC if legacy else MAGIC
    header[1] = VERSION
    header[2] = num_tokens
    header[3] = 0 if legacy else itemsize
    return header.tobytes()


def is_nanogpt(path: str | os.PathLike) -> bool:
    """Cheap sniff: the first int32 is one of the two magics."""
    try:
        with open(path, "rb") as f:
            head = f.read(4)
    except OSError:
        return False
    return len(head) == 4 and int.from_bytes(head, "little", signed=True) in (LEGACY_MAGIC, MAGIC)


def read_header(path: str | os.PathLike) -> NanogptHeader:
    """Parse and check the 1024-byte header and the file size."""
    path = str(path)
    with open(path, "rb") as f:
        raw = f.read(HEADER_BYTES)
    if len(raw) < HEADER_BYTES:
        raise FormatError(f"{path}: truncated header: {len(raw)} of {HEADER_BYTES} bytes; "
                          "the file is cut short or is not a nanoGPT shard")
    h = np.frombuffer(raw, dtype="<i4")
    magic, version, count, itemsize = (int(x) for x in h[:4])
    if magic not in (LEGACY_MAGIC, MAGIC):
        raise FormatError(f"{path}: header magic {magic} is neither {MAGIC} (new) nor {LEGACY_MAGIC} "
                          "(legacy); not a nanoGPT shard (a raw .bin needs --dtype)")
    if version != VERSION:
        raise FormatError(f"{path}: header version {version}, expected {VERSION}; unsupported writer")
    if count < 0:
        raise FormatError(f"{path}: header num_tokens {count} is negative; the header is corrupt")
    if magic == LEGACY_MAGIC:
        if itemsize not in (0, 2):
            raise FormatError(f"{path}: legacy header (magic {LEGACY_MAGIC}) has bytes/token {itemsize}; "
                              "legacy shards are uint16 (0 or 2); the header is corrupt")
        itemsize = 2
    elif itemsize not in (2, 4):
        raise FormatError(f"{path}: header bytes/token {itemsize}, expected 2 (uint16) or 4 (uint32)")
    if np.any(h[4:]):
        first = int(np.flatnonzero(h[4:])[0]) + 4
        raise FormatError(f"{path}: header int32 #{first} is {int(h[first])}, expected 0 "
                          "(reserved); the header is corrupt")
    check_payload_size(path, HEADER_BYTES, count, itemsize, "the header's num_tokens")
    return NanogptHeader(magic, version, count, itemsize)


def open_nanogpt(path: str | os.PathLike) -> TokenFile:
    h = read_header(path)
    return TokenFile(str(path), h.dtype, HEADER_BYTES, h.num_tokens)


class NanogptSink(RawSink):
    """One nanoGPT shard being written (see above); with `bos_id` it also writes `<stem>.bos.idx` after it."""

    def __init__(self, path, dtype, *, legacy: bool = False, bos_id: int | None = None):
        self.legacy, self.bos_id = legacy, bos_id
        self._bos: list[np.ndarray] = []
        super().__init__(path, dtype)

    def _header(self, count: int) -> bytes:
        return make_header(count, self.dtype, legacy=self.legacy)

    def write(self, arr: np.ndarray) -> None:
        if self.tokens + len(arr) > MAX_TOKENS_PER_FILE:
            raise ConfigError(f"{self.path}: more than {MAX_TOKENS_PER_FILE} tokens in one nanoGPT file")
        if self.bos_id is not None:
            self._bos.append(np.flatnonzero(arr == self.bos_id) + self.tokens)
        super().write(arr)

    def close(self) -> dict:
        rec = super().close()
        if self.bos_id is not None:
            positions = np.concatenate(self._bos) if self._bos else np.empty(0, dtype=np.int64)
            rec["bos_index"] = write_bos_index(self.path, positions)
        return rec


def shard_name(prefix: str, index: int) -> str:
    return f"{prefix}_{index:06d}.bin"
